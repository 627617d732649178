// The CUDA fused Q/K/V + index projection (include/flashmsa/projection.hpp): one kernel quantizes
// each token of the bf16 hidden states to E4M3 with its own scale, then the product with the
// packed E4M3 weight, both scale vectors applied after the sums, writes the bf16 fused rows the
// producer reads: for up to 8 tokens a weight-streaming mma.sync kernel, above one cuBLASLt FP8
// GEMM (outer-vector scaling, sm_90 and later).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <map>
#include <mutex>
#include <tuple>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/cuda_ops.hpp"
#include "src/cuda/launch.hpp"
#include "src/projection_workspace.hpp"

namespace flashmsa::cuda {

namespace {

constexpr int kQuantThreads = 256;
constexpr float kE4m3Max = 448.0f;

// One CTA per token: scale = max |x| / 448 (1 for an all-zero token, NaN with the codes zero for
// a token holding a NaN or infinity, so that its outputs are NaN, as on the CPU), then codes =
// e4m3_satfinite(x / scale), rounded to nearest even: the CPU's quantize_row bit for bit. The
// row is read twice; the second read comes from L1 / L2.
__global__ void __launch_bounds__(kQuantThreads)
    quantize_tokens_kernel(const __nv_bfloat16* __restrict__ hidden, std::int64_t width,
                           std::uint8_t* __restrict__ codes, float* __restrict__ scales) {
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

// Up to 8 tokens (decode) the GEMM is a weight stream: cuBLASLt's tiles left most SMs idle there
// (1536 x 1 x 6144 ran on 11 CTAs in 29 us, 14x the weight's read time). This kernel gives
// each CTA 16 output channels and all tokens; its 8 warps split K and stream the weight rows once
// (16-byte loads, kStreamUnroll 64-byte chunks in flight per thread) into mma.sync m16n8k32 E4M3
// (exact products, fp32 sums); the warps' sums are added in a fixed order, then multiplied by the
// channel's and the token's scales and rounded to bf16: cuBLASLt's computation up to the order of
// the fp32 sums. K order inside a 64-byte chunk is permuted, the same way for both operands: a
// thread's 16-byte piece t of a weight row holds A's k = 4t..4t+3 (and 16 + 4t.. ) of two MMA
// steps.
// (Measured on the H200: 16.6 us for a TP-8 rank at T = 1 against cuBLASLt's 29.4; 36.0 against
// 39.3 for the whole layer. With more token tiles every CTA re-reads all tokens' codes from L2:
// T = 64 took 87.6 us against cuBLASLt's 32.7, so only one tile of 8 tokens is used.)
constexpr int kStreamMaxTokens = 8;
constexpr int kStreamWarps = 8;

__global__ void __launch_bounds__(kStreamWarps * 32)
    project_stream_kernel(const std::uint8_t* __restrict__ weight,
                          const float* __restrict__ weight_scale,
                          const std::uint8_t* __restrict__ codes,
                          const float* __restrict__ token_scale, __nv_bfloat16* __restrict__ out,
                          int n, int k, int tokens) {
  constexpr int kNTiles = 1;  // tiles of 8 tokens (kStreamMaxTokens)
  constexpr int kUnroll = 4;  // chunks per thread in flight
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * 16;
  // Rows past n read row n - 1 (never stored): every load stays in the weight.
  const auto* wa = reinterpret_cast<const uint4*>(weight + std::int64_t{min(row0 + g, n - 1)} * k);
  const auto* wb =
      reinterpret_cast<const uint4*>(weight + std::int64_t{min(row0 + g + 8, n - 1)} * k);
  float acc[kNTiles][4] = {};
  const int chunks = k / 64;
  for (int c0 = warp * kUnroll; c0 < chunks; c0 += kStreamWarps * kUnroll) {
    uint4 a_lo[kUnroll], a_hi[kUnroll];
    uint2 b[kUnroll][kNTiles][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u;
      const bool live = c < chunks;
      a_lo[u] = live ? __ldg(wa + c * 4 + t) : make_uint4(0, 0, 0, 0);
      a_hi[u] = live ? __ldg(wb + c * 4 + t) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int token = nt * 8 + g;
        const auto* src =
            reinterpret_cast<const uint2*>(codes + std::int64_t{token} * k + c * 64 + 16 * t);
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          b[u][nt][step] = live && token < tokens ? __ldg(src + step) : make_uint2(0, 0);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int step = 0; step < 2; ++step) {
        const std::uint32_t lo[4] = {a_lo[u].x, a_lo[u].y, a_lo[u].z, a_lo[u].w};
        const std::uint32_t hi[4] = {a_hi[u].x, a_hi[u].y, a_hi[u].z, a_hi[u].w};
        const std::uint32_t a[4] = {lo[2 * step], hi[2 * step], lo[2 * step + 1], hi[2 * step + 1]};
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          mma_e4m3_16832(acc[nt], a, b[u][nt][step].x, b[u][nt][step].y);
        }
      }
    }
  }
  // The warps' sums, added in warp order; then scales and the store (16 channels of a token are
  // 32 contiguous bytes).
  __shared__ float partial[kStreamWarps][kNTiles][16][8];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[warp][nt][g + 8 * (j / 2)][2 * t + j % 2] = acc[nt][j];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kNTiles * 128; i += kStreamWarps * 32) {
    const int r = i % 16, col = (i / 16) % 8, nt = i / 128;
    const int row = row0 + r, token = nt * 8 + col;
    if (row >= n || token >= tokens) continue;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kStreamWarps; ++w) sum += partial[w][nt][r][col];
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

  if (tokens <= kStreamMaxTokens && k % 64 == 0) {
    const auto* w = static_cast<const std::uint8_t*>(weights.weight.data);
    const auto* ws_scale = static_cast<const float*>(weights.scale.data);
    auto* o = static_cast<__nv_bfloat16*>(out.data);
    const dim3 grid(static_cast<unsigned>(ceil_div(n, 16)));
    const int ni = static_cast<int>(n), ki = static_cast<int>(k), ti = static_cast<int>(tokens);
    launch_kernel(project_stream_kernel, grid, kStreamWarps * 32, 0, stream, w, ws_scale, codes,
                  token_scales, o, ni, ki, ti);
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
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    FLASHMSA_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(
        handle, op.desc, a.layout, b.layout, d.layout, d.layout, pref.pref, 1, &result, &count));
    if (count == 0) {
      throw Error(ErrorKind::kUnsupported,
                  detail::concat("project_qkv_index: cuBLASLt has no FP8 GEMM with per-channel and "
                                 "per-token scales for ",
                                 tokens, " x ", n, " x ", k,
                                 " on this device (needs sm_90+ and "
                                 "cuBLAS 12.9+)"));
    }
    found = cache.algos.emplace(key, result.algo).first;
  }
  const cublasLtMatmulAlgo_t algo = found->second;
  lock.unlock();

  const float alpha = 1.0f, beta = 0.0f;
  FLASHMSA_CHECK_CUBLAS(cublasLtMatmul(handle, op.desc, &alpha, weights.weight.data, a.layout,
                                       codes, b.layout, &beta, out.data, d.layout, out.data,
                                       d.layout, &algo, ws + l.gemm,
                                       detail::kProjectionGemmWorkspaceBytes, stream));
}

}  // namespace flashmsa::cuda
