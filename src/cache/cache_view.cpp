#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
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

CachePlane plane(CacheBuffer base, std::int64_t offset, std::int64_t page_stride,
                 std::int64_t head_stride, std::int64_t token_stride, std::int64_t row_bytes) {
  return {base.data ? static_cast<std::byte*>(base.data) + offset : nullptr,
          page_stride,
          head_stride,
          token_stride,
          row_bytes,
          std::max<std::int64_t>(0, base.bytes - offset)};
}

// K and V planes of `layout` for rows of `row` bytes, over buffers `k_base` and `v_base`.
std::array<CachePlane, 2> layout_planes(KvLayout layout, const KvCacheShape& s, std::int64_t row,
                                        CacheBuffer k_base, CacheBuffer v_base) {
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

std::int64_t product_or_throw(const char* what, std::initializer_list<std::int64_t> factors) {
  std::int64_t p = 1;
  for (std::int64_t f : factors) {
    FLASHMSA_CHECK_ARG(f >= 0 && checked_mul(p, f, &p), what, " overflow int64 (a factor is ", f,
                       ")");
  }
  return p;
}

// ---- Views over framework tensors ----

std::int64_t element_bytes(DType t) {
  return std::max(1, dtype_bits(t) / 8);
}

// The tensor dtypes that may carry a cache of `cache` (raw bytes for the 8- and 4-bit ones).
bool carries(DType cache, DType tensor, bool scales) {
  if (scales) return tensor == DType::kUint8 || tensor == DType::kFp8E4m3;
  switch (cache) {
    case DType::kBf16:
    case DType::kFp16: return tensor == cache;
    case DType::kFp8E4m3:
    case DType::kFp8E5m2: return tensor == cache || tensor == DType::kUint8;
    case DType::kNvfp4: return tensor == DType::kUint8;
    default: return false;
  }
}

std::string carrier_names(DType cache, bool scales) {
  if (scales) return "uint8 or fp8_e4m3";
  if (cache == DType::kFp8E4m3 || cache == DType::kFp8E5m2)
    return detail::concat(to_string(cache), " or uint8");
  if (cache == DType::kNvfp4) return "uint8";
  return std::string(to_string(cache));
}

// A tensor as a cache buffer: dtype, rank, strides (last dimension contiguous) checked; the
// buffer's extent is what its shape and strides reach.
struct TensorBuffer {
  CacheBuffer buffer;
  std::int64_t elem = 1;  // bytes per element
};

TensorBuffer tensor_buffer(const TensorView& t, const char* name, DType cache, bool scales,
                           int rank, const char* shape_text) {
  FLASHMSA_CHECK_ARG(t.data != nullptr || t.rank > 0, name,
                     " is required for this layout and dtype");
  FLASHMSA_CHECK_ARG(carries(cache, t.dtype, scales), name, " of a ", to_string(cache),
                     " cache must have dtype ", carrier_names(cache, scales), ", got ",
                     to_string(t.dtype));
  FLASHMSA_CHECK_ARG(t.rank == rank, name, " must have shape ", shape_text, " (rank ", rank,
                     "), got rank ", t.rank);
  // Strides, pointer and offsets (the shape's extents are the layout's business).
  if (rank == 3) check_tensor(t, name, t.dtype, t.device, {-1, -1, -1});
  if (rank == 4) check_tensor(t, name, t.dtype, t.device, {-1, -1, -1, -1});
  if (rank == 5) check_tensor(t, name, t.dtype, t.device, {-1, -1, -1, -1, -1});
  TensorBuffer b;
  b.elem = element_bytes(t.dtype);
  std::int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) last += t.stride[d] * std::max<std::int64_t>(0, t.shape[d] - 1);
  b.buffer = {t.data, t.numel() == 0 ? 0 : (last + 1) * b.elem};
  return b;
}

// One plane of a view over a tensor: `dims` are the tensor dimensions that index page, head and
// token (-1: none), `offset` the plane's first element within the tensor.
CachePlane tensor_plane(const TensorView& t, const TensorBuffer& b, int page_dim, int head_dim,
                        int token_dim, std::int64_t offset_elems, std::int64_t row_elems) {
  auto stride = [&](int d) { return d < 0 ? 0 : t.stride[d] * b.elem; };
  return plane(b.buffer, offset_elems * b.elem, stride(page_dim), stride(head_dim),
               stride(token_dim), row_elems * b.elem);
}

}  // namespace

