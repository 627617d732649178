// Block-scaled formats: NVFP4 groups (the fp4 cache format) and MXFP8 rows (the decode output
// format for the next GEMM). Spec sections 6 and 7. Host and device.
#pragma once

#include <cstdint>

#include "flashmsa/formats/minifloat.hpp"

namespace flashmsa::fmt {

// ---- NVFP4: 16 elements share one E4M3 scale; two E2M1 codes per byte ----------------------

inline constexpr int kNvfp4GroupSize = 16;

// max |x| ignoring NaN (fmaxf semantics); 0 for an all-NaN group.
FLASHMSA_HD float nan_ignoring_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = bits_float(float_bits(x[i]) & 0x7FFFFFFFu);
    amax = a > amax ? a : amax;  // false for NaN, so NaN never wins
  }
  return amax;
}

// Quantizes 16 floats: scale s = e4m3_satfinite(amax / 6), codes e2m1_rn(x / s) (s == 0 gives
// zero codes). Element 2i goes to the low nibble of byte i, element 2i+1 to the high nibble.
// Returns the E4M3 scale byte.
FLASHMSA_HD std::uint8_t nvfp4_quantize_group(const float* x, std::uint8_t* packed) {
  const std::uint8_t scale = float_to_e4m3(nan_ignoring_amax(x, kNvfp4GroupSize) / 6.0f);
  const float s = e4m3_to_float(scale);
  for (int i = 0; i < kNvfp4GroupSize / 2; ++i) {
    const std::uint8_t lo = s == 0.0f ? 0 : float_to_e2m1(x[2 * i] / s);
    const std::uint8_t hi = s == 0.0f ? 0 : float_to_e2m1(x[2 * i + 1] / s);
    packed[i] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
  return scale;
}

// Element i of a packed NVFP4 group: code * scale (exact; also exact in bf16).
FLASHMSA_HD float nvfp4_element(const std::uint8_t* packed, std::uint8_t scale, int i) {
  const std::uint8_t code = (packed[i / 2] >> ((i & 1) * 4)) & 0xFu;
  return e2m1_to_float(code) * e4m3_to_float(scale);
}

// ---- MXFP8: 32 elements share one E8M0 scale; values E4M3 --------------------------------

inline constexpr int kMxfp8GroupSize = 32;

enum class Mxfp8ScaleRule {
  // FlashInfer / TensorRT-LLM mxfp8_quantize: scale = 2^ceil(log2(amax * rcp(448))), with the
  // hardware's approximate reciprocal and flush-to-zero, values x * rcp(scale). The default.
  kRceil,
  // OCP MX specification: scale = 2^(floor(log2(amax)) - 8), values x / scale.
  kFloor,
};

enum class ScaleLayout {
  kRowMajor,       // [rows, cols / 32]
  kSwizzled128x4,  // FlashInfer / cuBLAS block-scaled GEMM layout, 128-row x 4-column tiles
};

// rcp.approx.ftz.f32(448.0f) on sm_90: the constant FlashInfer multiplies amax by. The GPU
// format test checks it against the instruction.
inline constexpr std::uint32_t kRcp448Bits = 0x3B124925u;

// rcp.approx.ftz.f32 for the only inputs MXFP8 feeds it: powers of two 2^k (k in [-127, 127])
// and NaN. Exact for normal results; 2^-127 is flushed to +0 on input (giving +Inf) and 2^-127
// as a result is flushed to +0.
FLASHMSA_HD float rcp_approx_ftz_pow2(float p) {
  const std::uint32_t u = float_bits(p);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return p;
  const int biased = static_cast<int>(u >> 23);
  if (biased == 0) return bits_float(0x7F800000u);  // subnormal input flushed: 1/0
  const int k = biased - 127;
  return -k >= -126 ? exact_pow2(-k) : 0.0f;
}

// max |x| over bf16 values the way __hmax2 reduces: NaN operands are ignored, an all-NaN group
// gives NaN. Returns the bf16 bits.
FLASHMSA_HD std::uint16_t bf16_amax(const std::uint16_t* x, int n) {
  std::uint16_t amax = 0x7FFF;  // canonical NaN until a number is seen
  bool seen_number = false;
  for (int i = 0; i < n; ++i) {
    const std::uint16_t a = x[i] & 0x7FFFu;
    if (a > 0x7F80u) continue;
    if (!seen_number || a > amax) amax = a;  // |bf16| bit patterns order like the values
    seen_number = true;
  }
  return amax;
}

// Quantizes one group of 32 bf16 values to E4M3 codes; returns the E8M0 scale byte.
FLASHMSA_HD std::uint8_t mxfp8_quantize_group(const std::uint16_t* x, std::uint8_t* codes,
                                              Mxfp8ScaleRule rule = Mxfp8ScaleRule::kRceil) {
  const float amax = bf16_to_float(bf16_amax(x, kMxfp8GroupSize));
  std::uint8_t scale;
  float multiplier;
  if (rule == Mxfp8ScaleRule::kRceil) {
    scale = float_to_e8m0(amax * bits_float(kRcp448Bits), E8m0Rounding::kUp);
    // A scale clamped to 2^-127 has no fp32 reciprocal under flush-to-zero (FlashInfer's
    // expression gives Inf, and its zeros NaN): values are x * 2^127, exact (spec section 7).
    multiplier = amax == 0.0f ? 0.0f
                 : scale == 0 ? exact_pow2(127)
                              : rcp_approx_ftz_pow2(e8m0_to_float(scale));
  } else {
    // floor(log2(amax)) is amax's unbiased exponent (bf16 subnormals count from their top bit).
    int e;
    if (amax != amax) {
      scale = 0xFF;
      multiplier = amax;
    } else {
      if (amax == 0.0f) {
        e = -127;
      } else {  // Inf reads as 2^128 here, so its group scales like the largest finite values
        const std::uint32_t a = float_bits(amax);
        int log2_floor = static_cast<int>(a >> 23) - 127;
        if ((a >> 23) == 0) {
          log2_floor = -127;
          for (std::uint32_t m = (a & 0x7FFFFFu) << 1; m < 0x800000u; m <<= 1) --log2_floor;
        }
        e = log2_floor - 8;
        e = e < -127 ? -127 : (e > 127 ? 127 : e);
      }
      scale = static_cast<std::uint8_t>(e + 127);
      multiplier = exact_pow2(-e);
    }
  }
  for (int i = 0; i < kMxfp8GroupSize; ++i) {
    codes[i] = float_to_e4m3(bf16_to_float(x[i]) * multiplier, Saturation::kFinite);
  }
  return scale;
}

// Byte offset of scale (row, col) in a scale buffer with `scale_cols` scale columns per row.
FLASHMSA_HD std::int64_t mxfp8_scale_offset(std::int64_t row, std::int64_t col,
                                            std::int64_t scale_cols, ScaleLayout layout) {
  if (layout == ScaleLayout::kRowMajor) return row * scale_cols + col;
  const std::int64_t padded_cols = (scale_cols + 3) / 4 * 4;
  return (row / 128) * padded_cols * 128 + (col / 4) * 512 + (row % 32) * 16 +
         ((row % 128) / 32) * 4 + col % 4;
}

// Bytes a scale buffer needs: the swizzled layout pads rows to 128 and columns to 4.
FLASHMSA_HD std::int64_t mxfp8_scale_buffer_size(std::int64_t rows, std::int64_t scale_cols,
                                                 ScaleLayout layout) {
  if (layout == ScaleLayout::kRowMajor) return rows * scale_cols;
  return (rows + 127) / 128 * 128 * ((scale_cols + 3) / 4 * 4);
}

}  // namespace flashmsa::fmt
