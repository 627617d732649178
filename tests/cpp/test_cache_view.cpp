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
      const KvCacheView view =
          KvCacheView::make(layout, dtype, s, k.data(), v.data(), Device::kCpu,
                            nvfp4 ? ks.data() : nullptr, nvfp4 ? vs.data() : nullptr);
      const bool two = layout == KvLayout::kSeparate || layout == KvLayout::kTokenMajor;
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
  view.k = {k.data(), 4 * 128 * 72, 128 * 72, 72, 64};
  view.v = {v.data(), 4 * 128 * 72, 128 * 72, 72, 64};
  view.k_block_scale = {k.data() + 64, 4 * 128 * 72, 128 * 72, 72, 8};
  view.v_block_scale = {v.data() + 64, 4 * 128 * 72, 128 * 72, 72, 8};
  EXPECT_NO_THROW(view.validate());
}

TEST(CacheView, ValidationNamesThePlaneAndTheRule) {
  const KvCacheShape s{4, 2, 128, 128};
  std::vector<std::uint16_t> buf(KvCacheView::buffer_bytes(KvLayout::kPacked, DType::kBf16, s));
  KvCacheView good = KvCacheView::make(KvLayout::kPacked, DType::kBf16, s, buf.data());

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
  bad.k.data = reinterpret_cast<std::byte*>(buf.data()) + 1;
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
              KvCacheView::make(KvLayout::kPacked, DType::kNvfp4, s, buf.data());
            }).find("kv_cache.k_block_scale.data must be non-null"),
            std::string::npos);
  // Index cache.
  std::vector<std::uint8_t> idx(IndexCacheView::buffer_bytes(DType::kFp8E4m3, 3, 128));
  EXPECT_NO_THROW(IndexCacheView::make(DType::kFp8E4m3, 3, 128, idx.data()));
  EXPECT_NE(expect_error([&] {
              IndexCacheView::make(DType::kFp16, 3, 128, idx.data());
            }).find("index_cache.dtype must be one of bf16, fp8_e4m3, nvfp4, got fp16"),
            std::string::npos);
  EXPECT_NE(expect_error([&] {
              IndexCacheView::make(DType::kBf16, 3, 128, nullptr);
            }).find("index_cache.k.data must be non-null"),
            std::string::npos);
}

}  // namespace
}  // namespace flashmsa