KvCacheView KvCacheView::from_tensors(KvLayout layout, DType dtype, const TensorView& k,
                                      const TensorView& v, const TensorView& k_scales,
                                      const TensorView& v_scales) {
  FLASHMSA_CHECK_ARG(dtype == DType::kBf16 || dtype == DType::kFp16 || dtype == DType::kFp8E4m3 ||
                         dtype == DType::kFp8E5m2 || dtype == DType::kNvfp4,
                     "kv_cache dtype must be one of bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4, got ",
                     to_string(dtype));
  const bool two = two_buffers(layout), nvfp4 = dtype == DType::kNvfp4;
  FLASHMSA_CHECK_ARG(two || (v.rank == 0 && v_scales.rank == 0), "v and v_scales must be None for",
                     " the one-buffer layouts (packed, stacked)");
  FLASHMSA_CHECK_ARG(nvfp4 || (k_scales.rank == 0 && v_scales.rank == 0),
                     "k_scales / v_scales are only for nvfp4 caches, got them with ",
                     to_string(dtype));
  // Per layout: rank, which dimension is page / head / token, and the row factor (2 for packed).
  struct Dims {
    int rank, page, head, token;
    const char* shape;
  };
  Dims dims{};
  switch (layout) {
    case KvLayout::kPacked: dims = {4, 0, 1, 2, "[pages, Hkv, page, 2*E]"}; break;
    case KvLayout::kSeparate: dims = {4, 0, 1, 2, "[pages, Hkv, page, E]"}; break;
    case KvLayout::kStacked: dims = {5, 0, 2, 3, "[pages, 2, Hkv, page, E]"}; break;
    case KvLayout::kTokenMajor: dims = {4, 0, 2, 1, "[pages, page, Hkv, E]"}; break;
  }
  const TensorBuffer kb = tensor_buffer(k, "k", dtype, false, dims.rank, dims.shape);
  std::int64_t row_elems = k.shape[dims.rank - 1];
  if (layout == KvLayout::kPacked) {
    FLASHMSA_CHECK_ARG(row_elems % 2 == 0,
                       "k (packed) must have an even last dimension (K then V),"
                       " got ",
                       row_elems);
    row_elems /= 2;
  }
  if (layout == KvLayout::kStacked) {
    FLASHMSA_CHECK_ARG(k.shape[1] == 2, "k (stacked) must have 2 in dimension 1 (K, V), got ",
                       k.shape[1]);
  }
  const std::int64_t row_bytes = row_elems * kb.elem;
  KvCacheShape shape;
  shape.num_pages = k.shape[0];
  shape.num_kv_heads = k.shape[dims.head];
  shape.page_size = k.shape[dims.token];
  shape.head_dim = row_bytes * 8 / dtype_bits(dtype);

  KvCacheView view;
  view.dtype = dtype;
  view.device = k.device;
  view.shape = shape;
  auto same_shape = [&](const TensorView& t, const char* name, std::int64_t last) {
    bool ok = t.rank == k.rank && t.device == k.device;
    for (int d = 0; ok && d < k.rank - 1; ++d) ok = t.shape[d] == k.shape[d];
    ok = ok && t.shape[k.rank - 1] == last;
    FLASHMSA_CHECK_ARG(ok, name, " must be on ", to_string(k.device), " with k's shape up to its ",
                       "last dimension and ", last, " there (", dims.shape, ")");
  };
  if (layout == KvLayout::kPacked) {
    view.k = tensor_plane(k, kb, dims.page, dims.head, dims.token, 0, row_elems);
    view.v = tensor_plane(k, kb, dims.page, dims.head, dims.token, row_elems, row_elems);
  } else if (layout == KvLayout::kStacked) {
    view.k = tensor_plane(k, kb, dims.page, dims.head, dims.token, 0, row_elems);
    view.v = tensor_plane(k, kb, dims.page, dims.head, dims.token, k.stride[1], row_elems);
  } else {
    const TensorBuffer vb = tensor_buffer(v, "v", dtype, false, dims.rank, dims.shape);
    same_shape(v, "v", k.shape[dims.rank - 1]);
    FLASHMSA_CHECK_ARG(v.dtype == k.dtype, "v must have k's dtype ", to_string(k.dtype), ", got ",
                       to_string(v.dtype));
    view.k = tensor_plane(k, kb, dims.page, dims.head, dims.token, 0, row_elems);
    view.v = tensor_plane(v, vb, dims.page, dims.head, dims.token, 0, row_elems);
  }
  if (nvfp4) {
    const std::int64_t srow = shape.head_dim / kNvfp4ScaleGroup;
    const std::int64_t k_last = layout == KvLayout::kPacked ? 2 * srow : srow;
    const TensorBuffer sb = tensor_buffer(k_scales, "k_scales", dtype, true, dims.rank, dims.shape);
    same_shape(k_scales, "k_scales", k_last);
    if (layout == KvLayout::kPacked || layout == KvLayout::kStacked) {
      view.k_block_scale = tensor_plane(k_scales, sb, dims.page, dims.head, dims.token, 0, srow);
      view.v_block_scale =
          tensor_plane(k_scales, sb, dims.page, dims.head, dims.token,
                       layout == KvLayout::kPacked ? srow : k_scales.stride[1], srow);
    } else {
      const TensorBuffer vsb =
          tensor_buffer(v_scales, "v_scales", dtype, true, dims.rank, dims.shape);
      same_shape(v_scales, "v_scales", srow);
      view.k_block_scale = tensor_plane(k_scales, sb, dims.page, dims.head, dims.token, 0, srow);
      view.v_block_scale = tensor_plane(v_scales, vsb, dims.page, dims.head, dims.token, 0, srow);
    }
  }
  view.validate();
  return view;
}

