// Host conversions against the device: the CUDA intrinsics on sm_90 and our own format code
// compiled for the device, over every rounding boundary, random values and every code. Also the
// FlashInfer MXFP8 recipe written with the intrinsics, against our host mxfp8_quantize_group.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "flashmsa/formats.hpp"
#include "src/cuda/sm90/convert.cuh"
#include "tests/cpp/format_samples.hpp"
#include "tests/cpp/gpu/gpu_test_util.cuh"

namespace flashmsa {
namespace {

using test::DeviceBuffer;

// Conversions of each input: [0] intrinsic, [1] our code on the device.
enum Conversion {
  kBf16,
  kFp16,
  kE4m3Sat,
  kE4m3NoSat,
  kE5m2Sat,
  kE5m2NoSat,
  kE2m1,
  kE8m0UpSat,
  kE8m0ZeroSat,
  kE8m0UpNoSat,
  kNumConversions
};

__global__ void encode_kernel(const float* x, int n, std::uint32_t* intrinsic,
                              std::uint32_t* ours) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  std::uint32_t* a = intrinsic + static_cast<size_t>(i) * kNumConversions;
  std::uint32_t* b = ours + static_cast<size_t>(i) * kNumConversions;
  a[kBf16] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  a[kFp16] = __half_as_ushort(__float2half_rn(v));
  a[kE4m3Sat] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  a[kE4m3NoSat] = __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E4M3);
  a[kE5m2Sat] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
  a[kE5m2NoSat] = __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E5M2);
  a[kE2m1] = __nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest);
  a[kE8m0UpSat] = __nv_cvt_float_to_e8m0(v, __NV_SATFINITE, cudaRoundPosInf);
  a[kE8m0ZeroSat] = __nv_cvt_float_to_e8m0(v, __NV_SATFINITE, cudaRoundZero);
  a[kE8m0UpNoSat] = __nv_cvt_float_to_e8m0(v, __NV_NOSAT, cudaRoundPosInf);
  using fmt::E8m0Rounding;
  using fmt::Saturation;
  b[kBf16] = fmt::float_to_bf16(v);
  b[kFp16] = fmt::float_to_fp16(v);
  b[kE4m3Sat] = fmt::float_to_e4m3(v, Saturation::kFinite);
  b[kE4m3NoSat] = fmt::float_to_e4m3(v, Saturation::kNone);
  b[kE5m2Sat] = fmt::float_to_e5m2(v, Saturation::kFinite);
  b[kE5m2NoSat] = fmt::float_to_e5m2(v, Saturation::kNone);
  b[kE2m1] = fmt::float_to_e2m1(v);
  b[kE8m0UpSat] = fmt::float_to_e8m0(v, E8m0Rounding::kUp, Saturation::kFinite);
  b[kE8m0ZeroSat] = fmt::float_to_e8m0(v, E8m0Rounding::kTowardZero, Saturation::kFinite);
  b[kE8m0UpNoSat] = fmt::float_to_e8m0(v, E8m0Rounding::kUp, Saturation::kNone);
}

std::uint32_t host_encode(Conversion c, float v) {
  using fmt::E8m0Rounding;
  using fmt::Saturation;
  switch (c) {
    case kBf16: return fmt::float_to_bf16(v);
    case kFp16: return fmt::float_to_fp16(v);
    case kE4m3Sat: return fmt::float_to_e4m3(v, Saturation::kFinite);
    case kE4m3NoSat: return fmt::float_to_e4m3(v, Saturation::kNone);
    case kE5m2Sat: return fmt::float_to_e5m2(v, Saturation::kFinite);
    case kE5m2NoSat: return fmt::float_to_e5m2(v, Saturation::kNone);
    case kE2m1: return fmt::float_to_e2m1(v);
    case kE8m0UpSat: return fmt::float_to_e8m0(v, E8m0Rounding::kUp, Saturation::kFinite);
    case kE8m0ZeroSat: return fmt::float_to_e8m0(v, E8m0Rounding::kTowardZero, Saturation::kFinite);
    case kE8m0UpNoSat: return fmt::float_to_e8m0(v, E8m0Rounding::kUp, Saturation::kNone);
    default: return 0;
  }
}

