// flashmsa_hopper_microbench: the H200 measurements the Hopper kernel designs rest on
// (docs/performance.md, "The hardware"). Each section answers one design question:
//   l2       L2 read bandwidth for working sets under 50 MB (what a re-read page costs)
//   hbm      HBM read with plain loads, cp.async rings and TMA bulk copies at several bytes in
//            flight per SM (how deep a page pipeline must be to stream at the limit)
//   launch   a CUDA graph of 1..16 dependent empty kernels, with and without programmatic
//            dependent launch (the fixed cost of each extra kernel in a decode step)
//   wgmma    bf16 and fp8 wgmma throughput from shared memory, M 64 x N 128/256 x K 128, in a
//            minimal CuTe mainloop, one and two warpgroups per SM; and bf16 wgmma with A from
//            registers (N 64 and 16) fed by NVFP4 codes converted in registers as it runs (the
//            NVFP4 speculative decode tile of docs/performance.md)
//   convert  in-register widening of fp8 and NVFP4 codes (src/cuda/sm90/convert.cuh), elements
//            per clock per SM, against what streaming the cache at the HBM limit needs
//   gather   the sparse prefill attention's key-stationary schedule: a K/V page loaded once for
//            several gathered groups of 4 tokens, each group's single-page attention and its
//            partial output stored (the rate a gather kernel could reach whatever the selections)
// Usage: flashmsa_hopper_microbench [--json FILE] [--only SECTION]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <nlohmann/json.hpp>

#include "flashmsa/error.hpp"
#include "src/cuda/sm90/attention/prefill_attention_kernel.cuh"
#include "src/cuda/sm90/convert.cuh"
#include "src/cuda/sm90/page_pipeline.cuh"
#include "src/cuda/sm90/wgmma.cuh"

namespace {

int g_sms = 0;
double g_clock_ghz = 0;
nlohmann::json g_results = nlohmann::json::array();

// Median over `trials` of the time of `reps` calls of `launch`, in microseconds per call.
double time_us(const std::function<void()>& launch, int reps, int trials = 7) {
  cudaEvent_t a, b;
  FLASHMSA_CHECK_CUDA(cudaEventCreate(&a));
  FLASHMSA_CHECK_CUDA(cudaEventCreate(&b));
  launch();  // warm-up
  FLASHMSA_CHECK_CUDA(cudaGetLastError());
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int i = 0; i < trials; ++i) {
    FLASHMSA_CHECK_CUDA(cudaEventRecord(a));
    for (int r = 0; r < reps; ++r) launch();
    FLASHMSA_CHECK_CUDA(cudaEventRecord(b));
    FLASHMSA_CHECK_CUDA(cudaEventSynchronize(b));
    FLASHMSA_CHECK_CUDA(cudaGetLastError());
    float ms = 0;
    FLASHMSA_CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(1e3 * ms / reps);
  }
  FLASHMSA_CHECK_CUDA(cudaEventDestroy(a));
  FLASHMSA_CHECK_CUDA(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void record(const std::string& section, const std::string& name, double value,
            const std::string& unit, nlohmann::json extra = nlohmann::json::object()) {
  std::printf("%-8s %-58s %10.3f %s\n", section.c_str(), name.c_str(), value, unit.c_str());
  extra["section"] = section;
  extra["name"] = name;
  extra["value"] = value;
  extra["unit"] = unit;
  g_results.push_back(extra);
}

__device__ __forceinline__ std::uint32_t fold(uint4 v) {
  return v.x ^ v.y ^ v.z ^ v.w;
}

// The sink is written only when a checksum hits a value random data essentially never gives;
// the compiler cannot know that, so every load and conversion stays.
constexpr std::uint32_t kNever = 0x9E3779B9u;

// ---- L2 ----

__global__ void l2_read_kernel(const uint4* __restrict__ p, std::size_t n, int passes,
                               std::uint32_t* sink) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::uint32_t acc = 0;
  for (int pass = 0; pass < passes; ++pass) {
    std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
      const uint4 a = __ldcg(p + i), b = __ldcg(p + i + stride), c = __ldcg(p + i + 2 * stride),
                  d = __ldcg(p + i + 3 * stride);
      acc ^= fold(a) ^ fold(b) ^ fold(c) ^ fold(d);
    }
    for (; i < n; i += stride) acc ^= fold(__ldcg(p + i));
  }
  if (acc == kNever) sink[0] = acc;
}

void bench_l2(const std::uint8_t* buffer, std::uint32_t* sink) {
  for (int mb : {4, 8, 16, 24, 32, 40, 48}) {
    const std::size_t n = std::size_t(mb) << 20 >> 4;
    const int passes = 20;
    const double us = time_us(
        [&] {
          l2_read_kernel<<<g_sms * 4, 512>>>(reinterpret_cast<const uint4*>(buffer), n, passes,
                                             sink);
        },
        3);
    record("l2", "read, working set " + std::to_string(mb) + " MB, 16-byte ld.global.cg",
           double(n) * 16 * passes / us * 1e-6, "TB/s", {{"working_set_mb", mb}});
  }
}

// ---- HBM: plain loads, cp.async rings, TMA bulk copies ----