IndexCacheView IndexCacheView::from_tensors(DType dtype, const TensorView& data,
                                            const TensorView& scales) {
  FLASHMSA_CHECK_ARG(dtype == DType::kBf16 || dtype == DType::kFp8E4m3 || dtype == DType::kNvfp4,
                     "index_cache dtype must be one of bf16, fp8_e4m3, nvfp4, got ",
                     to_string(dtype));
  const bool nvfp4 = dtype == DType::kNvfp4;
  FLASHMSA_CHECK_ARG(nvfp4 || scales.rank == 0, "index_cache scales are only for nvfp4, got them ",
                     "with ", to_string(dtype));
  const TensorBuffer db = tensor_buffer(data, "index_cache", dtype, false, 3, "[pages, page, E]");
  IndexCacheView view;
  view.dtype = dtype;
  view.device = data.device;
  view.num_pages = data.shape[0];
  view.page_size = data.shape[1];
  view.index_dim = data.shape[2] * db.elem * 8 / dtype_bits(dtype);
  view.k = tensor_plane(data, db, 0, -1, 1, 0, data.shape[2]);
  if (nvfp4) {
    const TensorBuffer sb =
        tensor_buffer(scales, "index_cache scales", dtype, true, 3, "[pages, page, Di/16]");
    const std::int64_t srow = view.index_dim / kNvfp4ScaleGroup;
    FLASHMSA_CHECK_ARG(scales.device == data.device && scales.shape[0] == data.shape[0] &&
                           scales.shape[1] == data.shape[1] && scales.shape[2] == srow,
                       "index_cache scales must be on ", to_string(data.device), " with shape [",
                       data.shape[0], ", ", data.shape[1], ", ", srow, "], got [", scales.shape[0],
                       ", ", scales.shape[1], ", ", scales.shape[2], "]");
    view.block_scale = tensor_plane(scales, sb, 0, -1, 1, 0, srow);
  }
  view.validate();
  return view;
}

namespace {

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
  FLASHMSA_CHECK_ARG(max_offset <= pl.extent_bytes, name, ": ", pages, " pages reach ", max_offset,
                     " bytes from its data, but its memory (extent_bytes) holds ", pl.extent_bytes);
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

KvCacheView KvCacheView::make(KvLayout layout, DType dtype, const KvCacheShape& shape,
                              CacheBuffer k_data, CacheBuffer v_data, Device device,
                              CacheBuffer k_scales, CacheBuffer v_scales) {
  FLASHMSA_CHECK_ARG(two_buffers(layout) || (v_data.data == nullptr && v_scales.data == nullptr),
                     "kv_cache: this layout keeps K and V in one buffer; v_data and v_scales "
                     "must be empty");
  FLASHMSA_CHECK_ARG(
      dtype == DType::kNvfp4 || (k_scales.data == nullptr && v_scales.data == nullptr),
      "kv_cache block scales are only for nvfp4, got them with ", to_string(dtype));
  KvCacheView view;
  view.dtype = dtype;
  view.device = device;
  view.shape = shape;
  const auto data =
      layout_planes(layout, shape, cache_row_bytes(dtype, shape.head_dim), k_data, v_data);
  view.k = data[0];
  view.v = data[1];
  if (dtype == DType::kNvfp4) {
    const auto scales =
        layout_planes(layout, shape, scale_row_bytes(shape.head_dim), k_scales, v_scales);
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
  return product_or_throw("kv_cache buffer bytes", {two_buffers(layout) ? 1 : 2, shape.num_pages,
                                                    shape.num_kv_heads, shape.page_size, row});
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
                                    CacheBuffer data, Device device, CacheBuffer scales,
                                    std::int64_t page_size) {
  FLASHMSA_CHECK_ARG(dtype == DType::kNvfp4 || scales.data == nullptr,
                     "index_cache.block_scale is only for nvfp4, got it with ", to_string(dtype));
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
  return product_or_throw("index_cache buffer bytes", {num_pages, page_size,
                                                       scales ? scale_row_bytes(index_dim)
                                                              : cache_row_bytes(dtype, index_dim)});
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
