// The fused pre-processing producer on the GPU (spec section 3): one CTA per token, one half-warp
// per 128-wide head vector (16 lanes x 8 elements, 16-byte loads). Per vector: Gemma RMSNorm
// (sum of squares reduced over the half-warp), partial NeoX RoPE (the partner element lives in
// another lane of the same half-warp), one rounding at the store - q and index-q to their
// outputs, k and v into the main cache, index-k into the index cache. The math follows the CPU
// backend operation for operation (1 / sqrt, x * inv_rms * (1 + w), cos/sin of the fp32 angle
// in double); only the order of the sum of squares differs.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "flashmsa/error.hpp"
#include "src/cuda/common/cache_encode.cuh"
#include "src/cuda/common/device_plane.hpp"
#include "src/cuda/cuda_ops.hpp"
#include "src/cuda/launch.hpp"

namespace flashmsa::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kLanesPerVector = 16;  // 128 elements / 8
constexpr int kVectorsPerPass = kThreads / kLanesPerVector;
constexpr int kDim = 128;
constexpr int kMaxRopeHalf = 64;

enum Kind : int { kQ, kK, kV, kIndexQ, kIndexK };

struct CachePlaneParams {
  WritablePlane data, scales;  // scales: NVFP4 only
};

struct ProducerParams {
  const void* input;  // [T, width]
  std::int64_t input_stride;
  DType input_dtype;
  const void* weights[4];  // q, k, index-q, index-k norm weights [128]
  DType weight_dtypes[4];
  const void* positions;
  bool positions_int64;
  const std::int64_t* slots;  // main cache
  const std::int64_t* index_slots;
  std::int64_t slot_stride, index_slot_stride;
  float inv_freq[kMaxRopeHalf];
  int rope_half;
  float eps;
  int hq, hkv, hidx;
  // outputs
  void* q_out;
  std::int64_t q_stride[2];  // bytes
  DType q_dtype;
  void* iq_out;
  std::int64_t iq_stride[2];  // bytes
  DType iq_dtype;
  // caches
  CachePlaneParams k, v, index_k;
  DType kv_dtype, index_dtype;
  float k_scale, v_scale;
  std::int64_t kv_capacity, index_capacity, page_size;
};

__device__ float load_weight(const void* w, DType dtype, int i) {
  return dtype == DType::kFp32 ? static_cast<const float*>(w)[i]
                               : fmt::bf16_to_float(static_cast<const std::uint16_t*>(w)[i]);
}

