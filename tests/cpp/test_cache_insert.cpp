// Cache insertion against a per-element oracle, over every dtype and layout, with scattered
// slots, padding and out-of-range slots; every byte of the caches is checked (the canary: caches
// start as random bytes, and rows outside the write set must keep them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/ops.hpp"
#include "tests/cpp/cache_test_util.hpp"
#include "tests/cpp/error_message.hpp"

namespace flashmsa {
namespace {

using test::RandomCaches;

// Plainly encoded expected row bytes (spec 6): fp8 = e4m3/e5m2_satfinite(x / scale); NVFP4 by
// groups of 16. Returns data bytes and (NVFP4) scale bytes.
std::pair<std::vector<std::uint8_t>, std::vector<std::uint8_t>> expected_row(
    DType dtype, const std::vector<float>& x, float scale) {
  std::vector<std::uint8_t> data, scales;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (dtype == DType::kBf16 || dtype == DType::kFp16) {
      const std::uint16_t b =
          dtype == DType::kBf16 ? fmt::float_to_bf16(x[i]) : fmt::float_to_fp16(x[i]);
      data.push_back(static_cast<std::uint8_t>(b & 0xFF));
      data.push_back(static_cast<std::uint8_t>(b >> 8));
    } else if (dtype == DType::kFp8E4m3) {
      data.push_back(fmt::float_to_e4m3(x[i] / scale, fmt::Saturation::kFinite));
    } else if (dtype == DType::kFp8E5m2) {
      data.push_back(fmt::float_to_e5m2(x[i] / scale, fmt::Saturation::kFinite));
    }
  }
  if (dtype == DType::kNvfp4) {
    for (std::size_t g = 0; g < x.size() / 16; ++g) {
      std::uint8_t packed[8];
      scales.push_back(fmt::nvfp4_quantize_group(&x[g * 16], packed));
      data.insert(data.end(), packed, packed + 8);
    }
  }
  return {data, scales};
}

bool bytes_equal(const std::byte* a, const std::uint8_t* b, std::int64_t n) {
  return std::memcmp(a, b, static_cast<std::size_t>(n)) == 0;
}

struct SlotCase {
  std::vector<std::int64_t> slots;
  std::int64_t capacity;
};

// Distinct scattered slots, plus padding (-1) and slots at and beyond the capacity.
SlotCase make_slots(std::int64_t num_tokens, std::int64_t capacity, std::uint64_t seed) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(capacity));
  std::iota(all.begin(), all.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<std::int64_t> slots(all.begin(), all.begin() + num_tokens);
  slots[3] = -1;
  slots[5] = -7;
  slots[8] = capacity;
  slots[9] = capacity + 1000;
  return {slots, capacity};
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float scale = std::exp2(static_cast<float>(i % 13) - 6.0f);  // a spread of magnitudes
    v[i] = fmt::bf16_to_float(fmt::float_to_bf16(normal(rng) * scale));
  }
  return v;
}

const char* layout_name(KvLayout layout) {
  switch (layout) {
    case KvLayout::kPacked: return "packed";
    case KvLayout::kSeparate: return "separate";
    case KvLayout::kStacked: return "stacked";
    case KvLayout::kTokenMajor: return "token_major";
  }
  return "?";
}

class InsertKv : public ::testing::TestWithParam<std::tuple<DType, KvLayout>> {};

