// Non-owning views of the paged caches (spec section 6).
//
// A page holds `page_size` (128) consecutive tokens of one request. Each plane of a cache (K, V,
// index-K, and for NVFP4 their block scales) is addressed as rows: the row of (page, head, token)
// starts `page * page_stride + head * head_stride + token * token_stride` BYTES after `data` and
// holds `row_bytes` contiguous bytes. Byte strides express every engine layout without copies,
// including NVFP4's half-byte elements and interleaved data+scale slots.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashmsa/dtype.hpp"
#include "flashmsa/tensor.hpp"

namespace flashmsa {

struct CachePlane {
  void* data = nullptr;
  std::int64_t page_stride = 0;   // bytes
  std::int64_t head_stride = 0;   // bytes
  std::int64_t token_stride = 0;  // bytes
  std::int64_t row_bytes = 0;     // contiguous bytes of one (page, head, token) row
  // Bytes of the caller's memory from `data` on; validate() requires every row to end within
  // them, so a view can never reach outside its allocation.
  std::int64_t extent_bytes = 0;

  std::byte* row(std::int64_t page, std::int64_t head, std::int64_t token) const noexcept {
    return static_cast<std::byte*>(data) + page * page_stride + head * head_stride +
           token * token_stride;
  }
};

// Bytes of one row of `dim` elements: dim * bits / 8 (NVFP4: dim / 2).
std::int64_t cache_row_bytes(DType dtype, std::int64_t dim) noexcept;
// Bytes of one row of NVFP4 block scales: one E4M3 byte per 16 elements.
inline constexpr std::int64_t kNvfp4ScaleGroup = 16;

// The shape every main-cache layout shares.
struct KvCacheShape {
  std::int64_t num_pages = 0;
  std::int64_t num_kv_heads = 4;
  std::int64_t head_dim = 128;
  std::int64_t page_size = 128;
};

enum class KvLayout {
  kPacked,      // one buffer [pages, Hkv, page, 2*D]: K in [0, D), V in [D, 2D) (vLLM, default)
  kSeparate,    // K and V buffers [pages, Hkv, page, D] each (TensorRT-LLM / MSA "HND")
  kStacked,     // one buffer [pages, 2, Hkv, page, D]
  kTokenMajor,  // K and V buffers [pages, page, Hkv, D] each ("NHD", legacy vLLM)
};

// One caller-owned allocation: its first byte and its size.
struct CacheBuffer {
  void* data = nullptr;
  std::int64_t bytes = 0;
};

struct KvCacheView {
  DType dtype = DType::kBf16;  // bf16, fp16, fp8_e4m3, fp8_e5m2 or nvfp4
  Device device = Device::kCpu;
  KvCacheShape shape;
  CachePlane k, v;                          // element rows (NVFP4: packed E2M1 codes)
  CachePlane k_block_scale, v_block_scale;  // NVFP4 only: E4M3 scale rows, D/16 bytes
  float k_scale = 1.0f;                     // fp8 dequantization: x = fp8 * k_scale
  float v_scale = 1.0f;

  // Builds a view of `layout` over the caller's buffers, each at least buffer_bytes() long.
  // `v_data` is used by the layouts with two buffers (kSeparate, kTokenMajor) and must be empty
  // otherwise; NVFP4 needs scale buffers laid out the same way with D/16-byte rows (`k_scales`,
  // and `v_scales` for two-buffer layouts).
  static KvCacheView make(KvLayout layout, DType dtype, const KvCacheShape& shape,
                          CacheBuffer k_data, CacheBuffer v_data = {}, Device device = Device::kCpu,
                          CacheBuffer k_scales = {}, CacheBuffer v_scales = {});
  // Builds a view over framework tensors (any strides, last dimension contiguous), deriving the
  // page count, kv heads and head dim from their shapes:
  //   kPacked [pages, Hkv, page, 2*E], kSeparate [pages, Hkv, page, E] (k and v),
  //   kStacked [pages, 2, Hkv, page, E], kTokenMajor [pages, page, Hkv, E] (k and v),
  // where a row of E elements holds one head vector: bf16/fp16 caches take tensors of their own
  // dtype, fp8 caches their fp8 dtype or uint8, NVFP4 uint8 data (E = D/2) and uint8 or E4M3
  // scale tensors in the same layout (E = D/16). Every rule broken names the tensor.
  static KvCacheView from_tensors(KvLayout layout, DType dtype, const TensorView& k,
                                  const TensorView& v = {}, const TensorView& k_scales = {},
                                  const TensorView& v_scales = {});
  // Bytes of each buffer `make` expects for this layout (one plane's buffer for two-buffer
  // layouts); `scales` selects the NVFP4 scale buffer.
  static std::int64_t buffer_bytes(KvLayout layout, DType dtype, const KvCacheShape& shape,
                                   bool scales = false);

  std::int64_t capacity_tokens() const noexcept { return shape.num_pages * shape.page_size; }
  // Throws Error(kInvalidArgument) naming the plane and the broken rule: dtype, sizes, null or
  // misaligned pointers, strides under which two rows of a plane overlap, offsets past int64.
  void validate() const;
};

// Index-K side cache: one Di-vector per token, [pages, page, Di] (spec section 6).
struct IndexCacheView {
  DType dtype = DType::kBf16;  // bf16, fp8_e4m3 or nvfp4
  Device device = Device::kCpu;
  std::int64_t num_pages = 0;
  std::int64_t index_dim = 128;
  std::int64_t page_size = 128;
  CachePlane k;            // head index is always 0
  CachePlane block_scale;  // NVFP4 only

  static IndexCacheView make(DType dtype, std::int64_t num_pages, std::int64_t index_dim,
                             CacheBuffer data, Device device = Device::kCpu,
                             CacheBuffer scales = {}, std::int64_t page_size = 128);
  // Over framework tensors [pages, page, E] (any strides, last dimension contiguous): bf16 data,
  // fp8_e4m3 (or uint8) data, or NVFP4 uint8 data (E = Di/2) with scales [pages, page, Di/16].
  static IndexCacheView from_tensors(DType dtype, const TensorView& data,
                                     const TensorView& scales = {});
  static std::int64_t buffer_bytes(DType dtype, std::int64_t num_pages, std::int64_t index_dim,
                                   bool scales = false, std::int64_t page_size = 128);

  std::int64_t capacity_tokens() const noexcept { return num_pages * page_size; }
  void validate() const;
};

}  // namespace flashmsa