template <int kUnroll>
__global__ void hbm_plain_kernel(const uint4* __restrict__ p, std::size_t n, std::uint32_t* sink) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x * kUnroll;
  std::uint32_t acc = 0;
  for (std::size_t base = std::size_t(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; base < n;
       base += stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(p + base + u * blockDim.x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= fold(v[u]);
  }
  if (acc == kNever) sink[0] = acc;
}

// One CTA per SM, 256 threads; a ring of kStages 16 KB stages, each thread copying 4 x 16 bytes
// per stage; consuming a stage reads one word per thread.
constexpr int kCpAsyncThreads = 256, kStageBytes = 16384;

template <int kStages>
__global__ void __launch_bounds__(kCpAsyncThreads, 1)
    hbm_cp_async_kernel(const std::uint8_t* __restrict__ p, std::size_t bytes,
                        std::uint32_t* sink) {
  extern __shared__ __align__(128) std::uint8_t ring[];
  const std::size_t chunks = bytes / kStageBytes;
  auto issue = [&](std::size_t chunk, int slot) {
    if (chunk < chunks) {
#pragma unroll
      for (int i = 0; i < kStageBytes / 16 / kCpAsyncThreads; ++i) {
        const int off = (i * kCpAsyncThreads + threadIdx.x) * 16;
        flashmsa::cuda::cp_async_16(ring + slot * kStageBytes + off, p + chunk * kStageBytes + off);
      }
    }
    flashmsa::cuda::cp_async_commit();
  };
  for (int s = 0; s < kStages; ++s) issue(blockIdx.x + std::size_t(s) * gridDim.x, s);
  std::uint32_t acc = 0;
  for (std::size_t k = 0;; ++k) {
    const std::size_t chunk = blockIdx.x + k * gridDim.x;
    if (chunk >= chunks) break;
    const int slot = static_cast<int>(k % kStages);
    flashmsa::cuda::cp_async_wait<kStages - 1>();
    __syncthreads();
    acc ^= reinterpret_cast<const std::uint32_t*>(ring + slot * kStageBytes)[threadIdx.x];
    __syncthreads();
    issue(chunk + std::size_t(kStages) * gridDim.x, slot);
  }
  flashmsa::cuda::cp_async_wait<0>();
  if (acc == kNever) sink[0] = acc;
}

// One CTA per SM, 128 threads; thread 0 keeps kStages bulk copies of kChunk bytes in flight, each
// completing on its stage's mbarrier; every thread waits for a stage and reads one word of it.
// (The primitives of page_pipeline.cuh; the ring here keeps all kStages in flight while the
// kernels' BulkCopyPageRing keeps kStages - 1 and computes on the last.)
template <int kStages, int kChunk>
__global__ void __launch_bounds__(128, 1)
    hbm_bulk_kernel(const std::uint8_t* __restrict__ p, std::size_t bytes, std::uint32_t* sink) {
  extern __shared__ __align__(128) std::uint8_t ring[];
  __shared__ __align__(8) std::uint64_t full[kStages];
  const std::size_t chunks = bytes / kChunk;
  using namespace flashmsa::cuda;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbarrier_init(&full[s], 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  auto issue = [&](std::size_t chunk, int slot) {
    if (chunk >= chunks) return;
    mbarrier_arrive_expect_tx(&full[slot], kChunk);
    bulk_copy_to_shared(ring + slot * kChunk, p + chunk * kChunk, kChunk, &full[slot]);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) issue(blockIdx.x + std::size_t(s) * gridDim.x, s);
  }
  std::uint32_t acc = 0;
  for (std::size_t k = 0;; ++k) {
    const std::size_t chunk = blockIdx.x + k * gridDim.x;
    if (chunk >= chunks) break;
    const int slot = static_cast<int>(k % kStages);
    mbarrier_wait(&full[slot], static_cast<std::uint32_t>(k / kStages) & 1);
    acc ^= reinterpret_cast<const std::uint32_t*>(ring + slot * kChunk)[threadIdx.x];
    __syncthreads();  // every thread is done with the slot before it is refilled
    if (threadIdx.x == 0) issue(chunk + std::size_t(kStages) * gridDim.x, slot);
  }
  if (acc == kNever) sink[0] = acc;
}

template <class Kernel>
void set_smem(Kernel kernel, int bytes) {
  FLASHMSA_CHECK_CUDA(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

void bench_hbm(const std::uint8_t* buffer, std::size_t bytes, std::uint32_t* sink) {
  const auto* v = reinterpret_cast<const uint4*>(buffer);
  const std::size_t n = bytes / 16;
  auto report = [&](const std::string& method, int in_flight_kb, double us,
                    const std::string& how) {
    record("hbm",
           method + ", " + std::to_string(in_flight_kb) + " KB in flight per SM (" + how + ")",
           double(bytes) / us * 1e-6, "TB/s", {{"method", method}, {"kb_in_flight", in_flight_kb}});
  };
  auto plain = [&](auto kernel, int unroll, int threads_per_sm) {
    const int blocks = g_sms * threads_per_sm / 256;
    report("plain loads", threads_per_sm * unroll * 16 / 1024,
           time_us([&] { kernel<<<blocks, 256>>>(v, n, sink); }, 3),
           std::to_string(threads_per_sm) + " threads/SM x " + std::to_string(unroll) + " x 16 B");
  };
  for (int threads : {256, 512, 1024, 2048}) {
    plain(hbm_plain_kernel<1>, 1, threads);
    plain(hbm_plain_kernel<2>, 2, threads);
    plain(hbm_plain_kernel<4>, 4, threads);
    if (threads <= 1024) plain(hbm_plain_kernel<8>, 8, threads);
  }
  auto cp_async = [&](auto kernel, int stages) {
    const int smem = stages * kStageBytes;
    set_smem(kernel, smem);
    report("cp.async ring", stages * kStageBytes / 1024,
           time_us([&] { kernel<<<g_sms, kCpAsyncThreads, smem>>>(buffer, bytes, sink); }, 3),
           std::to_string(stages) + " stages x 16 KB, 1 CTA/SM");
  };
  cp_async(hbm_cp_async_kernel<2>, 2);
  cp_async(hbm_cp_async_kernel<4>, 4);
  cp_async(hbm_cp_async_kernel<6>, 6);
  cp_async(hbm_cp_async_kernel<8>, 8);
  cp_async(hbm_cp_async_kernel<12>, 12);
  auto bulk = [&](auto kernel, int stages, int chunk) {
    const int smem = stages * chunk;
    set_smem(kernel, smem);
    report("TMA bulk copy", smem / 1024,
           time_us([&] { kernel<<<g_sms, 128, smem>>>(buffer, bytes, sink); }, 3),
           std::to_string(stages) + " x " + std::to_string(chunk / 1024) + " KB, 1 CTA/SM");
  };
  bulk(hbm_bulk_kernel<2, 8192>, 2, 8192);
  bulk(hbm_bulk_kernel<4, 8192>, 4, 8192);
  bulk(hbm_bulk_kernel<2, 16384>, 2, 16384);
  bulk(hbm_bulk_kernel<4, 16384>, 4, 16384);
  bulk(hbm_bulk_kernel<6, 16384>, 6, 16384);
  bulk(hbm_bulk_kernel<8, 16384>, 8, 16384);
  bulk(hbm_bulk_kernel<4, 32768>, 4, 32768);
  bulk(hbm_bulk_kernel<6, 32768>, 6, 32768);
}

// ---- Launch latency ----

__global__ void empty_kernel(int pdl) {
  if (pdl) {
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
}

void bench_launch() {
  cudaStream_t stream;
  FLASHMSA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int pdl = 0; pdl < 2; ++pdl) {
    for (int kernels : {1, 2, 4, 8, 16}) {
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      FLASHMSA_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < kernels; ++i) {
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(1);
        config.blockDim = dim3(32);
        config.stream = stream;
        cudaLaunchAttribute attribute[1];
        attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute[0].val.programmaticStreamSerializationAllowed = 1;
        config.attrs = attribute;
        config.numAttrs = pdl && i > 0 ? 1 : 0;
        FLASHMSA_CHECK_CUDA(cudaLaunchKernelEx(&config, empty_kernel, pdl));
      }
      FLASHMSA_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
      FLASHMSA_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      // Event to event around one replay: what a step of a serving loop waits for.
      cudaEvent_t a, b;
      FLASHMSA_CHECK_CUDA(cudaEventCreate(&a));
      FLASHMSA_CHECK_CUDA(cudaEventCreate(&b));
      std::vector<double> t;
      for (int r = 0; r < 300; ++r) {
        FLASHMSA_CHECK_CUDA(cudaEventRecord(a, stream));
        FLASHMSA_CHECK_CUDA(cudaGraphLaunch(exec, stream));
        FLASHMSA_CHECK_CUDA(cudaEventRecord(b, stream));
        FLASHMSA_CHECK_CUDA(cudaEventSynchronize(b));
        float ms;
        FLASHMSA_CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
        if (r >= 20) t.push_back(1e3 * ms);
      }
      std::sort(t.begin(), t.end());
      record("launch",
             "graph of " + std::to_string(kernels) + " dependent empty kernels" +
                 (pdl ? ", programmatic dependent launch" : ""),
             t[t.size() / 2], "us", {{"kernels", kernels}, {"pdl", pdl == 1}});
      FLASHMSA_CHECK_CUDA(cudaEventDestroy(a));
      FLASHMSA_CHECK_CUDA(cudaEventDestroy(b));
      FLASHMSA_CHECK_CUDA(cudaGraphExecDestroy(exec));
      FLASHMSA_CHECK_CUDA(cudaGraphDestroy(graph));
    }
  }
  FLASHMSA_CHECK_CUDA(cudaStreamDestroy(stream));
}

// ---- wgmma throughput (CuTe) ----

// kWarpGroups warpgroups per CTA, one CTA per SM; each multiplies its own 64 x 128 A tile by the
// CTA's N x 128 B tile (K-major, 128-byte swizzle, both from shared memory) `iters` times into
// registers, waiting for each K = 128 batch (the accumulators chain the batches anyway).
template <class Atom, class Element, int kN, int kWarpGroups>
__global__ void __launch_bounds__(128 * kWarpGroups, 1) wgmma_kernel(int iters, float* sink) {
  using namespace cute;
  constexpr int kM = 64, kK = 128;
  auto sA_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<kM>, Int<kK>>{});
  auto sB_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<kN>, Int<kK>>{});
  extern __shared__ __align__(1024) std::uint8_t smem[];
  auto* a_base = reinterpret_cast<Element*>(smem);
  auto* b_base = a_base + kWarpGroups * cosize(sA_layout);
  const int total = kWarpGroups * cosize(sA_layout) + cosize(sB_layout);
  auto* bytes = reinterpret_cast<std::uint8_t*>(a_base);
  for (int i = threadIdx.x; i < total * int(sizeof(Element)); i += blockDim.x) {
    // Small finite values of either type: a hash into exponent-limited bit patterns.
    const std::uint32_t h = (i * 2654435761u) >> 13;
    bytes[i] =
        static_cast<std::uint8_t>(sizeof(Element) == 2 && (i & 1) ? 0x3C | (h & 0x83) : (h & 0xB7));
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic stores -> wgmma reads
  __syncthreads();
  const int wg = threadIdx.x / 128;
  Tensor sA = make_tensor(make_smem_ptr(a_base + wg * cosize(sA_layout)), sA_layout);
  Tensor sB = make_tensor(make_smem_ptr(b_base), sB_layout);
  TiledMMA mma = make_tiled_mma(Atom{});
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor acc = partition_fragment_C(mma, Shape<Int<kM>, Int<kN>>{});
  clear(acc);
  for (int it = 0; it < iters; ++it) {
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tCrA); ++k) gemm(mma, tCrA(_, _, k), tCrB(_, _, k), acc);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
  }
  float s = 0;
  for (int i = 0; i < size(acc); ++i) s += acc(i);
  if (s == 1.2345f) sink[0] = s;
}

