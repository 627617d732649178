// Numeric formats against an independent oracle: codes decoded from the format definition in
// double, and rounding done by searching the format's value list (nearest, ties to the even
// code). Exact comparison everywhere: conversions have one right answer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/formats.hpp"
#include "tests/cpp/format_samples.hpp"

namespace flashmsa {
namespace {

using fmt::MiniFloatFormat;
using fmt::Saturation;

enum class TieRule { kEven, kAway };

// The oracle: round |x| to the nearest finite value of f (or past the largest, an overflow).
std::uint32_t oracle_round(const MiniFloatFormat& f, float x, Saturation sat,
                           TieRule ties = TieRule::kEven) {
  const int total = 1 + f.exp_bits + f.man_bits;
  if (std::isnan(x)) return f.nan_code;
  static thread_local const MiniFloatFormat* cached = nullptr;
  static thread_local std::vector<double> mags;
  if (cached != &f) {
    mags = test::finite_magnitudes(f);
    mags.push_back(2.0 * mags.back() - mags[mags.size() - 2]);  // "max_code + 1": overflow
    cached = &f;
  }
  const double a = std::fabs(static_cast<double>(x));
  std::uint32_t code;
  if (std::isinf(a)) {
    code = f.max_code + 1;
  } else {
    auto hi = std::lower_bound(mags.begin(), mags.end(), a);
    if (hi == mags.end()) {
      code = f.max_code + 1;
    } else if (*hi == a || hi == mags.begin()) {
      code = static_cast<std::uint32_t>(hi - mags.begin());
    } else {
      const auto lo = hi - 1;
      const double dlo = a - *lo, dhi = *hi - a;
      const std::uint32_t clo = static_cast<std::uint32_t>(lo - mags.begin());
      if (dlo < dhi) {
        code = clo;
      } else if (dhi < dlo) {
        code = clo + 1;
      } else {
        code = ties == TieRule::kAway ? clo + 1 : (clo % 2 == 0 ? clo : clo + 1);
      }
    }
  }
  if (code > f.max_code) {
    const bool always_saturates = !f.has_inf && f.nan_code == f.max_code;
    if (sat == Saturation::kFinite || always_saturates) {
      code = f.max_code;
    } else if (f.has_inf) {
      code = ((1u << f.exp_bits) - 1u) << f.man_bits;
    } else {
      code = f.nan_code;
    }
  }
  return std::signbit(x) ? code | (1u << (total - 1)) : code;
}

struct FormatCase {
  std::string name;
  const MiniFloatFormat* format;
  std::function<std::uint32_t(float, Saturation)> encode;
  std::function<float(std::uint32_t)> decode;
  bool has_saturation_choice;
};

std::vector<FormatCase> all_formats() {
  return {
      {"bf16", &fmt::kBf16Format, [](float x, Saturation) { return fmt::float_to_bf16(x); },
       [](std::uint32_t c) { return fmt::bf16_to_float(static_cast<std::uint16_t>(c)); }, false},
      {"fp16", &fmt::kFp16Format, [](float x, Saturation) { return fmt::float_to_fp16(x); },
       [](std::uint32_t c) { return fmt::fp16_to_float(static_cast<std::uint16_t>(c)); }, false},
      {"e4m3", &fmt::kE4m3Format, [](float x, Saturation s) { return fmt::float_to_e4m3(x, s); },
       [](std::uint32_t c) { return fmt::e4m3_to_float(static_cast<std::uint8_t>(c)); }, true},
      {"e5m2", &fmt::kE5m2Format, [](float x, Saturation s) { return fmt::float_to_e5m2(x, s); },
       [](std::uint32_t c) { return fmt::e5m2_to_float(static_cast<std::uint8_t>(c)); }, true},
      {"e2m1", &fmt::kE2m1Format, [](float x, Saturation) { return fmt::float_to_e2m1(x); },
       [](std::uint32_t c) { return fmt::e2m1_to_float(static_cast<std::uint8_t>(c)); }, false},
  };
}

void PrintTo(const FormatCase& c, std::ostream* os) {
  *os << c.name;
}

class FormatTest : public ::testing::TestWithParam<FormatCase> {};

std::uint32_t code_count(const MiniFloatFormat& f) {
  return 1u << (1 + f.exp_bits + f.man_bits);
}

// Every code decodes to its defined value, and re-encoding gives the same code (NaN codes give
// the format's canonical NaN).
TEST_P(FormatTest, EveryCodeDecodesExactlyAndRoundTrips) {
  const FormatCase& fc = GetParam();
  const MiniFloatFormat& f = *fc.format;
  for (std::uint32_t c = 0; c < code_count(f); ++c) {
    const double want = test::decode_by_definition(f, c);
    const float got = fc.decode(c);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << fc.name << " code " << c;
      for (Saturation s : {Saturation::kNone, Saturation::kFinite}) {
        ASSERT_EQ(fc.encode(got, s), f.nan_code) << fc.name << " code " << c;
      }
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want) << fc.name << " code " << c;
    ASSERT_EQ(std::signbit(got), std::signbit(want)) << fc.name << " code " << c;
    for (Saturation s : {Saturation::kNone, Saturation::kFinite}) {
      // Inf re-encodes as itself unless saturation clamps it to the largest finite code.
      const bool clamped = std::isinf(got) && s == Saturation::kFinite && fc.has_saturation_choice;
      const std::uint32_t sign_bit = c & (1u << (f.exp_bits + f.man_bits));
      const std::uint32_t want_code = clamped ? sign_bit | f.max_code : c;
      ASSERT_EQ(fc.encode(got, s), want_code) << fc.name << " code " << c;
    }
  }
}

// Round-to-nearest-even against the oracle at every midpoint, next to it, and at random values.
TEST_P(FormatTest, RoundsToNearestEvenLikeTheOracle) {
  const FormatCase& fc = GetParam();
  const MiniFloatFormat& f = *fc.format;
  const std::vector<float> samples = test::rounding_samples(f, 1 << 18, 1234);
  for (Saturation s : {Saturation::kNone, Saturation::kFinite}) {
    if (!fc.has_saturation_choice && s == Saturation::kFinite) continue;
    size_t checked = 0;
    for (float x : samples) {
      const std::uint32_t want = oracle_round(f, x, s);
      const std::uint32_t got = fc.encode(x, s);
      ASSERT_EQ(got, want) << fc.name << " x=" << x << " (bits 0x" << std::hex << fmt::float_bits(x)
                           << ") saturation " << static_cast<int>(s);
      ++checked;
    }
    EXPECT_GT(checked, 100000u);
  }
}

// The two tests above can fail: a converter that breaks ties away from zero, or truncates,
// disagrees with the oracle on these samples. (Run against deliberately wrong rounding rules.)
TEST_P(FormatTest, SamplesCatchWrongRoundingRules) {
  const FormatCase& fc = GetParam();
  const MiniFloatFormat& f = *fc.format;
  const std::vector<float> samples = test::rounding_samples(f, 1 << 12, 99);
  const std::vector<double> mags = test::finite_magnitudes(f);
  size_t ties_away_differs = 0, truncation_differs = 0;
  for (float x : samples) {
    if (std::isnan(x)) continue;
    const std::uint32_t good = fc.encode(x, Saturation::kFinite);
    ties_away_differs += oracle_round(f, x, Saturation::kFinite, TieRule::kAway) != good;
    // Truncation: the largest magnitude not above |x|.
    const double a = std::fabs(static_cast<double>(x));
    auto it = std::upper_bound(mags.begin(), mags.end(), a);
    std::uint32_t trunc = static_cast<std::uint32_t>((it - mags.begin()) - 1);
    if (std::signbit(x)) trunc |= 1u << (f.exp_bits + f.man_bits);
    truncation_differs += trunc != good;
  }
  EXPECT_GE(ties_away_differs, 4u) << fc.name << ": too few exact ties in the samples";
  EXPECT_GT(truncation_differs, 100u) << fc.name;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, FormatTest, ::testing::ValuesIn(all_formats()),
                         [](const ::testing::TestParamInfo<FormatCase>& param_info) {
                           return param_info.param.name;
                         });

TEST(Formats, NamedBoundaries) {
  // bf16: ties to even at 1 + 2^-8 (down) and 1 + 3*2^-8 (up); overflow to Inf; NaN canonical.
  EXPECT_EQ(fmt::float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(fmt::float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(fmt::float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(fmt::float_to_bf16(-std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(fmt::float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  // fp16: 65519 rounds to 65504, 65520 (the midpoint) to Inf; 2^-25 (half the smallest
  // subnormal) ties to zero, a hair above it rounds up.
  EXPECT_EQ(fmt::float_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(fmt::float_to_fp16(65520.0f), 0x7C00);
  EXPECT_EQ(fmt::float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(fmt::float_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(fmt::float_to_fp16(-0.0f), 0x8000);
  // E4M3: max 448; 464 is the midpoint to the (NaN) code above and ties down to 448; past it,
  // satfinite clamps and non-saturating gives NaN. Inf likewise. 2^-10 ties to zero.
  EXPECT_EQ(fmt::float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(fmt::float_to_e4m3(464.0f, Saturation::kNone), 0x7E);
  EXPECT_EQ(fmt::float_to_e4m3(465.0f, Saturation::kNone), 0x7F);
  EXPECT_EQ(fmt::float_to_e4m3(-1e9f, Saturation::kFinite), 0xFE);
  EXPECT_EQ(fmt::float_to_e4m3(-INFINITY, Saturation::kNone), 0xFF);
  EXPECT_EQ(fmt::float_to_e4m3(INFINITY, Saturation::kFinite), 0x7E);
  EXPECT_EQ(fmt::float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(fmt::float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(fmt::float_to_e4m3(NAN), 0x7F);
  // E5M2: max 57344; the midpoint 61440 ties up to Inf (57344's code is odd).
  EXPECT_EQ(fmt::float_to_e5m2(61439.0f, Saturation::kNone), 0x7B);
  EXPECT_EQ(fmt::float_to_e5m2(61440.0f, Saturation::kNone), 0x7C);
  EXPECT_EQ(fmt::float_to_e5m2(61440.0f, Saturation::kFinite), 0x7B);
  EXPECT_EQ(fmt::float_to_e5m2(-INFINITY, Saturation::kNone), 0xFC);
  // E2M1: {0, .5, 1, 1.5, 2, 3, 4, 6}; 5 ties to 4 (even), 2.5 to 2, 0.25 to 0; NaN -> +6.
  EXPECT_EQ(fmt::float_to_e2m1(5.0f), 0x6);
  EXPECT_EQ(fmt::float_to_e2m1(2.5f), 0x4);
  EXPECT_EQ(fmt::float_to_e2m1(0.25f), 0x0);
  EXPECT_EQ(fmt::float_to_e2m1(-0.26f), 0x9);
  EXPECT_EQ(fmt::float_to_e2m1(-100.0f), 0xF);
  EXPECT_EQ(fmt::float_to_e2m1(-NAN), 0x7);
  EXPECT_EQ(fmt::float_to_e2m1(-0.1f), 0x8);  // -0
}

// E8M0 against ceil/floor(log2 |x|) computed with frexp.
std::uint8_t oracle_e8m0(float x, fmt::E8m0Rounding rounding, Saturation sat) {
  if (std::isnan(x)) return 0xFF;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return sat == Saturation::kFinite ? 0xFE : 0xFF;
  if (a <= std::ldexp(1.0, -127)) return 0;  // 2^-127 is the smallest scale
  int e;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int log2_floor = e - 1;
  const bool exact = m == 0.5;
  int k = rounding == fmt::E8m0Rounding::kUp && !exact ? log2_floor + 1 : log2_floor;
  k = std::max(k, -127);
  if (k > 127) return sat == Saturation::kFinite ? 0xFE : 0xFF;
  return static_cast<std::uint8_t>(k + 127);
}

TEST(Formats, E8m0MatchesLog2Oracle) {
  std::vector<float> samples = test::rounding_samples(fmt::kBf16Format, 1 << 18, 7);
  for (int k = -149; k <= 127; ++k) {
    const float p = fmt::exact_pow2(k);
    for (float y : {p, std::nextafter(p, 0.0f), std::nextafter(p, INFINITY)}) samples.push_back(y);
  }
  for (float x : samples) {
    for (auto r : {fmt::E8m0Rounding::kUp, fmt::E8m0Rounding::kTowardZero}) {
      for (Saturation s : {Saturation::kNone, Saturation::kFinite}) {
        ASSERT_EQ(fmt::float_to_e8m0(x, r, s), oracle_e8m0(x, r, s))
            << "x=" << x << " bits 0x" << std::hex << fmt::float_bits(x);
      }
    }
  }
  for (int b = 0; b < 255; ++b) {
    ASSERT_EQ(static_cast<double>(fmt::e8m0_to_float(static_cast<std::uint8_t>(b))),
              std::ldexp(1.0, b - 127));
  }
  EXPECT_TRUE(std::isnan(fmt::e8m0_to_float(0xFF)));
}

// ---- NVFP4 ----------------------------------------------------------------------------------

TEST(Formats, Nvfp4GroupMatchesDefinition) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> log_scale(-30.0f, 20.0f);
  for (int trial = 0; trial < 20000; ++trial) {
    float x[16];
    const float scale = std::exp2(log_scale(rng));
    for (float& v : x) v = normal(rng) * scale;
    if (trial % 97 == 0) x[trial % 16] = NAN;
    if (trial % 89 == 0) std::fill(std::begin(x), std::end(x), 0.0f);
    std::uint8_t packed[8];
    const std::uint8_t s_code = fmt::nvfp4_quantize_group(x, packed);
    // Definition (spec 6): s = e4m3_rn_satfinite(amax / 6); codes e2m1_rn(x / s); s == 0 -> 0.
    float amax = 0.0f;
    for (float v : x) {
      if (!std::isnan(v)) amax = std::max(amax, std::fabs(v));
    }
    const std::uint32_t want_scale =
        oracle_round(fmt::kE4m3Format, amax / 6.0f, Saturation::kFinite);
    ASSERT_EQ(s_code, want_scale) << "trial " << trial;
    const float s = static_cast<float>(test::decode_by_definition(fmt::kE4m3Format, s_code));
    for (int i = 0; i < 16; ++i) {
      const std::uint32_t want =
          s == 0.0f ? 0u : oracle_round(fmt::kE2m1Format, x[i] / s, Saturation::kFinite);
      const std::uint32_t got = (packed[i / 2] >> (4 * (i % 2))) & 0xF;
      ASSERT_EQ(got, want) << "trial " << trial << " element " << i;
      const double deq = test::decode_by_definition(fmt::kE2m1Format, got) * s;
      ASSERT_EQ(static_cast<double>(fmt::nvfp4_element(packed, s_code, i)), deq);
      // Dequantized values are exact in bf16 (spec 6).
      const float f = fmt::nvfp4_element(packed, s_code, i);
      ASSERT_EQ(fmt::bf16_to_float(fmt::float_to_bf16(f)), f);
    }
  }
}

TEST(Formats, Nvfp4PacksLowNibbleFirst) {
  float x[16] = {6, -6, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.5f};
  std::uint8_t packed[8];
  const std::uint8_t s = fmt::nvfp4_quantize_group(x, packed);
  EXPECT_EQ(s, fmt::float_to_e4m3(1.0f));  // amax 6 -> scale 1
  EXPECT_EQ(packed[0], 0xF7);              // element 0 (+6) low, element 1 (-6) high
  EXPECT_EQ(packed[1], 0x02);              // element 2 (+1) low
  EXPECT_EQ(packed[7], 0x10);              // element 15 (0.5) high
}

// ---- MXFP8 ----------------------------------------------------------------------------------

std::vector<std::uint16_t> bf16_group(const std::vector<float>& v) {
  std::vector<std::uint16_t> out;
  for (float x : v) out.push_back(fmt::float_to_bf16(x));
  out.resize(32, fmt::float_to_bf16(0.0f));
  return out;
}

TEST(Formats, Mxfp8RceilScaleBoundaries) {
  std::uint8_t codes[32];
  // amax = 448 * 2^k exactly: scale 2^k (the multiply by rcp(448) lands exactly on 2^k).
  for (int k = -20; k <= 20; ++k) {
    auto g = bf16_group({std::ldexp(448.0f, k), std::ldexp(-1.0f, k)});
    EXPECT_EQ(fmt::mxfp8_quantize_group(g.data(), codes), 127 + k) << k;
    EXPECT_EQ(codes[0], 0x7E) << k;  // 448 * 2^k / 2^k = 448
    // The next bf16 above rounds the scale up.
    g[0] = static_cast<std::uint16_t>(g[0] + 1);
    EXPECT_EQ(fmt::mxfp8_quantize_group(g.data(), codes), 128 + k) << k;
  }
  // An all-zero group stores scale byte 0 (2^-127) and zero codes, as FlashInfer does.
  auto zeros = bf16_group({});
  EXPECT_EQ(fmt::mxfp8_quantize_group(zeros.data(), codes), 0);
  for (std::uint8_t c : codes) EXPECT_EQ(c, 0);
  // NaN elements are skipped by the amax and become E4M3 NaN.
  auto with_nan = bf16_group({NAN, 2.0f});
  EXPECT_EQ(fmt::mxfp8_quantize_group(with_nan.data(), codes),
            fmt::float_to_e8m0(2.0f * fmt::bits_float(fmt::kRcp448Bits), fmt::E8m0Rounding::kUp));
  EXPECT_EQ(codes[0], 0x7F);
}

// Spec section 7: finite input never gives a NaN code. A group whose scale clamps to 2^-127
// (amax <= about 2^-118) is quantized as x * 2^127, exactly, and its zeros stay zero.
TEST(Formats, Mxfp8ClampedScaleKeepsZerosAndValues) {
  std::uint8_t codes[32];
  auto g = bf16_group(
      {std::ldexp(1.0f, -125), 0.0f, std::ldexp(-1.5f, -130), -0.0f, std::ldexp(1.0f, -133)});
  for (auto rule : {fmt::Mxfp8ScaleRule::kRceil, fmt::Mxfp8ScaleRule::kFloor}) {
    EXPECT_EQ(fmt::mxfp8_quantize_group(g.data(), codes, rule), 0);
    EXPECT_EQ(codes[0], fmt::float_to_e4m3(4.0f, fmt::Saturation::kFinite));
    EXPECT_EQ(codes[1], 0x00);
    EXPECT_EQ(codes[2], fmt::float_to_e4m3(-0.1875f, fmt::Saturation::kFinite));
    EXPECT_EQ(codes[3], 0x80);  // -0 keeps its sign
    EXPECT_EQ(codes[4], fmt::float_to_e4m3(0.015625f, fmt::Saturation::kFinite));
    for (int i = 0; i < 32; ++i) EXPECT_NE(codes[i] & 0x7F, 0x7F) << "NaN code at " << i;
  }
  // The largest amax whose RCEIL scale clamps: 448 * 2^-127; one bf16 step above, scale 1.
  auto top = bf16_group({std::ldexp(448.0f, -127), 0.0f});
  EXPECT_EQ(fmt::mxfp8_quantize_group(top.data(), codes), 0);
  EXPECT_EQ(codes[0], 0x7E);
  EXPECT_EQ(codes[1], 0x00);
}

TEST(Formats, Mxfp8RceilMatchesDefinitionOnRandomRows) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> log_scale(-40.0f, 40.0f);
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<float> v(32);
    const float s = std::exp2(log_scale(rng));
    for (float& x : v) x = normal(rng) * s;
    auto g = bf16_group(v);
    std::uint8_t codes[32];
    const std::uint8_t scale = fmt::mxfp8_quantize_group(g.data(), codes);
    // Definition: e = ceil(log2(amax * rcp448)); values e4m3_satfinite(x / 2^e).
    double amax = 0;
    for (auto b : g) amax = std::max(amax, std::fabs(static_cast<double>(fmt::bf16_to_float(b))));
    const float sf = static_cast<float>(amax) * fmt::bits_float(fmt::kRcp448Bits);
    const int e = static_cast<int>(std::ceil(std::log2(static_cast<double>(sf))));
    ASSERT_EQ(scale, std::clamp(e, -127, 127) + 127) << trial;
    for (int i = 0; i < 32; ++i) {
      const float x = fmt::bf16_to_float(g[i]);
      ASSERT_EQ(codes[i], oracle_round(fmt::kE4m3Format, static_cast<float>(std::ldexp(x, -e)),
                                       Saturation::kFinite));
    }
  }
}

TEST(Formats, Mxfp8FloorRule) {
  std::uint8_t codes[32];
  auto g = bf16_group({448.0f, -1.0f});
  EXPECT_EQ(fmt::mxfp8_quantize_group(g.data(), codes, fmt::Mxfp8ScaleRule::kFloor), 127);
  EXPECT_EQ(codes[0], 0x7E);
  // floor(log2(500)) - 8 = 0: 500 saturates to 448 under the floor rule.
  g = bf16_group({500.0f});
  EXPECT_EQ(fmt::mxfp8_quantize_group(g.data(), codes, fmt::Mxfp8ScaleRule::kFloor), 127);
  EXPECT_EQ(codes[0], 0x7E);
  EXPECT_EQ(fmt::mxfp8_quantize_group(g.data(), codes, fmt::Mxfp8ScaleRule::kRceil), 128);
  g = bf16_group({1.0f});
  EXPECT_EQ(fmt::mxfp8_quantize_group(g.data(), codes, fmt::Mxfp8ScaleRule::kFloor), 119);
  EXPECT_EQ(codes[0], fmt::float_to_e4m3(256.0f));
}

TEST(Formats, Mxfp8SwizzledLayoutIsABijectionMatchingTheSpecFormula) {
  for (std::int64_t rows : {1, 127, 128, 129, 300}) {
    for (std::int64_t scale_cols : {1, 4, 7, 256}) {
      const auto size =
          fmt::mxfp8_scale_buffer_size(rows, scale_cols, fmt::ScaleLayout::kSwizzled128x4);
      EXPECT_EQ(size, (rows + 127) / 128 * 128 * ((scale_cols + 3) / 4 * 4));
      std::set<std::int64_t> seen;
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < scale_cols; ++c) {
          const auto off =
              fmt::mxfp8_scale_offset(r, c, scale_cols, fmt::ScaleLayout::kSwizzled128x4);
          ASSERT_GE(off, 0);
          ASSERT_LT(off, size);
          ASSERT_TRUE(seen.insert(off).second) << r << "," << c;
        }
      }
    }
  }
  // Spec section 7's formula with n_cols = 256 (M3: 64 heads x 128 / 32).
  EXPECT_EQ(fmt::mxfp8_scale_offset(129, 5, 256, fmt::ScaleLayout::kSwizzled128x4),
            1 * 256 * 128 + 1 * 512 + 1 * 16 + 0 * 4 + 1);
  EXPECT_EQ(fmt::mxfp8_scale_offset(37, 2, 256, fmt::ScaleLayout::kSwizzled128x4),
            0 + 0 + 5 * 16 + 1 * 4 + 2);
}

TEST(Formats, Mxfp8RowsWriteOnlyTheirScales) {
  const std::int64_t rows = 3, cols = 64, stride = 80;
  std::vector<std::uint16_t> x(rows * stride);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (auto& v : x) v = fmt::float_to_bf16(normal(rng));
  for (auto layout : {fmt::ScaleLayout::kRowMajor, fmt::ScaleLayout::kSwizzled128x4}) {
    const auto size = fmt::mxfp8_scale_buffer_size(rows, cols / 32, layout);
    std::vector<std::uint8_t> codes(rows * cols, 0xAB), scales(size, 0xCD);
    fmt::mxfp8_quantize_rows(x.data(), rows, cols, stride, codes.data(), scales.data(), layout);
    int untouched = 0;
    for (auto s : scales) untouched += s == 0xCD;
    EXPECT_EQ(untouched, size - rows * (cols / 32));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t g = 0; g < cols / 32; ++g) {
        std::uint8_t want_codes[32];
        const auto want = fmt::mxfp8_quantize_group(&x[r * stride + g * 32], want_codes);
        EXPECT_EQ(scales[fmt::mxfp8_scale_offset(r, g, cols / 32, layout)], want);
        EXPECT_TRUE(std::equal(want_codes, want_codes + 32, &codes[r * cols + g * 32]));
      }
    }
  }
  std::vector<std::uint8_t> codes(64), scales(8);
  EXPECT_THROW(fmt::mxfp8_quantize_rows(x.data(), 1, 48, 48, codes.data(), scales.data(),
                                        fmt::ScaleLayout::kRowMajor),
               Error);
}

}  // namespace
}  // namespace flashmsa