TEST(FormatsGpu, EncodeMatchesIntrinsicsBitForBit) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  std::vector<float> x;
  for (const auto* f : {&fmt::kBf16Format, &fmt::kFp16Format, &fmt::kE4m3Format, &fmt::kE5m2Format,
                        &fmt::kE2m1Format}) {
    auto s = test::rounding_samples(*f, 1 << 20, 77);
    x.insert(x.end(), s.begin(), s.end());
  }
  for (int k = -149; k <= 127; ++k) x.push_back(fmt::exact_pow2(k) * 1.0000001f);
  const int n = static_cast<int>(x.size());
  DeviceBuffer<float> dx(x);
  DeviceBuffer<std::uint32_t> intrinsic(x.size() * kNumConversions);
  DeviceBuffer<std::uint32_t> ours(x.size() * kNumConversions);
  encode_kernel<<<(n + 255) / 256, 256>>>(dx.get(), n, intrinsic.get(), ours.get());
  FLASHMSA_CHECK_LAUNCH();
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
  const auto a = intrinsic.to_host();
  const auto b = ours.to_host();
  int reported = 0;
  size_t mismatches = 0;
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < kNumConversions; ++c) {
      const std::uint32_t want = a[static_cast<size_t>(i) * kNumConversions + c];
      const std::uint32_t host = host_encode(static_cast<Conversion>(c), x[i]);
      const std::uint32_t device_ours = b[static_cast<size_t>(i) * kNumConversions + c];
      if (host != want || device_ours != want) {
        ++mismatches;
        if (reported++ < 20) {
          ADD_FAILURE() << "conversion " << c << " x=" << x[i] << " bits 0x" << std::hex
                        << fmt::float_bits(x[i]) << ": intrinsic 0x" << want << ", host 0x" << host
                        << ", ours on device 0x" << device_ours;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << n << " inputs x " << kNumConversions << " conversions";
}

__global__ void decode_kernel(std::uint32_t* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;  // 0..65535
  if (c >= 65536) return;
  std::uint32_t* o = out + static_cast<size_t>(c) * 5;
  o[0] = __float_as_uint(__bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(c))));
  o[1] = __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(c))));
  const auto byte = static_cast<__nv_fp8_storage_t>(c & 0xFF);
  o[2] = __float_as_uint(__half2float(__half(__nv_cvt_fp8_to_halfraw(byte, __NV_E4M3))));
  o[3] = __float_as_uint(__half2float(__half(__nv_cvt_fp8_to_halfraw(byte, __NV_E5M2))));
  __nv_fp8_e8m0 e;
  e.__x = byte;
  o[4] = __float_as_uint(static_cast<float>(e));
}

TEST(FormatsGpu, DecodeMatchesIntrinsicsForEveryCode) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  DeviceBuffer<std::uint32_t> out(65536 * 5);
  decode_kernel<<<256, 256>>>(out.get());
  FLASHMSA_CHECK_LAUNCH();
  const auto d = out.to_host();
  auto same = [](std::uint32_t want, float got) {
    const float w = fmt::bits_float(want);
    return (std::isnan(w) && std::isnan(got)) || want == fmt::float_bits(got);
  };
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const std::uint32_t* o = &d[c * 5];
    ASSERT_EQ(o[0], fmt::float_bits(fmt::bf16_to_float(static_cast<std::uint16_t>(c)))) << c;
    ASSERT_TRUE(same(o[1], fmt::fp16_to_float(static_cast<std::uint16_t>(c)))) << c;
    if (c < 256) {
      const auto b = static_cast<std::uint8_t>(c);
      ASSERT_TRUE(same(o[2], fmt::e4m3_to_float(b))) << c;
      ASSERT_TRUE(same(o[3], fmt::e5m2_to_float(b))) << c;
      ASSERT_TRUE(same(o[4], fmt::e8m0_to_float(b))) << c;
    }
  }
}

__device__ float rcp_approx_ftz(float v) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

__global__ void rcp_kernel(float* out) {
  const int k = static_cast<int>(threadIdx.x) - 127;  // 0..254 -> 2^-127 .. 2^127
  out[threadIdx.x] = rcp_approx_ftz(fmt::exact_pow2(k));
  if (threadIdx.x == 0) out[255] = rcp_approx_ftz(448.0f);
}

