#include "tests/cpp/producer_checks.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "tests/cpp/cache_test_util.hpp"

namespace flashmsa::test {
namespace {

// The fp64 oracle for one head vector: Gemma RMSNorm then NeoX RoPE on [0, rope_dim), with the
// engines' fp32 angle (float(p) * fp32 inv_freq) and exact cos/sin.
std::vector<double> oracle_head(const Config& c, const std::vector<double>& x,
                                const std::vector<double>& w, std::int64_t position) {
  const auto n = static_cast<std::int64_t>(x.size());
  double ms = 0;
  for (double v : x) ms += v * v;
  ms /= static_cast<double>(n);
  std::vector<double> y(x.size());
  for (std::int64_t d = 0; d < n; ++d) y[d] = x[d] / std::sqrt(ms + c.rms_norm_eps) * (1.0 + w[d]);
  const int half = c.rope_dim / 2;
  std::vector<double> out = y;
  for (int i = 0; i < half; ++i) {
    const auto inv_freq = static_cast<float>(std::pow(c.rope_theta, -2.0 * i / c.rope_dim));
    const float angle = static_cast<float>(position) * inv_freq;
    const double cs = std::cos(static_cast<double>(angle)),
                 sn = std::sin(static_cast<double>(angle));
    out[i] = y[i] * cs - y[i + half] * sn;
    out[i + half] = y[i + half] * cs + y[i] * sn;
  }
  return out;
}

// Checks one stored row of `dtype` against the oracle values y; returns false with a message.
::testing::AssertionResult row_matches(DType dtype, const std::byte* row,
                                       const std::byte* scale_row, const std::vector<double>& y,
                                       double scale) {
  const auto n = static_cast<std::int64_t>(y.size());
  if (dtype == DType::kNvfp4) {
    for (std::int64_t g = 0; g < n / 16; ++g) {
      float honest_in[16];
      for (int i = 0; i < 16; ++i) honest_in[i] = static_cast<float>(y[g * 16 + i]);
      std::uint8_t packed[8];
      const std::uint8_t s = fmt::nvfp4_quantize_group(honest_in, packed);
      double honest_err = 0, err = 0, amax = 0;
      for (int i = 0; i < 16; ++i) {
        const double want = y[g * 16 + i];
        honest_err = std::max(honest_err, std::fabs(fmt::nvfp4_element(packed, s, i) - want));
        err = std::max(
            err, std::fabs(test::decode_element(dtype, row, scale_row, g * 16 + i, 1) - want));
        amax = std::max(amax, std::fabs(want));
      }
      if (err > 2 * honest_err + 1e-6 * amax) {
        return ::testing::AssertionFailure()
               << "nvfp4 group " << g << ": error " << err << " > 2 x honest " << honest_err;
      }
    }
    return ::testing::AssertionSuccess();
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const double got = test::decode_element(dtype, row, scale_row, i, scale);
    const double tol = test::ulp_at(dtype, y[i], scale);
    if (!(std::fabs(got - y[i]) <= tol)) {
      return ::testing::AssertionFailure() << to_string(dtype) << " element " << i << ": got "
                                           << got << ", fp64 " << y[i] << ", tolerance " << tol;
    }
  }
  return ::testing::AssertionSuccess();
}

class Producer : public ::testing::TestWithParam<ProducerCase> {};

}  // namespace

std::vector<ProducerCase> producer_cases() {
  return {ProducerCase{"bf16_packed", DType::kBf16, DType::kBf16, KvLayout::kPacked, 1, 1, false},
          ProducerCase{"fp16_separate_nvfp4_index", DType::kFp16, DType::kNvfp4,
                       KvLayout::kSeparate, 1, 1, false},
          ProducerCase{"e4m3_stacked_fp8_indexer", DType::kFp8E4m3, DType::kFp8E4m3,
                       KvLayout::kStacked, 0.25f, 2.0f, false},
          ProducerCase{"e5m2_token_major", DType::kFp8E5m2, DType::kBf16, KvLayout::kTokenMajor,
                       0.5f, 1.0f, true},
          ProducerCase{"nvfp4_packed_own_index_slots", DType::kNvfp4, DType::kBf16,
                       KvLayout::kPacked, 1, 1, true}};
}

void check_producer_case(const ProducerCase& pc, const ProducerRunner& run) {
  Config c;
  c.kv_cache_dtype = pc.kv_dtype;
  c.set_index_cache_dtype(pc.index_dtype);
  ASSERT_TRUE(c.validate().empty());
  const std::int64_t Hq = 64, Hkv = 4, Hidx = 4, D = 128, Di = 128, T = 24;
  const KvCacheShape shape{4, Hkv, D, 128};
  RandomCaches caches(pc.layout, shape, pc.kv_dtype, pc.index_dtype, Di, 17);
  caches.kv.k_scale = pc.k_scale;
  caches.kv.v_scale = pc.v_scale;
  const auto k_before = caches.k, v_before = caches.v, ks_before = caches.k_scales;
  const auto vs_before = caches.v_scales, index_before = caches.index;
  const auto index_scales_before = caches.index_scales;

  std::mt19937_64 rng(99);
  std::normal_distribution<float> normal;
  const std::int64_t width = Hq * D + 2 * Hkv * D + Hidx * Di + Di;
  std::vector<std::uint16_t> input(static_cast<std::size_t>(T * width));
  for (std::size_t i = 0; i < input.size(); ++i) {
    input[i] = fmt::float_to_bf16(normal(rng) * std::exp2(static_cast<float>(i % 7) - 3.0f));
  }
  std::vector<std::uint16_t> weights(static_cast<std::size_t>(2 * D + 2 * Di));
  for (auto& w : weights) w = fmt::float_to_bf16(0.3f * normal(rng));
  const std::vector<std::int64_t> positions{0,     1,      127,    128,     129, 5000,    7,  65535,
                                            65536, 300000, 999999, 1048575, 2,   3,       4,  5,
                                            6,     8,      9,      10,      11,  2097151, 12, 13};
  // Scattered slots; row 4 is padding, row 6 beyond the capacity.
  std::vector<std::int64_t> slots(static_cast<std::size_t>(T));
  std::vector<std::int64_t> all(static_cast<std::size_t>(caches.kv.capacity_tokens()));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::copy(all.begin(), all.begin() + T, slots.begin());
  slots[4] = -1;
  slots[6] = caches.kv.capacity_tokens() + 3;
  std::vector<std::int64_t> index_slots = slots;
  if (pc.separate_index_slots) {
    std::shuffle(all.begin(), all.end(), rng);
    std::copy(all.begin(), all.begin() + T, index_slots.begin());
    index_slots[10] = -1;
  }

  const DType iq_dtype = pc.index_dtype == DType::kFp8E4m3 ? DType::kFp8E4m3 : DType::kBf16;
  std::vector<std::uint16_t> q_out(static_cast<std::size_t>(T * Hq * D), 0xFFFF);  // NaN poison
  std::vector<std::uint8_t> iq_out(static_cast<std::size_t>(T * Hidx * Di * 2), 0xFF);
  ProducerInputs in;
  in.qkv_index = TensorView::contiguous(input.data(), DType::kBf16, {T, width});
  in.q_norm_weight = TensorView::contiguous(weights.data(), DType::kBf16, {D});
  in.k_norm_weight = TensorView::contiguous(weights.data() + D, DType::kBf16, {D});
  in.index_q_norm_weight = TensorView::contiguous(weights.data() + 2 * D, DType::kBf16, {Di});
  in.index_k_norm_weight = TensorView::contiguous(weights.data() + 2 * D + Di, DType::kBf16, {Di});
  in.positions = TensorView::contiguous(positions.data(), DType::kInt64, {T});
  in.slot_mapping = TensorView::contiguous(slots.data(), DType::kInt64, {T});
  if (pc.separate_index_slots) {
    in.index_slot_mapping = TensorView::contiguous(index_slots.data(), DType::kInt64, {T});
  }
  ProducerOutputs out{TensorView::contiguous(q_out.data(), DType::kBf16, {T, Hq, D}),
                      TensorView::contiguous(iq_out.data(), iq_dtype, {T, Hidx, Di})};
  run(c, in, caches.kv, caches.ix, out);

  auto input_head = [&](std::int64_t t, std::int64_t offset, std::int64_t dim) {
    std::vector<double> x(static_cast<std::size_t>(dim));
    for (std::int64_t e = 0; e < dim; ++e) x[e] = fmt::bf16_to_float(input[t * width + offset + e]);
    return x;
  };
  auto weight = [&](std::int64_t offset, std::int64_t dim) {
    std::vector<double> w(static_cast<std::size_t>(dim));
    for (std::int64_t e = 0; e < dim; ++e) w[e] = fmt::bf16_to_float(weights[offset + e]);
    return w;
  };
  const auto wq = weight(0, D), wk = weight(D, D), wiq = weight(2 * D, Di);
  const auto wik = weight(2 * D + Di, Di);
  const std::int64_t k_off = Hq * D, v_off = k_off + Hkv * D, iq_off = v_off + Hkv * D;
  const std::int64_t ik_off = iq_off + Hidx * Di;

  // Outputs: every element of q and index_q.
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t h = 0; h < Hq; ++h) {
      const auto y = oracle_head(c, input_head(t, h * D, D), wq, positions[t]);
      ASSERT_TRUE(row_matches(DType::kBf16,
                              reinterpret_cast<const std::byte*>(&q_out[(t * Hq + h) * D]), nullptr,
                              y, 1.0))
          << "q token " << t << " head " << h;
    }
    for (std::int64_t h = 0; h < Hidx; ++h) {
      const auto y = oracle_head(c, input_head(t, iq_off + h * Di, Di), wiq, positions[t]);
      const std::int64_t elem = iq_dtype == DType::kBf16 ? 2 : 1;
      ASSERT_TRUE(row_matches(
          iq_dtype, reinterpret_cast<const std::byte*>(iq_out.data()) + (t * Hidx + h) * Di * elem,
          nullptr, y, 1.0))
          << "index_q token " << t << " head " << h;
    }
  }
  // Main cache: every row, written or not.
  std::vector<std::int64_t> writer(static_cast<std::size_t>(caches.kv.capacity_tokens()), -1);
  std::vector<std::int64_t> index_writer(writer.size(), -1);
  for (std::int64_t t = 0; t < T; ++t) {
    if (slots[t] >= 0 && slots[t] < caches.kv.capacity_tokens()) writer[slots[t]] = t;
    if (index_slots[t] >= 0 && index_slots[t] < caches.kv.capacity_tokens()) {
      index_writer[index_slots[t]] = t;
    }
  }
  const bool nvfp4 = pc.kv_dtype == DType::kNvfp4;
  const std::int64_t row = cache_row_bytes(pc.kv_dtype, D);
  for (std::int64_t s = 0; s < caches.kv.capacity_tokens(); ++s) {
    const std::int64_t p = s / 128, o = s % 128, t = writer[s];
    for (std::int64_t h = 0; h < Hkv; ++h) {
      for (int plane = 0; plane < 2; ++plane) {
        const std::byte* got = caches.kv_row(plane, p, h, o);
        const std::byte* got_scales = nvfp4 ? caches.kv_scale_row(plane, p, h, o) : nullptr;
        const bool second = plane == 1 && test::two_buffers(pc.layout);
        if (t < 0) {
          const auto& buf = second ? caches.v : caches.k;
          const auto& before = second ? v_before : k_before;
          ASSERT_EQ(std::memcmp(got, before.data() + (got - buf.data()), row), 0)
              << "main-cache row outside the write set changed, slot " << s;
          if (nvfp4) {
            const auto& sbuf = second ? caches.v_scales : caches.k_scales;
            const auto& sbefore = second ? vs_before : ks_before;
            ASSERT_EQ(std::memcmp(got_scales, sbefore.data() + (got_scales - sbuf.data()), 8), 0);
          }
          continue;
        }
        if (plane == 0) {
          const auto y = oracle_head(c, input_head(t, k_off + h * D, D), wk, positions[t]);
          ASSERT_TRUE(row_matches(pc.kv_dtype, got, got_scales, y, pc.k_scale))
              << "k token " << t << " head " << h;
        } else {  // V: stored unchanged (one rounding to the cache dtype)
          const auto x = input_head(t, v_off + h * D, D);
          for (std::int64_t d = 0; d < D; ++d) {
            float xs[16];
            double want;
            if (nvfp4) {
              const std::int64_t g = d / 16;
              for (int i = 0; i < 16; ++i) xs[i] = static_cast<float>(x[g * 16 + i]);
              std::uint8_t packed[8];
              const std::uint8_t sc = fmt::nvfp4_quantize_group(xs, packed);
              want = fmt::nvfp4_element(packed, sc, static_cast<int>(d % 16));
            } else if (pc.kv_dtype == DType::kFp8E4m3) {
              want = fmt::e4m3_to_float(fmt::float_to_e4m3(static_cast<float>(x[d]) / pc.v_scale)) *
                     static_cast<double>(pc.v_scale);
            } else if (pc.kv_dtype == DType::kFp8E5m2) {
              want = fmt::e5m2_to_float(fmt::float_to_e5m2(static_cast<float>(x[d]) / pc.v_scale)) *
                     static_cast<double>(pc.v_scale);
            } else {
              want = x[d];  // bf16 input is exact in bf16 and fp16 here
              if (pc.kv_dtype == DType::kFp16) {
                want = fmt::fp16_to_float(fmt::float_to_fp16(static_cast<float>(x[d])));
              }
            }
            ASSERT_EQ(test::decode_element(pc.kv_dtype, got, got_scales, d, pc.v_scale), want)
                << "v token " << t << " head " << h << " dim " << d;
          }
        }
      }
    }
  }
  // Index cache.
  const std::int64_t irow = caches.index_row_bytes();
  for (std::int64_t s = 0; s < caches.ix.capacity_tokens(); ++s) {
    const std::int64_t t = index_writer[s];
    const std::byte* got = caches.index_row(s / 128, s % 128);
    const bool invfp4 = pc.index_dtype == DType::kNvfp4;
    const std::byte* got_scales = invfp4 ? caches.index_scale_row(s / 128, s % 128) : nullptr;
    if (t < 0) {
      ASSERT_EQ(std::memcmp(got, index_before.data() + s * irow, irow), 0)
          << "index row outside the write set changed, slot " << s;
      if (invfp4) {
        ASSERT_EQ(std::memcmp(got_scales, index_scales_before.data() + s * 8, 8), 0);
      }
      continue;
    }
    const auto y = oracle_head(c, input_head(t, ik_off, Di), wik, positions[t]);
    ASSERT_TRUE(row_matches(pc.index_dtype, got, got_scales, y, 1.0)) << "index_k token " << t;
  }
}

}  // namespace flashmsa::test