template <class Atom, class Element, int kN, int kWarpGroups>
void wgmma_case(const char* type, float* sink) {
  auto kernel = wgmma_kernel<Atom, Element, kN, kWarpGroups>;
  const int smem = (kWarpGroups * 64 + kN) * 128 * int(sizeof(Element));
  set_smem(kernel, smem);
  const int iters = 4096;
  const double us = time_us([&] { kernel<<<g_sms, 128 * kWarpGroups, smem>>>(iters, sink); }, 3);
  const double flops = 2.0 * 64 * kN * 128 * iters * kWarpGroups * g_sms;
  record("wgmma",
         std::string(type) + " M64 x N" + std::to_string(kN) + " x K128 from smem, " +
             std::to_string(kWarpGroups) + " warpgroup" + (kWarpGroups > 1 ? "s" : "") + "/SM",
         flops / us * 1e-6, "TFLOP/s", {{"type", type}, {"n", kN}, {"warpgroups", kWarpGroups}});
}

void bench_wgmma(float* sink) {
  using namespace cute;
  using Bf16_128 = SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>;
  using Bf16_256 = SM90_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>;
  using Fp8_128 = SM90_64x128x32_F32E4M3E4M3_SS_TN<>;
  using Fp8_256 = SM90_64x256x32_F32E4M3E4M3_SS_TN<>;
  wgmma_case<Bf16_128, bfloat16_t, 128, 1>("bf16", sink);
  wgmma_case<Bf16_128, bfloat16_t, 128, 2>("bf16", sink);
  wgmma_case<Bf16_256, bfloat16_t, 256, 1>("bf16", sink);
  wgmma_case<Bf16_256, bfloat16_t, 256, 2>("bf16", sink);
  wgmma_case<Fp8_128, float_e4m3_t, 128, 1>("fp8 e4m3", sink);
  wgmma_case<Fp8_128, float_e4m3_t, 128, 2>("fp8 e4m3", sink);
  wgmma_case<Fp8_256, float_e4m3_t, 256, 1>("fp8 e4m3", sink);
  wgmma_case<Fp8_256, float_e4m3_t, 256, 2>("fp8 e4m3", sink);
}

// ---- wgmma with A from registers, fed by NVFP4 codes (CuTe) ----

// S^T's A fragments (m64 keys x k128 dims) of a warpgroup's 64 keys, from an NVFP4 tile of 64
// code rows (64 bytes) then 64 scale rows (8 bytes): thread (g, t) of warp w takes keys 16 w + g
// and + 8, bytes [16 t, 16 t + 16) of each (dims 32 t .. 32 t + 31, register_qk's permuted k
// order), times their block scales (e2m1_pair_times_scale, scaled down). A registers of a k step:
// rows g, g + 8 of its first 8 k, then of its last 8.
template <class Fragment>
__device__ __forceinline__ void widen_nvfp4_keys_as_a(Fragment& frag, const std::uint8_t* tile,
                                                      int warp, int lane) {
  namespace cv = flashmsa::cuda::convert;
  auto regs = cute::recast<std::uint32_t>(frag);
  uint4 row[2];
  std::uint32_t scales[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = 16 * warp + lane / 4 + 8 * r;
    row[r] = *reinterpret_cast<const uint4*>(tile + key * 64 + (lane % 4) * 16);
    const std::uint32_t pair =
        *reinterpret_cast<const std::uint16_t*>(tile + 64 * 64 + key * 8 + (lane % 4) * 2);
    scales[r] = cv::bf16x2_mul(cv::e4m3x2_to_bf16x2_cvt(pair, 0), cv::kE2m1ScaleUp);
  }
#pragma unroll
  for (int s = 0; s < 8; ++s) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::uint32_t word = (&row[r].x)[s / 2];
      const std::uint32_t scale = cv::prmt(scales[r], 0, s < 4 ? 0x1010u : 0x3232u);
      if (s % 2 == 0) {
        regs(4 * s + r) = cv::e2m1_pair_times_scale<0, true>(word, scale);
        regs(4 * s + 2 + r) = cv::e2m1_pair_times_scale<1, true>(word, scale);
      } else {
        regs(4 * s + r) = cv::e2m1_pair_times_scale<2, true>(word, scale);
        regs(4 * s + 2 + r) = cv::e2m1_pair_times_scale<3, true>(word, scale);
      }
    }
  }
}

// The inner loop of a decode tile that converts each NVFP4 page once for all its rows
// (docs/performance.md, NVFP4 decode): S^T = K Q^T with the keys as wgmma's register A operand (M =
// 64 keys a warpgroup, K = 128 dims) and 4 rows x 16 heads as the shared-memory B operand (N = 64).
// The warps widen the A fragments (widen_nvfp4_keys_as_a) into one of two register buffers while
// the wgmma of the other runs. kConvert false converts once before the loop: the wgmma alone. N 16
// is one row's heads: the same tile with MMAs only for the rows that selected a page, kRows of
// them (each its own B tile and accumulators) multiplying each widened A fragment.
template <bool kConvert, int kN, int kRows, int kWarpGroups, class Atom>
__global__ void __launch_bounds__(128 * kWarpGroups, 1)
    wgmma_rs_nvfp4_kernel(int iters, float* sink) {
  using namespace cute;
  constexpr int kM = 64, kK = 128;
  constexpr int kCodeTiles = 4;                 // code tiles a warpgroup cycles through
  constexpr int kTileBytes = kM * 64 + kM * 8;  // 64 keys: codes, then E4M3 scales
  auto sA_layout =
      tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, Shape<Int<kM>, Int<kK>>{});
  auto sB_layout =
      tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, Shape<Int<kN>, Int<kK>>{});
  extern __shared__ __align__(1024) std::uint8_t smem[];
  auto* b_base = reinterpret_cast<bfloat16_t*>(smem);
  const int b_bytes = kRows * cosize(sB_layout) * int(sizeof(bfloat16_t));
  std::uint8_t* codes = smem + b_bytes;
  const int total = b_bytes + kWarpGroups * kCodeTiles * kTileBytes;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const std::uint32_t h = (i * 2654435761u) >> 13;
    // B: small finite bf16; codes: any nibble; scales: E4M3 of exponent fields 4..7 (no NaN).
    const bool scale = i >= b_bytes && (i - b_bytes) % kTileBytes >= kM * 64;
    smem[i] = static_cast<std::uint8_t>(i < b_bytes ? ((i & 1) ? 0x3C | (h & 0x83) : h & 0xB7)
                                        : scale     ? 0x20 | (h & 0x3F)
                                                    : h);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic stores -> wgmma reads
  __syncthreads();
  const int wg = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  Tensor sA = make_tensor(make_smem_ptr(b_base), sA_layout);  // shape only: A is in registers
  TiledMMA mma = make_tiled_mma(Atom{});
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor tCrA0 = thr.partition_fragment_A(sA);
  Tensor tCrA1 = thr.partition_fragment_A(sA);
  auto b_fragment = [&](int r) {  // row r's B tile (its heads' Q^T)
    return thr.make_fragment_B(
        thr.partition_B(make_tensor(make_smem_ptr(b_base + r * cosize(sB_layout)), sB_layout)));
  };
  decltype(b_fragment(0)) tCrB[kRows];
  decltype(partition_fragment_C(mma, Shape<Int<kM>, Int<kN>>{})) acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    tCrB[r] = b_fragment(r);
    clear(acc[r]);
  }
  const std::uint8_t* my_codes = codes + wg * kCodeTiles * kTileBytes;
  auto widen = [&](auto& frag, int tile) {
    widen_nvfp4_keys_as_a(frag, my_codes + tile * kTileBytes, warp, lane);
  };
  auto multiply = [&](auto& frag) {
    warpgroup_fence_operand(frag);
#pragma unroll
    for (int r = 0; r < kRows; ++r) warpgroup_fence_operand(acc[r]);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(frag); ++k) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) gemm(mma, frag(_, _, k), tCrB[r](_, _, k), acc[r]);
    }
    warpgroup_commit_batch();
  };
  widen(tCrA0, 0);
  if constexpr (!kConvert) widen(tCrA1, 1);
  for (int it = 0; it < iters; it += 2) {
    // Each buffer is widened while the other's wgmma runs, then waited for before its reuse.
    multiply(tCrA0);
    if constexpr (kConvert) widen(tCrA1, (it + 1) % kCodeTiles);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tCrA0);
    multiply(tCrA1);
    if constexpr (kConvert) widen(tCrA0, (it + 2) % kCodeTiles);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tCrA1);
  }
  float s = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    warpgroup_fence_operand(acc[r]);
    for (int i = 0; i < size(acc[r]); ++i) s += acc[r](i);
  }
  if (s == 1.2345f) sink[0] = s;
}