__global__ void __launch_bounds__(kThreads)
    producer_kernel(const __grid_constant__ ProducerParams p) {
  __shared__ float one_plus_w[4][kDim];
  __shared__ float cos_a[kMaxRopeHalf], sin_a[kMaxRopeHalf];
  const std::int64_t t = blockIdx.x;
  for (int i = threadIdx.x; i < 4 * kDim; i += kThreads) {
    one_plus_w[i / kDim][i % kDim] =
        1.0f + load_weight(p.weights[i / kDim], p.weight_dtypes[i / kDim], i % kDim);
  }
  const std::int64_t pos = p.positions_int64 ? static_cast<const std::int64_t*>(p.positions)[t]
                                             : static_cast<const std::int32_t*>(p.positions)[t];
  if (threadIdx.x < p.rope_half) {
    // The engines' fp32 angle; its cos and sin exact (computed in double, rounded once).
    const float angle = static_cast<float>(pos) * p.inv_freq[threadIdx.x];
    cos_a[threadIdx.x] = static_cast<float>(cos(static_cast<double>(angle)));
    sin_a[threadIdx.x] = static_cast<float>(sin(static_cast<double>(angle)));
  }
  __syncthreads();

  const std::int64_t slot = p.slots[t * p.slot_stride];
  const std::int64_t index_slot = p.index_slots[t * p.index_slot_stride];
  const int num_vectors = p.hq + 2 * p.hkv + p.hidx + 1;
  const int part = threadIdx.x % kLanesPerVector;
  const int half_lane0 = (threadIdx.x % 32) & ~(kLanesPerVector - 1);
  const int rope_parts = p.rope_half / kChunkElems;  // parts holding the first rotated half
  const int partner = half_lane0 + (part < rope_parts ? part + rope_parts : part - rope_parts);

  // Whole warps iterate together: the shuffles below are unconditional.
  for (int base = 0; base < num_vectors; base += kVectorsPerPass) {
    const int vec = base + static_cast<int>(threadIdx.x) / kLanesPerVector;
    const bool live = vec < num_vectors;
    Kind kind = kQ;
    int head = vec;
    if (vec >= p.hq + 2 * p.hkv + p.hidx) {
      kind = kIndexK, head = 0;
    } else if (vec >= p.hq + 2 * p.hkv) {
      kind = kIndexQ, head = vec - p.hq - 2 * p.hkv;
    } else if (vec >= p.hq + p.hkv) {
      kind = kV, head = vec - p.hq - p.hkv;
    } else if (vec >= p.hq) {
      kind = kK, head = vec - p.hq;
    }
    float x[kChunkElems] = {};
    if (live)
      load_chunk(p.input_dtype, p.input,
                 t * p.input_stride + std::int64_t{vec} * kDim + part * kChunkElems, x);

    // Gemma RMSNorm (not for V).
    float sum_sq = 0.0f;
    for (float v : x) sum_sq += v * v;
    for (int o = kLanesPerVector / 2; o > 0; o >>= 1)
      sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, o);
    const int weight_set = kind == kQ ? 0 : kind == kK ? 1 : kind == kIndexQ ? 2 : 3;
    if (kind != kV) {
      const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(kDim) + p.eps);
      for (int i = 0; i < kChunkElems; ++i) {
        x[i] = x[i] * inv_rms * one_plus_w[weight_set][part * kChunkElems + i];
      }
    }
    // Partial NeoX RoPE on [0, 2 * rope_half): element d pairs with d +/- rope_half.
    float other[kChunkElems];
    for (int i = 0; i < kChunkElems; ++i) other[i] = __shfl_sync(0xffffffffu, x[i], partner);
    if (kind != kV && part < 2 * rope_parts) {
      for (int i = 0; i < kChunkElems; ++i) {
        const int d = part * kChunkElems + i;
        if (d < p.rope_half) {
          x[i] = x[i] * cos_a[d] - other[i] * sin_a[d];
        } else {
          x[i] = x[i] * cos_a[d - p.rope_half] + other[i] * sin_a[d - p.rope_half];
        }
      }
    }

    // One rounding at the store.
    bool write = live;
    DType dtype = p.kv_dtype;
    std::byte* row = nullptr;
    std::byte* scale_row = nullptr;
    float scale = 1.0f;
    if (kind == kQ || kind == kIndexQ) {
      const bool q = kind == kQ;
      dtype = q ? p.q_dtype : p.iq_dtype;
      const std::int64_t* stride = q ? p.q_stride : p.iq_stride;
      row = static_cast<std::byte*>(q ? p.q_out : p.iq_out) + t * stride[0] + head * stride[1];
    } else {
      const bool index = kind == kIndexK;
      const std::int64_t s = index ? index_slot : slot;
      write = live && s >= 0 && s < (index ? p.index_capacity : p.kv_capacity);
      const CachePlaneParams& plane = index ? p.index_k : kind == kK ? p.k : p.v;
      dtype = index ? p.index_dtype : p.kv_dtype;
      scale = index ? 1.0f : kind == kK ? p.k_scale : p.v_scale;
      const std::int64_t page = write ? s / p.page_size : 0, offset = write ? s % p.page_size : 0;
      row = plane.data.row(page, head, offset);
      scale_row = plane.scales.row(page, head, offset);
    }
    encode_cache_chunk(dtype, x, write, row, scale_row, part, scale);
  }
}

CachePlaneParams plane_params(const CachePlane& data, const CachePlane& scales) {
  return {device_plane<WritablePlane>(data), device_plane<WritablePlane>(scales)};
}

}  // namespace

