// Conversions between fp32 and the narrow floating-point formats FlashMSA stores:
// bf16, fp16, fp8 E4M3 / E5M2, fp4 E2M1 (the NVFP4 element) and E8M0 (the MX scale).
//
// All of them are plain integer arithmetic on the fp32 bit pattern, usable on host and device,
// and bit-identical to the CUDA conversion intrinsics on sm_90 (tests/cpp/test_formats*.cpp and
// the GPU test compare them exhaustively or over every rounding boundary):
//   float_to_bf16  == __float2bfloat16_rn         float_to_fp16 == __float2half_rn
//   float_to_e4m3 / float_to_e5m2 == __nv_cvt_float_to_fp8(x, sat, ...)
//   float_to_e2m1  == __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)
//   float_to_e8m0  == __nv_cvt_float_to_e8m0(x, sat, cudaRoundPosInf / cudaRoundZero)
// Codes are returned as raw bits; a code's sign is its top bit.
#pragma once

#include <cstdint>

#include "flashmsa/formats/host_device.hpp"

namespace flashmsa::fmt {

// What happens to finite values beyond the largest finite code (and to +/-Inf).
enum class Saturation {
  kNone,    // overflow to Inf where the format has it, else to NaN (E4M3)
  kFinite,  // clamp to the largest finite magnitude ("satfinite")
};

// The parameters of one sign/exponent/mantissa format narrower than fp32.
struct MiniFloatFormat {
  int exp_bits;
  int man_bits;
  int bias;
  bool has_inf;            // all-ones exponent with zero mantissa is Inf (IEEE style)
  std::uint32_t max_code;  // largest finite magnitude, sign bit clear
  std::uint32_t nan_code;  // what a NaN input becomes (sign bit clear, as CUDA does)
};

inline constexpr MiniFloatFormat kBf16Format{8, 7, 127, true, 0x7F7F, 0x7FFF};
inline constexpr MiniFloatFormat kFp16Format{5, 10, 15, true, 0x7BFF, 0x7FFF};
inline constexpr MiniFloatFormat kE4m3Format{4, 3, 7, false, 0x7E, 0x7F};
inline constexpr MiniFloatFormat kE5m2Format{5, 2, 15, true, 0x7B, 0x7F};
// E2M1 has neither Inf nor NaN; CUDA turns NaN into +6 (the largest code) and always saturates.
inline constexpr MiniFloatFormat kE2m1Format{2, 1, 1, false, 0x7, 0x7};

// Round-to-nearest-even fp32 -> format F. Subnormal inputs and outputs are handled exactly.
template <const MiniFloatFormat& F>
FLASHMSA_HD std::uint32_t float_to_minifloat(float x, Saturation sat) {
  constexpr int kTotalBits = 1 + F.exp_bits + F.man_bits;
  constexpr int kMinExp = 1 - F.bias;  // exponent of the smallest normal
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 31) << (kTotalBits - 1);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return F.nan_code;

  std::uint32_t code;
  if (a == 0x7F800000u) {
    code = F.max_code + 1;  // Inf: handled as an overflow below
  } else {
    // a = significand * 2^(exp - 23), with the implicit bit for normal fp32 inputs.
    const int biased = static_cast<int>(a >> 23);
    const int exp = biased == 0 ? -126 : biased - 127;
    const std::uint32_t significand = (a & 0x7FFFFFu) | (biased == 0 ? 0u : 0x800000u);
    const int target_exp = exp > kMinExp ? exp : kMinExp;
    // Express the value in units of the target's ulp 2^(target_exp - man_bits), rounding to the
    // nearest integer, ties to even. shift >= 13 for every format here (fp32 has 23 bits).
    const int shift = (target_exp - F.man_bits) - (exp - 23);
    std::uint32_t units = 0;
    if (shift < 32) {
      units = significand >> shift;
      const std::uint32_t rest = significand & ((std::uint32_t{1} << shift) - 1u);
      const std::uint32_t half = std::uint32_t{1} << (shift - 1);
      if (rest > half || (rest == half && (units & 1u))) ++units;
    }
    // units carries the implicit bit, so adding it lets a mantissa carry bump the exponent.
    code = (static_cast<std::uint32_t>(target_exp - kMinExp) << F.man_bits) + units;
  }
  if (code > F.max_code) {
    if (sat == Saturation::kFinite || (!F.has_inf && F.nan_code == F.max_code)) {
      code = F.max_code;
    } else if (F.has_inf) {
      code = ((std::uint32_t{1} << F.exp_bits) - 1u) << F.man_bits;
    } else {
      code = F.nan_code;  // E4M3 without saturation: overflow is NaN (sign kept, like CUDA)
    }
  }
  return code | sign;
}