template <bool kConvert, int kN, int kRows, int kWarpGroups>
void wgmma_rs_nvfp4_case(float* sink) {
  using Atom = std::conditional_t<
      kN == 64, cute::SM90_64x64x16_F32BF16BF16_RS<cute::GMMA::Major::K, cute::GMMA::Major::K>,
      cute::SM90_64x16x16_F32BF16BF16_RS<cute::GMMA::Major::K, cute::GMMA::Major::K>>;
  auto kernel = wgmma_rs_nvfp4_kernel<kConvert, kN, kRows, kWarpGroups, Atom>;
  const int smem = kRows * kN * 128 * 2 + kWarpGroups * 4 * (64 * 64 + 64 * 8);
  set_smem(kernel, smem);
  const int iters = 4096;
  const double us = time_us([&] { kernel<<<g_sms, 128 * kWarpGroups, smem>>>(iters, sink); }, 3);
  const double widened = double(iters) * kWarpGroups * g_sms;  // 64 x 128 codes each
  const double products = widened * kRows;                     // 64 x kN x 128 each
  const double codes_per_clk = widened * 64 * 128 / (us * 1e-6) / g_sms / (g_clock_ghz * 1e9);
  record("wgmma",
         "bf16 M64 x N" + std::to_string(kN) + " x K128, A from registers" +
             (kRows > 1 ? " for " + std::to_string(kRows) + " B tiles" : std::string()) +
             (kConvert ? ", A widened from NVFP4 codes every time" : " (widened once)") + ", " +
             std::to_string(kWarpGroups) + " warpgroup" + (kWarpGroups > 1 ? "s" : "") + "/SM",
         2.0 * 64 * kN * 128 * products / us * 1e-6, "TFLOP/s",
         {{"type", "bf16"},
          {"n", kN},
          {"b_tiles", kRows},
          {"warpgroups", kWarpGroups},
          {"a_from", kConvert ? "nvfp4 codes" : "registers"},
          {"codes_per_clk_per_sm", kConvert ? codes_per_clk : 0.0}});
}