TEST(FormatsGpu, ApproximateReciprocalAsEmulated) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  DeviceBuffer<float> out(256);
  rcp_kernel<<<1, 255>>>(out.get());
  FLASHMSA_CHECK_LAUNCH();
  const auto r = out.to_host();
  EXPECT_EQ(fmt::float_bits(r[255]), fmt::kRcp448Bits) << "rcp.approx.ftz(448) on this GPU";
  for (int k = -127; k <= 127; ++k) {
    EXPECT_EQ(fmt::float_bits(r[k + 127]),
              fmt::float_bits(fmt::rcp_approx_ftz_pow2(fmt::exact_pow2(k))))
        << "k=" << k;
  }
}

// FlashInfer's MXFP8 group recipe, written with the CUDA intrinsics it uses, with the one
// deliberate difference of spec section 7: a scale clamped to 2^-127 multiplies by 2^127 (the
// recipe's rcp flushes to Inf there and turns zeros into NaN).
__global__ void mxfp8_recipe_kernel(const __nv_bfloat16* x, int groups, std::uint8_t* codes,
                                    std::uint8_t* scales) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const __nv_bfloat16* in = x + g * 32;
  __nv_bfloat16 amax = __habs(in[0]);
  for (int i = 1; i < 32; ++i) amax = __hmax(amax, __habs(in[i]));
  const float vec_max = __bfloat162float(amax);
  const float sf = vec_max * rcp_approx_ftz(448.0f);
  __nv_fp8_e8m0 sf8;
  sf8.__x = __nv_cvt_float_to_e8m0(sf, __NV_SATFINITE, cudaRoundPosInf);
  const float scale = vec_max == 0.0f ? 0.0f
                      : sf8.__x == 0  ? 0x1p127f
                                      : rcp_approx_ftz(static_cast<float>(sf8));
  scales[g] = sf8.__x;
  for (int i = 0; i < 32; ++i) {
    codes[g * 32 + i] =
        __nv_cvt_float_to_fp8(__bfloat162float(in[i]) * scale, __NV_SATFINITE, __NV_E4M3);
  }
}

TEST(FormatsGpu, Mxfp8MatchesFlashInferRecipe) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> log_scale(-135.0f, 130.0f);
  const int groups = 1 << 16;
  std::vector<std::uint16_t> x(static_cast<size_t>(groups) * 32);
  for (int g = 0; g < groups; ++g) {
    const float s = std::exp2(log_scale(rng));
    for (int i = 0; i < 32; ++i) x[g * 32 + i] = fmt::float_to_bf16(normal(rng) * s);
    switch (g % 16) {
      case 0: std::fill_n(&x[g * 32], 32, fmt::float_to_bf16(0.0f)); break;
      case 1: x[g * 32 + 3] = fmt::float_to_bf16(NAN); break;
      case 2: x[g * 32 + 5] = fmt::float_to_bf16(-INFINITY); break;
      case 3: x[g * 32] = fmt::float_to_bf16(std::ldexp(448.0f, g % 64 - 32)); break;
      case 4: std::fill_n(&x[g * 32], 32, fmt::float_to_bf16(NAN)); break;
      case 5: x[g * 32 + 7] = static_cast<std::uint16_t>(g % 128); break;  // subnormals
      case 6: x[g * 32 + 9] = fmt::float_to_bf16(0.0f); break;  // a zero (clamped scales too)
      default: break;
    }
  }
  DeviceBuffer<std::uint16_t> dx(x);
  DeviceBuffer<std::uint8_t> codes(x.size()), scales(groups);
  mxfp8_recipe_kernel<<<groups / 128, 128>>>(reinterpret_cast<const __nv_bfloat16*>(dx.get()),
                                             groups, codes.get(), scales.get());
  FLASHMSA_CHECK_LAUNCH();
  const auto dc = codes.to_host();
  const auto ds = scales.to_host();
  int failures = 0;
  for (int g = 0; g < groups && failures < 10; ++g) {
    std::uint8_t host_codes[32];
    const std::uint8_t host_scale = fmt::mxfp8_quantize_group(&x[g * 32], host_codes);
    bool ok = host_scale == ds[g];
    for (int i = 0; i < 32; ++i) ok = ok && host_codes[i] == dc[g * 32 + i];
    if (!ok) {
      ++failures;
      ADD_FAILURE() << "group " << g << ": scale device " << int(ds[g]) << " host "
                    << int(host_scale);
    }
  }
  EXPECT_EQ(failures, 0);
}

__global__ void nvfp4_kernel(const float* x, int groups, std::uint8_t* packed,
                             std::uint8_t* scales) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g < groups) scales[g] = fmt::nvfp4_quantize_group(x + g * 16, packed + g * 8);
}

