// The CUDA fused Q/K/V + index projection (include/flashmsa/projection.hpp): one kernel quantizes
// each token of the bf16 hidden states to E4M3 with its own scale, then the product with the
// packed E4M3 weight, both scale vectors applied after the sums, writes the bf16 fused rows the
// producer reads: for up to 8 tokens a weight-streaming kernel (a programmatic dependent of the
// quantization, its weight reads overlapping it), above one cuBLASLt FP8 GEMM (outer-vector
// scaling, sm_90 and later).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/cuda_ops.hpp"
#include "src/cuda/launch.hpp"
#include "src/cuda/sm90/page_pipeline.cuh"
#include "src/projection_workspace.hpp"

namespace flashmsa::cuda {

namespace {

constexpr int kQuantThreads = 256;
constexpr float kE4m3Max = 448.0f;

// One CTA per token: scale = max |x| / 448 (1 for an all-zero token, NaN with the codes zero for
// a token holding a NaN or infinity, so that its outputs are NaN, as on the CPU), then codes =
// e4m3_satfinite(x / scale), rounded to nearest even: the CPU's quantize_row bit for bit. The
// row is read twice; the second read comes from L1 / L2. The streaming kernel after it (a
// programmatic dependent) may start at once: it reads the weight first.
__global__ void __launch_bounds__(kQuantThreads)
    quantize_tokens_kernel(const __nv_bfloat16* __restrict__ hidden, std::int64_t width,
                           std::uint8_t* __restrict__ codes, float* __restrict__ scales) {
  allow_next_kernel();
  const std::int64_t token = blockIdx.x;
  const auto* row = reinterpret_cast<const uint4*>(hidden + token * width);
  const std::int64_t pieces = width / 8;  // 8 values per 16-byte piece
  float amax = 0.0f;
  bool finite = true;
  for (std::int64_t i = threadIdx.x; i < pieces; i += kQuantThreads) {
    const uint4 raw = row[i];
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(pairs[j]);
      finite = finite && isfinite(f.x) && isfinite(f.y);
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  __shared__ float warp_amax[kQuantThreads / 32];
  __shared__ int warp_finite[kQuantThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  finite = __all_sync(0xffffffffu, finite);
  if (threadIdx.x % 32 == 0) {
    warp_amax[threadIdx.x / 32] = amax;
    warp_finite[threadIdx.x / 32] = finite;
  }
  __syncthreads();
  amax = 0.0f;
  finite = true;
#pragma unroll
  for (int w = 0; w < kQuantThreads / 32; ++w) {
    amax = fmaxf(amax, warp_amax[w]);
    finite = finite && warp_finite[w];
  }
  const float scale = !finite ? __int_as_float(0x7fc00000) : amax > 0.0f ? amax / kE4m3Max : 1.0f;
  if (threadIdx.x == 0) scales[token] = scale;

  auto* out = reinterpret_cast<uint2*>(codes + token * width);
  for (std::int64_t i = threadIdx.x; i < pieces; i += kQuantThreads) {
    const uint4 raw = row[i];
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
    std::uint32_t word[2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(pairs[j]);
      const std::uint32_t two =
          finite ? __nv_cvt_float2_to_fp8x2(make_float2(f.x / scale, f.y / scale), __NV_SATFINITE,
                                            __NV_E4M3)
                 : 0u;
      word[j / 2] = j % 2 == 0 ? two : word[j / 2] | (two << 16);
    }
    out[i] = make_uint2(word[0], word[1]);
  }
}

// ---- Up to 8 tokens (decode): the weight streamed by the TMA --------------------------------
// There the GEMM is a weight stream: cuBLASLt's tiles left most SMs idle (1536 x 1 x 6144 ran on
// 11 CTAs in 29 us, 14x the weight's read time). This kernel runs as a programmatic dependent of
// the quantization kernel, so its weight reads overlap the quantization. Each CTA owns 16 output
// channels (the MMA's M) and all tokens:
//   1. lanes 0..15 of warp 0 issue one bulk copy per (weight row, K quarter) into shared memory,
//      each quarter completing on its own mbarrier: the CTA's whole 16 x K slice is in flight at
//      once (96 KB at K 6144), the compute on quarter 0 starts while the rest streams;
//   2. once the quantization kernel has finished, the CTA copies the tokens' codes (L2) into
//      shared memory;
//   3. its 8 warps split each quarter's 64-byte chunks: mma.sync m16n8k32 E4M3 (exact products,
//      fp32 sums), the warps' sums added in a fixed order, then multiplied by the channel's and
//      the token's scales and rounded to bf16: cuBLASLt's computation up to the order of the
//      fp32 sums.
// (Quantizing the tokens in every CTA instead, which saves the dependency, cost the TP-1 layer
// 118 us at T = 8 on the H200: every CTA repeated 8 x 6144 divisions.)
// K order inside a 64-byte chunk is permuted, the same way for both operands: a thread's 16-byte
// piece t of a weight row holds A's k = 4t..4t+3 and 16 + 4t..16 + 4t + 3 of two MMA steps.
// Shared-memory rows are K + 64 bytes apart, so the two rows one LDS.128 phase reads fall in
// different banks.
constexpr int kStreamMaxTokens = 8;  // the MMA's N
constexpr int kStreamWarps = 8;
constexpr int kStreamThreads = kStreamWarps * 32;
constexpr int kStreamRows = 16;  // output channels per CTA
constexpr int kStreamQuarters = 4;
constexpr int kStreamRowPad = 64;
constexpr int kMaxSmemPerCta = 227 * 1024;  // sm_90's opt-in limit

constexpr std::int64_t stream_row_stride(std::int64_t k) {
  return k + kStreamRowPad;
}
// Dynamic shared memory: the weight slice, the token codes, the barriers.
constexpr std::int64_t stream_smem_bytes(std::int64_t tokens, std::int64_t k) {
  return (kStreamRows + tokens) * stream_row_stride(k) + kStreamQuarters * 8;
}
// K in whole 64-byte chunks per quarter.
constexpr bool stream_path(std::int64_t tokens, std::int64_t k) {
  return tokens <= kStreamMaxTokens && k % (64 * kStreamQuarters) == 0 &&
         stream_smem_bytes(tokens, k) <= kMaxSmemPerCta;
}

__global__ void __launch_bounds__(kStreamThreads)
    project_stream_kernel(const std::uint8_t* __restrict__ weight,
                          const float* __restrict__ weight_scale,
                          const std::uint8_t* __restrict__ codes,
                          const float* __restrict__ token_scale, __nv_bfloat16* __restrict__ out,
                          int n, int k, int tokens) {
  extern __shared__ __align__(128) std::byte smem[];
  const int stride = static_cast<int>(stream_row_stride(k));
  auto* w_tile = reinterpret_cast<std::uint8_t*>(smem);
  auto* x_tile = w_tile + kStreamRows * stride;
  auto* quarter_full = reinterpret_cast<std::uint64_t*>(x_tile + tokens * stride);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = blockIdx.x * kStreamRows;
  const int quarter_bytes = k / kStreamQuarters;

  // 1. The weight slice (nothing earlier in the stream writes it while this kernel may run: the
  // quantization kernel before it only started once all earlier work had finished). Rows past n
  // copy row n - 1 (never stored).
  if (threadIdx.x == 0) {
    for (int q = 0; q < kStreamQuarters; ++q) mbarrier_init(&quarter_full[q], 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (warp == 0) {
    if (lane == 0) {
      for (int q = 0; q < kStreamQuarters; ++q) {
        mbarrier_arrive_expect_tx(&quarter_full[q], kStreamRows * quarter_bytes);
      }
    }
    __syncwarp();
    if (lane < kStreamRows) {
      const std::uint8_t* src = weight + std::int64_t{min(row0 + lane, n - 1)} * k;
      for (int q = 0; q < kStreamQuarters; ++q) {
        bulk_copy_to_shared(w_tile + lane * stride + q * quarter_bytes, src + q * quarter_bytes,
                            quarter_bytes, &quarter_full[q]);
      }
    }
  }

  // 2. The tokens' codes, once the quantization kernel is done.
  wait_for_previous_kernel();
  const int pieces = k / 16;
  for (int i = threadIdx.x; i < tokens * pieces; i += kStreamThreads) {
    const int tok = i / pieces, piece = i % pieces;
    *reinterpret_cast<uint4*>(x_tile + tok * stride + 16 * piece) =
        __ldcg(reinterpret_cast<const uint4*>(codes + std::int64_t{tok} * k) + piece);
  }
  __syncthreads();

  // 3. The product, quarter by quarter as the copies land.
  const int g = lane / 4, t = lane % 4;
  const std::uint8_t* a_lo = w_tile + g * stride + 16 * t;
  const std::uint8_t* a_hi = a_lo + 8 * stride;
  const std::uint8_t* b_row = x_tile + g * stride + 16 * t;
  const bool live_token = g < tokens;
  float acc[4] = {};
  const int quarter_chunks = quarter_bytes / 64;
#pragma unroll
  for (int q = 0; q < kStreamQuarters; ++q) {
    mbarrier_wait(&quarter_full[q], 0);
#pragma unroll 3
    for (int c = q * quarter_chunks + warp; c < (q + 1) * quarter_chunks; c += kStreamWarps) {
      const uint4 lo = *reinterpret_cast<const uint4*>(a_lo + c * 64);
      const uint4 hi = *reinterpret_cast<const uint4*>(a_hi + c * 64);
      const uint4 b =
          live_token ? *reinterpret_cast<const uint4*>(b_row + c * 64) : make_uint4(0, 0, 0, 0);
      const std::uint32_t step0[4] = {lo.x, hi.x, lo.y, hi.y};
      const std::uint32_t step1[4] = {lo.z, hi.z, lo.w, hi.w};
      mma_e4m3_16832(acc, step0, b.x, b.y);
      mma_e4m3_16832(acc, step1, b.z, b.w);
    }
  }

  // The warps' sums, added in warp order (in the weight slice's first 4 KB, now read by all);
  // then the scales and the store (16 channels of a token are 32 contiguous bytes).
  __syncthreads();
  auto* partial = reinterpret_cast<float*>(smem);  // [warp][16 channels][8 tokens]
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    partial[(warp * kStreamRows + g + 8 * (j / 2)) * kStreamMaxTokens + 2 * t + j % 2] = acc[j];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kStreamRows * kStreamMaxTokens; i += kStreamThreads) {
    const int r = i % kStreamRows, token = i / kStreamRows;
    const int row = row0 + r;
    if (row >= n || token >= tokens) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kStreamWarps; ++w) {
      sum += partial[(w * kStreamRows + r) * kStreamMaxTokens + token];
    }
    out[std::int64_t{token} * n + row] =
        __float2bfloat16_rn(sum * weight_scale[row] * token_scale[token]);
  }
}

#define FLASHMSA_CHECK_CUBLAS(expr)                                                             \
  do {                                                                                          \
    const cublasStatus_t flashmsa_cublas_status_ = (expr);                                      \
    if (flashmsa_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                        \
      throw Error(ErrorKind::kCuda, detail::concat(#expr, " failed: cublasStatus_t ",           \
                                                   static_cast<int>(flashmsa_cublas_status_))); \
    }                                                                                           \
  } while (0)

// cuBLASLt's handle per device and the algorithm chosen per GEMM shape, created once (the
// heuristic query is host work that a captured graph must not repeat per replay anyway).
struct LtCache {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;
  std::map<std::tuple<int, std::int64_t, std::int64_t, std::int64_t>, cublasLtMatmulAlgo_t> algos;
};
LtCache& lt_cache() {
  static LtCache* cache = new LtCache;  // never destroyed: handles outlive static destructors
  return *cache;
}

// RAII owners of the descriptors of one GEMM call.
struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc); }
};
struct MatrixLayout {
  cublasLtMatrixLayout_t layout = nullptr;
  ~MatrixLayout() { cublasLtMatrixLayoutDestroy(layout); }
};
struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  ~Preference() { cublasLtMatmulPreferenceDestroy(pref); }
};

