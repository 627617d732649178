#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "flashmsa/cache.hpp"
#include "flashmsa/error.hpp"
#include "tests/cpp/cache_test_util.hpp"

namespace flashmsa {
namespace {

std::string expect_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.message();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(CacheView, LayoutsAddressRowsAsTheSpecSays) {
  const KvCacheShape s{5, 3, 64, 16};
  for (DType dtype : {DType::kBf16, DType::kFp8E4m3, DType::kNvfp4}) {
    for (KvLayout layout :
         {KvLayout::kPacked, KvLayout::kSeparate, KvLayout::kStacked, KvLayout::kTokenMajor}) {
      const bool nvfp4 = dtype == DType::kNvfp4;
      std::vector<std::byte> k(KvCacheView::buffer_bytes(layout, dtype, s));
      std::vector<std::byte> v(k.size());
      std::vector<std::byte> ks(nvfp4 ? KvCacheView::buffer_bytes(layout, dtype, s, true) : 0);
      std::vector<std::byte> vs(ks.size());
      const bool two = layout == KvLayout::kSeparate || layout == KvLayout::kTokenMajor;
      if (!two) v.clear(), vs.clear();
      const KvCacheView view = KvCacheView::make(layout, dtype, s, test::buffer(k), test::buffer(v),
                                                 Device::kCpu, test::buffer(ks), test::buffer(vs));
      const std::int64_t row = cache_row_bytes(dtype, s.head_dim);
      EXPECT_EQ(view.k.row_bytes, row);
      for (std::int64_t p = 0; p < s.num_pages; ++p) {
        for (std::int64_t h = 0; h < s.num_kv_heads; ++h) {
          for (std::int64_t t = 0; t < s.page_size; ++t) {
            ASSERT_EQ(view.k.row(p, h, t) - k.data(),
                      test::spec_offset(layout, s, row, 0, p, h, t));
            ASSERT_EQ(view.v.row(p, h, t) - (two ? v.data() : k.data()),
                      test::spec_offset(layout, s, row, 1, p, h, t));
            if (nvfp4) {
              ASSERT_EQ(view.k_block_scale.row(p, h, t) - ks.data(),
                        test::spec_offset(layout, s, 4, 0, p, h, t));
              ASSERT_EQ(view.v_block_scale.row(p, h, t) - (two ? vs.data() : ks.data()),
                        test::spec_offset(layout, s, 4, 1, p, h, t));
            }
          }
        }
      }
    }
  }
}

TEST(CacheView, Nvfp4InterleavedSlotIsExpressible) {
  // MSA-style 72-byte slot per (page, head, token): 64 data bytes then 8 scale bytes.
  const KvCacheShape s{2, 4, 128, 128};
  std::vector<std::byte> k(2 * 4 * 128 * 72), v(k.size());
  KvCacheView view;
  view.dtype = DType::kNvfp4;
  view.shape = s;
  const auto bytes = static_cast<std::int64_t>(k.size());
  view.k = {k.data(), 4 * 128 * 72, 128 * 72, 72, 64, bytes};
  view.v = {v.data(), 4 * 128 * 72, 128 * 72, 72, 64, bytes};
  view.k_block_scale = {k.data() + 64, 4 * 128 * 72, 128 * 72, 72, 8, bytes - 64};
  view.v_block_scale = {v.data() + 64, 4 * 128 * 72, 128 * 72, 72, 8, bytes - 64};
  EXPECT_NO_THROW(view.validate());
  // One byte short of the last slot's scales.
  view.v_block_scale.extent_bytes = bytes - 65;
  EXPECT_NE(expect_error([&] {
              view.validate();
            }).find("kv_cache.v_block_scale: 2 pages reach " + std::to_string(bytes - 64)),
            std::string::npos);
}

TEST(CacheView, ValidationNamesThePlaneAndTheRule) {
  const KvCacheShape s{4, 2, 128, 128};
  std::vector<std::byte> buf(KvCacheView::buffer_bytes(KvLayout::kPacked, DType::kBf16, s));
  KvCacheView good = KvCacheView::make(KvLayout::kPacked, DType::kBf16, s, test::buffer(buf));

  KvCacheView bad = good;
  bad.k.token_stride = 128;  // rows of 256 bytes 128 apart overlap
  EXPECT_NE(expect_error([&] { bad.validate(); })
                .find("kv_cache.k.token_stride (128) makes rows "
                      "overlap"),
            std::string::npos);
  bad = good;
  bad.v.data = nullptr;
  EXPECT_NE(expect_error([&] { bad.validate(); }).find("kv_cache.v.data must be non-null"),
            std::string::npos);
  bad = good;
  bad.k.data = buf.data() + 1;
  EXPECT_NE(expect_error([&] { bad.validate(); }).find("kv_cache.k.data must be aligned to 2"),
            std::string::npos);
  bad = good;
  bad.k.page_stride = std::int64_t{1} << 62;  // 3 pages past the first overflow int64
  EXPECT_NE(expect_error([&] { bad.validate(); }).find("overflows int64"), std::string::npos);
  bad = good;
  bad.dtype = DType::kFp32;
  EXPECT_NE(expect_error([&] { bad.validate(); }).find("kv_cache.dtype must be one of"),
            std::string::npos);
  bad = good;
  bad.k_scale = 0.0f;
  EXPECT_NE(expect_error([&] { bad.validate(); }).find("kv_cache.k_scale must be finite and > 0"),
            std::string::npos);
  // NVFP4 without its scale buffer.
  EXPECT_NE(expect_error([&] {
              KvCacheView::make(KvLayout::kPacked, DType::kNvfp4, s, test::buffer(buf));
            }).find("kv_cache.k_block_scale.data must be non-null"),
            std::string::npos);
  // A buffer one byte short, and a second buffer for a one-buffer layout.
  EXPECT_NE(expect_error([&] {
              KvCacheView::make(KvLayout::kPacked, DType::kBf16, s,
                                {buf.data(), static_cast<std::int64_t>(buf.size()) - 1});
            }).find("kv_cache.v: 4 pages reach"),
            std::string::npos);
  EXPECT_NE(expect_error([&] {
              KvCacheView::make(KvLayout::kPacked, DType::kBf16, s, test::buffer(buf),
                                test::buffer(buf));
            }).find("v_data and v_scales must be empty"),
            std::string::npos);
  // Index cache.
  std::vector<std::byte> idx(IndexCacheView::buffer_bytes(DType::kFp8E4m3, 3, 128));
  EXPECT_NO_THROW(IndexCacheView::make(DType::kFp8E4m3, 3, 128, test::buffer(idx)));
  EXPECT_NE(expect_error([&] {
              IndexCacheView::make(DType::kFp16, 3, 128, test::buffer(idx));
            }).find("index_cache.dtype must be one of bf16, fp8_e4m3, nvfp4, got fp16"),
            std::string::npos);
  EXPECT_NE(expect_error([&] {
              IndexCacheView::make(DType::kBf16, 3, 128, {nullptr, 1 << 20});
            }).find("index_cache.k.data must be non-null"),
            std::string::npos);
  // The reproducer of a view larger than its memory: 1000 pages over 1000 bytes.
  EXPECT_NE(expect_error([&] {
              IndexCacheView::make(DType::kBf16, 1000, 128, {idx.data(), 1000});
            })
                .find("index_cache.k: 1000 pages reach 32768000 bytes from its data, but its "
                      "memory (extent_bytes) holds 1000"),
            std::string::npos);
}

// Views over framework tensors address exactly what make() addresses over the same memory,
// derive their shape, honour strides and refuse tensors that cannot hold the layout.
TEST(CacheView, FromTensorsMatchesMakeForEveryLayout) {
  const KvCacheShape s{3, 2, 16, 64};
  for (DType dtype : {DType::kBf16, DType::kFp16, DType::kFp8E5m2, DType::kNvfp4}) {
    for (KvLayout layout :
         {KvLayout::kPacked, KvLayout::kSeparate, KvLayout::kStacked, KvLayout::kTokenMajor}) {
      const bool nvfp4 = dtype == DType::kNvfp4, two = test::two_buffers(layout);
      std::vector<std::byte> k(KvCacheView::buffer_bytes(layout, dtype, s));
      std::vector<std::byte> v(two ? k.size() : 0);
      std::vector<std::byte> ks(nvfp4 ? KvCacheView::buffer_bytes(layout, dtype, s, true) : 0);
      std::vector<std::byte> vs(two ? ks.size() : 0);
      const KvCacheView want = KvCacheView::make(layout, dtype, s, test::buffer(k), test::buffer(v),
                                                 Device::kCpu, test::buffer(ks), test::buffer(vs));
      const DType carrier = nvfp4                      ? DType::kUint8
                            : dtype == DType::kFp8E5m2 ? DType::kUint8
                                                       : dtype;
      const std::int64_t e =
          cache_row_bytes(dtype, s.head_dim) / std::max(1, dtype_bits(carrier) / 8);
      auto tensor = [&](std::vector<std::byte>& b, DType t, std::int64_t last) {
        if (b.empty()) return TensorView{};
        switch (layout) {
          case KvLayout::kPacked:
            return TensorView::contiguous(b.data(), t,
                                          {s.num_pages, s.num_kv_heads, s.page_size, 2 * last});
          case KvLayout::kStacked:
            return TensorView::contiguous(b.data(), t,
                                          {s.num_pages, 2, s.num_kv_heads, s.page_size, last});
          case KvLayout::kSeparate:
            return TensorView::contiguous(b.data(), t,
                                          {s.num_pages, s.num_kv_heads, s.page_size, last});
          case KvLayout::kTokenMajor:
            return TensorView::contiguous(b.data(), t,
                                          {s.num_pages, s.page_size, s.num_kv_heads, last});
        }
        return TensorView{};
      };
      const std::int64_t se = s.head_dim / 16;
      const KvCacheView got =
          KvCacheView::from_tensors(layout, dtype, tensor(k, carrier, e), tensor(v, carrier, e),
                                    tensor(ks, DType::kUint8, se), tensor(vs, DType::kUint8, se));
      EXPECT_EQ(got.shape.num_pages, s.num_pages);
      EXPECT_EQ(got.shape.num_kv_heads, s.num_kv_heads);
      EXPECT_EQ(got.shape.page_size, s.page_size);
      EXPECT_EQ(got.shape.head_dim, s.head_dim);
      for (auto [a, b] : {std::pair{&got.k, &want.k},
                          {&got.v, &want.v},
                          {&got.k_block_scale, &want.k_block_scale},
                          {&got.v_block_scale, &want.v_block_scale}}) {
        EXPECT_EQ(a->data, b->data);
        EXPECT_EQ(a->page_stride, b->page_stride);
        EXPECT_EQ(a->head_stride, b->head_stride);
        EXPECT_EQ(a->token_stride, b->token_stride);
        EXPECT_EQ(a->row_bytes, b->row_bytes);
      }
    }
  }
}

TEST(CacheView, FromTensorsHonoursStridesAndRejectsWhatCannotHoldACache) {
  // Every second page of a [6, 4, 128, 256] bf16 buffer: 3 pages, page stride 2 pages.
  std::vector<std::uint16_t> buf(6 * 4 * 128 * 256);
  TensorView t = TensorView::contiguous(buf.data(), DType::kBf16, {3, 4, 128, 256});
  t.stride[0] *= 2;
  const KvCacheView kv = KvCacheView::from_tensors(KvLayout::kPacked, DType::kBf16, t);
  EXPECT_EQ(kv.shape.num_pages, 3);
  EXPECT_EQ(kv.v.row(2, 3, 127) - reinterpret_cast<std::byte*>(buf.data()),
            ((4 * 4 + 3) * 128 + 127) * 512 + 256);
  // fp32 is not a bf16 cache.
  const TensorView f32 = TensorView::contiguous(buf.data(), DType::kFp32, {3, 4, 128, 128});
  EXPECT_NE(expect_error([&] {
              KvCacheView::from_tensors(KvLayout::kPacked, DType::kBf16, f32);
            }).find("k of a bf16 cache must have dtype bf16, got fp32"),
            std::string::npos);
  // A broadcast (stride-0) page dimension would alias every page.
  TensorView alias = TensorView::contiguous(buf.data(), DType::kBf16, {3, 4, 128, 256});
  alias.stride[0] = 0;
  EXPECT_NE(expect_error([&] {
              KvCacheView::from_tensors(KvLayout::kPacked, DType::kBf16, alias);
            }).find("makes rows overlap"),
            std::string::npos);
  // Rank, a strided last dimension, the stacked K/V dimension, a missing V.
  const TensorView flat = TensorView::contiguous(buf.data(), DType::kBf16, {1000});
  EXPECT_NE(expect_error([&] {
              KvCacheView::from_tensors(KvLayout::kPacked, DType::kBf16, flat);
            }).find("k must have shape [pages, Hkv, page, 2*E] (rank 4), got rank 1"),
            std::string::npos);
  TensorView gappy = TensorView::contiguous(buf.data(), DType::kBf16, {1, 4, 128, 256});
  gappy.stride[3] = 2;
  EXPECT_NE(expect_error([&] {
              KvCacheView::from_tensors(KvLayout::kPacked, DType::kBf16, gappy);
            }).find("k must be contiguous in its last dimension"),
            std::string::npos);
  const TensorView three = TensorView::contiguous(buf.data(), DType::kBf16, {1, 3, 4, 128, 128});
  EXPECT_NE(expect_error([&] {
              KvCacheView::from_tensors(KvLayout::kStacked, DType::kBf16, three);
            }).find("must have 2 in dimension 1"),
            std::string::npos);
  const TensorView sep = TensorView::contiguous(buf.data(), DType::kBf16, {1, 4, 128, 128});
  EXPECT_NE(expect_error([&] {
              KvCacheView::from_tensors(KvLayout::kSeparate, DType::kBf16, sep);
            }).find("v is required for this layout and dtype"),
            std::string::npos);
  // Index cache: shape derived; NVFP4 scales must match.
  std::vector<std::uint8_t> idx(4 * 128 * 64), sc(4 * 128 * 8);
  const IndexCacheView ix = IndexCacheView::from_tensors(
      DType::kNvfp4, TensorView::contiguous(idx.data(), DType::kUint8, {4, 128, 64}),
      TensorView::contiguous(sc.data(), DType::kUint8, {4, 128, 8}));
  EXPECT_EQ(ix.index_dim, 128);
  EXPECT_EQ(ix.num_pages, 4);
  EXPECT_NE(expect_error([&] {
              IndexCacheView::from_tensors(
                  DType::kNvfp4, TensorView::contiguous(idx.data(), DType::kUint8, {4, 128, 64}),
                  TensorView::contiguous(sc.data(), DType::kUint8, {4, 128, 4}));
            }).find("index_cache scales must be on cpu with shape [4, 128, 8], got [4, 128, 4]"),
            std::string::npos);
}

}  // namespace
}  // namespace flashmsa
