// flashmsa_cuda_bench: the CUDA kernels on an H100/H200 at MiniMax-M3 shapes, against ceilings
// measured in the same run (HBM read stream, cuBLAS bf16 GEMM, cuBLASLt fp8 E4M3 GEMM). CUDA
// events, warm-up, medians of repeated runs with their coefficient of variation; decode steps are
// CUDA-graph replays, and small working sets rotate through more than 2x the L2 so no run measures
// a warm cache.
//
//   flashmsa_cuda_bench [--json FILE] [--filter SUBSTRING[,SUBSTRING...]] [--cases JSONL]
//                       [--quick-grid] [--grid-point KIND,BATCH,CONTEXT,DQL]
//   --grid-point runs only the given points of the decode grid (e.g. fp8,64,32768,4; repeatable),
//   to profile or check a few alone.
//   (see scripts/bench.sh)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "flashmsa/flashmsa.hpp"
#include "src/cuda/common/phase_clock.hpp"
#include "src/cuda/cuda_ops.hpp"  // index_decode_phases: scoring timed apart from top-k

namespace {

using namespace flashmsa;

#define BENCH_CHECK_CUBLAS(x)                                                  \
  do {                                                                         \
    if ((x) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cuBLAS: " #x); \
  } while (0)

struct Stat {
  double median_s = 0, cv = 0;
};

// Median and coefficient of variation of a set of timings (seconds).
Stat summarize(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  const double mean = std::accumulate(t.begin(), t.end(), 0.0) / t.size();
  double var = 0;
  for (double x : t) var += (x - mean) * (x - mean);
  return {t[t.size() / 2], std::sqrt(var / t.size()) / mean};
}

// Median (and coefficient of variation) of `reps` timings of `body`, after `warmup` runs.
Stat time_it(const std::function<void(int)>& body, int reps, int warmup = 3) {
  cudaEvent_t a, b;
  FLASHMSA_CHECK_CUDA(cudaEventCreate(&a));
  FLASHMSA_CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) body(i);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    FLASHMSA_CHECK_CUDA(cudaEventRecord(a));
    body(i);
    FLASHMSA_CHECK_CUDA(cudaEventRecord(b));
    FLASHMSA_CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    FLASHMSA_CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return summarize(std::move(t));
}

// An idle second: right after a sustained run (the ceilings' GEMMs) the clock is still down (a
// burst of 16384 x 9856 x 6144 read 1116 TFLOP/s there against 1366, fp8_clock_study.txt; the
// decode grid's first point, bf16 1 x 8K dql 1, read 23.2-23.6 us with a cv of 0.10-0.13 right
// after the ceilings against 19.1-19.8 when measured alone).
void let_clocks_recover() {
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
  std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Per-step times of several graph sets, each replayed round-robin (page sets rotated beyond the
// L2): `steps` replays back to back per timing (default: whole rotations of the set, at least 20
// replays and, after the first warm-up round has measured the step, at least kMinTimingSeconds:
// 20 replays of a 20 us step are a 0.4 ms timing, which one hiccup of the host or the clocks
// moves by 8%: seen as a cv of 0.08 at bf16 1 x 8K in one grid run and 0.003 in the next; 1: each
// replay alone, as time_it times the ceilings), the sets' timings interleaved (a set timed first
// would otherwise pay for clocks still rising: measured 3 us of a 20 us step), 3 warm-up rounds,
// median of 10.
std::vector<Stat> time_graph_sets(const std::vector<const std::vector<cudaGraphExec_t>*>& sets,
                                  cudaStream_t stream, int steps = 0) {
  constexpr double kMinTimingSeconds = 2e-3;
  cudaEvent_t a, z;
  FLASHMSA_CHECK_CUDA(cudaEventCreate(&a));
  FLASHMSA_CHECK_CUDA(cudaEventCreate(&z));
  std::vector<std::vector<double>> t(sets.size());
  std::vector<int> replays(sets.size());
  for (std::size_t k = 0; k < sets.size(); ++k) {
    const int size = static_cast<int>(sets[k]->size());
    replays[k] = steps ? steps : (std::max(size, 20) + size - 1) / size * size;
  }
  for (int rep = 0; rep < 13; ++rep) {
    for (std::size_t k = 0; k < sets.size(); ++k) {
      const std::vector<cudaGraphExec_t>& graphs = *sets[k];
      const int n = replays[k];
      FLASHMSA_CHECK_CUDA(cudaEventRecord(a, stream));
      for (int i = 0; i < n; ++i)
        FLASHMSA_CHECK_CUDA(cudaGraphLaunch(graphs[i % graphs.size()], stream));
      FLASHMSA_CHECK_CUDA(cudaEventRecord(z, stream));
      FLASHMSA_CHECK_CUDA(cudaEventSynchronize(z));
      float ms;
      FLASHMSA_CHECK_CUDA(cudaEventElapsedTime(&ms, a, z));
      const double per_step = ms * 1e-3 / n;
      if (rep >= 3) t[k].push_back(per_step);
      if (rep == 0 && !steps && n * per_step < kMinTimingSeconds) {
        const int size = static_cast<int>(graphs.size());
        const int rotations = static_cast<int>(std::ceil(kMinTimingSeconds / (per_step * size)));
        replays[k] = std::max(n, rotations * size);
      }
    }
  }
  cudaEventDestroy(a);
  cudaEventDestroy(z);
  std::vector<Stat> stats;
  for (auto& v : t) stats.push_back(summarize(std::move(v)));
  return stats;
}

Stat time_graphs(const std::vector<cudaGraphExec_t>& graphs, cudaStream_t stream, int steps = 0) {
  return time_graph_sets({&graphs}, stream, steps)[0];
}

// The work `body` enqueues on `stream`, captured as an instantiated graph.
cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void()>& body) {
  cudaGraph_t g;
  cudaGraphExec_t e;
  FLASHMSA_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body();
  FLASHMSA_CHECK_CUDA(cudaStreamEndCapture(stream, &g));
  FLASHMSA_CHECK_CUDA(cudaGraphInstantiate(&e, g, 0));
  cudaGraphDestroy(g);
  return e;
}

// Distinct valid ids of kv head h over rows [t0, t1) of top-k lists [4, rows, 16].
std::int64_t distinct_ids(const std::vector<std::int32_t>& topk, std::int64_t rows, std::int64_t h,
                          std::int64_t t0, std::int64_t t1) {
  std::vector<std::int32_t> u;
  for (std::int64_t i = (h * rows + t0) * 16; i < (h * rows + t1) * 16; ++i) {
    if (topk[i] >= 0) u.push_back(topk[i]);
  }
  std::sort(u.begin(), u.end());
  return std::unique(u.begin(), u.end()) - u.begin();
}

// How much neighbouring rows share their selections (what a query-stationary tile can reuse):
// distinct valid ids per kv head over aligned groups of 64, 8 and 4 consecutive rows of a request,
// averaged over the groups and heads. `requests` holds each request's row range.
struct Sharing {
  double per64 = 0, per8 = 0, per4 = 0;
  std::string text() const {  // as bench/report.py reads it back
    char out[96];
    std::snprintf(out, sizeof out, "%.1f pages/64 rows, %.1f/8, %.1f/4", per64, per8, per4);
    return out;
  }
};

Sharing sharing(const std::vector<std::int32_t>& topk, std::int64_t rows,
                const std::vector<std::pair<std::int64_t, std::int64_t>>& requests) {
  Sharing out;
  for (const auto& [group, result] : {std::pair{64, &out.per64}, {8, &out.per8}, {4, &out.per4}}) {
    double distinct = 0, groups = 0;
    for (std::int64_t h = 0; h < 4; ++h) {
      for (const auto& [begin, end] : requests) {
        for (std::int64_t t0 = begin; t0 < end; t0 += group, ++groups) {
          distinct += static_cast<double>(
              distinct_ids(topk, rows, h, t0, std::min<std::int64_t>(end, t0 + group)));
        }
      }
    }
    *result = groups > 0 ? distinct / groups : 0;
  }
  return out;
}

__global__ void fill_random_bf16(std::uint16_t* p, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    const float u = (static_cast<float>(h & 0xFFFFFF) + 0.5f) / 16777216.0f;  // (0, 1)
    const float x = (u - 0.5f) * 3.4641016f;  // uniform, unit variance
    const __nv_bfloat16 b = __float2bfloat16(x);
    p[i] = *reinterpret_cast<const std::uint16_t*>(&b);
  }
}

__global__ void read_stream(const uint4* p, std::int64_t n, unsigned* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) *sink = acc.x;  // keeps the loads
}

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceArray(std::size_t count) : n(count) {
    FLASHMSA_CHECK_CUDA(cudaMalloc(&ptr, std::max<std::size_t>(1, count) * sizeof(T)));
  }
  DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    FLASHMSA_CHECK_CUDA(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  // The allocation as a cache buffer (none when empty).
  CacheBuffer buffer() const {
    return {n ? static_cast<void*>(ptr) : nullptr, static_cast<std::int64_t>(n * sizeof(T))};
  }
};

void fill(std::uint16_t* p, std::size_t n, std::uint32_t seed) {
  fill_random_bf16<<<1024, 256>>>(p, static_cast<std::int64_t>(n), seed);
  FLASHMSA_CHECK_LAUNCH();
}

// Random cache bytes that decode to finite values: E4M3 codes of magnitude <= 8, NVFP4 codes
// (every nibble is valid) or E4M3 block scales in [0.25, 1).
enum class ByteFill { kE4m3, kNvfp4Codes, kE4m3Scales };

__global__ void fill_bytes_kernel(std::uint8_t* p, std::int64_t n, std::uint32_t seed,
                                  ByteFill kind) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    std::uint8_t b = static_cast<std::uint8_t>(h);
    if (kind == ByteFill::kE4m3) b = static_cast<std::uint8_t>((b & 0x80u) | ((h >> 8) % 0x50u));
    if (kind == ByteFill::kE4m3Scales) b = static_cast<std::uint8_t>(0x28u + (h >> 8) % 16u);
    p[i] = b;
  }
}

void fill_bytes(void* p, std::size_t n, std::uint32_t seed, ByteFill kind) {
  fill_bytes_kernel<<<1024, 256>>>(static_cast<std::uint8_t*>(p), static_cast<std::int64_t>(n),
                                   seed, kind);
  FLASHMSA_CHECK_LAUNCH();
}

struct Row {
  std::string name;
  double value, ceiling_fraction, cv, time_us;
  std::string unit;
};
std::vector<Row> g_rows;

void report(const std::string& name, double value, const std::string& unit, double fraction,
            const Stat& s) {
  g_rows.push_back({name, value, fraction, s.cv, s.median_s * 1e6, unit});
  std::printf("%-52s %10.1f %-8s %6.1f%% of ceiling  %9.1f us  cv %.3f\n", name.c_str(), value,
              unit.c_str(), fraction * 100, s.median_s * 1e6, s.cv);
  std::fflush(stdout);
}

double g_hbm_tbps = 0, g_gemm_tflops = 0, g_fp8_gemm_tflops = 0, g_fp8_gemm_sustained_tflops = 0;