TEST(FormatsGpu, Nvfp4DeviceMatchesHost) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  const int groups = 1 << 16;
  std::vector<float> x(static_cast<size_t>(groups) * 16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * std::exp2(float(i / 16 % 60) - 30);
  DeviceBuffer<float> dx(x);
  DeviceBuffer<std::uint8_t> packed(static_cast<size_t>(groups) * 8), scales(groups);
  nvfp4_kernel<<<groups / 128, 128>>>(dx.get(), groups, packed.get(), scales.get());
  FLASHMSA_CHECK_LAUNCH();
  const auto dp = packed.to_host();
  const auto ds = scales.to_host();
  for (int g = 0; g < groups; ++g) {
    std::uint8_t hp[8];
    ASSERT_EQ(fmt::nvfp4_quantize_group(&x[g * 16], hp), ds[g]) << g;
    for (int i = 0; i < 8; ++i) ASSERT_EQ(hp[i], dp[g * 8 + i]) << g;
  }
}

// ---- In-register widening (src/cuda/sm90/convert.cuh): every code, every variant ----

enum Widening { kE4m3F16, kE4m3Bf16Cvt, kE4m3Bf16Bits, kE5m2F16, kE5m2Bf16Bits, kNumWidenings };

// Thread t widens the fp8 word holding codes 4t..4t+3 (mod 256) with every variant: 2 pairs of
// 16-bit results per variant.
__global__ void widen_fp8_kernel(std::uint32_t* out) {
  namespace cv = cuda::convert;
  const unsigned t = threadIdx.x;
  const std::uint32_t codes = (4 * t & 255) | ((4 * t + 1) & 255) << 8 | ((4 * t + 2) & 255) << 16 |
                              ((4 * t + 3) & 255) << 24;
  std::uint32_t* o = out + t * kNumWidenings * 2;
  for (int pair = 0; pair < 2; ++pair) {
    o[kE4m3F16 * 2 + pair] = cv::e4m3x2_to_f16x2(codes, pair);
    o[kE4m3Bf16Cvt * 2 + pair] = cv::e4m3x2_to_bf16x2_cvt(codes, pair);
    o[kE4m3Bf16Bits * 2 + pair] = cv::e4m3x2_to_bf16x2_bits(codes, pair);
    o[kE5m2F16 * 2 + pair] = cv::e5m2x2_to_f16x2(codes, pair);
    o[kE5m2Bf16Bits * 2 + pair] = cv::e5m2x2_to_bf16x2_bits(codes, pair);
  }
}

// Thread t widens the NVFP4 word whose eight nibbles are t, t+1, ..., t+7 (mod 16) every way.
__global__ void widen_nvfp4_kernel(std::uint32_t* lut, std::uint32_t* shifted, std::uint32_t* bytes,
                                   std::uint32_t* paired) {
  namespace cv = cuda::convert;
  std::uint32_t codes = 0;
  for (unsigned i = 0; i < 8; ++i) codes |= ((threadIdx.x + i) & 15u) << (4 * i);
  std::uint32_t a[4], b[4], d[4];
  cv::e2m1x8_to_f16x2_lut(codes, a);
  cv::e2m1x8_to_f16x2_scaled_shift(codes, b);
  cv::e2m1x8_to_f16x2_scaled_bytes(codes, d);
  const std::uint32_t c[4] = {cv::e2m1_pair_to_bf16x2<0>(codes), cv::e2m1_pair_to_bf16x2<1>(codes),
                              cv::e2m1_pair_to_bf16x2<2>(codes), cv::e2m1_pair_to_bf16x2<3>(codes)};
  for (int i = 0; i < 4; ++i) {
    lut[threadIdx.x * 4 + i] = a[i], shifted[threadIdx.x * 4 + i] = b[i];
    bytes[threadIdx.x * 4 + i] = d[i];
    paired[threadIdx.x * 4 + i] = c[i];
  }
}

