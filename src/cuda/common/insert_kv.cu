// Cache insertion on the GPU: each (token, head, K-or-V) row is written by 16 threads, each
// taking 8 consecutive elements with 16-byte loads (32 for fp32 input) and quantizing them to the
// cache dtype with the same format code as the CPU backend, so the bytes are identical. NVFP4
// groups of 16 span two threads, which share their amax through one shuffle. Slots that are
// negative or past the capacity write nothing; nothing else is read from device memory.
#include <cuda_runtime.h>

#include <cstdint>

#include "flashmsa/error.hpp"
#include "flashmsa/formats.hpp"
#include "src/cuda/common/cache_encode.cuh"
#include "src/cuda/common/device_plane.hpp"
#include "src/cuda/cuda_ops.hpp"
#include "src/cuda/launch.hpp"

namespace flashmsa::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;

// One plane to write (K, V or index-K) and the activation rows that feed it.
struct PlaneParams {
  const void* src;                                 // [T, heads, dim] activations
  std::int64_t src_stride_token, src_stride_head;  // elements
  WritablePlane cache;
  WritablePlane scales;  // NVFP4 scale plane, or null
  float scale;           // per-tensor fp8 scale: fp8 stores x / scale
};

struct InsertParams {
  PlaneParams planes[2];  // K and V (index-K: one plane)
  int num_planes;
  const std::int64_t* slots;  // [T]
  std::int64_t slot_stride;
  std::int64_t num_tokens, num_heads, dim, page_size, capacity;
  DType src_dtype, cache_dtype;
};

__global__ void __launch_bounds__(kThreadsPerBlock) insert_kernel(const InsertParams p) {
  const int threads_per_row = static_cast<int>(p.dim / kChunkElems);
  const std::int64_t thread = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t row = thread / threads_per_row;  // (token, plane, head)
  const int part = static_cast<int>(thread % threads_per_row);
  const std::int64_t rows = p.num_tokens * p.num_planes * p.num_heads;
  // Whole NVFP4 groups live in one row, so both threads of a group see the same `row`.
  const bool active = row < rows;
  const std::int64_t token = active ? row / (p.num_planes * p.num_heads) : 0;
  const int plane = active ? static_cast<int>(row / p.num_heads % p.num_planes) : 0;
  const std::int64_t head = active ? row % p.num_heads : 0;
  const std::int64_t slot = active ? p.slots[token * p.slot_stride] : -1;
  const bool write = active && slot >= 0 && slot < p.capacity;
  const PlaneParams& pl = p.planes[plane];

  float x[kChunkElems] = {};
  const std::int64_t src_base =
      token * pl.src_stride_token + head * pl.src_stride_head + part * kChunkElems;
  if (write) load_chunk(p.src_dtype, pl.src, src_base, x);
  const std::int64_t page = slot / p.page_size, offset = slot % p.page_size;
  encode_cache_chunk(p.cache_dtype, x, write, pl.cache.row(page, head, offset),
                     pl.scales.row(page, head, offset), part, pl.scale);
}

PlaneParams plane_params(const TensorView& src, const CachePlane& plane, const CachePlane& scales,
                         float scale) {
  PlaneParams p{};
  p.src = src.data;
  p.src_stride_token = src.stride[0];
  p.src_stride_head = src.rank == 3 ? src.stride[1] : 0;
  p.cache = device_plane<WritablePlane>(plane);
  p.scales = device_plane<WritablePlane>(scales);
  p.scale = scale;
  return p;
}

// 16-byte accesses need 16-byte aligned rows on both sides.
void check_alignment(const TensorView& src, const char* name, const CachePlane& plane) {
  const std::int64_t elem = dtype_bits(src.dtype) / 8;
  const bool src_ok = aligned(src.data, 16) && (src.stride[0] * elem) % 16 == 0 &&
                      (src.rank < 3 || (src.stride[1] * elem) % 16 == 0);
  FLASHMSA_CHECK_ARG(src_ok, name,
                     " must have 16-byte aligned rows on the CUDA backend (data pointer and "
                     "strides)");
  FLASHMSA_CHECK_ARG(plane_aligned(plane, 4),
                     "the cache's rows must be 4-byte aligned on the CUDA backend");
}

void launch(const InsertParams& p, void* stream) {
  const std::int64_t threads = p.num_tokens * p.num_planes * p.num_heads * (p.dim / kChunkElems);
  if (threads == 0) return;
  const std::int64_t blocks = ceil_div(threads, kThreadsPerBlock);
  launch_kernel(insert_kernel, dim3(static_cast<unsigned>(blocks)), kThreadsPerBlock, 0,
                static_cast<cudaStream_t>(stream), p);
}

}  // namespace

void insert_kv(const KvCacheView& cache, const TensorView& k, const TensorView& v,
               const TensorView& slot_mapping, void* stream) {
  FLASHMSA_CHECK_SUPPORTED(cache.shape.head_dim % 16 == 0,
                           "the CUDA insertion needs head_dim to be a multiple of 16, got ",
                           cache.shape.head_dim);
  check_alignment(k, "k", cache.k);
  check_alignment(v, "v", cache.v);
  InsertParams p{};
  p.planes[0] = plane_params(k, cache.k, cache.k_block_scale, cache.k_scale);
  p.planes[1] = plane_params(v, cache.v, cache.v_block_scale, cache.v_scale);
  p.num_planes = 2;
  p.slots = slot_mapping.as<const std::int64_t>();
  p.slot_stride = slot_mapping.stride[0];
  p.num_tokens = k.shape[0];
  p.num_heads = cache.shape.num_kv_heads;
  p.dim = cache.shape.head_dim;
  p.page_size = cache.shape.page_size;
  p.capacity = cache.capacity_tokens();
  p.src_dtype = k.dtype;
  p.cache_dtype = cache.dtype;
  FLASHMSA_CHECK_ARG(v.dtype == k.dtype, "v must have the dtype of k (", to_string(k.dtype),
                     "), got ", to_string(v.dtype));
  launch(p, stream);
}

void insert_index_k(const IndexCacheView& cache, const TensorView& index_k,
                    const TensorView& slot_mapping, void* stream) {
  FLASHMSA_CHECK_SUPPORTED(cache.index_dim % 16 == 0,
                           "the CUDA insertion needs index_dim to be a multiple of 16, got ",
                           cache.index_dim);
  check_alignment(index_k, "index_k", cache.k);
  InsertParams p{};
  p.planes[0] = plane_params(index_k, cache.k, cache.block_scale, 1.0f);
  p.num_planes = 1;
  p.slots = slot_mapping.as<const std::int64_t>();
  p.slot_stride = slot_mapping.stride[0];
  p.num_tokens = index_k.shape[0];
  p.num_heads = 1;
  p.dim = cache.index_dim;
  p.page_size = cache.page_size;
  p.capacity = cache.capacity_tokens();
  p.src_dtype = index_k.dtype;
  p.cache_dtype = cache.dtype;
  launch(p, stream);
}

}  // namespace flashmsa::cuda