constexpr float kOne = 1.0f, kZero = 0.0f;  // alpha, beta

// cuBLASLt's first heuristic choice is not always its fastest kernel for these shapes: the first
// call per shape times this many of its candidates and keeps the fastest.
constexpr int kAlgoCandidates = 8;

// Whether work on `stream` is being captured into a graph (then nothing may be timed or
// synchronised). A stream that cannot be asked counts as capturing.
bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it for the launch checks that follow
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

// The index of the fastest of `count` candidates, run(i) launching candidate i on `stream`
// (a failing candidate is never chosen; candidate 0 if all fail). One warm-up run, then the
// median of 3 timed runs each; synchronises the stream.
template <class Run>
int fastest_algo(int count, Run&& run, cudaStream_t stream) {
  cudaEvent_t marks[4];
  for (auto& e : marks) FLASHMSA_CHECK_CUDA(cudaEventCreate(&e));
  int best = 0;
  float best_ms = INFINITY;
  for (int i = 0; i < count; ++i) {
    if (run(i) != CUBLAS_STATUS_SUCCESS) continue;
    float ms[3];
    bool ok = cudaEventRecord(marks[0], stream) == cudaSuccess;
    for (int r = 0; r < 3 && ok; ++r) {
      ok = run(i) == CUBLAS_STATUS_SUCCESS && cudaEventRecord(marks[r + 1], stream) == cudaSuccess;
    }
    FLASHMSA_CHECK_CUDA(cudaStreamSynchronize(stream));
    if (!ok) continue;
    for (int r = 0; r < 3; ++r) {
      FLASHMSA_CHECK_CUDA(cudaEventElapsedTime(&ms[r], marks[r], marks[r + 1]));
    }
    std::sort(ms, ms + 3);
    if (ms[1] < best_ms) {
      best_ms = ms[1];
      best = i;
    }
  }
  for (auto& e : marks) cudaEventDestroy(e);
  return best;
}

}  // namespace