// Thread s (an E4M3 block scale code) multiplies every E2M1 code by its scale the way
// register_qk and widen_planes do (convert::e2m1_pair_times_scale), scaled down by 2^-63 or not.
__global__ void nvfp4_times_scale_kernel(std::uint32_t* scaled, std::uint32_t* plain) {
  namespace cv = cuda::convert;
  const std::uint32_t scale = cv::prmt(cv::e4m3x2_to_bf16x2_cvt(threadIdx.x, 0), 0, 0x1010u);
  const std::uint32_t up = cv::bf16x2_mul(scale, cv::kE2m1ScaleUp);
  for (int w = 0; w < 2; ++w) {
    const std::uint32_t codes = w == 0 ? 0x76543210u : 0xFEDCBA98u;  // codes 8 w .. 8 w + 7
    const std::uint32_t s[4] = {cv::e2m1_pair_times_scale<0, true>(codes, up),
                                cv::e2m1_pair_times_scale<1, true>(codes, up),
                                cv::e2m1_pair_times_scale<2, true>(codes, up),
                                cv::e2m1_pair_times_scale<3, true>(codes, up)};
    const std::uint32_t p[4] = {cv::e2m1_pair_times_scale<0, false>(codes, scale),
                                cv::e2m1_pair_times_scale<1, false>(codes, scale),
                                cv::e2m1_pair_times_scale<2, false>(codes, scale),
                                cv::e2m1_pair_times_scale<3, false>(codes, scale)};
    for (int i = 0; i < 4; ++i) {
      scaled[(threadIdx.x * 2 + w) * 4 + i] = s[i];
      plain[(threadIdx.x * 2 + w) * 4 + i] = p[i];
    }
  }
}

// Bit-exact equality of values, NaN equal to NaN (the widenings keep NaN, not its payload).
bool same_value(float got, float want) {
  return (std::isnan(got) && std::isnan(want)) ||
         (got == want && std::signbit(got) == std::signbit(want));
}

float half_bits_value(std::uint16_t h) {
  return fmt::fp16_to_float(h);
}

float bf16_bits_value(std::uint16_t b) {
  return fmt::bf16_to_float(b);
}

// The element in each output half of e2m1x8_to_f16x2_scaled_shift and _scaled_bytes.
constexpr int kScaledF16Order[8] = {0, 2, 1, 3, 4, 6, 5, 7};

// The byte-building NVFP4 route uses only logic and byte permutes, which the host emulates
// (convert::prmt): every code at every position of a word, among random neighbours, on any
// machine. (InRegisterWideningIsExactForEveryCode checks the device's own instructions.)
TEST(FormatsGpu, Nvfp4HighBytesRouteIsExactOnTheHost) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 64; ++trial) {
    for (int position = 0; position < 8; ++position) {
      for (std::uint32_t code = 0; code < 16; ++code) {
        std::uint32_t codes = static_cast<std::uint32_t>(rng());
        codes = (codes & ~(15u << (4 * position))) | code << (4 * position);
        std::uint32_t out[4];
        cuda::convert::e2m1x8_to_f16x2_scaled_bytes(codes, out);
        for (int h = 0; h < 8; ++h) {
          const auto bits = static_cast<std::uint16_t>(out[h / 2] >> (16 * (h % 2)));
          const auto want = static_cast<std::uint8_t>(codes >> (4 * kScaledF16Order[h]) & 15u);
          ASSERT_TRUE(same_value(half_bits_value(bits) * 16384.0f, fmt::e2m1_to_float(want)))
              << "codes 0x" << std::hex << codes << ", half " << std::dec << h;
        }
      }
    }
  }
}