// cuBLASLt E4M3 x E4M3 -> bf16 GEMM n^3 (the layout fp8 needs: A transposed, B not), fp32
// accumulation, unit scales: the fp8 tensor-core ceiling of the same run. Timed two ways: in
// bursts (each run alone, the GPU at its boost clock: the ceiling every fraction uses) and
// sustained as time_graphs times the projection (20 runs back to back per timing), where the
// H200's power limit lowers the clock (1227 against 1408 TFLOP/s at 8192^3, fp8_clock_study.txt),
// so a sustained rate over the burst ceiling mixes two clock states.
void fp8_gemm_ceiling(int n) {
  DeviceArray<std::uint8_t> a(std::size_t(n) * n), b(std::size_t(n) * n);
  DeviceArray<std::uint16_t> c(std::size_t(n) * n);
  DeviceArray<std::uint8_t> workspace(std::size_t{32} << 20);
  fill_bytes(a.ptr, a.n, 3, ByteFill::kE4m3);
  fill_bytes(b.ptr, b.n, 4, ByteFill::kE4m3);
  cublasLtHandle_t lt;
  BENCH_CHECK_CUBLAS(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t op;
  BENCH_CHECK_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transposed = CUBLAS_OP_T, plain = CUBLAS_OP_N;
  BENCH_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transposed,
                                                    sizeof transposed));
  BENCH_CHECK_CUBLAS(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof plain));
  cublasLtMatrixLayout_t la, lb, lc;
  BENCH_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n));
  BENCH_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n));
  BENCH_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n));
  cublasLtMatmulPreference_t pref;
  BENCH_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws_bytes = workspace.n;
  BENCH_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t algo{};
  int found = 0;
  BENCH_CHECK_CUBLAS(
      cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &algo, &found));
  if (found == 0) throw std::runtime_error("cuBLASLt has no fp8 GEMM algorithm here");
  const float one = 1, zero = 0;
  auto run = [&] {
    BENCH_CHECK_CUBLAS(cublasLtMatmul(lt, op, &one, a.ptr, la, b.ptr, lb, &zero, c.ptr, lc, c.ptr,
                                      lc, &algo.algo, workspace.ptr, ws_bytes, 0));
  };
  const Stat g = time_it([&](int) { run(); }, 10);
  constexpr int kBackToBack = 20;
  const Stat sustained = time_it(
      [&](int) {
        for (int i = 0; i < kBackToBack; ++i) run();
      },
      10);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  g_fp8_gemm_tflops = 2.0 * n * n * n / g.median_s / 1e12;
  report("ceiling: cuBLASLt fp8 E4M3 GEMM 8192^3", g_fp8_gemm_tflops, "TFLOP/s", 1.0, g);
  const Stat per_run{sustained.median_s / kBackToBack, sustained.cv};
  g_fp8_gemm_sustained_tflops = 2.0 * n * n * n / per_run.median_s / 1e12;
  report("cuBLASLt fp8 E4M3 GEMM 8192^3, sustained (20 back to back)", g_fp8_gemm_sustained_tflops,
         "TFLOP/s", g_fp8_gemm_sustained_tflops / g_fp8_gemm_tflops, per_run);
}

void ceilings() {
  const std::size_t bytes = std::size_t{4} << 30;
  DeviceArray<uint4> buf(bytes / 16);
  DeviceArray<unsigned> sink(1);
  FLASHMSA_CHECK_CUDA(cudaMemset(buf.ptr, 1, bytes));
  const Stat s =
      time_it([&](int) { read_stream<<<132 * 8, 512>>>(buf.ptr, bytes / 16, sink.ptr); }, 10);
  g_hbm_tbps = bytes / s.median_s / 1e12;
  report("ceiling: HBM read stream (4 GiB, 16-byte loads)", g_hbm_tbps, "TB/s", 1.0, s);

  const int n = 8192;
  DeviceArray<std::uint16_t> a(std::size_t(n) * n), b(std::size_t(n) * n), c(std::size_t(n) * n);
  fill(a.ptr, a.n, 1);
  fill(b.ptr, b.n, 2);
  cublasHandle_t h;
  BENCH_CHECK_CUBLAS(cublasCreate(&h));
  const float one = 1, zero = 0;
  const Stat g = time_it(
      [&](int) {
        BENCH_CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.ptr,
                                        CUDA_R_16BF, n, b.ptr, CUDA_R_16BF, n, &zero, c.ptr,
                                        CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      },
      10);
  cublasDestroy(h);
  g_gemm_tflops = 2.0 * n * n * n / g.median_s / 1e12;
  report("ceiling: cuBLAS bf16 GEMM 8192^3", g_gemm_tflops, "TFLOP/s", 1.0, g);
  fp8_gemm_ceiling(n);
}

Config m3() {
  Config c;  // MiniMax-M3 defaults: 64/4 heads, 4 index heads, d 128, block 128, top-16
  return c;
}

// A batch of `requests` requests of `len` tokens each in a pool of `pages` pages (each request's
// pages scattered over the pool); `rotation` selects one of several disjoint page sets.
struct IndexBatch {
  std::int64_t requests, len, dql, max_blocks, pages;
  DeviceArray<std::uint16_t> cache, query;
  DeviceArray<std::int32_t> block_table, seq_lens, cu_seqlens;
  DeviceArray<std::int32_t> topk;
  DeviceArray<std::uint8_t> workspace;

  IndexBatch(std::int64_t b, std::int64_t l, std::int64_t q_len, std::int64_t rotations)
      : requests(b),
        len(l),
        dql(q_len),
        max_blocks((l + 127) / 128),
        pages(b * max_blocks * rotations),
        cache(std::size_t(pages) * 128 * 128),
        query(std::size_t(b * q_len) * 4 * 128),
        block_table(table(b, max_blocks, rotations)),
        seq_lens(std::vector<std::int32_t>(std::size_t(b), static_cast<std::int32_t>(l))),
        cu_seqlens(cu(b, q_len)),
        topk(std::size_t(4 * b * q_len * 16)),
        workspace(std::size_t(index_workspace_bytes(m3(), b * q_len, b, max_blocks))) {
    fill(cache.ptr, cache.n, 11);
    fill(query.ptr, query.n, 12);
  }
  static std::vector<std::int32_t> table(std::int64_t b, std::int64_t w, std::int64_t rotations) {
    std::vector<std::int32_t> t(std::size_t(rotations * b * w));
    std::iota(t.begin(), t.end(), 0);
    std::reverse(t.begin(), t.end());  // scattered: request r's blocks are not its neighbours'
    return t;
  }
  static std::vector<std::int32_t> cu(std::int64_t b, std::int64_t q) {
    std::vector<std::int32_t> c(std::size_t(b + 1));
    for (std::int64_t i = 0; i <= b; ++i) c[i] = static_cast<std::int32_t>(i * q);
    return c;
  }
  IndexCacheView view() const {
    return IndexCacheView::make(DType::kBf16, pages, 128, cache.buffer(), flashmsa::Device::kCuda);
  }
  IndexOutputs outputs() const {
    IndexOutputs o;
    o.topk = TensorView::contiguous(static_cast<void*>(topk.ptr), DType::kInt32,
                                    {4, requests * dql, 16}, flashmsa::Device::kCuda);
    o.workspace = TensorView::contiguous(static_cast<void*>(workspace.ptr), DType::kUint8,
                                         {std::int64_t(workspace.n)}, flashmsa::Device::kCuda);
    return o;
  }
  TensorView q() const {
    return TensorView::contiguous(static_cast<void*>(query.ptr), DType::kBf16,
                                  {requests * dql, 4, 128}, flashmsa::Device::kCuda);
  }
  TensorView table_view(std::int64_t rotation) const {
    return TensorView::contiguous(
        static_cast<void*>(block_table.ptr + rotation * requests * max_blocks), DType::kInt32,
        {requests, max_blocks}, flashmsa::Device::kCuda);
  }
};

void decode_indexer(std::int64_t requests, std::int64_t len) {
  // Rotate page sets so the working set exceeds 2x the 60 MB L2.
  const std::int64_t bytes_per_step = requests * len * 256;
  const std::int64_t rotations = std::max<std::int64_t>(1, (150 << 20) / bytes_per_step + 1);
  IndexBatch b(requests, len, 1, rotations);
  const TensorView seq = TensorView::contiguous(static_cast<void*>(b.seq_lens.ptr), DType::kInt32,
                                                {requests}, flashmsa::Device::kCuda);
  cudaStream_t stream;
  FLASHMSA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<cudaGraphExec_t> graphs;
  for (std::int64_t r = 0; r < rotations; ++r) {
    graphs.push_back(capture_graph(stream, [&] {
      index_decode(m3(), b.q(), b.view(), DecodeBatch{seq, b.table_view(r), 1}, b.outputs(),
                   {.stream = stream});
    }));
  }
  const Stat s = time_graphs(graphs, stream);
  const double tbps = bytes_per_step / s.median_s / 1e12;
  report("indexer decode (score + top-k, graph), " + std::to_string(requests) + " x " +
             std::to_string(len / 1024) + "K",
         tbps, "TB/s", tbps / g_hbm_tbps, s);
  for (auto e : graphs) cudaGraphExecDestroy(e);
  cudaStreamDestroy(stream);
}

// ---- Attention ---------------------------------------------------------------------------

TensorView device_view(const void* p, DType dtype, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(const_cast<void*>(p), dtype, shape, flashmsa::Device::kCuda);
}

// Top-k lists [4, len, 16] of a single prefill request: each row's own block plus 15 earlier
// ones. i.i.d. random: every row draws its own; coherent: the 64 rows of an aligned tile share
// one draw, each entry replaced by a fresh random block with probability 1/8 (real models'
// neighbouring queries mostly agree).
std::vector<std::int32_t> prefill_selection(std::int64_t len, bool coherent, double* flops,
                                            Sharing* shared) {
  std::mt19937 rng(7);
  std::vector<std::int32_t> topk(std::size_t(4 * len * 16), -1);
  double keys = 0;
  for (int h = 0; h < 4; ++h) {
    std::vector<std::int32_t> base;
    for (std::int64_t t = 0; t < len; ++t) {
      const std::int64_t nvb = t / 128 + 1;
      std::int32_t* row = topk.data() + (h * len + t) * 16;
      std::vector<std::int32_t> chosen{static_cast<std::int32_t>(nvb - 1)};
      if (nvb <= 16) {
        chosen.clear();
        for (std::int64_t b = 0; b < nvb; ++b) chosen.push_back(static_cast<std::int32_t>(b));
      } else {
        if (t % 64 == 0 || !coherent) {
          base.clear();
          std::vector<std::int32_t> all(std::size_t(nvb - 1));
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), rng);
          base.assign(all.begin(), all.begin() + 15);
        }
        for (std::int32_t b : base) {
          std::int32_t pick = b;
          if (coherent && rng() % 8 == 0) pick = static_cast<std::int32_t>(rng() % (nvb - 1));
          if (std::find(chosen.begin(), chosen.end(), pick) == chosen.end()) chosen.push_back(pick);
        }
      }
      std::sort(chosen.begin(), chosen.end());
      std::copy(chosen.begin(), chosen.end(), row);
      for (std::int32_t b : chosen) keys += std::min<std::int64_t>(128, t - b * 128 + 1);
    }
  }
  *flops = 4.0 * 128 * 16 * keys;  // 16 q heads per kv head, 4 * D FLOPs per (head, key)
  *shared = sharing(topk, len, {{0, len}});
  return topk;
}

