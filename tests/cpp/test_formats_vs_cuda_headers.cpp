// Our conversions against the CUDA toolkit's own host implementations in cuda_bf16.h,
// cuda_fp16.h, cuda_fp8.h and cuda_fp4.h (the code nvcc runs on the host, and on sm_90 for the
// conversions Hopper has no instruction for). Needs the toolkit's headers, not a GPU; the GPU
// test (gpu/test_formats_gpu.cu) compares with the device instructions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "flashmsa/formats.hpp"
#include "tests/cpp/format_samples.hpp"

namespace flashmsa {
namespace {

using fmt::Saturation;

std::vector<float> samples() {
  std::vector<float> all;
  for (const auto* f : {&fmt::kBf16Format, &fmt::kFp16Format, &fmt::kE4m3Format, &fmt::kE5m2Format,
                        &fmt::kE2m1Format}) {
    auto s = test::rounding_samples(*f, 1 << 16, 2024);
    all.insert(all.end(), s.begin(), s.end());
  }
  return all;
}

TEST(FormatsVsCudaHeaders, EncodeMatchesOverEveryBoundary) {
  for (float x : samples()) {
    const __nv_bfloat16_raw b = __nv_bfloat16(__float2bfloat16_rn(x));
    ASSERT_EQ(fmt::float_to_bf16(x), b.x) << x;
    const __half_raw h = __half(__float2half_rn(x));
    ASSERT_EQ(fmt::float_to_fp16(x), h.x) << x;
    for (auto [sat, nv_sat] : {std::pair{Saturation::kFinite, __NV_SATFINITE},
                               std::pair{Saturation::kNone, __NV_NOSAT}}) {
      ASSERT_EQ(fmt::float_to_e4m3(x, sat), __nv_cvt_float_to_fp8(x, nv_sat, __NV_E4M3)) << x;
      ASSERT_EQ(fmt::float_to_e5m2(x, sat), __nv_cvt_float_to_fp8(x, nv_sat, __NV_E5M2)) << x;
      ASSERT_EQ(fmt::float_to_e8m0(x, fmt::E8m0Rounding::kUp, sat),
                __nv_cvt_float_to_e8m0(x, nv_sat, cudaRoundPosInf))
          << x;
      ASSERT_EQ(fmt::float_to_e8m0(x, fmt::E8m0Rounding::kTowardZero, sat),
                __nv_cvt_float_to_e8m0(x, nv_sat, cudaRoundZero))
          << x;
    }
    ASSERT_EQ(fmt::float_to_e2m1(x), __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)) << x;
  }
}

float half_raw_to_float(__half_raw h) {
  return __half2float(__half(h));
}

TEST(FormatsVsCudaHeaders, DecodeMatchesForEveryCode) {
  for (std::uint32_t c = 0; c < 65536; ++c) {
    __nv_bfloat16_raw b;
    b.x = static_cast<unsigned short>(c);
    EXPECT_EQ(fmt::float_bits(fmt::bf16_to_float(static_cast<std::uint16_t>(c))),
              fmt::float_bits(__bfloat162float(__nv_bfloat16(b))));
    __half_raw h;
    h.x = static_cast<unsigned short>(c);
    const float want = half_raw_to_float(h);
    const float got = fmt::fp16_to_float(static_cast<std::uint16_t>(c));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << c;
    } else {
      ASSERT_EQ(fmt::float_bits(got), fmt::float_bits(want)) << c;
    }
  }
  for (std::uint32_t c = 0; c < 256; ++c) {
    const auto code = static_cast<__nv_fp8_storage_t>(c);
    for (auto [interp, ours] :
         {std::pair{__NV_E4M3, &fmt::e4m3_to_float}, std::pair{__NV_E5M2, &fmt::e5m2_to_float}}) {
      const float want = half_raw_to_float(__nv_cvt_fp8_to_halfraw(code, interp));
      const float got = ours(static_cast<std::uint8_t>(c));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << c;
      } else {
        EXPECT_EQ(fmt::float_bits(got), fmt::float_bits(want)) << c;
      }
    }
    if (c < 255) {
      __nv_fp8_e8m0 e;
      e.__x = code;
      EXPECT_EQ(fmt::float_bits(fmt::e8m0_to_float(code)), fmt::float_bits(static_cast<float>(e)))
          << c;
    }
  }
  for (std::uint32_t c = 0; c < 16; ++c) {
    const float want =
        half_raw_to_float(__nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(c), __NV_E2M1));
    EXPECT_EQ(fmt::float_bits(fmt::e2m1_to_float(static_cast<std::uint8_t>(c))),
              fmt::float_bits(want))
        << c;
  }
}

}  // namespace
}  // namespace flashmsa