TEST(FormatsGpu, InRegisterWideningIsExactForEveryCode) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  constexpr int kThreads = 64;  // 256 fp8 codes
  DeviceBuffer<std::uint32_t> fp8(kThreads * kNumWidenings * 2);
  widen_fp8_kernel<<<1, kThreads>>>(fp8.get());
  FLASHMSA_CHECK_LAUNCH();
  const auto got = fp8.to_host();
  int checked = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int w = 0; w < kNumWidenings; ++w) {
      for (int e = 0; e < 4; ++e) {
        const auto code = static_cast<std::uint8_t>(4 * t + e);
        const std::uint32_t word = got[(t * kNumWidenings + w) * 2 + e / 2];
        const auto bits = static_cast<std::uint16_t>(word >> (16 * (e % 2)));
        const bool e4m3 = w <= kE4m3Bf16Bits, f16 = w == kE4m3F16 || w == kE5m2F16;
        const float want = e4m3 ? fmt::e4m3_to_float(code) : fmt::e5m2_to_float(code);
        const float value = f16 ? half_bits_value(bits) : bf16_bits_value(bits);
        ASSERT_TRUE(same_value(value, want)) << "variant " << w << ", code 0x" << std::hex
                                             << int(code) << ": " << value << " != " << want;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 256 * kNumWidenings);

  DeviceBuffer<std::uint32_t> lut(16 * 4), shifted(16 * 4), bytes(16 * 4), paired(16 * 4);
  widen_nvfp4_kernel<<<1, 16>>>(lut.get(), shifted.get(), bytes.get(), paired.get());
  FLASHMSA_CHECK_LAUNCH();
  const auto lut_host = lut.to_host(), shifted_host = shifted.to_host(),
             bytes_host = bytes.to_host(), paired_host = paired.to_host();
  for (unsigned t = 0; t < 16; ++t) {
    for (int h = 0; h < 8; ++h) {
      const auto lut_bits = static_cast<std::uint16_t>(lut_host[t * 4 + h / 2] >> (16 * (h % 2)));
      const auto code = static_cast<std::uint8_t>((t + h) & 15);
      ASSERT_TRUE(same_value(half_bits_value(lut_bits), fmt::e2m1_to_float(code)))
          << "lut, code " << int(code);
      const auto shift_bits =
          static_cast<std::uint16_t>(shifted_host[t * 4 + h / 2] >> (16 * (h % 2)));
      const auto shift_code = static_cast<std::uint8_t>((t + kScaledF16Order[h]) & 15);
      ASSERT_TRUE(
          same_value(half_bits_value(shift_bits) * 16384.0f, fmt::e2m1_to_float(shift_code)))
          << "scaled shift, code " << int(shift_code);
      const auto bytes_bits =
          static_cast<std::uint16_t>(bytes_host[t * 4 + h / 2] >> (16 * (h % 2)));
      ASSERT_EQ(bytes_bits, shift_bits) << "scaled bytes, code " << int(shift_code);
      // e2m1_pair_to_bf16x2<j>: codes j (low half) and j + 4 (high half), exact bf16 values.
      const auto pair_bits =
          static_cast<std::uint16_t>(paired_host[t * 4 + h / 2] >> (16 * (h % 2)));
      const auto pair_code = static_cast<std::uint8_t>((t + h / 2 + 4 * (h % 2)) & 15);
      ASSERT_TRUE(same_value(bf16_bits_value(pair_bits), fmt::e2m1_to_float(pair_code)))
          << "bf16 pair, code " << int(pair_code);
    }
  }
}

// Every E2M1 code times every E4M3 scale, as the NVFP4 key and value fragments are made: exact,
// and with the scale x 2^63 (kE2m1ScaleUp) exactly 2^-63 of that (the claim that lets the index
// scoring and the attention drop one multiply a code pair).
TEST(FormatsGpu, Nvfp4CodeTimesScaleIsExactScaledDownOrNot) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  DeviceBuffer<std::uint32_t> scaled(256 * 8), plain(256 * 8);
  nvfp4_times_scale_kernel<<<1, 256>>>(scaled.get(), plain.get());
  FLASHMSA_CHECK_LAUNCH();
  const auto scaled_host = scaled.to_host(), plain_host = plain.to_host();
  for (int s = 0; s < 256; ++s) {
    const float scale = fmt::e4m3_to_float(static_cast<std::uint8_t>(s));
    for (int w = 0; w < 2; ++w) {
      for (int h = 0; h < 8; ++h) {  // output i = h / 2 holds codes i (low half), i + 4 (high)
        const int at = (s * 2 + w) * 4 + h / 2, shift = 16 * (h % 2);
        const auto code = static_cast<std::uint8_t>(8 * w + h / 2 + 4 * (h % 2));
        const float want = fmt::e2m1_to_float(code) * scale;  // exact: <= 6 significant bits
        const float down = bf16_bits_value(static_cast<std::uint16_t>(scaled_host[at] >> shift));
        const float full = bf16_bits_value(static_cast<std::uint16_t>(plain_host[at] >> shift));
        ASSERT_TRUE(same_value(full, want))
            << "code " << int(code) << " x scale 0x" << std::hex << s << ": " << full;
        ASSERT_TRUE(same_value(std::ldexp(down, 63), want))
            << "scaled down, code " << int(code) << " x scale 0x" << std::hex << s << ": " << down;
      }
    }
  }
}

}  // namespace
}  // namespace flashmsa