// One prefill request of `len` tokens: its cache, queries, outputs and workspace.
struct PrefillAttention {
  std::int64_t len, pages;
  DeviceArray<std::uint16_t> kv, q, out;
  DeviceArray<std::int32_t> table, seq_lens, cu;
  DeviceArray<std::uint8_t> workspace;
  explicit PrefillAttention(std::int64_t l)
      : len(l),
        pages((l + 127) / 128),
        kv(std::size_t(pages) * 4 * 128 * 256),
        q(std::size_t(l) * 64 * 128),
        out(std::size_t(l) * 64 * 128),
        table(IndexBatch::table(1, pages, 1)),
        seq_lens(std::vector<std::int32_t>{static_cast<std::int32_t>(l)}),
        cu(std::vector<std::int32_t>{0, static_cast<std::int32_t>(l)}),
        workspace(std::size_t(attention_workspace_bytes(m3(), l, 1))) {
    fill(kv.ptr, kv.n, 21);
    fill(q.ptr, q.n, 22);
  }
  KvCacheView cache() const {
    return KvCacheView::make(KvLayout::kPacked, DType::kBf16, {pages, 4, 128, 128}, kv.buffer(), {},
                             flashmsa::Device::kCuda);
  }
  PrefillBatch batch() const {
    return {device_view(cu.ptr, DType::kInt32, {2}), device_view(seq_lens.ptr, DType::kInt32, {1}),
            device_view(table.ptr, DType::kInt32, {1, pages})};
  }
  AttentionOutputs outputs() const {
    AttentionOutputs o{device_view(out.ptr, DType::kBf16, {len, 64, 128})};
    o.workspace = device_view(workspace.ptr, DType::kUint8, {std::int64_t(workspace.n)});
    return o;
  }
  TensorView query() const { return device_view(q.ptr, DType::kBf16, {len, 64, 128}); }
};

void prefill_attention(std::int64_t len, bool coherent) {
  PrefillAttention a(len);
  double flops = 0;
  Sharing shared;
  const DeviceArray<std::int32_t> topk(prefill_selection(len, coherent, &flops, &shared));
  const TensorView tk = device_view(topk.ptr, DType::kInt32, {4, len, 16});
  const Stat s = time_it(
      [&](int) {
        sparse_attention_prefill(m3(), a.query(), a.cache(), a.batch(), tk, a.outputs());
      },
      5);
  const double tflops = flops / s.median_s / 1e12;
  char name[160];
  std::snprintf(name, sizeof name, "sparse attention prefill, 1 x %lldK, %s (%s)",
                static_cast<long long>(len / 1024), coherent ? "coherent" : "random",
                shared.text().c_str());
  report(name, tflops, "TFLOP/s", tflops / g_gemm_tflops, s);
}

void dense_prefill_attention(std::int64_t len) {
  PrefillAttention a(len);
  const Stat s =
      time_it([&](int) { dense_attention(m3(), a.query(), a.cache(), a.batch(), a.outputs()); }, 3);
  const double flops = 4.0 * 128 * 64 * (double(len) * (len + 1) / 2);
  const double tflops = flops / s.median_s / 1e12;
  report("dense causal attention (ours), 1 x " + std::to_string(len / 1024) + "K", tflops,
         "TFLOP/s", tflops / g_gemm_tflops, s);
}

// ---- Cache dtypes, the decode grid and end-to-end prefill -------------------------

struct CacheKind {
  const char* name;
  DType kv, index;
};
constexpr CacheKind kCacheKinds[] = {{"bf16", DType::kBf16, DType::kBf16},
                                     {"fp8", DType::kFp8E4m3, DType::kFp8E4m3},
                                     {"nvfp4", DType::kNvfp4, DType::kNvfp4}};

Config config_for(const CacheKind& kind) {
  Config c = m3();
  c.kv_cache_dtype = kind.kv;
  c.set_index_cache_dtype(kind.index);
  return c;
}

// Bytes of one token's K and V rows of one kv head, and of one token's index key.
std::int64_t kv_token_bytes(DType d) {
  return d == DType::kBf16 ? 512 : d == DType::kNvfp4 ? 2 * (64 + 8) : 256;
}
std::int64_t index_token_bytes(DType d) {
  return d == DType::kBf16 ? 256 : d == DType::kNvfp4 ? 64 + 8 : 128;
}

void fill_plane(void* p, std::size_t bytes, DType d, std::uint32_t seed, bool scales) {
  if (scales) {
    fill_bytes(p, bytes, seed, ByteFill::kE4m3Scales);
  } else if (d == DType::kBf16) {
    fill(static_cast<std::uint16_t*>(p), bytes / 2, seed);
  } else {
    fill_bytes(p, bytes, seed, d == DType::kNvfp4 ? ByteFill::kNvfp4Codes : ByteFill::kE4m3);
  }
}

// A main cache and an index cache of `pages` pages in `kind`'s dtypes, filled.
struct Caches {
  KvCacheShape shape;
  DeviceArray<std::uint8_t> kv, kv_scales, index, index_scales;
  KvCacheView kv_view;
  IndexCacheView index_view;
  Caches(const CacheKind& kind, std::int64_t pages)
      : shape{pages, 4, 128, 128},
        kv(std::size_t(KvCacheView::buffer_bytes(KvLayout::kPacked, kind.kv, shape))),
        kv_scales(kind.kv == DType::kNvfp4 ? std::size_t(KvCacheView::buffer_bytes(
                                                 KvLayout::kPacked, kind.kv, shape, true))
                                           : 0),
        index(std::size_t(IndexCacheView::buffer_bytes(kind.index, pages, 128))),
        index_scales(kind.index == DType::kNvfp4
                         ? std::size_t(IndexCacheView::buffer_bytes(kind.index, pages, 128, true))
                         : 0) {
    fill_plane(kv.ptr, kv.n, kind.kv, 41, false);
    fill_plane(index.ptr, index.n, kind.index, 42, false);
    if (kv_scales.n) fill_plane(kv_scales.ptr, kv_scales.n, kind.kv, 43, true);
    if (index_scales.n) fill_plane(index_scales.ptr, index_scales.n, kind.index, 44, true);
    kv_view = KvCacheView::make(KvLayout::kPacked, kind.kv, shape, kv.buffer(), {},
                                flashmsa::Device::kCuda, kv_scales.buffer());
    index_view = IndexCacheView::make(kind.index, pages, 128, index.buffer(),
                                      flashmsa::Device::kCuda, index_scales.buffer());
  }
};

// The prefill indexer (score + top-k) of one request: `rows` query rows after a prefix of
// `prefix` tokens, in `kind`'s index cache (E4M3 queries for the fp8 indexer), scattered pages.
// FLOPs: 2 x 4 index heads x 128 per (row, visible key). The headline keys read these by name.
std::map<std::string, double> g_prefill_indexer;  // "bf16 32K" etc.: TFLOP/s; "...ms": time

void prefill_indexer(const CacheKind& kind, std::int64_t prefix, std::int64_t rows) {
  const Config c = config_for(kind);
  const std::int64_t len = prefix + rows, max_blocks = (len + 127) / 128;
  Caches caches(kind, max_blocks);
  const DeviceArray<std::int32_t> table(IndexBatch::table(1, max_blocks, 1));
  const DeviceArray<std::int32_t> seq(std::vector<std::int32_t>{static_cast<std::int32_t>(len)});
  const DeviceArray<std::int32_t> cu(std::vector<std::int32_t>{0, static_cast<std::int32_t>(rows)});
  const bool fp8_index = c.indexer_kv_dtype == "fp8";
  DeviceArray<std::uint16_t> iq(std::size_t(rows) * 4 * 128);
  if (fp8_index) {
    fill_bytes(iq.ptr, std::size_t(rows) * 4 * 128, 52, ByteFill::kE4m3);
  } else {
    fill(iq.ptr, iq.n, 52);
  }
  DeviceArray<std::int32_t> topk(std::size_t(4 * rows * 16));
  DeviceArray<std::uint8_t> workspace(std::size_t(index_workspace_bytes(c, rows, 1, max_blocks)));
  const auto dev = flashmsa::Device::kCuda;
  const TensorView q = TensorView::contiguous(
      static_cast<void*>(iq.ptr), fp8_index ? DType::kFp8E4m3 : DType::kBf16, {rows, 4, 128}, dev);
  const PrefillBatch batch{
      TensorView::contiguous(static_cast<void*>(cu.ptr), DType::kInt32, {2}, dev),
      TensorView::contiguous(static_cast<void*>(seq.ptr), DType::kInt32, {1}, dev),
      TensorView::contiguous(static_cast<void*>(table.ptr), DType::kInt32, {1, max_blocks}, dev)};
  IndexOutputs out;
  out.topk =
      TensorView::contiguous(static_cast<void*>(topk.ptr), DType::kInt32, {4, rows, 16}, dev);
  out.workspace = TensorView::contiguous(static_cast<void*>(workspace.ptr), DType::kUint8,
                                         {std::int64_t(workspace.n)}, dev);
  cudaStream_t stream;
  FLASHMSA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The call and the scoring alone (block scores into the workspace, no top-k: the selection's
  // share), each a graph replayed back to back, interleaved: the GPU's time, as an engine that
  // captures or queues its calls sees it. Then one eager call at a time, which adds the host's
  // launch work (the GPU idles until the first kernel is enqueued).
  const std::vector<cudaGraphExec_t> call{capture_graph(
      stream, [&] { index_prefill(c, q, caches.index_view, batch, out, {.stream = stream}); })};
  const std::vector<cudaGraphExec_t> scoring{capture_graph(stream, [&] {
    flashmsa::cuda::index_prefill_phases(c, q, caches.index_view, batch, out, stream, false);
  })};
  const std::vector<Stat> graph_times = time_graph_sets({&call, &scoring}, stream);
  const Stat st = graph_times[0], score = graph_times[1];
  const Stat eager = time_it([&](int) { index_prefill(c, q, caches.index_view, batch, out); }, 10);
  for (auto e : {call[0], scoring[0]}) cudaGraphExecDestroy(e);
  cudaStreamDestroy(stream);
  const double flops = 2.0 * 128 * 4 * (double(rows) * prefix + double(rows) * (rows + 1) / 2);
  const double tflops = flops / st.median_s / 1e12;
  const double ceiling = fp8_index ? g_fp8_gemm_tflops : g_gemm_tflops;
  std::string shape = std::to_string(rows / 1024) + "K";
  if (prefix > 0) shape += " after " + std::to_string(prefix / 1024) + "K";
  report(std::string("indexer prefill (score + top-k, graph) ") + kind.name + ", 1 x " + shape,
         tflops, "TFLOP/s", tflops / ceiling, st);
  const double score_tflops = flops / score.median_s / 1e12;
  report(std::string("indexer prefill scoring alone (graph) ") + kind.name + ", 1 x " + shape,
         score_tflops, "TFLOP/s", score_tflops / ceiling, score);
  const Stat selection{st.median_s - score.median_s, st.cv};
  report(std::string("indexer prefill top-k (score + top-k - scoring) ") + kind.name + ", 1 x " +
             shape,
         selection.median_s * 1e6, "us", selection.median_s / st.median_s, selection);
  const double eager_tflops = flops / eager.median_s / 1e12;
  report(std::string("indexer prefill (score + top-k, one eager call) ") + kind.name + ", 1 x " +
             shape,
         eager_tflops, "TFLOP/s", eager_tflops / ceiling, eager);
  g_prefill_indexer[std::string(kind.name) + " " + shape] = tflops;
  g_prefill_indexer[std::string(kind.name) + " " + shape + " ms"] = st.median_s * 1e3;
}

// Index queries [rows, 4, 128]: bf16, or E4M3 for the fp8 indexer. Coherent: the rows of each
// aligned 64-row tile share most of their query (a tile draw plus a quarter-weight row draw), as
// neighbouring tokens' index queries do in real models; else i.i.d.
__global__ void index_queries_bf16(std::uint16_t* p, std::int64_t rows, bool coherent) {
  const std::int64_t n = rows * 4 * 128;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    auto draw = [](std::uint64_t key) {
      std::uint32_t h = static_cast<std::uint32_t>(key * 0x9E3779B97F4A7C15ull >> 32);
      h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
      return ((static_cast<float>(h & 0xFFFFFF) + 0.5f) / 16777216.0f - 0.5f) * 3.4641016f;
    };
    const std::int64_t row = i / 512, rest = i % 512;
    float x = draw(static_cast<std::uint64_t>(i) + 7);
    if (coherent) x = draw((static_cast<std::uint64_t>(row / 64) << 20) + rest + 99) + 0.25f * x;
    const __nv_bfloat16 b = __float2bfloat16(x);
    p[i] = *reinterpret_cast<const std::uint16_t*>(&b);
  }
}

