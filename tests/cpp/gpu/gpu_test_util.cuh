// Shared helpers of the GPU tests: skipping without a device, and device buffers.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "flashmsa/error.hpp"
#include "src/cuda/device_info.hpp"

// Skips the current test, with the reason, where no sm_90 device can run it.
#define FLASHMSA_REQUIRE_SM90_OR_SKIP()                                     \
  do {                                                                      \
    if (auto reason = ::flashmsa::cuda::sm90_device_unavailable_reason()) { \
      GTEST_SKIP() << "GPU test skipped: " << *reason;                      \
    }                                                                       \
  } while (0)

namespace flashmsa::test {

// A device array filled with a poison byte, so anything a kernel fails to write shows.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n, unsigned char poison = 0xA5) : n_(n) {
    FLASHMSA_CHECK_CUDA(cudaMalloc(&ptr_, bytes()));
    FLASHMSA_CHECK_CUDA(cudaMemset(ptr_, poison, bytes()));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    FLASHMSA_CHECK_CUDA(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  std::vector<T> to_host() const {
    std::vector<T> host(n_);
    FLASHMSA_CHECK_CUDA(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

}  // namespace flashmsa::test