void produce_qkv_index(const Config& config, const ProducerInputs& in, const KvCacheView& kv,
                       const IndexCacheView& ix, const ProducerOutputs& out, void* stream) {
  const ResolvedHeads heads = config.resolve_heads();
  FLASHMSA_CHECK_SUPPORTED(config.head_dim == kDim && config.sparse_index_dim == kDim,
                           "the CUDA producer needs head_dim and index_dim 128, got ",
                           config.head_dim, " and ", config.sparse_index_dim);
  FLASHMSA_CHECK_SUPPORTED(config.rope_dim % 16 == 0 && config.rope_dim <= kDim,
                           "the CUDA producer needs rope_dim to be a multiple of 16 <= 128, got ",
                           config.rope_dim);
  const std::int64_t elem = dtype_bits(in.qkv_index.dtype) / 8;
  FLASHMSA_CHECK_ARG(aligned(in.qkv_index.data, 16) && (in.qkv_index.stride[0] * elem) % 16 == 0 &&
                         in.qkv_index.stride[1] == 1,
                     "qkv_index must have contiguous, 16-byte aligned rows on the CUDA backend");
  for (const TensorView* o : {&out.q, &out.index_q}) {
    const std::int64_t e = dtype_bits(o->dtype) / 8;
    FLASHMSA_CHECK_ARG(aligned(o->data, 16) && (o->stride[0] * e) % 16 == 0 &&
                           (o->stride[1] * e) % 16 == 0 && o->stride[2] == 1,
                       o == &out.q ? "q" : "index_q",
                       " must have contiguous, 16-byte aligned head rows on the CUDA backend");
  }
  for (const CachePlane* plane : {&kv.k, &kv.v, &ix.k}) {
    FLASHMSA_CHECK_ARG(plane_aligned(*plane, 4),
                       "the caches' rows must be 4-byte aligned on the CUDA backend");
  }
  const std::int64_t num_tokens = in.qkv_index.shape[0];
  if (num_tokens == 0) return;

  ProducerParams p{};
  p.input = in.qkv_index.data;
  p.input_stride = in.qkv_index.stride[0];
  p.input_dtype = in.qkv_index.dtype;
  const TensorView* weights[4] = {&in.q_norm_weight, &in.k_norm_weight, &in.index_q_norm_weight,
                                  &in.index_k_norm_weight};
  for (int i = 0; i < 4; ++i) {
    FLASHMSA_CHECK_ARG(weights[i]->stride[0] == 1,
                       "norm weights must be contiguous on the CUDA backend");
    p.weights[i] = weights[i]->data;
    p.weight_dtypes[i] = weights[i]->dtype;
  }
  p.positions = in.positions.data;
  p.positions_int64 = in.positions.dtype == DType::kInt64;
  FLASHMSA_CHECK_ARG(in.positions.stride[0] == 1,
                     "positions must be contiguous on the CUDA backend");
  const TensorView& index_slots =
      in.index_slot_mapping.data ? in.index_slot_mapping : in.slot_mapping;
  p.slots = in.slot_mapping.as<const std::int64_t>();
  p.slot_stride = in.slot_mapping.stride[0];
  p.index_slots = index_slots.as<const std::int64_t>();
  p.index_slot_stride = index_slots.stride[0];
  p.rope_half = config.rope_dim / 2;
  for (int i = 0; i < p.rope_half; ++i) {
    p.inv_freq[i] = static_cast<float>(
        std::pow(config.rope_theta, -2.0 * static_cast<double>(i) / config.rope_dim));
  }
  p.eps = static_cast<float>(config.rms_norm_eps);
  p.hq = static_cast<int>(heads.num_attention_heads);
  p.hkv = static_cast<int>(heads.num_key_value_heads);
  p.hidx = config.sparse_num_index_heads;
  p.q_out = out.q.data;
  p.q_stride[0] = out.q.stride[0] * dtype_bits(out.q.dtype) / 8;
  p.q_stride[1] = out.q.stride[1] * dtype_bits(out.q.dtype) / 8;
  p.q_dtype = out.q.dtype;
  p.iq_out = out.index_q.data;
  p.iq_stride[0] = out.index_q.stride[0] * dtype_bits(out.index_q.dtype) / 8;
  p.iq_stride[1] = out.index_q.stride[1] * dtype_bits(out.index_q.dtype) / 8;
  p.iq_dtype = out.index_q.dtype;
  p.k = plane_params(kv.k, kv.k_block_scale);
  p.v = plane_params(kv.v, kv.v_block_scale);
  p.index_k = plane_params(ix.k, ix.block_scale);
  p.kv_dtype = kv.dtype;
  p.index_dtype = ix.dtype;
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  p.kv_capacity = kv.capacity_tokens();
  p.index_capacity = ix.capacity_tokens();
  p.page_size = kv.shape.page_size;
  FLASHMSA_CHECK_SUPPORTED(ix.page_size == kv.shape.page_size,
                           "the CUDA producer needs one page size for both caches");
  FLASHMSA_CHECK_SUPPORTED(num_tokens <= 0x7fffffff,
                           "too many tokens for one launch: ", num_tokens);
  launch_kernel(producer_kernel, dim3(static_cast<unsigned>(num_tokens)), kThreads, 0,
                static_cast<cudaStream_t>(stream), p);
}

}  // namespace flashmsa::cuda