// A whole NVFP4 page of that tile, with its softmax or without (kSoftmax): each of two
// warpgroups widens its 64 keys' K codes into S^T's A
// fragments (M 64 keys, K 128 dims) and their V codes into O^T's (M 64 dims twice, K 64 keys:
// n-tile-free dim order, thread (g, t) takes dims 4 c + {0, 1} (M block 0) and + {2, 3} (block 1)
// of keys 2 t, 2 t + 1, 2 t + 8, 2 t + 9 of each 16-key step, a byte permute pairing two keys'
// codes as register_pv does), then runs S^T = K Q_r^T (8 x m64n16k16) and O_r^T += V^T P_r^T
// (2 x 4 x m64n16k16) for kRows rows, B tiles from shared memory. With kSoftmax, between the two
// products each row's online softmax along M: the column (head) max of the warp's keys by
// shuffles, the warpgroup's by a shared-memory exchange and a named barrier, O^T rescaled, P
// written as the row's P^T tile (bf16), then a proxy fence and a barrier before O^T's wgmma reads
// it. (The accumulators' values mean nothing: the data are arbitrary; the work is the tile's.)
// The two warpgroups alternate between widening and MMAs by themselves. Clocks a page per SM: the
// tile's page rate without HBM or selection.
template <int kRows, bool kSoftmax>
__global__ void __launch_bounds__(256, 1) nvfp4_page_skeleton_kernel(int iters, float* sink) {
  using namespace cute;
  namespace cv = flashmsa::cuda::convert;
  using Atom = SM90_64x16x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::K>;
  constexpr int kCodeTiles = 4;
  constexpr int kTileBytes = 2 * (64 * 64 + 64 * 8);  // 64 keys: K codes, scales, V codes, scales
  auto s_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, Shape<_64, _128>{});
  auto v_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, Shape<_64, _64>{});
  auto q_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, Shape<_16, _128>{});
  auto p_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, Shape<_16, _64>{});
  extern __shared__ __align__(1024) std::uint8_t smem[];
  auto* q_base = reinterpret_cast<bfloat16_t*>(smem);  // kRows Q_r^T tiles, then 2 x kRows P^T
  auto* p_base = q_base + kRows * cosize(q_layout);
  const int b_bytes = (kRows * cosize(q_layout) + 2 * kRows * cosize(p_layout)) * 2;
  std::uint8_t* codes = smem + b_bytes;
  // kSoftmax: each warp's column maxima, [warpgroup][row][warp][16 heads] (a row its own slots:
  // no warp overwrites a row's maxima before every warp has read them)
  auto* exchange = reinterpret_cast<float*>(codes + 2 * kCodeTiles * kTileBytes);
  const int total = b_bytes + 2 * kCodeTiles * kTileBytes;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const std::uint32_t h = (i * 2654435761u) >> 13;
    const int c = (i - b_bytes) % (kTileBytes / 2);
    smem[i] = static_cast<std::uint8_t>(i < b_bytes    ? ((i & 1) ? 0x3C | (h & 0x83) : h & 0xB7)
                                        : c >= 64 * 64 ? 0x20 | (h & 0x3F)
                                                       : h);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const int wg = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  TiledMMA mma = make_tiled_mma(Atom{});
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor kfrag = thr.partition_fragment_A(make_tensor(make_smem_ptr(q_base), s_layout));
  Tensor vfrag0 = thr.partition_fragment_A(make_tensor(make_smem_ptr(q_base), v_layout));
  Tensor vfrag1 = thr.partition_fragment_A(make_tensor(make_smem_ptr(q_base), v_layout));
  auto q_fragment = [&](int r) {
    return thr.make_fragment_B(
        thr.partition_B(make_tensor(make_smem_ptr(q_base + r * cosize(q_layout)), q_layout)));
  };
  auto p_fragment = [&](int r) {
    return thr.make_fragment_B(thr.partition_B(
        make_tensor(make_smem_ptr(p_base + (wg * kRows + r) * cosize(p_layout)), p_layout)));
  };
  using Acc = decltype(partition_fragment_C(mma, Shape<_64, _16>{}));
  decltype(q_fragment(0)) qf[kRows];
  decltype(p_fragment(0)) pf[kRows];
  Acc s_acc[kRows], o_acc[kRows][2];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    qf[r] = q_fragment(r);
    pf[r] = p_fragment(r);
    clear(s_acc[r]);
    clear(o_acc[r][0]);
    clear(o_acc[r][1]);
  }
  const std::uint8_t* my_codes = codes + wg * kCodeTiles * kTileBytes;
  auto widen = [&](int tile) {
    const std::uint8_t* k_codes = my_codes + tile * kTileBytes;
    const std::uint8_t* v_codes = k_codes + kTileBytes / 2;
    widen_nvfp4_keys_as_a(kfrag, k_codes, warp, lane);
    // V^T: per 16-key step, the two code bytes (4 dims) of keys 2 t, 2 t + 1, 2 t + 8, 2 t + 9;
    // byte 0 feeds M block 0, byte 1 block 1. In the word [key 2 t, key 2 t + 8, key 2 t + 1,
    // key 2 t + 9] of one byte, codes (j, j + 4) are the A registers (row g = the byte's low dim:
    // keys 2 t, 2 t + 1), (row g + 8 = its high dim: the same keys), then both for keys + 8.
    auto v0 = recast<std::uint32_t>(vfrag0);
    auto v1 = recast<std::uint32_t>(vfrag1);
    const int dim_byte = 16 * warp + 2 * g;  // dims 4 c .. 4 c + 3, c = 8 warp + g: bytes b, b + 1
#pragma unroll
    for (int st = 0; st < 4; ++st) {
      std::uint32_t b[4], sc[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int key = 16 * st + 2 * t + (k & 1) + 8 * (k >> 1);
        b[k] = *reinterpret_cast<const std::uint16_t*>(v_codes + key * 64 + dim_byte);
        sc[k] = v_codes[64 * 64 + key * 8 + dim_byte / 8];
      }
      const std::uint32_t lo_scale = cv::e4m3x2_to_bf16x2_cvt(cv::prmt(sc[0], sc[1], 0x40), 0);
      const std::uint32_t hi_scale = cv::e4m3x2_to_bf16x2_cvt(cv::prmt(sc[2], sc[3], 0x40), 0);
      const std::uint32_t s_lo = cv::bf16x2_mul(lo_scale, cv::kE2m1ScaleUp);
      const std::uint32_t s_hi = cv::bf16x2_mul(hi_scale, cv::kE2m1ScaleUp);
      const std::uint32_t ab = cv::prmt(b[0], b[1], 0x5140);  // bytes k0.0 k1.0 k0.1 k1.1
      const std::uint32_t cd = cv::prmt(b[2], b[3], 0x5140);  // the same of keys + 8
      const std::uint32_t w0 = cv::prmt(ab, cd, 0x5140);      // k0.0 k8.0 k1.0 k9.0
      const std::uint32_t w1 = cv::prmt(ab, cd, 0x7362);      // k0.1 k8.1 k1.1 k9.1
      v0(4 * st + 0) = cv::e2m1_pair_times_scale<0, true>(w0, s_lo);
      v0(4 * st + 1) = cv::e2m1_pair_times_scale<1, true>(w0, s_lo);
      v0(4 * st + 2) = cv::e2m1_pair_times_scale<2, true>(w0, s_hi);
      v0(4 * st + 3) = cv::e2m1_pair_times_scale<3, true>(w0, s_hi);
      v1(4 * st + 0) = cv::e2m1_pair_times_scale<0, true>(w1, s_lo);
      v1(4 * st + 1) = cv::e2m1_pair_times_scale<1, true>(w1, s_lo);
      v1(4 * st + 2) = cv::e2m1_pair_times_scale<2, true>(w1, s_hi);
      v1(4 * st + 3) = cv::e2m1_pair_times_scale<3, true>(w1, s_hi);
    }
  };
  // kSoftmax: each row's running max and sum of the thread's four columns (heads 2 t, 2 t + 1,
  // 2 t + 8, 2 t + 9: accumulator elements {0, 2}, {1, 3}, {4, 6}, {5, 7} of the m64n16 layout).
  float row_max[kRows][4], row_sum[kRows][4];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int c = 0; c < 4; ++c) row_max[r][c] = -INFINITY, row_sum[r][c] = 0.0f;
  }
  const auto p_tile = [&](int r) {
    return make_tensor(make_smem_ptr(p_base + (wg * kRows + r) * cosize(p_layout)), p_layout);
  };
  const auto warpgroup_barrier = [&] {
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
  };
  const auto softmax = [&](int r) {
    auto& sv = s_acc[r];
    float cm[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) cm[c] = fmaxf(sv(c % 2 + 4 * (c / 2)), sv(c % 2 + 4 * (c / 2) + 2));
#pragma unroll
    for (int off = 4; off <= 16; off *= 2) {
#pragma unroll
      for (int c = 0; c < 4; ++c) cm[c] = fmaxf(cm[c], __shfl_xor_sync(0xffffffffu, cm[c], off));
    }
    float* const rows = exchange + (wg * kRows + r) * 64;
    float* mine = rows + warp * 16;
    if (g == 0) {
      *reinterpret_cast<float2*>(mine + 2 * t) = make_float2(cm[0], cm[1]);
      *reinterpret_cast<float2*>(mine + 8 + 2 * t) = make_float2(cm[2], cm[3]);
    }
    warpgroup_barrier();
    float alpha[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int head = 2 * t + c % 2 + 8 * (c / 2);
      float mx = rows[head];
#pragma unroll
      for (int w = 1; w < 4; ++w) mx = fmaxf(mx, rows[w * 16 + head]);
      const float new_max = fmaxf(row_max[r][c], mx * 0.12752f);  // the score scale, log2 units
      alpha[c] = exp2f(row_max[r][c] - new_max);
      row_max[r][c] = new_max;
      row_sum[r][c] *= alpha[c];
    }
#pragma unroll
    for (int mb = 0; mb < 2; ++mb) {
#pragma unroll
      for (int i = 0; i < 8; ++i) o_acc[r][mb](i) *= alpha[i % 2 + 2 * (i / 4)];
    }
    auto sp = p_tile(r);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = i % 2 + 2 * (i / 4);
      const float p = exp2f(sv(i) * 0.12752f - row_max[r][c]);
      row_sum[r][c] += p;
      const int key = 16 * warp + g + 8 * ((i / 2) % 2), head = 2 * t + i % 2 + 8 * (i / 4);
      sp(head, key) = bfloat16_t(p);
    }
  };
  const auto o_products = [&](int r) {  // O_r^T += V^T P_r^T: both M blocks, 4 steps of 16 keys
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k) {
      gemm(mma, vfrag0(_, _, k), pf[r](_, _, k), o_acc[r][0]);
      gemm(mma, vfrag1(_, _, k), pf[r](_, _, k), o_acc[r][1]);
    }
  };
  for (int it = 0; it < iters; ++it) {
    widen(it % kCodeTiles);
    warpgroup_fence_operand(kfrag);
    warpgroup_fence_operand(vfrag0);
    warpgroup_fence_operand(vfrag1);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      warpgroup_fence_operand(s_acc[r]);
      warpgroup_fence_operand(o_acc[r][0]);
      warpgroup_fence_operand(o_acc[r][1]);
    }
    warpgroup_arrive();
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      mma.accumulate_ = kSoftmax ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;  // S^T a page
      CUTE_UNROLL
      for (int k = 0; k < 8; ++k) {
        gemm(mma, kfrag(_, _, k), qf[r](_, _, k), s_acc[r]);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      if constexpr (!kSoftmax) o_products(r);
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    if constexpr (kSoftmax) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        warpgroup_fence_operand(s_acc[r]);
        softmax(r);
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // P^T -> the wgmma's reads
      warpgroup_barrier();
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        warpgroup_fence_operand(o_acc[r][0]);
        warpgroup_fence_operand(o_acc[r][1]);
      }
      warpgroup_arrive();
#pragma unroll
      for (int r = 0; r < kRows; ++r) o_products(r);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
    }
    warpgroup_fence_operand(kfrag);
    warpgroup_fence_operand(vfrag0);
    warpgroup_fence_operand(vfrag1);
  }
  float sum = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    warpgroup_fence_operand(s_acc[r]);
    warpgroup_fence_operand(o_acc[r][0]);
    warpgroup_fence_operand(o_acc[r][1]);
    for (int i = 0; i < size(s_acc[r]); ++i) sum += s_acc[r](i) + o_acc[r][0](i) + o_acc[r][1](i);
#pragma unroll
    for (int c = 0; c < 4; ++c) sum += row_sum[r][c];
  }
  if (sum == 1.2345f) sink[0] = sum;
}

