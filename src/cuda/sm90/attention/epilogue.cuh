// The attention epilogue's pieces: the output scale of a finished softmax, the weighted merge of
// partial rows (attention_kernel's key parts), and the final stores (bf16 / fp16 / fp32 rows, or
// MXFP8 codes and scales, and the log-sum-exp).
#pragma once

#include <cstdint>

#include "flashmsa/formats.hpp"
#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/sm90/attention/attention_params.hpp"

namespace flashmsa::cuda::attention_detail {

// The normalisation of a row from its softmax sum l and max m (log2 units): 1 / l (times the
// V scale) and the log2-sum-exp when l > 0; no key (l == 0): 0 (exact zeros, unless a NaN value
// sat behind a zero weight) and -inf; a NaN l (a NaN or +Inf score): NaN and NaN (spec 5).
struct OutputScale {
  float inv, lse_log2;
};
__device__ __forceinline__ OutputScale output_scale(float l, float m, float v_scale) {
  if (l > 0.0f) return {v_scale / l, m + __log2f(l)};
  if (l == 0.0f) return {0.0f, -INFINITY};
  return {__int_as_float(0x7FC00000), __int_as_float(0x7FC00000)};
}

// v += w * src[0, W): part of one (row, head)'s output values weighted into a merge.
template <int W>
__device__ __forceinline__ void add_scaled(float (&v)[W], const float* src, float w) {
  static_assert(W % 4 == 0);
  const auto* src4 = reinterpret_cast<const float4*>(src);
#pragma unroll
  for (int j = 0; j < W / 4; ++j) {
    const float4 x = src4[j];
    v[4 * j] += w * x.x;
    v[4 * j + 1] += w * x.y;
    v[4 * j + 2] += w * x.z;
    v[4 * j + 3] += w * x.w;
  }
}

// Stores 32 consecutive output values (dims col .. col + 31 of head hq's D = 128) of row t, and
// the log-sum-exp with dim 0. MXFP8 quantizes the bf16-rounded values with the CPU's own code.
__device__ inline void store_values(const AttentionStore& s, std::int64_t t, int hq, int col,
                                    const float (&v)[32], float lse) {
  if (s.dtype == DType::kFp8E4m3) {
    std::uint16_t bf16[32];
    for (int i = 0; i < 32; ++i) bf16[i] = fmt::float_to_bf16(v[i]);
    alignas(16) std::uint8_t codes[32];
    const std::uint8_t scale = fmt::mxfp8_quantize_group(bf16, codes, s.mxfp8_rule);
    const std::int64_t column = std::int64_t{hq} * 128 + col;
    auto* dst =
        reinterpret_cast<uint4*>(static_cast<std::uint8_t*>(s.out) + t * s.row_stride + column);
    dst[0] = reinterpret_cast<const uint4*>(codes)[0];
    dst[1] = reinterpret_cast<const uint4*>(codes)[1];
    s.mxfp8_scales[fmt::mxfp8_scale_offset(t, column / 32, s.mxfp8_scale_cols, s.mxfp8_layout)] =
        scale;
  } else if (s.dtype == DType::kFp32) {
    auto* dst = reinterpret_cast<float4*>(static_cast<float*>(s.out) + t * s.row_stride +
                                          hq * s.head_stride + col);
    for (int i = 0; i < 8; ++i)
      dst[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
  } else {
    const bool half = s.dtype == DType::kFp16;
    auto* dst = reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(s.out) + t * s.row_stride +
                                         hq * s.head_stride + col);
    for (int i = 0; i < 4; ++i) {
      std::uint32_t w[4];
      for (int j = 0; j < 4; ++j) {
        const float lo = v[8 * i + 2 * j], hi = v[8 * i + 2 * j + 1];
        w[j] = half ? pack_fp16(lo, hi) : pack_bf16(lo, hi);
      }
      dst[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  if (col == 0 && s.lse) s.lse[t * s.lse_row_stride + hq * s.lse_head_stride] = lse;
}

}  // namespace flashmsa::cuda::attention_detail
