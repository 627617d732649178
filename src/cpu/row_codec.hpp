// Element and cache-row conversions of the CPU backend: activations in bf16 / fp16 / fp32 (and
// E4M3 for the fp8 indexer's query), cache rows in every cache dtype.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashmsa/dtype.hpp"
#include "flashmsa/formats.hpp"

namespace flashmsa::cpu {

inline float load_activation(DType dtype, const void* base, std::int64_t i) {
  switch (dtype) {
    case DType::kBf16: return fmt::bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::kFp16: return fmt::fp16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::kFp32: return static_cast<const float*>(base)[i];
    case DType::kFp8E4m3: return fmt::e4m3_to_float(static_cast<const std::uint8_t*>(base)[i]);
    default: return 0.0f;  // callers validate dtypes first
  }
}

inline void store_activation(DType dtype, void* base, std::int64_t i, float x) {
  switch (dtype) {
    case DType::kBf16: static_cast<std::uint16_t*>(base)[i] = fmt::float_to_bf16(x); break;
    case DType::kFp16: static_cast<std::uint16_t*>(base)[i] = fmt::float_to_fp16(x); break;
    case DType::kFp32: static_cast<float*>(base)[i] = x; break;
    // The fp8 indexer's query: a direct saturating cast, no scale (spec 3).
    case DType::kFp8E4m3: static_cast<std::uint8_t*>(base)[i] = fmt::float_to_e4m3(x); break;
    default: break;
  }
}

// Quantizes n floats into one cache row (and, for NVFP4, its scale row). `scale` is the
// per-tensor fp8 dequantization scale (x = fp8 * scale), so fp8 stores x / scale.
inline void encode_cache_row(DType dtype, const float* x, std::int64_t n, std::byte* row,
                             std::byte* scale_row, float scale) {
  auto* out8 = reinterpret_cast<std::uint8_t*>(row);
  auto* out16 = reinterpret_cast<std::uint16_t*>(row);
  switch (dtype) {
    case DType::kBf16:
      for (std::int64_t i = 0; i < n; ++i) out16[i] = fmt::float_to_bf16(x[i]);
      break;
    case DType::kFp16:
      for (std::int64_t i = 0; i < n; ++i) out16[i] = fmt::float_to_fp16(x[i]);
      break;
    case DType::kFp8E4m3:
      for (std::int64_t i = 0; i < n; ++i) out8[i] = fmt::float_to_e4m3(x[i] / scale);
      break;
    case DType::kFp8E5m2:
      for (std::int64_t i = 0; i < n; ++i) out8[i] = fmt::float_to_e5m2(x[i] / scale);
      break;
    case DType::kNvfp4:
      for (std::int64_t g = 0; g < n / fmt::kNvfp4GroupSize; ++g) {
        reinterpret_cast<std::uint8_t*>(scale_row)[g] =
            fmt::nvfp4_quantize_group(x + g * fmt::kNvfp4GroupSize, out8 + g * 8);
      }
      break;
    default: break;
  }
}

// The inverse: n dequantized values of a cache row.
inline void decode_cache_row(DType dtype, const std::byte* row, const std::byte* scale_row,
                             std::int64_t n, float scale, float* out) {
  const auto* in8 = reinterpret_cast<const std::uint8_t*>(row);
  const auto* in16 = reinterpret_cast<const std::uint16_t*>(row);
  switch (dtype) {
    case DType::kBf16:
      for (std::int64_t i = 0; i < n; ++i) out[i] = fmt::bf16_to_float(in16[i]);
      break;
    case DType::kFp16:
      for (std::int64_t i = 0; i < n; ++i) out[i] = fmt::fp16_to_float(in16[i]);
      break;
    case DType::kFp8E4m3:
      for (std::int64_t i = 0; i < n; ++i) out[i] = fmt::e4m3_to_float(in8[i]) * scale;
      break;
    case DType::kFp8E5m2:
      for (std::int64_t i = 0; i < n; ++i) out[i] = fmt::e5m2_to_float(in8[i]) * scale;
      break;
    case DType::kNvfp4: {
      const auto* scales = reinterpret_cast<const std::uint8_t*>(scale_row);
      for (std::int64_t i = 0; i < n; ++i) {
        out[i] = fmt::nvfp4_element(in8 + (i / 16) * 8, scales[i / 16], static_cast<int>(i % 16));
      }
      break;
    }
    default: break;
  }
}

}  // namespace flashmsa::cpu
