#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "flashmsa/cache.hpp"
#include "flashmsa/error.hpp"

namespace flashmsa {

std::int64_t cache_row_bytes(DType dtype, std::int64_t dim) noexcept {
  return dim * dtype_bits(dtype) / 8;
}

namespace {

std::int64_t scale_row_bytes(std::int64_t dim) {
  return dim / kNvfp4ScaleGroup;
}

CachePlane plane(void* base, std::int64_t offset, std::int64_t page_stride,
                 std::int64_t head_stride, std::int64_t token_stride, std::int64_t row_bytes) {
  return {base ? static_cast<std::byte*>(base) + offset : nullptr, page_stride, head_stride,
          token_stride, row_bytes};
}

// K and V planes of `layout` for rows of `row` bytes, over buffers `k_base` and `v_base`.
std::array<CachePlane, 2> layout_planes(KvLayout layout, const KvCacheShape& s, std::int64_t row,
                                        void* k_base, void* v_base) {
  const std::int64_t h = s.num_kv_heads, p = s.page_size;
  switch (layout) {
    case KvLayout::kPacked:
      return {plane(k_base, 0, h * p * 2 * row, p * 2 * row, 2 * row, row),
              plane(k_base, row, h * p * 2 * row, p * 2 * row, 2 * row, row)};
    case KvLayout::kSeparate:
      return {plane(k_base, 0, h * p * row, p * row, row, row),
              plane(v_base, 0, h * p * row, p * row, row, row)};
    case KvLayout::kStacked:
      return {plane(k_base, 0, 2 * h * p * row, p * row, row, row),
              plane(k_base, h * p * row, 2 * h * p * row, p * row, row, row)};
    case KvLayout::kTokenMajor:
      return {plane(k_base, 0, p * h * row, row, h * row, row),
              plane(v_base, 0, p * h * row, row, h * row, row)};
  }
  return {};
}

bool two_buffers(KvLayout layout) {
  return layout == KvLayout::kSeparate || layout == KvLayout::kTokenMajor;
}

bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// One plane: pointer, alignment, strides under which no two rows overlap, offsets within int64.
void validate_plane(const std::string& name, const CachePlane& pl, std::int64_t pages,
                    std::int64_t heads, std::int64_t tokens, std::int64_t want_row_bytes,
                    std::int64_t align) {
  FLASHMSA_CHECK_ARG(pl.row_bytes == want_row_bytes, name, ".row_bytes must be ", want_row_bytes,
                     ", got ", pl.row_bytes);
  if (pages == 0) return;
  FLASHMSA_CHECK_ARG(pl.data != nullptr, name, ".data must be non-null for ", pages, " pages");
  FLASHMSA_CHECK_ARG(reinterpret_cast<std::uintptr_t>(pl.data) % align == 0, name,
                     ".data must be aligned to ", align, " bytes");
  struct Dim {
    const char* what;
    std::int64_t stride, extent;
  };
  std::array<Dim, 3> dims{{{"page_stride", pl.page_stride, pages},
                           {"head_stride", pl.head_stride, heads},
                           {"token_stride", pl.token_stride, tokens}}};
  std::int64_t max_offset = 0;
  for (const Dim& d : dims) {
    FLASHMSA_CHECK_ARG(d.stride >= 0, name, ".", d.what, " must be >= 0, got ", d.stride);
    FLASHMSA_CHECK_ARG(d.stride % align == 0, name, ".", d.what, " must be a multiple of ", align,
                       " bytes, got ", d.stride);
    std::int64_t span;
    FLASHMSA_CHECK_ARG(checked_mul(d.stride, d.extent - 1, &span) &&
                           !__builtin_add_overflow(max_offset, span, &max_offset),
                       name, ": the largest offset overflows int64 (", d.what, " ", d.stride, " x ",
                       d.extent - 1, ")");
  }
  FLASHMSA_CHECK_ARG(!__builtin_add_overflow(max_offset, pl.row_bytes, &max_offset), name,
                     ": the largest offset overflows int64");
  // Rows must not overlap: with the dimensions ordered by stride, each stride must clear
  // everything the smaller ones span.
  std::sort(dims.begin(), dims.end(),
            [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  std::int64_t covered = pl.row_bytes;
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    FLASHMSA_CHECK_ARG(d.stride >= covered, name, ".", d.what, " (", d.stride,
                       ") makes rows overlap: it must be >= ", covered, " bytes");
    covered = d.stride * (d.extent - 1) + covered;
  }
}

void check_scale_factor(const char* name, float scale) {
  FLASHMSA_CHECK_ARG(std::isfinite(scale) && scale > 0.0f, name, " must be finite and > 0, got ",
                     scale);
}

}  // namespace

KvCacheView KvCacheView::make(KvLayout layout, DType dtype, const KvCacheShape& shape, void* k_data,
                              void* v_data, Device device, void* k_scales, void* v_scales) {
  KvCacheView view;
  view.dtype = dtype;
  view.device = device;
  view.shape = shape;
  const auto data = layout_planes(layout, shape, cache_row_bytes(dtype, shape.head_dim), k_data,
                                  two_buffers(layout) ? v_data : nullptr);
  view.k = data[0];
  view.v = data[1];
  if (dtype == DType::kNvfp4) {
    const auto scales = layout_planes(layout, shape, scale_row_bytes(shape.head_dim), k_scales,
                                      two_buffers(layout) ? v_scales : nullptr);
    view.k_block_scale = scales[0];
    view.v_block_scale = scales[1];
  }
  view.validate();
  return view;
}

std::int64_t KvCacheView::buffer_bytes(KvLayout layout, DType dtype, const KvCacheShape& shape,
                                       bool scales) {
  const std::int64_t row =
      scales ? scale_row_bytes(shape.head_dim) : cache_row_bytes(dtype, shape.head_dim);
  const std::int64_t per_plane = shape.num_pages * shape.num_kv_heads * shape.page_size * row;
  return two_buffers(layout) ? per_plane : 2 * per_plane;
}

void KvCacheView::validate() const {
  FLASHMSA_CHECK_ARG(dtype == DType::kBf16 || dtype == DType::kFp16 || dtype == DType::kFp8E4m3 ||
                         dtype == DType::kFp8E5m2 || dtype == DType::kNvfp4,
                     "kv_cache.dtype must be one of bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4, got ",
                     to_string(dtype));
  FLASHMSA_CHECK_ARG(shape.num_pages >= 0, "kv_cache.num_pages must be >= 0, got ",
                     shape.num_pages);
  FLASHMSA_CHECK_ARG(shape.num_kv_heads > 0, "kv_cache.num_kv_heads must be > 0, got ",
                     shape.num_kv_heads);
  FLASHMSA_CHECK_ARG(shape.page_size > 0, "kv_cache.page_size must be > 0, got ", shape.page_size);
  FLASHMSA_CHECK_ARG(shape.head_dim > 0 && shape.head_dim % 2 == 0,
                     "kv_cache.head_dim must be even and > 0, got ", shape.head_dim);
  const bool nvfp4 = dtype == DType::kNvfp4;
  FLASHMSA_CHECK_ARG(!nvfp4 || shape.head_dim % kNvfp4ScaleGroup == 0,
                     "kv_cache.head_dim must be a multiple of 16 for nvfp4, got ", shape.head_dim);
  const std::int64_t align = std::max(1, dtype_bits(dtype) / 8);
  const std::int64_t row = cache_row_bytes(dtype, shape.head_dim);
  validate_plane("kv_cache.k", k, shape.num_pages, shape.num_kv_heads, shape.page_size, row, align);
  validate_plane("kv_cache.v", v, shape.num_pages, shape.num_kv_heads, shape.page_size, row, align);
  if (nvfp4) {
    const std::int64_t srow = scale_row_bytes(shape.head_dim);
    validate_plane("kv_cache.k_block_scale", k_block_scale, shape.num_pages, shape.num_kv_heads,
                   shape.page_size, srow, 1);
    validate_plane("kv_cache.v_block_scale", v_block_scale, shape.num_pages, shape.num_kv_heads,
                   shape.page_size, srow, 1);
  } else {
    FLASHMSA_CHECK_ARG(k_block_scale.data == nullptr && v_block_scale.data == nullptr,
                       "kv_cache block scales are only for nvfp4, got them with ",
                       to_string(dtype));
  }
  check_scale_factor("kv_cache.k_scale", k_scale);
  check_scale_factor("kv_cache.v_scale", v_scale);
}

IndexCacheView IndexCacheView::make(DType dtype, std::int64_t num_pages, std::int64_t index_dim,
                                    void* data, Device device, void* scales,
                                    std::int64_t page_size) {
  IndexCacheView view;
  view.dtype = dtype;
  view.device = device;
  view.num_pages = num_pages;
  view.index_dim = index_dim;
  view.page_size = page_size;
  const std::int64_t row = cache_row_bytes(dtype, index_dim);
  view.k = plane(data, 0, page_size * row, 0, row, row);
  if (dtype == DType::kNvfp4) {
    const std::int64_t srow = scale_row_bytes(index_dim);
    view.block_scale = plane(scales, 0, page_size * srow, 0, srow, srow);
  }
  view.validate();
  return view;
}

std::int64_t IndexCacheView::buffer_bytes(DType dtype, std::int64_t num_pages,
                                          std::int64_t index_dim, bool scales,
                                          std::int64_t page_size) {
  return num_pages * page_size *
         (scales ? scale_row_bytes(index_dim) : cache_row_bytes(dtype, index_dim));
}

void IndexCacheView::validate() const {
  FLASHMSA_CHECK_ARG(dtype == DType::kBf16 || dtype == DType::kFp8E4m3 || dtype == DType::kNvfp4,
                     "index_cache.dtype must be one of bf16, fp8_e4m3, nvfp4, got ",
                     to_string(dtype));
  FLASHMSA_CHECK_ARG(num_pages >= 0, "index_cache.num_pages must be >= 0, got ", num_pages);
  FLASHMSA_CHECK_ARG(page_size > 0, "index_cache.page_size must be > 0, got ", page_size);
  FLASHMSA_CHECK_ARG(index_dim > 0 && index_dim % 2 == 0,
                     "index_cache.index_dim must be even and > 0, got ", index_dim);
  const bool nvfp4 = dtype == DType::kNvfp4;
  FLASHMSA_CHECK_ARG(!nvfp4 || index_dim % kNvfp4ScaleGroup == 0,
                     "index_cache.index_dim must be a multiple of 16 for nvfp4, got ", index_dim);
  validate_plane("index_cache.k", k, num_pages, 1, page_size, cache_row_bytes(dtype, index_dim),
                 std::max(1, dtype_bits(dtype) / 8));
  if (nvfp4) {
    validate_plane("index_cache.block_scale", block_scale, num_pages, 1, page_size,
                   scale_row_bytes(index_dim), 1);
  } else {
    FLASHMSA_CHECK_ARG(block_scale.data == nullptr,
                       "index_cache.block_scale is only for nvfp4, got it with ", to_string(dtype));
  }
}

}  // namespace flashmsa
