#include "flashmsa/tensor.hpp"

#include <algorithm>
#include <array>
#include <sstream>

#include "flashmsa/error.hpp"

namespace flashmsa {

std::string_view to_string(Device device) noexcept {
  return device == Device::kCuda ? "cuda" : "cpu";
}

TensorView TensorView::contiguous(void* data, DType dtype,
                                  std::initializer_list<std::int64_t> shape, Device device) {
  FLASHMSA_CHECK_ARG(shape.size() <= static_cast<size_t>(kMaxRank), "rank must be <= ", kMaxRank,
                     ", got ", shape.size());
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), t.shape.begin());
  std::int64_t s = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = s;
    s *= t.shape[d];
  }
  return t;
}

std::int64_t TensorView::numel() const noexcept {
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

namespace {

std::string shape_string(const TensorView& t) {
  std::ostringstream out;
  out << '[';
  for (int d = 0; d < t.rank; ++d) out << (d ? ", " : "") << t.shape[d];
  out << ']';
  return out.str();
}

std::string shape_string(std::initializer_list<std::int64_t> shape) {
  std::ostringstream out;
  out << '[';
  bool first = true;
  for (std::int64_t s : shape) {
    out << (first ? "" : ", ");
    if (s < 0) {
      out << '*';
    } else {
      out << s;
    }
    first = false;
  }
  out << ']';
  return out.str();
}

}  // namespace

void check_tensor(const TensorView& t, std::string_view name, std::initializer_list<DType> dtypes,
                  Device device, std::initializer_list<std::int64_t> shape) {
  bool dtype_ok = false;
  std::ostringstream wanted;
  for (DType d : dtypes) {
    dtype_ok = dtype_ok || d == t.dtype;
    wanted << (wanted.tellp() > 0 ? " or " : "") << to_string(d);
  }
  FLASHMSA_CHECK_ARG(dtype_ok, name, " must have dtype ", wanted.str(), ", got ",
                     to_string(t.dtype));
  FLASHMSA_CHECK_ARG(t.device == device, name, " must be on ", to_string(device), ", got ",
                     to_string(t.device));
  bool shape_ok = t.rank == static_cast<int>(shape.size());
  int d = 0;
  for (std::int64_t s : shape) {
    shape_ok = shape_ok && (s < 0 || t.shape[d] == s) && t.shape[d] >= 0;
    ++d;
  }
  FLASHMSA_CHECK_ARG(shape_ok, name, " must have shape ", shape_string(shape), ", got ",
                     shape_string(t));
  // A tensor without elements is never read or written: its strides and pointer do not matter
  // (numpy gives zero-size arrays zero strides).
  if (t.numel() == 0) return;
  for (d = 0; d < t.rank; ++d) {
    FLASHMSA_CHECK_ARG(t.stride[d] >= 0, name, " must have non-negative strides, got stride ",
                       t.stride[d], " in dimension ", d);
  }
  FLASHMSA_CHECK_ARG(t.rank == 0 || t.shape[t.rank - 1] <= 1 || t.stride[t.rank - 1] == 1, name,
                     " must be contiguous in its last dimension, got stride ",
                     t.rank ? t.stride[t.rank - 1] : 0);
  FLASHMSA_CHECK_ARG(t.data != nullptr, name, " has ", t.numel(), " elements but no data");
  const auto bytes = static_cast<std::uintptr_t>(std::max(1, dtype_bits(t.dtype) / 8));
  FLASHMSA_CHECK_ARG(reinterpret_cast<std::uintptr_t>(t.data) % bytes == 0, name,
                     " data must be aligned to ", bytes, " bytes");
  // The largest element offset must be addressable (64-bit products of shape and stride).
  std::int64_t last = 0;
  for (d = 0; d < t.rank; ++d) {
    std::int64_t span = 0;
    FLASHMSA_CHECK_ARG(!__builtin_mul_overflow(t.stride[d], t.shape[d] - 1, &span) &&
                           !__builtin_add_overflow(last, span, &last),
                       name, ": the offset of its last element overflows int64 (shape ",
                       shape_string(t), ")");
  }
}

void check_output_tensor(const TensorView& t, std::string_view name,
                         std::initializer_list<DType> dtypes, Device device,
                         std::initializer_list<std::int64_t> shape) {
  check_tensor(t, name, dtypes, device, shape);
  if (t.numel() == 0) return;
  // No two elements may share memory: ordered by stride, each dimension's stride must clear
  // what the smaller ones span (a broadcast, stride-0 output would race with itself).
  std::array<int, TensorView::kMaxRank> order{};
  for (int d = 0; d < t.rank; ++d) {  // insertion sort by stride (rank <= 5)
    int i = d;
    for (; i > 0 && t.stride[order[i - 1]] > t.stride[d]; --i) order[i] = order[i - 1];
    order[i] = d;
  }
  std::int64_t covered = 1;  // elements spanned by the dimensions seen so far
  for (int i = 0; i < t.rank; ++i) {
    const int d = order[i];
    if (t.shape[d] <= 1) continue;
    FLASHMSA_CHECK_ARG(t.stride[d] >= covered, name,
                       " must not overlap itself (it is written), got stride ", t.stride[d],
                       " in dimension ", d, " where at least ", covered, " is needed");
    covered = t.stride[d] * (t.shape[d] - 1) + covered;
  }
}

void check_output_tensor(const TensorView& t, std::string_view name, DType dtype, Device device,
                         std::initializer_list<std::int64_t> shape) {
  check_output_tensor(t, name, {dtype}, device, shape);
}

void check_tensor(const TensorView& t, std::string_view name, DType dtype, Device device,
                  std::initializer_list<std::int64_t> shape) {
  check_tensor(t, name, {dtype}, device, shape);
}

}  // namespace flashmsa