TEST_P(InsertKv, WritesExactlyTheSlotsRowsQuantizedPerSpec) {
  const auto [dtype, layout] = GetParam();
  const KvCacheShape shape{6, 4, 128, 128};
  RandomCaches caches(layout, shape, dtype, DType::kBf16, 128, 11);
  caches.kv.k_scale = 0.5f;
  caches.kv.v_scale = 4.0f;
  const std::vector<std::byte> k_before = caches.k, v_before = caches.v;
  const std::vector<std::byte> ks_before = caches.k_scales, vs_before = caches.v_scales;

  const std::int64_t T = 40, H = shape.num_kv_heads, D = shape.head_dim;
  // K and V interleaved in one [T, 2, H, D] fp32 buffer: strided views.
  const std::vector<float> kv_values = random_values(static_cast<std::size_t>(T * 2 * H * D), 5);
  TensorView k = TensorView::contiguous(kv_values.data(), DType::kFp32, {T, H, D});
  k.stride[0] = 2 * H * D;
  TensorView v = k;
  v.data = const_cast<float*>(kv_values.data()) + H * D;
  const SlotCase sc = make_slots(T, caches.kv.capacity_tokens(), 9);
  const auto slots = TensorView::contiguous(sc.slots.data(), DType::kInt64, {T});
  insert_kv(caches.kv, k, v, slots);

  // Which (page, offset) rows were written, by which token.
  std::vector<std::int64_t> writer(static_cast<std::size_t>(sc.capacity), -1);
  for (std::int64_t t = 0; t < T; ++t) {
    if (sc.slots[t] >= 0 && sc.slots[t] < sc.capacity) writer[sc.slots[t]] = t;
  }
  const std::int64_t row = cache_row_bytes(dtype, D);
  std::int64_t written = 0;
  for (std::int64_t p = 0; p < shape.num_pages; ++p) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t o = 0; o < shape.page_size; ++o) {
        const std::int64_t t = writer[p * shape.page_size + o];
        for (int plane = 0; plane < 2; ++plane) {
          const std::byte* got = caches.kv_row(plane, p, h, o);
          const std::byte* got_scales =
              dtype == DType::kNvfp4 ? caches.kv_scale_row(plane, p, h, o) : nullptr;
          const bool second = plane == 1 && test::two_buffers(layout);
          if (t < 0) {  // canary: untouched rows keep their random bytes
            const auto& before = second ? v_before : k_before;
            const std::byte* was = before.data() + (got - (second ? caches.v : caches.k).data());
            ASSERT_EQ(std::memcmp(got, was, static_cast<std::size_t>(row)), 0)
                << "row outside the write set changed: page " << p << " head " << h;
            if (got_scales) {
              const auto& sb = second ? vs_before : ks_before;
              const auto& sc_buf = second ? caches.v_scales : caches.k_scales;
              ASSERT_EQ(std::memcmp(got_scales, sb.data() + (got_scales - sc_buf.data()), 8), 0);
            }
            continue;
          }
          std::vector<float> x(static_cast<std::size_t>(D));
          for (std::int64_t d = 0; d < D; ++d) {
            x[d] = kv_values[((t * 2 + plane) * H + h) * D + d];
          }
          const auto [data, scales] = expected_row(dtype, x, plane ? 4.0f : 0.5f);
          ASSERT_TRUE(bytes_equal(got, data.data(), row)) << "token " << t << " head " << h;
          if (got_scales) {
            ASSERT_TRUE(bytes_equal(got_scales, scales.data(), 8));
          }
          ++written;
        }
      }
    }
  }
  EXPECT_EQ(written, (T - 4) * H * 2);
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypesAndLayouts, InsertKv,
    ::testing::Combine(::testing::Values(DType::kBf16, DType::kFp16, DType::kFp8E4m3,
                                         DType::kFp8E5m2, DType::kNvfp4),
                       ::testing::Values(KvLayout::kPacked, KvLayout::kSeparate, KvLayout::kStacked,
                                         KvLayout::kTokenMajor)),
    [](const ::testing::TestParamInfo<std::tuple<DType, KvLayout>>& param_info) {
      return std::string(to_string(std::get<0>(param_info.param))) + "_" +
             layout_name(std::get<1>(param_info.param));
    });

