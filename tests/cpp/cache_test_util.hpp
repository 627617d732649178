// Helpers of the cache tests: the spec's layouts written out independently of the library, caches
// over random bytes (so any stray write shows), and the tolerance rule for rounded values.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "flashmsa/cache.hpp"
#include "flashmsa/formats.hpp"

namespace flashmsa::test {

// Byte offset of the K (kv = 0) or V (kv = 1) row of (page, head, token) in the buffer that holds
// it, for rows of `row` bytes, per spec section 6.
inline std::int64_t spec_offset(KvLayout layout, const KvCacheShape& s, std::int64_t row, int kv,
                                std::int64_t page, std::int64_t head, std::int64_t token) {
  const std::int64_t H = s.num_kv_heads, P = s.page_size;
  switch (layout) {
    case KvLayout::kPacked:  // [pages, H, P, 2*D]
      return (((page * H + head) * P + token) * 2 + kv) * row;
    case KvLayout::kSeparate:  // [pages, H, P, D] per buffer
      return ((page * H + head) * P + token) * row;
    case KvLayout::kStacked:  // [pages, 2, H, P, D]
      return (((page * 2 + kv) * H + head) * P + token) * row;
    case KvLayout::kTokenMajor:  // [pages, P, H, D] per buffer
      return ((page * P + token) * H + head) * row;
  }
  return -1;
}

inline bool two_buffers(KvLayout layout) {
  return layout == KvLayout::kSeparate || layout == KvLayout::kTokenMajor;
}

inline void fill_random_bytes(std::vector<std::byte>& v, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
}

// A CacheBuffer over a byte vector (none when it is empty).
inline CacheBuffer buffer(std::vector<std::byte>& v) {
  return {v.empty() ? nullptr : v.data(), static_cast<std::int64_t>(v.size())};
}

// A main K/V cache and an index cache over random bytes, with snapshots for canary checks.
struct RandomCaches {
  KvLayout layout;
  KvCacheShape shape;
  DType kv_dtype, index_dtype;
  std::vector<std::byte> k, v, k_scales, v_scales, index, index_scales;
  KvCacheView kv;
  IndexCacheView ix;

  RandomCaches(KvLayout layout_, const KvCacheShape& shape_, DType kv_dtype_, DType index_dtype_,
               std::int64_t index_dim, std::uint64_t seed)
      : layout(layout_), shape(shape_), kv_dtype(kv_dtype_), index_dtype(index_dtype_) {
    const bool nvfp4 = kv_dtype == DType::kNvfp4;
    k.resize(KvCacheView::buffer_bytes(layout, kv_dtype, shape));
    v.resize(two_buffers(layout) ? k.size() : 0);
    if (nvfp4) {
      k_scales.resize(KvCacheView::buffer_bytes(layout, kv_dtype, shape, true));
      v_scales.resize(two_buffers(layout) ? k_scales.size() : 0);
    }
    index.resize(IndexCacheView::buffer_bytes(index_dtype, shape.num_pages, index_dim, false,
                                              shape.page_size));
    if (index_dtype == DType::kNvfp4) {
      index_scales.resize(IndexCacheView::buffer_bytes(index_dtype, shape.num_pages, index_dim,
                                                       true, shape.page_size));
    }
    for (auto* b : {&k, &v, &k_scales, &v_scales, &index, &index_scales}) {
      fill_random_bytes(*b, seed++);
    }
    kv = KvCacheView::make(layout, kv_dtype, shape, buffer(k), buffer(v), Device::kCpu,
                           buffer(k_scales), buffer(v_scales));
    ix = IndexCacheView::make(index_dtype, shape.num_pages, index_dim, buffer(index), Device::kCpu,
                              buffer(index_scales), shape.page_size);
  }
  RandomCaches(const RandomCaches&) = delete;

  // The row bytes of K/V (kv 0/1) and of its NVFP4 scales, located by the spec's formula.
  const std::byte* kv_row(int kv_plane, std::int64_t page, std::int64_t head,
                          std::int64_t token) const {
    const auto& buf = (kv_plane == 1 && two_buffers(layout)) ? v : k;
    return buf.data() + spec_offset(layout, shape, cache_row_bytes(kv_dtype, shape.head_dim),
                                    kv_plane, page, head, token);
  }
  const std::byte* kv_scale_row(int kv_plane, std::int64_t page, std::int64_t head,
                                std::int64_t token) const {
    const auto& buf = (kv_plane == 1 && two_buffers(layout)) ? v_scales : k_scales;
    return buf.data() +
           spec_offset(layout, shape, shape.head_dim / 16, kv_plane, page, head, token);
  }
  std::int64_t index_row_bytes() const { return cache_row_bytes(index_dtype, ix.index_dim); }
  const std::byte* index_row(std::int64_t page, std::int64_t token) const {
    return index.data() + (page * shape.page_size + token) * index_row_bytes();
  }
  const std::byte* index_scale_row(std::int64_t page, std::int64_t token) const {
    return index_scales.data() + (page * shape.page_size + token) * (ix.index_dim / 16);
  }
};

// Dequantizes element i of a row written in `dtype` (per spec 6).
inline double decode_element(DType dtype, const std::byte* row, const std::byte* scale_row,
                             std::int64_t i, double scale) {
  const auto* b8 = reinterpret_cast<const std::uint8_t*>(row);
  std::uint16_t b16 = 0;  // read only for 16-bit rows: an 8- or 4-bit row may end before 2i+2
  if (dtype == DType::kBf16 || dtype == DType::kFp16) std::memcpy(&b16, row + 2 * i, 2);
  switch (dtype) {
    case DType::kBf16: return fmt::bf16_to_float(b16);
    case DType::kFp16: return fmt::fp16_to_float(b16);
    case DType::kFp8E4m3: return fmt::e4m3_to_float(b8[i]) * scale;
    case DType::kFp8E5m2: return fmt::e5m2_to_float(b8[i]) * scale;
    case DType::kNvfp4: {
      const std::uint8_t code = (b8[i / 2] >> (4 * (i % 2))) & 0xF;
      const auto s = reinterpret_cast<const std::uint8_t*>(scale_row)[i / 16];
      return static_cast<double>(fmt::e2m1_to_float(code)) * fmt::e4m3_to_float(s);
    }
    default: return NAN;
  }
}

// Spacing of `dtype`'s values around |x| (one ulp), times the dequantization scale.
inline double ulp_at(DType dtype, double x, double scale = 1.0) {
  int man_bits, min_exp;
  switch (dtype) {
    case DType::kBf16: man_bits = 7, min_exp = -126; break;
    case DType::kFp16: man_bits = 10, min_exp = -14; break;
    case DType::kFp8E4m3: man_bits = 3, min_exp = -6; break;
    case DType::kFp8E5m2: man_bits = 2, min_exp = -14; break;
    default: return NAN;
  }
  const double a = std::fabs(x) / scale;
  const int e = a > 0 ? std::max(static_cast<int>(std::floor(std::log2(a))), min_exp) : min_exp;
  return std::ldexp(1.0, e - man_bits) * scale;
}

}  // namespace flashmsa::test