// Per-step time of the decode step (graph) and of its two halves, for `requests` x `len` with
// `dql` query rows per request in `kind`'s caches; the bytes are those that must be read. The
// step is the one call sparse_decode_step (the attention selects where it can); two_calls is the
// same step as index_decode then sparse_attention_decode.
struct DecodeTimes {
  Stat step, two_calls, indexer, score, attention;
  std::int64_t step_bytes = 0, attention_bytes = 0;
};

// Set by decode_phases: called with the first step graph once the step has been timed (label
// "step: "), and with the two calls' (label "two calls: ").
std::function<void(cudaGraphExec_t, cudaStream_t, const std::string&)> g_step_study;

DecodeTimes run_decode(const CacheKind& kind, std::int64_t requests, std::int64_t len, int dql) {
  const Config c = config_for(kind);
  const std::int64_t max_blocks = (len + 127) / 128, rows = requests * dql;
  const std::int64_t index_bytes = requests * len * index_token_bytes(kind.index);
  const std::int64_t guess = index_bytes + requests * 4 * 16 * 128 * kv_token_bytes(kind.kv);
  const std::int64_t rotations = std::max<std::int64_t>(1, (150 << 20) / guess + 1);
  const std::int64_t pages = requests * max_blocks * rotations;
  Caches caches(kind, pages);
  const DeviceArray<std::int32_t> table(IndexBatch::table(requests, max_blocks, rotations));
  const DeviceArray<std::int32_t> lens(
      std::vector<std::int32_t>(std::size_t(requests), static_cast<std::int32_t>(len)));
  DeviceArray<std::uint16_t> q(std::size_t(rows) * 64 * 128), out(std::size_t(rows) * 64 * 128),
      iq(std::size_t(rows) * 4 * 128);
  fill(q.ptr, q.n, 51);
  const bool fp8_index = c.indexer_kv_dtype == "fp8";
  if (fp8_index) {
    fill_bytes(iq.ptr, std::size_t(rows) * 4 * 128, 52, ByteFill::kE4m3);
  } else {
    fill(iq.ptr, iq.n, 52);
  }
  DeviceArray<std::int32_t> topk(std::size_t(4 * rows * 16));
  DeviceArray<std::uint8_t> ws(std::size_t(decode_workspace_bytes(c, requests, dql, max_blocks)));
  const TensorView wsv = device_view(ws.ptr, DType::kUint8, {std::int64_t(ws.n)});
  const TensorView qv = device_view(q.ptr, DType::kBf16, {rows, 64, 128});
  const TensorView iqv =
      device_view(iq.ptr, fp8_index ? DType::kFp8E4m3 : DType::kBf16, {rows, 4, 128});
  const TensorView tk = device_view(topk.ptr, DType::kInt32, {4, rows, 16});
  const TensorView seq = device_view(lens.ptr, DType::kInt32, {requests});
  IndexOutputs io{tk};
  io.workspace = wsv;
  AttentionOutputs ao{device_view(out.ptr, DType::kBf16, {rows, 64, 128})};
  ao.workspace = wsv;
  cudaStream_t stream;
  FLASHMSA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // step (one call), indexer, attention, indexer scoring only, step as two calls
  std::vector<cudaGraphExec_t> graphs[5];
  for (std::int64_t r = 0; r < rotations; ++r) {
    const DecodeBatch batch{
        seq,
        device_view(table.ptr + r * requests * max_blocks, DType::kInt32, {requests, max_blocks}),
        dql};
    for (int part = 0; part < 5; ++part) {
      graphs[part].push_back(capture_graph(stream, [&] {
        if (part == 0) {
          sparse_decode_step(c, iqv, caches.index_view, qv, caches.kv_view, batch, io, ao,
                             {.stream = stream});
        }
        if (part == 4 || part == 1) {
          index_decode(c, iqv, caches.index_view, batch, io, {.stream = stream});
        }
        if (part == 4 || part == 2) {
          sparse_attention_decode(c, qv, caches.kv_view, batch, tk, ao, {.stream = stream});
        }
        if (part == 3) {
          flashmsa::cuda::index_decode_phases(c, iqv, caches.index_view, batch, io, stream, false);
        }
      }));
    }
  }
  DecodeTimes t;
  // The two forms of the step interleaved; both leave valid top-k lists for the attention alone.
  const std::vector<Stat> steps = time_graph_sets({&graphs[0], &graphs[4]}, stream);
  t.step = steps[0];
  t.two_calls = steps[1];
  if (g_step_study) {
    g_step_study(graphs[0][0], stream, "step: ");
    g_step_study(graphs[4][0], stream, "two calls: ");
  }
  t.indexer = time_graphs(graphs[1], stream);
  t.attention = time_graphs(graphs[2], stream);
  t.score = time_graphs(graphs[3], stream);
  // The one call must leave what the two calls leave, bit for bit (same selection, same union
  // order).
  {
    std::vector<std::uint16_t> out_two(out.n), out_one(out.n);
    std::vector<std::int32_t> ids_two(topk.n), ids_one(topk.n);
    for (int part : {4, 0}) {
      FLASHMSA_CHECK_CUDA(cudaMemsetAsync(out.ptr, 0xA5, out.n * 2, stream));
      FLASHMSA_CHECK_CUDA(cudaMemsetAsync(topk.ptr, 0xA5, topk.n * 4, stream));
      FLASHMSA_CHECK_CUDA(cudaGraphLaunch(graphs[part][0], stream));
      FLASHMSA_CHECK_CUDA(cudaStreamSynchronize(stream));
      FLASHMSA_CHECK_CUDA(cudaMemcpy((part ? out_two : out_one).data(), out.ptr, out.n * 2,
                                     cudaMemcpyDeviceToHost));
      FLASHMSA_CHECK_CUDA(cudaMemcpy((part ? ids_two : ids_one).data(), topk.ptr, topk.n * 4,
                                     cudaMemcpyDeviceToHost));
    }
    if (out_one != out_two || ids_one != ids_two) {
      throw std::runtime_error("decode " + std::string(kind.name) + " " + std::to_string(requests) +
                               "x" + std::to_string(len) +
                               ": sparse_decode_step's outputs differ from the two calls'");
    }
  }
  std::vector<std::int32_t> ids(std::size_t(4 * rows * 16));
  FLASHMSA_CHECK_CUDA(cudaMemcpy(ids.data(), topk.ptr, ids.size() * 4, cudaMemcpyDeviceToHost));
  std::int64_t distinct = 0;  // each (request, kv head)'s pages, its rows' selections merged
  for (std::int64_t h = 0; h < 4; ++h) {
    for (std::int64_t r = 0; r < requests; ++r)
      distinct += distinct_ids(ids, rows, h, r * dql, (r + 1) * dql);
  }
  const std::int64_t q_bytes = rows * 64 * 128 * 2;
  t.attention_bytes = distinct * 128 * kv_token_bytes(kind.kv) + q_bytes;
  t.step_bytes = index_bytes + t.attention_bytes + rows * 4 * 128 * (fp8_index ? 1 : 2);
  for (auto& list : graphs) {
    for (auto e : list) cudaGraphExecDestroy(e);
  }
  cudaStreamDestroy(stream);
  return t;
}

double index_bytes(const CacheKind& kind, std::int64_t requests, std::int64_t len) {
  return static_cast<double>(requests * len * index_token_bytes(kind.index));
}

// The decode step (indexer + top-k + attention) and its attention alone, bf16 caches.
void decode_step(std::int64_t requests, std::int64_t len, int dql) {
  const DecodeTimes t = run_decode(kCacheKinds[0], requests, len, dql);
  const std::string shape = std::to_string(requests) + " x " + std::to_string(len / 1024) + "K" +
                            (dql > 1 ? ", dql " + std::to_string(dql) : "");
  const double step = t.step_bytes / t.step.median_s / 1e12;
  report("decode step (indexer + top-k + attention, graph), " + shape, step, "TB/s",
         step / g_hbm_tbps, t.step);
  const double attention = t.attention_bytes / t.attention.median_s / 1e12;
  report("decode sparse attention alone (graph), " + shape, attention, "TB/s",
         attention / g_hbm_tbps, t.attention);
}