// Exact format F -> fp32. NaN codes give the canonical fp32 NaN.
template <const MiniFloatFormat& F>
FLASHMSA_HD float minifloat_to_float(std::uint32_t code) {
  constexpr int kTotalBits = 1 + F.exp_bits + F.man_bits;
  const std::uint32_t sign = (code >> (kTotalBits - 1)) & 1u;
  const std::uint32_t mag = code & ((std::uint32_t{1} << (kTotalBits - 1)) - 1u);
  const std::uint32_t exp_field = mag >> F.man_bits;
  const std::uint32_t man = mag & ((std::uint32_t{1} << F.man_bits) - 1u);
  constexpr std::uint32_t kExpAllOnes = (std::uint32_t{1} << F.exp_bits) - 1u;
  std::uint32_t out;
  if (F.has_inf && exp_field == kExpAllOnes) {
    out = man == 0 ? 0x7F800000u : 0x7FFFFFFFu;
  } else if (!F.has_inf && F.nan_code != F.max_code && mag == F.nan_code) {
    out = 0x7FFFFFFFu;
  } else if (exp_field == 0) {
    // Subnormal: man * 2^(1 - bias - man_bits), exact in fp32 for every format here.
    out = float_bits(static_cast<float>(man) * exact_pow2(1 - F.bias - F.man_bits));
  } else {
    out = ((exp_field - F.bias + 127u) << 23) | (man << (23 - F.man_bits));
  }
  if (out == 0x7FFFFFFFu) return bits_float(out);
  return bits_float(out | (sign << 31));
}

// ---- bf16 and fp16 (round to nearest even; overflow gives Inf, NaN gives 0x7FFF) ----------

FLASHMSA_HD std::uint16_t float_to_bf16(float x) {
  return static_cast<std::uint16_t>(float_to_minifloat<kBf16Format>(x, Saturation::kNone));
}
FLASHMSA_HD float bf16_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}
FLASHMSA_HD std::uint16_t float_to_fp16(float x) {
  return static_cast<std::uint16_t>(float_to_minifloat<kFp16Format>(x, Saturation::kNone));
}
FLASHMSA_HD float fp16_to_float(std::uint16_t h) {
  return minifloat_to_float<kFp16Format>(h);
}

// ---- fp8 ----------------------------------------------------------------------------------

FLASHMSA_HD std::uint8_t float_to_e4m3(float x, Saturation sat = Saturation::kFinite) {
  return static_cast<std::uint8_t>(float_to_minifloat<kE4m3Format>(x, sat));
}
FLASHMSA_HD float e4m3_to_float(std::uint8_t c) {
  return minifloat_to_float<kE4m3Format>(c);
}
FLASHMSA_HD std::uint8_t float_to_e5m2(float x, Saturation sat = Saturation::kFinite) {
  return static_cast<std::uint8_t>(float_to_minifloat<kE5m2Format>(x, sat));
}
FLASHMSA_HD float e5m2_to_float(std::uint8_t c) {
  return minifloat_to_float<kE5m2Format>(c);
}

// ---- fp4 E2M1: a 4-bit code in the low nibble; magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} -------

FLASHMSA_HD std::uint8_t float_to_e2m1(float x) {
  return static_cast<std::uint8_t>(float_to_minifloat<kE2m1Format>(x, Saturation::kFinite));
}
FLASHMSA_HD float e2m1_to_float(std::uint8_t c) {
  return minifloat_to_float<kE2m1Format>(c & 0xFu);
}

// ---- E8M0: an unsigned power of two 2^(byte - 127); 0xFF is NaN ----------------------------

enum class E8m0Rounding {
  kUp,          // smallest power of two >= |x| ("RCEIL", cudaRoundPosInf)
  kTowardZero,  // largest power of two <= |x| (cudaRoundZero)
};

// Sign is ignored; |x| <= 2^-127 (zero included) gives 0. With Saturation::kFinite results above
// 2^127 clamp to 0xFE, else they become 0xFF (NaN).
FLASHMSA_HD std::uint8_t float_to_e8m0(float x, E8m0Rounding rounding,
                                       Saturation sat = Saturation::kFinite) {
  const std::uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0xFF;
  std::uint32_t e = a >> 23;  // biased exponent, equals the E8M0 byte for 2^k
  if (a == 0x7F800000u) {
    e = 0xFF;
  } else if (e == 0) {
    // fp32 subnormal: 2^-127 is 0x400000; above that rounds up to 2^-126.
    if (rounding == E8m0Rounding::kUp && a > 0x400000u) e = 1;
  } else if (rounding == E8m0Rounding::kUp && (a & 0x7FFFFFu) != 0) {
    ++e;
  }
  if (e == 0xFF && sat == Saturation::kFinite) e = 0xFE;
  return static_cast<std::uint8_t>(e);
}

FLASHMSA_HD float e8m0_to_float(std::uint8_t b) {
  return b == 0xFF ? bits_float(0x7FFFFFFFu) : exact_pow2(static_cast<int>(b) - 127);
}

}  // namespace flashmsa::fmt
