// Inputs for the numeric-format tests: every rounding boundary of a format plus random values.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "flashmsa/formats/minifloat.hpp"

namespace flashmsa::test {

// Plain, independent decoding of a format's code (double arithmetic from the field definitions).
inline double decode_by_definition(const fmt::MiniFloatFormat& f, std::uint32_t code) {
  const int total = 1 + f.exp_bits + f.man_bits;
  const bool negative = (code >> (total - 1)) & 1u;
  const std::uint32_t mag = code & ((1u << (total - 1)) - 1u);
  const std::uint32_t exp = mag >> f.man_bits;
  const std::uint32_t man = mag & ((1u << f.man_bits) - 1u);
  const std::uint32_t exp_all_ones = (1u << f.exp_bits) - 1u;
  double v;
  if (f.has_inf && exp == exp_all_ones) {
    v = man == 0 ? std::numeric_limits<double>::infinity()
                 : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.has_inf && f.nan_code != f.max_code && mag == f.nan_code) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -f.man_bits),
                   static_cast<int>(exp) - f.bias);
  }
  return negative ? -v : v;
}

// The finite non-negative values of a format in code order (= value order).
inline std::vector<double> finite_magnitudes(const fmt::MiniFloatFormat& f) {
  std::vector<double> values;
  for (std::uint32_t c = 0; c <= f.max_code; ++c) values.push_back(decode_by_definition(f, c));
  return values;
}

// Every value, every midpoint between neighbours, one fp32 ulp either side of each, both signs,
// the overflow boundary, specials, and `random_count` random fp32 values (half of them drawn
// from the format's exponent range).
inline std::vector<float> rounding_samples(const fmt::MiniFloatFormat& f, int random_count,
                                           std::uint32_t seed) {
  std::vector<double> mags = finite_magnitudes(f);
  // The would-be next value after the largest finite one marks the overflow midpoint.
  mags.push_back(2.0 * mags.back() - mags[mags.size() - 2]);
  std::vector<float> out;
  auto push_around = [&](double v) {
    const float x = static_cast<float>(v);
    for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, INFINITY)}) {
      out.push_back(y);
      out.push_back(-y);
    }
  };
  for (size_t i = 0; i + 1 < mags.size(); ++i) {
    push_around(mags[i]);
    push_around(0.5 * (mags[i] + mags[i + 1]));
  }
  push_around(mags.back());
  for (float s : {0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()}) {
    out.push_back(s);
    out.push_back(-s);
  }
  out.push_back(std::numeric_limits<float>::quiet_NaN());
  out.push_back(-std::numeric_limits<float>::quiet_NaN());
  out.push_back(fmt::bits_float(0x7F800001u));  // signalling NaN
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::uint32_t> bits;
  const double lo = mags[1] / 4, hi = mags.back() * 2;
  std::uniform_real_distribution<double> log_mag(std::log2(lo), std::log2(hi));
  for (int i = 0; i < random_count; ++i) {
    if (i % 2) {
      out.push_back(fmt::bits_float(bits(rng)));
    } else {
      const float v = static_cast<float>(std::exp2(log_mag(rng)));
      out.push_back(bits(rng) & 1u ? v : -v);
    }
  }
  return out;
}

}  // namespace flashmsa::test