void decode_phases(const CacheKind& kind, std::int64_t requests, std::int64_t len) {
  using flashmsa::cuda::kPhaseSlots;
  using flashmsa::cuda::PhaseKernel;
  constexpr std::int64_t kCtas = 1 << 14;
  struct Kernel {
    PhaseKernel id;
    const char* name;
    std::vector<const char*> phases;  // what ends at each stamp after the first
  };
  const Kernel kernels[] = {
      {PhaseKernel::kIndexScore, "index scoring", {"first page landed", "pages scored"}},
      {PhaseKernel::kIndexTopk, "top-k", {"selection"}},
      {PhaseKernel::kAttention,
       "attention",
       {"union built", "queries + first page landed", "pages attended",
        "epilogue (with splits: to shared memory, cluster barrier)",
        "split merge through distributed shared memory + stores"}}};
  let_clocks_recover();  // as before the decode grid (the first case follows the ceilings)
  std::vector<std::unique_ptr<DeviceArray<unsigned long long>>> stamps;
  for (const Kernel& k : kernels) {
    stamps.push_back(
        std::make_unique<DeviceArray<unsigned long long>>(std::size_t(kCtas * 2 * kPhaseSlots)));
    flashmsa::cuda::phase_clock(k.id) = {stamps.back()->ptr, kCtas};
  }
  int clock_khz = 0;
  FLASHMSA_CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  // metric name -> one value per sample (us)
  std::vector<std::pair<std::string, std::vector<double>>> metrics;
  auto add = [&](const std::string& name, double us) {
    for (auto& [n, v] : metrics) {
      if (n == name) return v.push_back(us);
    }
    metrics.push_back({name, {us}});
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  g_step_study = [&](cudaGraphExec_t step, cudaStream_t stream, const std::string& label) {
    for (int warm = 0; warm < 10; ++warm) FLASHMSA_CHECK_CUDA(cudaGraphLaunch(step, stream));
    for (int sample = 0; sample < 15; ++sample) {
      for (auto& b : stamps)
        FLASHMSA_CHECK_CUDA(cudaMemsetAsync(b->ptr, 0, b->n * sizeof(unsigned long long), stream));
      FLASHMSA_CHECK_CUDA(cudaGraphLaunch(step, stream));
      FLASHMSA_CHECK_CUDA(cudaStreamSynchronize(stream));
      std::vector<std::vector<unsigned long long>> host;
      for (auto& b : stamps) {
        host.emplace_back(b->n);
        FLASHMSA_CHECK_CUDA(
            cudaMemcpy(host.back().data(), b->ptr, b->n * 8, cudaMemcpyDeviceToHost));
      }
      unsigned long long t0 = ~0ull;
      for (std::int64_t c = 0; c < kCtas; ++c) {
        if (host[0][c * 2 * kPhaseSlots]) t0 = std::min(t0, host[0][c * 2 * kPhaseSlots]);
      }
      // FLASHMSA_PHASE_DUMP=FILE: the last sample's stamps, a line a CTA (for studies beyond the
      // summary below: which CTAs and SMs end early).
      if (const char* dump = std::getenv("FLASHMSA_PHASE_DUMP"); dump && sample == 14) {
        std::FILE* f = std::fopen(dump, "a");
        for (std::size_t k = 0; f && k < std::size(kernels); ++k) {
          for (std::int64_t c = 0; c < kCtas; ++c) {
            const unsigned long long* row = host[k].data() + c * 2 * kPhaseSlots;
            if (row[0] == 0) continue;
            std::fprintf(f, "%s%s,%lld,%llu", label.c_str(), kernels[k].name,
                         static_cast<long long>(c), row[flashmsa::cuda::kSmSlot] - 1);
            for (int ph = 0; ph + 1 < kPhaseSlots; ++ph)
              std::fprintf(f, ",%.3f", row[ph] ? double(row[ph] - t0) * 1e-3 : -1.0);
            std::fprintf(f, "\n");
          }
        }
        if (f) std::fclose(f);
      }
      for (std::size_t k = 0; k < std::size(kernels); ++k) {
        const int last = static_cast<int>(kernels[k].phases.size());
        unsigned long long first_start = ~0ull, last_end = 0;
        std::vector<std::vector<double>> phase_us(last + 1);
        std::vector<double> starts, ends;  // each CTA's start and end, from t0 (us)
        // Each CTA's end and phase lengths (globaltimer, us), by the SM it ran on (%smid + 1).
        struct CtaTimes {
          double end;
          std::vector<double> phases;
        };
        std::map<unsigned long long, std::vector<CtaTimes>> by_sm;
        for (std::int64_t c = 0; c < kCtas; ++c) {
          const unsigned long long* row = host[k].data() + c * 2 * kPhaseSlots;
          if (row[0] == 0) continue;
          first_start = std::min(first_start, row[0]);
          starts.push_back(double(row[0] - t0) * 1e-3);
          for (int ph = last; ph > 0; --ph) {  // the CTA's last recorded phase
            if (row[ph]) {
              last_end = std::max(last_end, row[ph]);
              ends.push_back(double(row[ph] - t0) * 1e-3);
              CtaTimes t{ends.back(), std::vector<double>(last + 1, 0.0)};
              for (int q = 1, prev = 0; q <= ph; ++q) {
                if (row[q] == 0) continue;
                t.phases[q] = double(row[q] - row[prev]) * 1e-3;
                prev = q;
              }
              by_sm[row[flashmsa::cuda::kSmSlot]].push_back(std::move(t));
              break;
            }
          }
          for (int ph = 1; ph <= last; ++ph) {  // cycles since the previous recorded phase
            int prev = ph - 1;
            while (prev > 0 && row[prev] == 0) --prev;
            const unsigned long long* cyc = row + kPhaseSlots;
            if (row[ph] && cyc[ph] >= cyc[prev])
              phase_us[ph].push_back(double(cyc[ph] - cyc[prev]) / clock_khz * 1e3);
          }
        }
        if (first_start == ~0ull) continue;  // not launched
        const std::string name = label + kernels[k].name;
        add(name + ": first CTA starts", double(first_start - t0) * 1e-3);
        add(name + ": last CTA ends", double(last_end - t0) * 1e-3);
        // The spread of the CTAs' starts and ends: a one-wave grid lasts as long as its slowest
        // CTA.
        auto percentile = [](std::vector<double>& v, int pct) {
          std::sort(v.begin(), v.end());
          return v[std::min(v.size() - 1, v.size() * pct / 100)];
        };
        add(name + ": CTA starts, 90th percentile", percentile(starts, 90));
        for (const int pct : {10, 50, 90}) {
          if (!ends.empty())  // none when no CTA recorded a phase after its start
            add(name + ": CTA ends, " + std::to_string(pct) + "th percentile",
                percentile(ends, pct));
        }
        // Whose spread it is: the SMs' (their CTAs end together, the SMs apart) or the work's
        // (CTAs of one SM end apart), and in which phase the SM's last CTA loses to its first.
        std::vector<double> sm_mean, within;
        std::vector<std::vector<double>> within_phase(last + 1);
        for (auto& [sm, v] : by_sm) {
          double sum = 0;
          for (const CtaTimes& t : v) sum += t.end;
          sm_mean.push_back(sum / v.size());
          if (v.size() < 2) continue;
          const auto [first, latest] = std::minmax_element(
              v.begin(), v.end(),
              [](const CtaTimes& a, const CtaTimes& b) { return a.end < b.end; });
          within.push_back(latest->end - first->end);
          for (int ph = 1; ph <= last; ++ph)
            within_phase[ph].push_back(latest->phases[ph] - first->phases[ph]);
        }
        if (!sm_mean.empty())
          add(name + ": SMs' mean CTA end, 90th - 10th percentile",
              percentile(sm_mean, 90) - percentile(sm_mean, 10));
        if (!within.empty()) {
          add(name + ": CTA ends within an SM, latest - earliest (median over SMs)",
              median(within));
          for (int ph = 1; ph <= last; ++ph)
            add(name + ": within an SM, latest - earliest CTA, " + kernels[k].phases[ph - 1],
                median(within_phase[ph]));
        }
        for (int ph = 1; ph <= last; ++ph) {
          if (!phase_us[ph].empty())
            add(name + ": per CTA, " + kernels[k].phases[ph - 1], median(phase_us[ph]));
        }
      }
    }
  };
  const DecodeTimes t = run_decode(kind, requests, len, 1);
  g_step_study = nullptr;
  for (const Kernel& k : kernels) flashmsa::cuda::phase_clock(k.id) = {};
  const std::string shape = std::string("decode phases ") + kind.name + " " +
                            std::to_string(requests) + "x" + std::to_string(len / 1024) + "K: ";
  report(shape + "step (graph, events)", t.step.median_s * 1e6, "us", 1.0, t.step);
  report(shape + "step as two calls (graph, events)", t.two_calls.median_s * 1e6, "us",
         t.two_calls.median_s / t.step.median_s, t.two_calls);
  for (const auto& [name, v] : metrics) {
    const double us = median(v);
    report(shape + name, us, "us", us / (t.step.median_s * 1e6), Stat{us * 1e-6, 0.0});
  }
}

// The decode grid: batch x context x query length x cache dtype, skipping what does not fit.
// The top-k row's "fraction" is its share of the step time.
// --quick-grid: the corners a no-regression check needs (1 and 64 requests, 8K and 32K, dql 1
// and 4, every cache kind) instead of the whole grid.
bool g_quick_grid = false;
// --grid-point (repeatable): the decode-grid points to run (none given: the whole grid).
struct GridPoint {
  std::string kind;
  std::int64_t batch = 0, len = 0;
  int dql = 0;
};
std::vector<GridPoint> g_grid_points;

// Every measured decode-grid step, for the headline decode floors (write_json).
struct DecodePoint {
  std::string kind;
  std::int64_t batch = 0, len = 0;
  int dql = 0;
  double step_us = 0, bytes = 0;
};
std::vector<DecodePoint> g_decode_points;

void decode_grid() {
  let_clocks_recover();  // the grid runs after the ceilings' GEMMs
  const std::vector<std::int64_t> batches = g_quick_grid
                                                ? std::vector<std::int64_t>{1, 64}
                                                : std::vector<std::int64_t>{1, 8, 32, 64, 128};
  const std::vector<std::int64_t> lens =
      g_quick_grid ? std::vector<std::int64_t>{8192, 32768}
                   : std::vector<std::int64_t>{8192, 32768, 131072, 524288};
  for (const CacheKind& kind : kCacheKinds) {
    for (std::int64_t b : batches) {
      for (std::int64_t len : lens) {
        const std::int64_t token_bytes =
            4 * kv_token_bytes(kind.kv) + index_token_bytes(kind.index);
        if (b * len * token_bytes > (std::int64_t{90} << 30)) continue;  // beyond the H200's HBM
        for (int dql : {1, 4}) {
          const auto chosen = [&](const GridPoint& g) {
            return g.kind == kind.name && g.batch == b && g.len == len && g.dql == dql;
          };
          if (!g_grid_points.empty() &&
              std::none_of(g_grid_points.begin(), g_grid_points.end(), chosen)) {
            continue;
          }
          const DecodeTimes t = run_decode(kind, b, len, dql);
          g_decode_points.push_back(
              {kind.name, b, len, dql, t.step.median_s * 1e6, static_cast<double>(t.step_bytes)});
          char name[160];
          std::snprintf(name, sizeof name, "decode grid %s %lldx%lldK dql%d", kind.name,
                        static_cast<long long>(b), static_cast<long long>(len / 1024), dql);
          const double step = t.step_bytes / t.step.median_s / 1e12;
          report(std::string(name) + ": step", step, "TB/s", step / g_hbm_tbps, t.step);
          report(std::string(name) + ": indexer (score + top-k)",
                 (t.step_bytes - t.attention_bytes) / t.indexer.median_s / 1e12, "TB/s",
                 (t.step_bytes - t.attention_bytes) / t.indexer.median_s / 1e12 / g_hbm_tbps,
                 t.indexer);
          report(std::string(name) + ": indexer scoring",
                 index_bytes(kind, b, len) / t.score.median_s / 1e12, "TB/s",
                 index_bytes(kind, b, len) / t.score.median_s / 1e12 / g_hbm_tbps, t.score);
          // Top-k: the indexer's time less its scoring; as a share of the step.
          const Stat topk{t.indexer.median_s - t.score.median_s, t.indexer.cv};
          report(std::string(name) + ": top-k (indexer - scoring)", topk.median_s * 1e6, "us",
                 topk.median_s / t.step.median_s, topk);
          report(std::string(name) + ": attention", t.attention_bytes / t.attention.median_s / 1e12,
                 "TB/s", t.attention_bytes / t.attention.median_s / 1e12 / g_hbm_tbps, t.attention);
          const double two = t.step_bytes / t.two_calls.median_s / 1e12;
          report(std::string(name) + ": step as two calls (index_decode + sparse_attention_decode)",
                 two, "TB/s", two / g_hbm_tbps, t.two_calls);
        }
      }
    }
  }
}

// One prefill call end to end (indexer + top-k, then sparse attention) over requests of
// (prefix, query) tokens, bf16 caches; index queries coherent or i.i.d. With dense_reps > 0 also
// our dense causal attention over the same batch (the baseline that needs no indexer).
struct PrefillResult {
  Stat indexer, attention, dense;
  double indexer_flops = 0, attention_flops = 0, dense_flops = 0;
  Sharing shared;
};

PrefillResult run_prefill(const std::vector<std::int64_t>& prefix,
                          const std::vector<std::int64_t>& query, bool coherent, int reps,
                          int dense_reps = 0) {
  const Config c = m3();
  const std::int64_t B = static_cast<std::int64_t>(query.size());
  std::int64_t rows = 0, max_blocks = 1, pages = 0;
  std::vector<std::int32_t> cu{0}, lens;
  for (std::int64_t r = 0; r < B; ++r) {
    rows += query[r];
    cu.push_back(static_cast<std::int32_t>(rows));
    lens.push_back(static_cast<std::int32_t>(prefix[r] + query[r]));
    max_blocks = std::max<std::int64_t>(max_blocks, (lens.back() + 127) / 128);
  }
  std::vector<std::int32_t> table(std::size_t(B * max_blocks), -1);
  for (std::int64_t r = 0; r < B; ++r) {  // each request's pages scattered (descending)
    const std::int64_t n = (lens[r] + 127) / 128;
    for (std::int64_t b = 0; b < n; ++b)
      table[r * max_blocks + b] = static_cast<std::int32_t>(pages + n - 1 - b);
    pages += n;
  }
  Caches caches(kCacheKinds[0], std::max<std::int64_t>(pages, 1));
  const DeviceArray<std::int32_t> table_d(table), cu_d(cu), lens_d(lens);
  DeviceArray<std::uint16_t> q(std::size_t(rows) * 64 * 128), out(q.n),
      iq(std::size_t(rows) * 4 * 128);
  fill(q.ptr, q.n, 61);
  index_queries_bf16<<<1024, 256>>>(iq.ptr, rows, coherent);
  FLASHMSA_CHECK_LAUNCH();
  DeviceArray<std::int32_t> topk(std::size_t(4 * rows * 16));
  DeviceArray<std::uint8_t> ws(std::size_t(std::max(index_workspace_bytes(c, rows, B, max_blocks),
                                                    attention_workspace_bytes(c, rows, B))));
  const TensorView wsv = device_view(ws.ptr, DType::kUint8, {std::int64_t(ws.n)});
  const PrefillBatch batch{device_view(cu_d.ptr, DType::kInt32, {B + 1}),
                           device_view(lens_d.ptr, DType::kInt32, {B}),
                           device_view(table_d.ptr, DType::kInt32, {B, max_blocks})};
  IndexOutputs io{device_view(topk.ptr, DType::kInt32, {4, rows, 16})};
  io.workspace = wsv;
  AttentionOutputs ao{device_view(out.ptr, DType::kBf16, {rows, 64, 128})};
  ao.workspace = wsv;
  const TensorView iqv = device_view(iq.ptr, DType::kBf16, {rows, 4, 128});
  const TensorView qv = device_view(q.ptr, DType::kBf16, {rows, 64, 128});
  PrefillResult res;
  res.indexer = time_it([&](int) { index_prefill(c, iqv, caches.index_view, batch, io); }, reps, 1);
  res.attention = time_it(
      [&](int) { sparse_attention_prefill(c, qv, caches.kv_view, batch, io.topk, ao); }, reps, 1);
  if (dense_reps > 0) {
    res.dense =
        time_it([&](int) { dense_attention(c, qv, caches.kv_view, batch, ao); }, dense_reps, 1);
    for (std::int64_t r = 0; r < B; ++r) {  // 4 * D per (q head, causal key)
      const double p = static_cast<double>(prefix[r]), n = static_cast<double>(query[r]);
      res.dense_flops += 4.0 * 128 * 64 * (p * n + n * (n + 1) / 2);
    }
  }
  // Useful FLOPs from the selections the indexer made.
  std::vector<std::int32_t> ids(topk.n);
  FLASHMSA_CHECK_CUDA(cudaMemcpy(ids.data(), topk.ptr, ids.size() * 4, cudaMemcpyDeviceToHost));
  double keys = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (std::int64_t r = 0; r < B; ++r) {
    ranges.emplace_back(cu[r], cu[r + 1]);
    for (std::int64_t t = cu[r]; t < cu[r + 1]; ++t) {
      const std::int64_t pos = prefix[r] + (t - cu[r]);
      res.indexer_flops += 2.0 * 128 * 4 * static_cast<double>(pos + 1);
      for (std::int64_t h = 0; h < 4; ++h) {
        for (int i = 0; i < 16; ++i) {
          const std::int32_t b = ids[(h * rows + t) * 16 + i];
          if (b >= 0) keys += static_cast<double>(std::min<std::int64_t>(128, pos - b * 128 + 1));
        }
      }
    }
  }
  res.attention_flops = 4.0 * 128 * 16 * keys;
  res.shared = sharing(ids, rows, ranges);
  return res;
}

void report_prefill(const std::string& name, const PrefillResult& r) {
  const double it = r.indexer_flops / r.indexer.median_s / 1e12;
  const double at = r.attention_flops / r.attention.median_s / 1e12;
  report(name + ": indexer", it, "TFLOP/s", it / g_gemm_tflops, r.indexer);
  report(name + ": attention (" + r.shared.text() + ")", at, "TFLOP/s", at / g_gemm_tflops,
         r.attention);
  const Stat e2e{r.indexer.median_s + r.attention.median_s, std::max(r.indexer.cv, r.attention.cv)};
  const double total = (r.indexer_flops + r.attention_flops) / e2e.median_s / 1e12;
  report(name + ": end to end", total, "TFLOP/s", total / g_gemm_tflops, e2e);
  if (r.dense_flops > 0) {
    const double dense = r.dense_flops / r.dense.median_s / 1e12;
    report(name + ": dense attention (ours)", dense, "TFLOP/s", dense / g_gemm_tflops, r.dense);
  }
}

// Single requests of 8K / 32K / 128K and a chunked prefill (128K prefix + 8K chunk), with
// coherent and i.i.d. index queries.
void prefill_end_to_end() {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes{
      {0, 8192}, {0, 32768}, {0, 131072}, {131072, 8192}};
  for (auto [prefix, query] : shapes) {
    for (bool coherent : {true, false}) {
      char name[128];
      std::snprintf(name, sizeof name, "prefill %lldK + %lldK, %s",
                    static_cast<long long>(prefix / 1024), static_cast<long long>(query / 1024),
                    coherent ? "coherent" : "random");
      // Dense attention does not depend on the selections: timed once per shape.
      report_prefill(name, run_prefill({prefix}, {query}, coherent, 3, coherent ? 3 : 0));
    }
  }
}

// A 1M-token context, so the indexer's O(n^2) is measured where it dominates: the last 8K chunk
// after a 1M-token prefix (sparse end to end, and our dense attention over the same chunk), and
// one request's whole 1M-token prefill in 8K chunks, each chunk's indexer then its attention, in
// order on one stream (bf16 caches, coherent index queries). Dense over the whole prefill is its
// FLOPs at the rate our dense attention reached on the last chunk: dense's rate only falls on
// shorter prefixes, so that is its best case (bench/report.py does the same with cuDNN's rate
// on the last chunk, from sdpa.json).
constexpr std::int64_t k1M = 1 << 20, k1MChunk = 8192;
struct Prefill1M {
  double chunk_s = 0, total_s = 0, dense_total_s = 0;
};
std::optional<Prefill1M> g_prefill_1m;

double dense_causal_flops(double prefix, double query) {  // 4 * D per (q head, causal key)
  return 4.0 * 128 * 64 * (prefix * query + query * (query + 1) / 2);
}

void prefill_1m() {
  Prefill1M res;
  const PrefillResult last = run_prefill({k1M}, {k1MChunk}, true, 3, 1);
  report_prefill("prefill 1024K + 8K, coherent", last);
  res.chunk_s = last.indexer.median_s + last.attention.median_s;

  const Config c = m3();
  const std::int64_t chunks = k1M / k1MChunk, max_blocks = k1M / 128;
  Caches caches(kCacheKinds[0], max_blocks);
  const DeviceArray<std::int32_t> table(IndexBatch::table(1, max_blocks, 1));
  const DeviceArray<std::int32_t> cu(std::vector<std::int32_t>{0, std::int32_t{k1MChunk}});
  std::vector<std::int32_t> lens(static_cast<std::size_t>(chunks));
  for (std::int64_t i = 0; i < chunks; ++i) lens[i] = static_cast<std::int32_t>((i + 1) * k1MChunk);
  const DeviceArray<std::int32_t> lens_d(lens);
  DeviceArray<std::uint16_t> q(std::size_t(k1MChunk) * 64 * 128), out(q.n),
      iq(std::size_t(k1MChunk) * 4 * 128);
  fill(q.ptr, q.n, 63);
  index_queries_bf16<<<1024, 256>>>(iq.ptr, k1MChunk, true);
  FLASHMSA_CHECK_LAUNCH();
  DeviceArray<std::int32_t> topk(std::size_t(4 * k1MChunk * 16));
  DeviceArray<std::uint8_t> ws(
      std::size_t(std::max(index_workspace_bytes(c, k1MChunk, 1, max_blocks),
                           attention_workspace_bytes(c, k1MChunk, 1))));
  IndexOutputs io{device_view(topk.ptr, DType::kInt32, {4, k1MChunk, 16})};
  io.workspace = device_view(ws.ptr, DType::kUint8, {std::int64_t(ws.n)});
  AttentionOutputs ao{device_view(out.ptr, DType::kBf16, {k1MChunk, 64, 128})};
  ao.workspace = io.workspace;
  const TensorView iqv = device_view(iq.ptr, DType::kBf16, {k1MChunk, 4, 128});
  const TensorView qv = device_view(q.ptr, DType::kBf16, {k1MChunk, 64, 128});
  double sparse_flops = 0, dense_flops = 0;
  for (std::int64_t i = 0; i < chunks; ++i) {
    const double prefix = static_cast<double>(i * k1MChunk);
    // The indexer's work, 2 x 4 heads x 128 per (row, visible key), and the attention's as 16
    // whole blocks a (row, q head), 4 x 128 per key (exact but for the first 2K positions).
    sparse_flops += 2.0 * 128 * 4 * (prefix * k1MChunk + k1MChunk * (k1MChunk + 1) / 2.0) +
                    4.0 * 128 * 64 * 16 * 128 * static_cast<double>(k1MChunk);
    dense_flops += dense_causal_flops(prefix, k1MChunk);
  }
  const Stat whole = time_it(
      [&](int) {
        for (std::int64_t i = 0; i < chunks; ++i) {
          const PrefillBatch batch{device_view(cu.ptr, DType::kInt32, {2}),
                                   device_view(lens_d.ptr + i, DType::kInt32, {1}),
                                   device_view(table.ptr, DType::kInt32, {1, max_blocks})};
          index_prefill(c, iqv, caches.index_view, batch, io);
          sparse_attention_prefill(c, qv, caches.kv_view, batch, io.topk, ao);
        }
      },
      1, 1);
  res.total_s = whole.median_s;
  res.dense_total_s = dense_flops / (last.dense_flops / last.dense.median_s);
  const double tflops = sparse_flops / whole.median_s / 1e12;
  report("prefill 1M in 8K chunks: indexer + top-k + sparse attention", tflops, "TFLOP/s",
         tflops / g_gemm_tflops, whole);
  const double dense_tflops = dense_flops / res.dense_total_s / 1e12;
  report("prefill 1M in 8K chunks: dense attention (ours) at its last-chunk rate", dense_tflops,
         "TFLOP/s", dense_tflops / g_gemm_tflops, Stat{res.dense_total_s, last.dense.cv});
  g_prefill_1m = res;
}

// The production prefill case set (bench/data): every case, and the weighted aggregate of the
// `representative` ones (weighted mean time and useful TFLOP/s, README of the data).

// Production-weighted sums of one way of running the set (bench/data/README.md: weighted mean
// time = sum(w t) / sum(w); useful TFLOP/s = sum(w flops) / sum(w t)).
struct Weighted {
  double weight = 0, time = 0, flops = 0, upstream_flops = 0;
  void add(double w, double t, double f, double upstream) {
    weight += w, time += w * t, flops += w * f, upstream_flops += w * upstream;
  }
  void report_as(const std::string& name, bool ours_only) const {
    if (weight <= 0) {  // no representative case in the set: there is no aggregate to report
      std::printf("%-52s (no case with a representative weight: aggregate omitted)\n",
                  name.c_str());
      return;
    }
    const Stat mean{time / weight, 0};
    const double upstream = upstream_flops / time / 1e12, ours = flops / time / 1e12;
    if (!ours_only) {
      report(name + ": weighted useful TFLOP/s, data set's definition", upstream, "TFLOP/s",
             upstream / g_gemm_tflops, mean);
    }
    report(name + ": weighted TFLOP/s, FLOPs computed", ours, "TFLOP/s", ours / g_gemm_tflops,
           mean);
  }
};

void production_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the case set " + path);
  Weighted coherent, random, dense;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json entry = nlohmann::json::parse(line);
    const auto query = entry.at("query_lens").get<std::vector<std::int64_t>>();
    const auto prefix = entry.at("prefix_lens").get<std::vector<std::int64_t>>();
    const std::string id = entry.at("case_id").get<std::string>();
    const nlohmann::json& w = entry.at("representative_weight");
    const double weight = w.is_null() ? 0.0 : w.get<double>();
    // The data set's own convention: 2 * 128 * 128 per (query token, complete visible page).
    const double upstream_flops = entry.at("useful_flops").get<double>();
    const std::string name =
        "case " + id + (weight > 0 ? " (w " + std::to_string(int(weight)) + ")" : "");
    const PrefillResult c = run_prefill(prefix, query, true, 3, 2);
    report_prefill(name + ", coherent", c);
    const PrefillResult r = run_prefill(prefix, query, false, 3);
    report_prefill(name + ", random", r);
    if (weight > 0) {
      coherent.add(weight, c.indexer.median_s + c.attention.median_s,
                   c.indexer_flops + c.attention_flops, upstream_flops);
      random.add(weight, r.indexer.median_s + r.attention.median_s,
                 r.indexer_flops + r.attention_flops, upstream_flops);
      dense.add(weight, c.dense.median_s, c.dense_flops, upstream_flops);
    }
    ++n;
  }
  const std::string set = "production prefill set (" + std::to_string(n) + " cases)";
  coherent.report_as(set + ", coherent", false);
  random.report_as(set + ", random", false);
  dense.report_as(set + ", dense attention (ours)", true);
}

