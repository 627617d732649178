// Element types of the tensors FlashMSA reads and writes, with their names and sizes.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace flashmsa {

enum class DType : std::uint8_t {
  kBf16,
  kFp16,
  kFp32,
  kFp8E4m3,
  kFp8E5m2,
  kNvfp4,  // E2M1 codes, two per byte, plus one E4M3 scale per 16 elements (a separate view)
  kInt32,
  kInt64,
  kUint8,
};

// "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "nvfp4", "int32", "int64", "uint8".
std::string_view to_string(DType dtype) noexcept;
std::optional<DType> parse_dtype(std::string_view name) noexcept;

// Bits per element: 4 for nvfp4 data (scales not counted), 8 for fp8 and uint8, and so on.
int dtype_bits(DType dtype) noexcept;

}  // namespace flashmsa
