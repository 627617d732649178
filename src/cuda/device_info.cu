#include <cuda_runtime.h>

#include "flashmsa/error.hpp"
#include "src/cuda/cuda_ops.hpp"
#include "src/cuda/device_info.hpp"

namespace flashmsa::cuda {

bool compiled_with_cuda() noexcept {
  return true;
}

int visible_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

std::optional<std::string> sm90_device_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return detail::concat("no usable CUDA device (cudaGetDeviceCount: ", cudaGetErrorName(status),
                          ")");
  }
  if (count == 0) return std::string("no CUDA device is visible");
  int device = 0;
  FLASHMSA_CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  FLASHMSA_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  if (prop.major != 9 || prop.minor != 0) {
    return detail::concat("the CUDA backend needs compute capability 9.0 (Hopper), device ", device,
                          " (", prop.name, ") is ", prop.major, ".", prop.minor);
  }
  return std::nullopt;
}

void* device_malloc(std::size_t bytes) {
  void* ptr = nullptr;
  FLASHMSA_CHECK_CUDA(cudaMalloc(&ptr, bytes));
  return ptr;
}

void device_free(void* ptr) noexcept {
  cudaFree(ptr);
}

void device_memset(void* ptr, int value, std::size_t bytes) {
  FLASHMSA_CHECK_CUDA(cudaMemset(ptr, value, bytes));
}

void copy_host_to_device(void* device, const void* host, std::size_t bytes) {
  if (bytes) FLASHMSA_CHECK_CUDA(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
}

void copy_device_to_host(void* host, const void* device, std::size_t bytes) {
  if (bytes) FLASHMSA_CHECK_CUDA(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
}

void device_synchronize() {
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
}

std::string device_name() {
  int device = 0;
  FLASHMSA_CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  FLASHMSA_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

std::vector<std::byte> copy_to_host(const TensorView& t, void* stream) {
  if (t.data == nullptr || t.numel() == 0) return {};
  std::int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) last += (t.shape[i] - 1) * t.stride[i];
  const auto bytes = static_cast<std::size_t>((last + 1) * dtype_bits(t.dtype) / 8);
  std::vector<std::byte> host(bytes);
  const auto s = static_cast<cudaStream_t>(stream);
  FLASHMSA_CHECK_CUDA(cudaMemcpyAsync(host.data(), t.data, bytes, cudaMemcpyDeviceToHost, s));
  FLASHMSA_CHECK_CUDA(cudaStreamSynchronize(s));
  return host;
}

}  // namespace flashmsa::cuda
