// A non-owning view of a dense tensor (activations, outputs, metadata arrays) and the checks that
// every operation applies to its arguments. Framework-free: bindings map torch / numpy / DLPack
// tensors onto it without copies.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "flashmsa/dtype.hpp"

namespace flashmsa {

enum class Device { kCpu, kCuda };
std::string_view to_string(Device device) noexcept;

struct TensorView {
  static constexpr int kMaxRank = 5;

  void* data = nullptr;
  DType dtype = DType::kBf16;
  Device device = Device::kCpu;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> stride{};  // in elements

  // A row-major contiguous view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               Device device = Device::kCpu);
  static TensorView contiguous(const void* data, DType dtype,
                               std::initializer_list<std::int64_t> shape,
                               Device device = Device::kCpu) {
    return contiguous(const_cast<void*>(data), dtype, shape, device);
  }

  std::int64_t numel() const noexcept;
  bool empty() const noexcept { return numel() == 0; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data);
  }
  // Element i of a host int32 or int64 vector (positions, slots).
  std::int64_t integer_at(std::int64_t i) const noexcept {
    return dtype == DType::kInt32 ? as<const std::int32_t>()[i * stride[0]]
                                  : as<const std::int64_t>()[i * stride[0]];
  }
};

// Throws Error(kInvalidArgument) naming `name` unless `t` has this dtype, device and shape (-1 in
// `shape` accepts any extent) and, when it has elements, non-negative strides, a contiguous last
// dimension, a non-null, element-aligned data pointer and offsets that fit in int64. A tensor
// without elements is accepted whatever its strides and pointer.
void check_tensor(const TensorView& t, std::string_view name, DType dtype, Device device,
                  std::initializer_list<std::int64_t> shape);

// The same, accepting any of `dtypes`.
void check_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                  Device device, std::initializer_list<std::int64_t> shape);

// check_tensor for a tensor an op writes: also no two of its elements may share memory.
void check_output_tensor(const TensorView& t, std::string_view name, DType dtype, Device device,
                         std::initializer_list<std::int64_t> shape);
void check_output_tensor(const TensorView& t, std::string_view name,
                         std::initializer_list<DType> dtypes, Device device,
                         std::initializer_list<std::int64_t> shape);

}  // namespace flashmsa