template <int kRows, bool kSoftmax>
void nvfp4_page_skeleton_case(float* sink) {
  auto kernel = nvfp4_page_skeleton_kernel<kRows, kSoftmax>;
  const int smem = (kRows * 16 * 128 + 2 * kRows * 16 * 64) * 2 + 2 * 4 * 2 * (64 * 64 + 64 * 8) +
                   2 * kRows * 4 * 16 * 4;  // the softmax's exchange
  set_smem(kernel, smem);
  const int iters = 2048;
  const double us = time_us([&] { kernel<<<g_sms, 256, smem>>>(iters, sink); }, 3);
  const double clocks_per_page = us * 1e-6 * g_clock_ghz * 1e9 / iters;  // one page a CTA an SM
  record("wgmma",
         "NVFP4 decode page skeleton: K and V widened once, S^T and O^T (m64n16k16, A from "
         "registers)" +
             std::string(kSoftmax ? " with the softmax" : "") + " for " + std::to_string(kRows) +
             " row" + (kRows > 1 ? "s" : "") + ", 2 warpgroups/SM",
         clocks_per_page, "clk/page/SM",
         {{"rows", kRows},
          {"softmax", kSoftmax},
          {"codes_per_clk_per_sm", 128.0 * 256 / clocks_per_page},
          {"tflops", 2.0 * 128 * 16 * 128 * 2 * kRows * iters * g_sms / us * 1e-6}});
}

void bench_wgmma_rs_nvfp4(float* sink) {
  // N 64: four speculative rows' 16 heads in one MMA; N 16: one row's heads (a page's MMAs only
  // for the rows that selected it), one or four rows a widened page.
  wgmma_rs_nvfp4_case<false, 64, 1, 2>(sink);
  wgmma_rs_nvfp4_case<true, 64, 1, 1>(sink);
  wgmma_rs_nvfp4_case<true, 64, 1, 2>(sink);
  wgmma_rs_nvfp4_case<false, 16, 1, 2>(sink);
  wgmma_rs_nvfp4_case<true, 16, 1, 2>(sink);
  wgmma_rs_nvfp4_case<false, 16, 4, 2>(sink);
  wgmma_rs_nvfp4_case<true, 16, 4, 2>(sink);
  nvfp4_page_skeleton_case<1, false>(sink);
  nvfp4_page_skeleton_case<2, false>(sink);
  nvfp4_page_skeleton_case<4, false>(sink);
  nvfp4_page_skeleton_case<1, true>(sink);
  nvfp4_page_skeleton_case<2, true>(sink);
  nvfp4_page_skeleton_case<4, true>(sink);
}

// ---- In-register conversions ----

enum class Widen {
  kBaseline,
  kE4m3F16,
  kE4m3Bf16Cvt,
  kE4m3Bf16Bits,
  kE5m2F16,
  kE5m2Bf16Bits,
  kNvfp4F16Lut,
  kNvfp4F16ScaledShift,
  kNvfp4F16ScaledBytes,
  kNvfp4Bf16PairShift
};

// Each thread widens 8 words of codes `iters` times; the words rotate by a byte each round and
// the results fold into a checksum (the "baseline" variant does only that bookkeeping, so its
// cost can be taken off).
template <Widen kWiden>
__global__ void __launch_bounds__(256)
    convert_kernel(const std::uint32_t* codes, int iters, std::uint32_t* sink) {
  namespace cv = flashmsa::cuda::convert;
  std::uint32_t c[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) c[j] = codes[(blockIdx.x * blockDim.x + threadIdx.x) * 8 + j];
  std::uint32_t acc = 0;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (kWiden == Widen::kBaseline) {
        acc ^= c[j];
      } else if constexpr (kWiden == Widen::kE4m3F16) {
        acc ^= cv::e4m3x2_to_f16x2(c[j], 0) ^ cv::e4m3x2_to_f16x2(c[j], 1);
      } else if constexpr (kWiden == Widen::kE4m3Bf16Cvt) {
        acc ^= cv::e4m3x2_to_bf16x2_cvt(c[j], 0) ^ cv::e4m3x2_to_bf16x2_cvt(c[j], 1);
      } else if constexpr (kWiden == Widen::kE4m3Bf16Bits) {
        acc ^= cv::e4m3x2_to_bf16x2_bits(c[j], 0) ^ cv::e4m3x2_to_bf16x2_bits(c[j], 1);
      } else if constexpr (kWiden == Widen::kE5m2F16) {
        acc ^= cv::e5m2x2_to_f16x2(c[j], 0) ^ cv::e5m2x2_to_f16x2(c[j], 1);
      } else if constexpr (kWiden == Widen::kE5m2Bf16Bits) {
        acc ^= cv::e5m2x2_to_bf16x2_bits(c[j], 0) ^ cv::e5m2x2_to_bf16x2_bits(c[j], 1);
      } else {
        std::uint32_t o[4];
        if constexpr (kWiden == Widen::kNvfp4F16Lut) {
          cv::e2m1x8_to_f16x2_lut(c[j], o);
        } else if constexpr (kWiden == Widen::kNvfp4F16ScaledShift) {
          cv::e2m1x8_to_f16x2_scaled_shift(c[j], o);
        } else if constexpr (kWiden == Widen::kNvfp4F16ScaledBytes) {
          cv::e2m1x8_to_f16x2_scaled_bytes(c[j], o);
        } else {
          o[0] = cv::e2m1_pair_to_bf16x2<0>(c[j]), o[1] = cv::e2m1_pair_to_bf16x2<1>(c[j]);
          o[2] = cv::e2m1_pair_to_bf16x2<2>(c[j]), o[3] = cv::e2m1_pair_to_bf16x2<3>(c[j]);
        }
        acc ^= o[0] ^ o[1] ^ o[2] ^ o[3];
      }
      c[j] = __byte_perm(c[j], c[j], 0x0321);  // next round: other codes in each position
    }
  }
  if (acc == kNever) sink[0] = acc;
}

void bench_convert(const std::uint8_t* random, std::uint32_t* sink) {
  const auto* codes = reinterpret_cast<const std::uint32_t*>(random);
  const int blocks = g_sms * 8, iters = 4096;
  const double words = double(blocks) * 256 * 8 * iters;
  auto per_clock_per_sm = [&](double us, double elements) {
    return elements / (us * 1e-6) / g_sms / (g_clock_ghz * 1e9);
  };
  const double base_us =
      time_us([&] { convert_kernel<Widen::kBaseline><<<blocks, 256>>>(codes, iters, sink); }, 3);
  record("convert", "bookkeeping alone (rotate + xor per word)", per_clock_per_sm(base_us, words),
         "words/clk/SM");
  auto run = [&](auto kernel, const char* name, int elements_per_word, const char* need) {
    const double us = time_us([&] { kernel<<<blocks, 256>>>(codes, iters, sink); }, 3);
    const double elements = words * elements_per_word;
    record("convert", name, per_clock_per_sm(us, elements), "elem/clk/SM",
           {{"net_elem_per_clk_per_sm", per_clock_per_sm(us - base_us, elements)},
            {"needed_at_hbm_rate", need}});
  };
  // Elements per clock per SM that streaming the cache at 4.35 TB/s needs: fp8 one byte per
  // element, NVFP4 two elements per byte (plus its scales).
  run(convert_kernel<Widen::kE4m3F16>, "E4M3 -> f16x2, cvt (F2FP)", 4, "fp8");
  run(convert_kernel<Widen::kE4m3Bf16Cvt>, "E4M3 -> bf16x2, cvt via f16 and f32", 4, "fp8");
  run(convert_kernel<Widen::kE4m3Bf16Bits>, "E4M3 -> bf16x2, bits + mul 2^120 + NaN mask", 4,
      "fp8");
  run(convert_kernel<Widen::kE5m2F16>, "E5M2 -> f16x2, byte permute", 4, "fp8");
  run(convert_kernel<Widen::kE5m2Bf16Bits>, "E5M2 -> bf16x2, bits + mul 2^112 + Inf/NaN mask", 4,
      "fp8");
  run(convert_kernel<Widen::kNvfp4F16Lut>, "NVFP4 E2M1 -> f16x2, prmt lookup + signs", 8, "nvfp4");
  run(convert_kernel<Widen::kNvfp4F16ScaledShift>,
      "NVFP4 E2M1 -> f16x2 * 2^-14, shifts (k order permuted)", 8, "nvfp4");
  run(convert_kernel<Widen::kNvfp4F16ScaledBytes>,
      "NVFP4 E2M1 -> f16x2 * 2^-14, high bytes built in place + prmt (k order permuted)", 8,
      "nvfp4");
  run(convert_kernel<Widen::kNvfp4Bf16PairShift>,
      "NVFP4 E2M1 -> bf16x2, pairs (j, j+4) shifted + mul 2^126 (k order permuted)", 8, "nvfp4");
}