// The results as JSON (names escaped, NaN and Inf as null: it always parses).
// The decode floors: a step may take at most 10 us + bytes / (f C), with C the same-run HBM read
// ceiling and f 0.95 for bf16 and fp8 caches, 0.65 for NVFP4 (on sm_90 E2M1 codes have no
// tensor-core path: every code is converted by instructions, which bounds the rate below HBM's).
double decode_floor_us(const DecodePoint& d) {
  const double f = d.kind == "nvfp4" ? 0.65 : 0.95;
  return 10.0 + d.bytes / (f * g_hbm_tbps * 1e12) * 1e6;
}

// ---- Fused FP8 projection ------------------------------------------------------

// Per (tensor-parallel size, tokens): the projection's time, for the headline keys.
struct ProjectionPoint {
  int tp;
  std::int64_t tokens;
  double us, tflops;
  double sustained_tflops = 0;  // compute-bound points: also timed back to back (time_graphs)
};
std::vector<ProjectionPoint> g_projection_points;
double g_projection_weight_bound_tp1_us = 0;

// project_qkv_index (up to 8 tokens one weight-streaming kernel, above a quantization kernel and
// a cuBLASLt FP8 GEMM with per-token and per-channel scales) at M3's hidden 6144, for the whole
// layer (TP 1: 9856 output channels) and one rank of TP 8 (1536), graph replay; weight copies
// rotated so the weights stream from HBM as in serving.
void projection() {
  constexpr std::int64_t kHidden = 6144;
  for (const int tp : {1, 8}) {
    const flashmsa::Config rank = m3().for_tensor_parallel(tp, 0).config;
    const std::int64_t n = flashmsa::projection_out_features(rank);
    const std::int64_t weight_bytes = n * kHidden;
    const std::int64_t copies = std::max<std::int64_t>(1, (150 << 20) / weight_bytes + 1);
    DeviceArray<std::uint8_t> weights(static_cast<std::size_t>(copies * weight_bytes));
    fill_bytes(weights.ptr, weights.n, 11, ByteFill::kE4m3);
    std::vector<float> host_scale(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) host_scale[i] = std::ldexp(1.0f, -10 + int(i % 5));
    DeviceArray<float> scale(host_scale);
    if (tp == 1) g_projection_weight_bound_tp1_us = weight_bytes / (g_hbm_tbps * 1e12) * 1e6;
    for (const std::int64_t tokens : {1, 8, 64, 4096, 16384}) {
      DeviceArray<std::uint16_t> hidden(static_cast<std::size_t>(tokens * kHidden));
      fill(hidden.ptr, hidden.n, 12);
      DeviceArray<std::uint16_t> out(static_cast<std::size_t>(tokens * n));
      DeviceArray<std::uint8_t> ws(
          static_cast<std::size_t>(flashmsa::projection_workspace_bytes(tokens, kHidden)));
      cudaStream_t stream;
      FLASHMSA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      std::vector<cudaGraphExec_t> graphs;
      const std::int64_t rotations = tokens >= 4096 ? 1 : copies;  // large T: compute-bound
      for (std::int64_t r = 0; r < rotations; ++r) {
        const flashmsa::ProjectionWeightView view{
            TensorView::contiguous(weights.ptr + r * weight_bytes, DType::kFp8E4m3, {n, kHidden},
                                   flashmsa::Device::kCuda),
            TensorView::contiguous(scale.ptr, DType::kFp32, {n}, flashmsa::Device::kCuda)};
        auto call = [&] {
          flashmsa::project_qkv_index(
              view,
              TensorView::contiguous(hidden.ptr, DType::kBf16, {tokens, kHidden},
                                     flashmsa::Device::kCuda),
              TensorView::contiguous(out.ptr, DType::kBf16, {tokens, n}, flashmsa::Device::kCuda),
              TensorView::contiguous(ws.ptr, DType::kUint8, {static_cast<std::int64_t>(ws.n)},
                                     flashmsa::Device::kCuda),
              {.stream = stream});
        };
        call();  // outside the capture: cuBLASLt's one-time setup and algorithm choice
        FLASHMSA_CHECK_CUDA(cudaStreamSynchronize(stream));
        graphs.push_back(capture_graph(stream, call));
      }
      // Small T is a weight stream, timed as decode steps are (back to back, weights rotated
      // past the L2). Large T is compute-bound, where the clock matters: timed like the fp8
      // ceiling it is compared with, each run alone (bursts), and also back to back against the
      // sustained ceiling (fp8_gemm_ceiling says why both).
      const double flops = 2.0 * tokens * n * kHidden;
      const std::string name = "projection fp8 TP" + std::to_string(tp) + " (" + std::to_string(n) +
                               " x 6144), T " + std::to_string(tokens);
      ProjectionPoint point{tp, tokens, 0, 0};
      if (rotations == 1) {
        let_clocks_recover();
        const Stat burst = time_graphs(graphs, stream, 1);
        const Stat sustained = time_graphs(graphs, stream);
        point.us = burst.median_s * 1e6;
        point.tflops = flops / burst.median_s / 1e12;
        point.sustained_tflops = flops / sustained.median_s / 1e12;
        report(name, point.tflops, "TFLOP/s", point.tflops / g_fp8_gemm_tflops, burst);
        report(name + ", sustained", point.sustained_tflops, "TFLOP/s",
               point.sustained_tflops / g_fp8_gemm_sustained_tflops, sustained);
      } else {
        const Stat st = time_graphs(graphs, stream);
        point.us = st.median_s * 1e6;
        point.tflops = flops / st.median_s / 1e12;
        report(name, point.tflops, "TFLOP/s", point.tflops / g_fp8_gemm_tflops, st);
      }
      g_projection_points.push_back(point);
      for (auto e : graphs) cudaGraphExecDestroy(e);
      cudaStreamDestroy(stream);
    }
  }
  std::printf("projection TP1 weight read at the HBM ceiling: %.1f us (T = 1 lower bound)\n",
              g_projection_weight_bound_tp1_us);

  // Its share of the work it feeds, same run: a decode step of 64 requests at 32K (fp8 caches and
  // fp8 indexer, what the fused path requires) and a 4096-token prefill chunk after a 28K prefix
  // (indexer + sparse attention, bf16 caches, coherent selections).
  auto share = [&](const std::string& what, double projection_us, double rest_us) {
    const double f = projection_us / (projection_us + rest_us);
    report("projection share of " + what, 100 * f, "%", f,
           Stat{(projection_us + rest_us) * 1e-6, 0});
  };
  auto point = [](int tp, std::int64_t tokens) {
    for (const ProjectionPoint& p : g_projection_points) {
      if (p.tp == tp && p.tokens == tokens) return p.us;
    }
    return 0.0;
  };
  const DecodeTimes step = run_decode(kCacheKinds[1], 64, 32768, 1);
  share("a decode step, 64 x 32K fp8, TP1", point(1, 64), step.step.median_s * 1e6);
  share("a decode step, 64 x 32K fp8, TP8 rank", point(8, 64), step.step.median_s * 1e6);
  const PrefillResult chunk = run_prefill({28672}, {4096}, true, 3);
  share("a 4096-token prefill chunk at 32K, TP1", point(1, 4096),
        (chunk.indexer.median_s + chunk.attention.median_s) * 1e6);
}