TEST(InsertIndexK, EveryIndexDtype) {
  for (DType dtype : {DType::kBf16, DType::kFp8E4m3, DType::kNvfp4}) {
    RandomCaches caches(KvLayout::kPacked, {5, 1, 128, 128}, DType::kBf16, dtype, 128, 21);
    const std::vector<std::byte> before = caches.index, scales_before = caches.index_scales;
    const std::int64_t T = 30, Di = 128;
    std::vector<std::uint16_t> ik(static_cast<std::size_t>(T * Di));
    const auto values = random_values(ik.size(), 8);
    for (std::size_t i = 0; i < ik.size(); ++i) ik[i] = fmt::float_to_bf16(values[i]);
    const SlotCase sc = make_slots(T, caches.ix.capacity_tokens(), 4);
    insert_index_k(caches.ix, TensorView::contiguous(ik.data(), DType::kBf16, {T, Di}),
                   TensorView::contiguous(sc.slots.data(), DType::kInt64, {T}));
    std::vector<std::int64_t> writer(static_cast<std::size_t>(sc.capacity), -1);
    for (std::int64_t t = 0; t < T; ++t) {
      if (sc.slots[t] >= 0 && sc.slots[t] < sc.capacity) writer[sc.slots[t]] = t;
    }
    for (std::int64_t s = 0; s < sc.capacity; ++s) {
      const std::byte* got = caches.index_row(s / 128, s % 128);
      const std::int64_t row = caches.index_row_bytes();
      if (writer[s] < 0) {
        ASSERT_EQ(std::memcmp(got, before.data() + s * row, static_cast<std::size_t>(row)), 0);
        if (dtype == DType::kNvfp4) {
          ASSERT_EQ(std::memcmp(caches.index_scale_row(s / 128, s % 128),
                                scales_before.data() + s * 8, 8),
                    0);
        }
        continue;
      }
      std::vector<float> x(values.begin() + writer[s] * Di, values.begin() + (writer[s] + 1) * Di);
      const auto [data, scales] = expected_row(dtype, x, 1.0f);
      ASSERT_TRUE(bytes_equal(got, data.data(), row)) << to_string(dtype) << " slot " << s;
      if (dtype == DType::kNvfp4) {
        ASSERT_TRUE(bytes_equal(caches.index_scale_row(s / 128, s % 128), scales.data(), 8));
      }
    }
  }
}

TEST(InsertKv, CheckedModeReportsTheFirstBadSlotAndWritesNothing) {
  RandomCaches caches(KvLayout::kPacked, {2, 4, 128, 128}, DType::kBf16, DType::kBf16, 128, 3);
  const std::vector<std::byte> before = caches.k;
  const std::int64_t T = 4;
  std::vector<std::uint16_t> k(T * 4 * 128, fmt::float_to_bf16(1.5f));
  std::vector<std::int64_t> slots{0, -1, 256, 300};
  try {
    insert_kv(caches.kv, TensorView::contiguous(k.data(), DType::kBf16, {T, 4, 128}),
              TensorView::contiguous(k.data(), DType::kBf16, {T, 4, 128}),
              TensorView::contiguous(slots.data(), DType::kInt64, {T}), {.checked = true});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "slot_mapping[2] = 256 is beyond the cache capacity of 256 slots");
  }
  EXPECT_EQ(caches.k, before);
}

TEST(InsertKv, ArgumentErrorsNameTheArgument) {
  RandomCaches caches(KvLayout::kPacked, {2, 4, 128, 128}, DType::kBf16, DType::kBf16, 128, 3);
  std::vector<std::uint16_t> k(3 * 4 * 128);
  std::vector<std::int64_t> slots(3);
  std::vector<std::int32_t> slots32(3);
  const auto good_k = TensorView::contiguous(k.data(), DType::kBf16, {3, 4, 128});
  const auto good_slots = TensorView::contiguous(slots.data(), DType::kInt64, {3});
  EXPECT_EQ(test::error_message([&] {
              insert_kv(caches.kv, TensorView::contiguous(k.data(), DType::kBf16, {3, 2, 256}),
                        good_k, good_slots);
            }),
            "k must have shape [*, 4, 128], got [3, 2, 256]");
  EXPECT_EQ(test::error_message([&] {
              insert_kv(caches.kv, good_k, good_k,
                        TensorView::contiguous(slots32.data(), DType::kInt32, {3}));
            }),
            "slot_mapping must have dtype int64, got int32");
  EXPECT_EQ(test::error_message([&] {
              insert_kv(caches.kv, good_k,
                        TensorView::contiguous(k.data(), DType::kInt32, {3, 4, 128}), good_slots);
            }),
            "v must have dtype bf16 or fp16 or fp32, got int32");
  EXPECT_EQ(test::error_message([&] {
              insert_kv(caches.kv, good_k,
                        TensorView::contiguous(k.data(), DType::kBf16, {2, 4, 128}), good_slots);
            }),
            "v must have shape [3, 4, 128], got [2, 4, 128]");
  EXPECT_EQ(test::error_message([&] {
              insert_kv(caches.kv,
                        TensorView::contiguous(k.data(), DType::kBf16, {3, 4, 128}, Device::kCuda),
                        good_k, good_slots);
            }),
            "k must be on cpu, got cuda");
}

}  // namespace
}  // namespace flashmsa