// ---- Key-stationary sparse prefill attention (a gather schedule) ----

// A work item is one K/V page of a kv head (its K plane, then its V plane: 128 keys of two 64-dim
// halves of 128-byte swizzled rows, as the prefill attention's TMA lays them out) and kGroups
// groups of 4 tokens that selected it (4 x 16 q heads: wgmma's M of 64). Warp 0 of the producer
// warpgroup loads the page once and gathers each group's queries (a bulk copy of each token's
// 4 KB) into the ring of the consumer warpgroup that takes the group (groups alternate between
// the two). A consumer computes S = Q K^T (8 x m64n128k16, both operands from shared memory),
// the softmax of this page alone (row max, exp2, row sum: nothing to rescale), O = P V (8 x
// m64n128k16, P from registers) and stores the group's partial: O / l (bf16 or fp32) and each
// row's (max, sum), which a combine pass would merge with the token's other pages' partials (not
// timed here; it reads what this writes). Partials::kNone stores nothing (the cost of the
// stores, by difference). The page's causal mask and the V rows' non-finite check are left out
// (one page in 16 of a long row, and once a page for all its groups). The values mean nothing
// (arbitrary finite data); the work, the loads and the stores are the schedule's. Useful rate:
// 4 x 128 x 128 FLOPs a (query head, page) pair.
namespace gather {
enum class Partials { kNone, kBf16, kFp32 };
constexpr int kPageBytes = 65536, kGroupBytes = 16384, kStages = 2;
constexpr int kSmemBytes = 1024 + kStages * kPageBytes + 2 * kStages * kGroupBytes + 256;
}  // namespace gather

template <int kGroups, gather::Partials kPartials>
__global__ void __launch_bounds__(384, 1)
    gather_kernel(const std::uint8_t* __restrict__ pages, int num_pages,
                  const std::uint8_t* __restrict__ queries, int num_tokens, void* partials,
                  float2* stats, std::size_t partial_rows, int items, float* sink) {
  using namespace flashmsa::cuda;
  using namespace gather;
  static_assert(kGroups % 2 == 0, "the two consumers take a page's groups in turn");
  extern __shared__ std::uint8_t smem_raw[];
  std::uint8_t* smem = smem_raw + (1024u - smem_address(smem_raw) % 1024u) % 1024u;
  std::uint8_t* page_stages = smem;
  std::uint8_t* q_stages = smem + kStages * kPageBytes;  // [consumer][stage]
  auto* barriers = reinterpret_cast<std::uint64_t*>(q_stages + 2 * kStages * kGroupBytes);
  std::uint64_t* page_full = barriers;
  std::uint64_t* page_empty = barriers + kStages;
  std::uint64_t* q_full = barriers + 2 * kStages;   // [consumer][stage]
  std::uint64_t* q_empty = barriers + 4 * kStages;  // [consumer][stage]
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&page_full[s], 1);
      mbarrier_init(&page_empty[s], 8);  // a warp of each consumer's 8
      for (int c = 0; c < 2; ++c) {
        mbarrier_init(&q_full[c * kStages + s], 1);
        mbarrier_init(&q_empty[c * kStages + s], 4);
      }
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  auto mix = [](std::uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
  };
  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x != 0) return;
    int q_count[2] = {0, 0};
    for (int it = 0, item = blockIdx.x; item < items; ++it, item += gridDim.x) {
      const int s = it % kStages;
      if (it >= kStages) mbarrier_wait(&page_empty[s], ((it / kStages) & 1) ^ 1);
      const std::uint8_t* page = pages + std::size_t(mix(item) % num_pages) * kPageBytes;
      mbarrier_arrive_expect_tx(&page_full[s], kPageBytes);
      for (int part = 0; part < 4; ++part) {
        bulk_copy_to_shared(page_stages + s * kPageBytes + part * 16384, page + part * 16384, 16384,
                            &page_full[s]);
      }
      for (int g = 0; g < kGroups; ++g) {
        const int c = g % 2, n = q_count[c]++, qs = n % kStages;
        std::uint64_t* full = &q_full[c * kStages + qs];
        if (n >= kStages) mbarrier_wait(&q_empty[c * kStages + qs], ((n / kStages) & 1) ^ 1);
        mbarrier_arrive_expect_tx(full, kGroupBytes);
        for (int t = 0; t < 4; ++t) {
          const std::uint32_t token = mix(item * 64 + g * 4 + t + 0x5bd1e995u) % num_tokens;
          bulk_copy_to_shared(q_stages + (c * kStages + qs) * kGroupBytes + t * 4096,
                              queries + std::size_t(token) * 4096, 4096, full);
        }
      }
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int c = wg - 1;
  const float scale = 0.12752f;  // 1 / sqrt(128) in log2 units
  float sum_check = 0.0f;
  auto advance = [](std::uint64_t desc, std::uint32_t bytes) {
    return (desc & 0xffffffff00000000ull) | (static_cast<std::uint32_t>(desc) + (bytes >> 4));
  };
  int n = 0;
  for (int it = 0, item = blockIdx.x; item < items; ++it, item += gridDim.x) {
    const int s = it % kStages;
    mbarrier_wait(&page_full[s], (it / kStages) & 1);
    const std::uint64_t k_desc = sw128_descriptor(page_stages + s * kPageBytes);
    const std::uint64_t v_desc =
        sw128_mn_descriptor(page_stages + s * kPageBytes + kPageBytes / 2, 128 * 128);
    // Group n's S = Q K^T into acc (issued and committed, not waited for).
    auto issue_s = [&](float(&acc)[64], int n) {
      const int qs = n % kStages;
      mbarrier_wait(&q_full[c * kStages + qs], (n / kStages) & 1);
      const std::uint64_t q_desc = sw128_descriptor(q_stages + (c * kStages + qs) * kGroupBytes);
      wgmma_fence_accumulators(acc);
      cute::warpgroup_arrive();
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const int half = ks / 4, offset = (ks % 4) * 32;
        wgmma_64x128x16_bf16(advance(q_desc, half * 8192 + offset),
                             advance(k_desc, half * 16384 + offset), acc, ks > 0);
      }
      cute::warpgroup_commit_batch();
    };
    // Once group n's S has landed: its query stage back to the producer.
    auto release_q = [&](float(&acc)[64], int n) {
      wgmma_fence_accumulators(acc);
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&q_empty[c * kStages + n % kStages]);
    };
    // Group g's softmax of this page, O = P V (waited for, with every wgmma issued before it) and
    // its partial.
    auto finish = [&](float(&acc)[64], int g) {
      // The page's softmax (log2 units, the scale folded into the exponent's FFMA); each row's
      // max and sum as the prefill attention reduces them (reduce_rows), then over the quad.
      float t[2], row_max[2], row_sum[2];
      prefill_attention::reduce_rows(
          acc, [](float a, float b) { return fmaxf(a, b); }, t);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = t[h];
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        row_max[h] = mx * scale;
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          acc[4 * j + i] = fast_exp2(fmaf(acc[4 * j + i], scale, -row_max[i / 2]));
      }
      prefill_attention::reduce_rows(
          acc, [](float a, float b) { return a + b; }, t);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = t[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        row_sum[h] = l;
      }
      std::uint32_t pf[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          pf[kk][i] = pack2<__nv_bfloat16>(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1]);
      }
      float o[64];
#pragma unroll
      for (float& x : o) x = 0.0f;
      wgmma_fence_accumulators(o);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        wgmma_64x128x16_rs_accumulate<__nv_bfloat16>(pf[kk], advance(v_desc, kk * 16 * 128), o);
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      wgmma_fence_accumulators(o);
      // The partial: O / l of the group's 64 rows, and each row's (max, sum).
      const std::size_t group_row =
          (std::size_t(item) * kGroups + g) * 64 % partial_rows + 16 * warp + lane / 4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float inv = 1.0f / row_sum[h];
        const std::size_t row = group_row + 8 * h;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const std::size_t at = row * 128 + 8 * j + 2 * (lane % 4);
          const float x = o[4 * j + 2 * h] * inv, y = o[4 * j + 2 * h + 1] * inv;
          if constexpr (kPartials == Partials::kFp32) {
            *reinterpret_cast<float2*>(static_cast<float*>(partials) + at) = make_float2(x, y);
          } else if constexpr (kPartials == Partials::kBf16) {
            *reinterpret_cast<std::uint32_t*>(static_cast<__nv_bfloat16*>(partials) + at) =
                pack2<__nv_bfloat16>(x, y);
          }
        }
        if (kPartials != Partials::kNone && lane % 4 == 0) {
          stats[row] = make_float2(row_max[h], row_sum[h]);
        }
      }
      sum_check += o[0] * row_sum[0] + o[63] * row_sum[1];
    };
    constexpr int kMine = kGroups / 2;  // this consumer's groups of the page: c, c + 2, ...