// Where a decode step's time goes: the step graph replayed with every kernel's phase
// clock set (src/cuda/common/phase_clock.hpp), 15 samples after warm-up. Per kernel, when its
// first CTA starts and its last one ends (globaltimer, from the step's first CTA start); per CTA
// of the attention and the scoring, the median time of each phase (clock64 at the boost clock).
// The step's event time less the kernels' span is the graph launch and the gaps it leaves.
// The headline keys the issue's floors are read from; a key whose grid point did not run (a
// --quick-grid or filtered run) is left out. decode_worst_floor_ratio is the largest measured /
// floor over the points that ran (decode_floor_points of them).
nlohmann::ordered_json headline() {
  using Json = nlohmann::ordered_json;
  Json h = Json::object();
  auto point = [](const char* kind, std::int64_t b, std::int64_t len) -> const DecodePoint* {
    for (const DecodePoint& d : g_decode_points) {
      if (d.kind == kind && d.batch == b && d.len == len && d.dql == 1) return &d;
    }
    return nullptr;
  };
  auto hbm = [](const DecodePoint* d) {
    return d->bytes / (d->step_us * 1e-6) / 1e12 / g_hbm_tbps;
  };
  if (const auto* d = point("bf16", 1, 8192)) h["decode_bf16_1x8K_us"] = d->step_us;
  if (const auto* d = point("bf16", 8, 32768)) h["decode_bf16_8x32K_us"] = d->step_us;
  if (const auto* d = point("bf16", 64, 32768)) h["decode_bf16_64x32K_hbm"] = hbm(d);
  if (const auto* d = point("bf16", 128, 131072)) h["decode_bf16_128x128K_hbm"] = hbm(d);
  const DecodePoint* bf16 = point("bf16", 64, 32768);
  if (const auto* d = point("fp8", 64, 32768); d && bf16) {
    h["decode_fp8_speedup_64x32K"] = bf16->step_us / d->step_us;
  }
  if (const auto* d = point("nvfp4", 64, 32768); d && bf16) {
    h["decode_nvfp4_speedup_64x32K"] = bf16->step_us / d->step_us;
  }
  auto projection_point = [](int tp, std::int64_t tokens) -> const ProjectionPoint* {
    for (const ProjectionPoint& p : g_projection_points) {
      if (p.tp == tp && p.tokens == tokens) return &p;
    }
    return nullptr;
  };
  // The whole layer (TP 1) at M3's hidden 6144; T = 1 also per TP-8 rank, and the
  // TP-1 weight's read time at the HBM ceiling (no T = 1 projection can beat it).
  // Like for like: the burst rate over the burst ceiling, the sustained over the sustained.
  if (const auto* p = projection_point(1, 4096)) {
    h["projection_fp8_4096_tflops"] = p->tflops;
    h["projection_fp8_4096_ceiling_fraction"] = p->tflops / g_fp8_gemm_tflops;
    h["projection_fp8_4096_sustained_ceiling_fraction"] =
        p->sustained_tflops / g_fp8_gemm_sustained_tflops;
  }
  if (const auto* p = projection_point(1, 16384)) {
    h["projection_fp8_16384_ceiling_fraction"] = p->tflops / g_fp8_gemm_tflops;
    h["projection_fp8_16384_sustained_ceiling_fraction"] =
        p->sustained_tflops / g_fp8_gemm_sustained_tflops;
  }
  if (const auto* p = projection_point(1, 1)) {
    h["projection_fp8_T1_us"] = p->us;
    h["projection_fp8_T1_weight_read_us"] = g_projection_weight_bound_tp1_us;
  }
  if (const auto* p = projection_point(8, 1)) h["projection_fp8_T1_tp8_us"] = p->us;
  // The prefill indexer's floors (score + top-k, 1 request).
  for (const auto& [key, shape] : {std::pair{"prefill_indexer_bf16_8K_tflops", "bf16 8K"},
                                   {"prefill_indexer_bf16_32K_tflops", "bf16 32K"},
                                   {"prefill_indexer_bf16_128K_tflops", "bf16 128K"},
                                   {"prefill_indexer_fp8_32K_tflops", "fp8 32K"},
                                   {"prefill_indexer_fp8_128K_tflops", "fp8 128K"},
                                   {"prefill_indexer_nvfp4_32K_tflops", "nvfp4 32K"},
                                   {"prefill_indexer_4K_after_32K_ms", "bf16 4K after 32K ms"}}) {
    if (auto it = g_prefill_indexer.find(shape); it != g_prefill_indexer.end()) h[key] = it->second;
  }
  if (g_prefill_1m) {  // bench/report.py moves the speedup to the fastest dense it has
    h["prefill_1M_chunk_ms"] = g_prefill_1m->chunk_s * 1e3;
    h["prefill_1M_total_s"] = g_prefill_1m->total_s;
    h["prefill_1M_dense_speedup"] = g_prefill_1m->dense_total_s / g_prefill_1m->total_s;
    h["prefill_1M_dense_baseline"] = "ours";
  }
  if (!g_decode_points.empty()) {
    double worst = 0;
    for (const DecodePoint& d : g_decode_points)
      worst = std::max(worst, d.step_us / decode_floor_us(d));
    h["decode_worst_floor_ratio"] = worst;
    h["decode_floor_points"] = g_decode_points.size();
  }
  return h;
}

