#include "flashmsa/dtype.hpp"

#include <array>
#include <utility>

namespace flashmsa {
namespace {
constexpr std::array<std::pair<DType, std::string_view>, 9> kNames{{
    {DType::kBf16, "bf16"},
    {DType::kFp16, "fp16"},
    {DType::kFp32, "fp32"},
    {DType::kFp8E4m3, "fp8_e4m3"},
    {DType::kFp8E5m2, "fp8_e5m2"},
    {DType::kNvfp4, "nvfp4"},
    {DType::kInt32, "int32"},
    {DType::kInt64, "int64"},
    {DType::kUint8, "uint8"},
}};
}  // namespace

std::string_view to_string(DType dtype) noexcept {
  for (const auto& [d, name] : kNames) {
    if (d == dtype) return name;
  }
  return "unknown";
}

std::optional<DType> parse_dtype(std::string_view name) noexcept {
  for (const auto& [d, n] : kNames) {
    if (n == name) return d;
  }
  return std::nullopt;
}

int dtype_bits(DType dtype) noexcept {
  switch (dtype) {
    case DType::kBf16:
    case DType::kFp16: return 16;
    case DType::kFp32:
    case DType::kInt32: return 32;
    case DType::kInt64: return 64;
    case DType::kFp8E4m3:
    case DType::kFp8E5m2:
    case DType::kUint8: return 8;
    case DType::kNvfp4: return 4;
  }
  return 0;
}

}  // namespace flashmsa