#pragma unroll 1
    for (int i = 0; i < kMine; ++i) {
      float acc[64];
      issue_s(acc, n + i);
      cute::warpgroup_wait<0>();
      release_q(acc, n + i);
      finish(acc, c + 2 * i);
    }
    n += kMine;
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&page_empty[s]);  // 4 warps a consumer, both consumers
  }
  if (sum_check == 1.2345f) sink[0] = sum_check;
}

__global__ void fill_finite_bf16_kernel(std::uint32_t* p, std::size_t words) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::uint32_t h = static_cast<std::uint32_t>((i + 1) * 0x9E3779B97F4A7C15ull >> 32);
    // Two bf16 values of magnitude in [2^-4, 2): exponents 123..127, any sign and mantissa.
    auto value = [](std::uint32_t x) { return (x & 0x807fu) | ((123u + (x >> 8) % 5) << 7); };
    p[i] = value(h & 0xffffu) | value(h >> 16) << 16;
  }
}

template <int kGroups, gather::Partials kPartials>
void gather_case(const std::uint8_t* pages, int num_pages, const std::uint8_t* queries,
                 int num_tokens, void* partials, float2* stats, std::size_t partial_rows,
                 float* sink) {
  using gather::Partials;
  auto kernel = gather_kernel<kGroups, kPartials>;
  set_smem(kernel, gather::kSmemBytes);
  const int items = g_sms * 1024 / kGroups;  // 1024 groups an SM
  const double us = time_us(
      [&] {
        kernel<<<g_sms, 384, gather::kSmemBytes>>>(pages, num_pages, queries, num_tokens, partials,
                                                   stats, partial_rows, items, sink);
      },
      3);
  const double flops = 4.0 * 128 * 128 * 64 * kGroups * double(items);
  const int value_bytes = kPartials == Partials::kFp32 ? 4 : kPartials == Partials::kBf16 ? 2 : 0;
  const double partial_bytes =
      double(items) * kGroups * 64 * (128 * value_bytes + (value_bytes > 0 ? 8 : 0));
  const char* stored = kPartials == Partials::kFp32   ? "fp32 partials"
                       : kPartials == Partials::kBf16 ? "bf16 partials"
                                                      : "no partials stored";
  const bool in_l2 = num_pages * double(gather::kPageBytes) < 40e6;
  record("gather",
         "page once for " + std::to_string(kGroups) + " groups of 4 tokens, " + stored + ", " +
             std::to_string(num_pages) + " pages" + (in_l2 ? " (in L2)" : ""),
         flops / us * 1e-6, "TFLOP/s",
         {{"groups", kGroups},
          {"partials", stored},
          {"pages", num_pages},
          {"pages_in_l2", in_l2},
          {"partial_write_tb_per_s", partial_bytes / us * 1e-6}});
}

void bench_gather(float* sink) {
  // 1024 pages (one kv head's 64 MB of K/V at 128K: read from HBM, as a long prefill's are) and
  // 32K tokens of queries; 256 MB of partials rewritten in turn (well past the L2).
  const int num_pages = 1024, num_tokens = 32768;
  const std::size_t partial_rows = std::size_t(1) << 19;  // 256 MB of fp32 rows
  std::uint8_t *pages, *queries;
  void* partials;
  float2* stats;
  FLASHMSA_CHECK_CUDA(cudaMalloc(&pages, std::size_t(num_pages) * gather::kPageBytes));
  FLASHMSA_CHECK_CUDA(cudaMalloc(&queries, std::size_t(num_tokens) * 4096));
  FLASHMSA_CHECK_CUDA(cudaMalloc(&partials, partial_rows * 128 * 4));
  FLASHMSA_CHECK_CUDA(cudaMalloc(&stats, partial_rows * sizeof(float2)));
  fill_finite_bf16_kernel<<<g_sms * 8, 256>>>(reinterpret_cast<std::uint32_t*>(pages),
                                              std::size_t(num_pages) * gather::kPageBytes / 4);
  fill_finite_bf16_kernel<<<g_sms * 8, 256>>>(reinterpret_cast<std::uint32_t*>(queries),
                                              std::size_t(num_tokens) * 4096 / 4);
  FLASHMSA_CHECK_CUDA(cudaGetLastError());
  auto run = [&](auto kernel_case, int pages_used) {
    kernel_case(pages, pages_used, queries, num_tokens, partials, stats, partial_rows, sink);
  };
  using gather::Partials;
  run(gather_case<2, Partials::kBf16>, num_pages);
  run(gather_case<2, Partials::kBf16>, 256);
  run(gather_case<4, Partials::kBf16>, num_pages);
  run(gather_case<8, Partials::kBf16>, num_pages);
  run(gather_case<16, Partials::kBf16>, num_pages);
  run(gather_case<16, Partials::kFp32>, num_pages);
  run(gather_case<16, Partials::kNone>, num_pages);
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
  FLASHMSA_CHECK_CUDA(cudaFree(pages));
  FLASHMSA_CHECK_CUDA(cudaFree(queries));
  FLASHMSA_CHECK_CUDA(cudaFree(partials));
  FLASHMSA_CHECK_CUDA(cudaFree(stats));
}

__global__ void fill_random_kernel(std::uint32_t* p, std::size_t n) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    p[i] = static_cast<std::uint32_t>(x);
  }
}

}  // namespace

int run(int argc, char** argv) {
  std::string json_path, only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--json" || a == "--only") && i + 1 < argc) {
      (a == "--json" ? json_path : only) = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--only l2|hbm|launch|wgmma|convert|gather]\n",
                   argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop;
  FLASHMSA_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  FLASHMSA_CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  g_sms = prop.multiProcessorCount;
  g_clock_ghz = clock_khz * 1e-6;
  std::printf("%s, %d SMs, %.2f GHz nominal clock, %.0f MB L2\n", prop.name, g_sms, g_clock_ghz,
              prop.l2CacheSize / 1048576.0);
  if (prop.major != 9) {
    std::fprintf(stderr, "needs a Hopper GPU (sm_90), found sm_%d%d\n", prop.major, prop.minor);
    return 1;
  }
  const std::size_t bytes = std::size_t(4) << 30;  // beyond the L2 many times over
  std::uint8_t* buffer;
  std::uint32_t* sink;
  FLASHMSA_CHECK_CUDA(cudaMalloc(&buffer, bytes));
  FLASHMSA_CHECK_CUDA(cudaMalloc(&sink, 64));
  fill_random_kernel<<<g_sms * 8, 256>>>(reinterpret_cast<std::uint32_t*>(buffer), bytes / 4);
  FLASHMSA_CHECK_CUDA(cudaGetLastError());
  auto want = [&](const char* section) { return only.empty() || only == section; };
  if (want("l2")) bench_l2(buffer, sink);
  if (want("hbm")) bench_hbm(buffer, bytes, sink);
  if (want("launch")) bench_launch();
  if (want("wgmma")) {
    bench_wgmma(reinterpret_cast<float*>(sink));
    bench_wgmma_rs_nvfp4(reinterpret_cast<float*>(sink));
  }
  if (want("convert")) bench_convert(buffer, sink);
  if (want("gather")) bench_gather(reinterpret_cast<float*>(sink));
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
  if (!json_path.empty()) {
    nlohmann::json doc = {
        {"device", prop.name}, {"sms", g_sms}, {"clock_ghz", g_clock_ghz}, {"results", g_results}};
    std::ofstream(json_path) << doc.dump(2) << "\n";
  }
  FLASHMSA_CHECK_CUDA(cudaFree(buffer));
  FLASHMSA_CHECK_CUDA(cudaFree(sink));
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashmsa_hopper_microbench: %s\n", e.what());
    return 1;
  }
}