void project_qkv_index(const ProjectionWeightView& weights, const TensorView& hidden,
                       const TensorView& out, const TensorView& workspace, void* stream_ptr) {
  const std::int64_t tokens = hidden.shape[0], k = hidden.shape[1], n = weights.weight.shape[0];
  const auto l = detail::projection_workspace_layout(tokens, k);
  std::byte* ws = checked_workspace(workspace, l.total, "projection_workspace_bytes");
  FLASHMSA_CHECK_ARG(aligned(hidden.data, 16) && aligned(weights.weight.data, 16) &&
                         aligned(out.data, 16) && aligned(weights.scale.data, 16),
                     "hidden, out, weights.weight and weights.scale must be 16-byte aligned on "
                     "the CUDA backend");
  if (tokens == 0) return;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  auto* codes = reinterpret_cast<std::uint8_t*>(ws + l.codes);
  auto* token_scales = reinterpret_cast<float*>(ws + l.scales);
  launch_kernel(quantize_tokens_kernel, dim3(static_cast<unsigned>(tokens)), kQuantThreads, 0,
                stream, static_cast<const __nv_bfloat16*>(hidden.data), k, codes, token_scales);

  if (stream_path(tokens, k)) {
    launch_dependent_kernel(
        project_stream_kernel, dim3(static_cast<unsigned>(ceil_div(n, kStreamRows))),
        kStreamThreads, static_cast<int>(stream_smem_bytes(tokens, k)), stream,
        static_cast<const std::uint8_t*>(weights.weight.data),
        static_cast<const float*>(weights.scale.data), static_cast<const std::uint8_t*>(codes),
        static_cast<const float*>(token_scales), static_cast<__nv_bfloat16*>(out.data),
        static_cast<int>(n), static_cast<int>(k), static_cast<int>(tokens));
    return;
  }

  // Column-major view for cuBLASLt: D[n, T] = op(A) B with A the weight (K x n, K-major, so
  // transposed) and B the codes (K x T): D is the row-major [T, n] output. Scale A per row of
  // op(A) (output channel), B per column (token).
  int device = 0;
  FLASHMSA_CHECK_CUDA(cudaGetDevice(&device));
  LtCache& cache = lt_cache();
  std::unique_lock lock(cache.mutex);
  auto& handle = cache.handles[device];
  if (handle == nullptr) FLASHMSA_CHECK_CUBLAS(cublasLtCreate(&handle));

  MatmulDesc op;
  FLASHMSA_CHECK_CUBLAS(cublasLtMatmulDescCreate(&op.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  const cublasLtMatmulMatrixScale_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const std::int8_t no_fast_accum = 0;  // fp32 accumulation throughout
  const void* a_scale = weights.scale.data;
  const void* b_scale = token_scales;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, std::size_t size) {
    FLASHMSA_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op.desc, attr, value, size));
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans));
  set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &no_fast_accum, sizeof(no_fast_accum));
  set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof(outer));
  set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof(outer));
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale));
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale));

  MatrixLayout a, b, d;
  FLASHMSA_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&a.layout, CUDA_R_8F_E4M3, k, n, k));
  FLASHMSA_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&b.layout, CUDA_R_8F_E4M3, k, tokens, k));
  FLASHMSA_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d.layout, CUDA_R_16BF, n, tokens, n));

  const auto key = std::make_tuple(device, tokens, n, k);
  auto found = cache.algos.find(key);
  if (found == cache.algos.end()) {
    Preference pref;
    FLASHMSA_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref.pref));
    const std::uint64_t limit = detail::kProjectionGemmWorkspaceBytes;
    FLASHMSA_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limit, sizeof(limit)));
    cublasLtMatmulHeuristicResult_t results[kAlgoCandidates]{};
    int count = 0;
    FLASHMSA_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle, op.desc, a.layout, b.layout,
                                                         d.layout, d.layout, pref.pref,
                                                         kAlgoCandidates, results, &count));
    if (count == 0) {
      throw Error(ErrorKind::kUnsupported,
                  detail::concat("project_qkv_index: cuBLASLt has no FP8 GEMM with per-channel and "
                                 "per-token scales for ",
                                 tokens, " x ", n, " x ", k,
                                 " on this device (needs sm_90+ and "
                                 "cuBLAS 12.9+)"));
    }
    int best = 0;
    if (count > 1 && !stream_is_capturing(stream)) {
      best = fastest_algo(
          count,
          [&](int i) {
            return cublasLtMatmul(handle, op.desc, &kOne, weights.weight.data, a.layout, codes,
                                  b.layout, &kZero, out.data, d.layout, out.data, d.layout,
                                  &results[i].algo, ws + l.gemm,
                                  detail::kProjectionGemmWorkspaceBytes, stream);
          },
          stream);
    }
    found = cache.algos.emplace(key, results[best].algo).first;
  }
  const cublasLtMatmulAlgo_t algo = found->second;
  lock.unlock();

  FLASHMSA_CHECK_CUBLAS(cublasLtMatmul(handle, op.desc, &kOne, weights.weight.data, a.layout, codes,
                                       b.layout, &kZero, out.data, d.layout, out.data, d.layout,
                                       &algo, ws + l.gemm, detail::kProjectionGemmWorkspaceBytes,
                                       stream));
}

}  // namespace flashmsa::cuda