void write_json(const char* path) {
  using Json = nlohmann::ordered_json;
  auto number = [](double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); };
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  Json cases = Json::array();
  for (const Row& r : g_rows) {
    cases.push_back({{"name", r.name},
                     {"value", number(r.value)},
                     {"unit", r.unit},
                     {"fraction_of_ceiling", number(r.ceiling_fraction)},
                     {"median_us", number(r.time_us)},
                     {"cv", number(r.cv)}});
  }
  std::ofstream f(path);
  if (!f) throw std::runtime_error(std::string("cannot write ") + path);
  f << Json{{"device", prop.name},
            {"hbm_read_tbps", number(g_hbm_tbps)},
            {"bf16_gemm_tflops", number(g_gemm_tflops)},
            {"fp8_gemm_tflops", number(g_fp8_gemm_tflops)},
            {"fp8_gemm_sustained_tflops", number(g_fp8_gemm_sustained_tflops)},
            {"headline", headline()},
            {"cases", cases}}
           .dump(2)
    << "\n";
}

}  // namespace

// A case group runs when the filter is empty or its key contains one of the filter's
// comma-separated substrings.
bool matches_filter(const std::string& key, const std::string& filter) {
  if (filter.empty()) return true;
  std::size_t begin = 0;
  while (begin <= filter.size()) {
    const std::size_t end = std::min(filter.find(',', begin), filter.size());
    const std::string part = filter.substr(begin, end - begin);
    if (!part.empty() && key.find(part) != std::string::npos) return true;
    begin = end + 1;
  }
  return false;
}

int main(int argc, char** argv) {
  const char* json = nullptr;
  std::string filter;  // run only the case groups it matches (matches_filter)
  std::string cases_path = "bench/data/msa_prefill_benchmark_v1.jsonl";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else if (std::strcmp(argv[i], "--filter") == 0 && i + 1 < argc) {
      filter = argv[++i];
    } else if (std::strcmp(argv[i], "--cases") == 0 && i + 1 < argc) {
      cases_path = argv[++i];
    } else if (std::strcmp(argv[i], "--quick-grid") == 0) {
      g_quick_grid = true;
    } else if (std::strcmp(argv[i], "--grid-point") == 0 && i + 1 < argc) {
      char kind[16];
      long long b = 0, len = 0;
      int dql = 0;
      if (std::sscanf(argv[++i], "%15[a-z0-9],%lld,%lld,%d", kind, &b, &len, &dql) != 4) {
        std::fprintf(stderr,
                     "--grid-point: expected KIND,BATCH,CONTEXT,DQL (e.g. fp8,64,32768,4), "
                     "got %s\n",
                     argv[i]);
        return 2;
      }
      g_grid_points.push_back({kind, b, len, dql});
    } else {
      std::fprintf(stderr,
                   "usage: flashmsa_cuda_bench [--json FILE] [--filter SUBSTRING] [--cases JSONL] "
                   "[--quick-grid] [--grid-point KIND,BATCH,CONTEXT,DQL]\n");
      return 2;
    }
  }
  if (auto reason = backend_unavailable_reason(Backend::kCudaSm90)) {
    std::printf("flashmsa_cuda_bench: no CUDA run: %s\n", reason->c_str());
    return 0;
  }
  // The ceilings always run first: every figure is a ratio to them.
  const std::vector<std::pair<std::string, std::function<void()>>> cases{
      {"indexer prefill 8K", [] { prefill_indexer(kCacheKinds[0], 0, 8192); }},
      {"indexer prefill 32K", [] { prefill_indexer(kCacheKinds[0], 0, 32768); }},
      {"indexer prefill 128K", [] { prefill_indexer(kCacheKinds[0], 0, 131072); }},
      {"indexer prefill 4K after 32K", [] { prefill_indexer(kCacheKinds[0], 32768, 4096); }},
      {"indexer prefill fp8 32K", [] { prefill_indexer(kCacheKinds[1], 0, 32768); }},
      {"indexer prefill fp8 128K", [] { prefill_indexer(kCacheKinds[1], 0, 131072); }},
      {"indexer prefill nvfp4 32K", [] { prefill_indexer(kCacheKinds[2], 0, 32768); }},
      {"indexer decode 64x32K", [] { decode_indexer(64, 32768); }},
      {"indexer decode 128x32K", [] { decode_indexer(128, 32768); }},
      {"indexer decode 1x8K", [] { decode_indexer(1, 8192); }},
      {"attention prefill 32K coherent", [] { prefill_attention(32768, true); }},
      {"attention prefill 32K random", [] { prefill_attention(32768, false); }},
      {"attention prefill 8K coherent", [] { prefill_attention(8192, true); }},
      {"attention prefill 128K coherent", [] { prefill_attention(131072, true); }},
      {"attention prefill 128K random", [] { prefill_attention(131072, false); }},
      {"dense attention 32K", [] { dense_prefill_attention(32768); }},
      {"decode step 64x32K", [] { decode_step(64, 32768, 1); }},
      {"decode step 128x32K", [] { decode_step(128, 32768, 1); }},
      {"decode step 1x8K", [] { decode_step(1, 8192, 1); }},
      {"decode step 64x32K dql4", [] { decode_step(64, 32768, 4); }},
      {"decode grid", decode_grid},
      {"decode phases 1x8K", [] { decode_phases(kCacheKinds[0], 1, 8192); }},
      {"decode phases 64x32K", [] { decode_phases(kCacheKinds[0], 64, 32768); }},
      {"decode phases fp8 64x32K", [] { decode_phases(kCacheKinds[1], 64, 32768); }},
      {"decode phases fp8 128x128K", [] { decode_phases(kCacheKinds[1], 128, 131072); }},
      {"decode phases nvfp4 64x32K", [] { decode_phases(kCacheKinds[2], 64, 32768); }},
      {"projection", projection},
      {"prefill end to end", prefill_end_to_end},
      {"prefill 1M", prefill_1m},
      {"production prefill set", [&] { production_cases(cases_path); }},
  };
  try {
    ceilings();
    if (json) write_json(json);
    for (const auto& [key, run] : cases) {
      if (!matches_filter(key, filter)) continue;
      run();
      if (json) write_json(json);  // after every case group: a run cut short keeps what it measured
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashmsa_cuda_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
