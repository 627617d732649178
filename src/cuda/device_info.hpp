// What the host code needs to know about the CUDA side of the build, callable from any .cpp
// (the CPU-only build links src/cuda/no_cuda.cpp instead of src/cuda/device_info.cu).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace flashmsa::cuda {

bool compiled_with_cuda() noexcept;
int visible_device_count() noexcept;  // 0 when no driver or device
// Why no sm_90 device can run the CUDA backend now; std::nullopt when device 0 can.
std::optional<std::string> sm90_device_unavailable_reason();

// Device memory for owners such as the cache manager (Error when CUDA is absent or fails).
void* device_malloc(std::size_t bytes);
void device_free(void* ptr) noexcept;
void device_memset(void* ptr, int value, std::size_t bytes);
// Blocking copies between host and device memory (default stream), and a device-wide wait.
void copy_host_to_device(void* device, const void* host, std::size_t bytes);
void copy_device_to_host(void* host, const void* device, std::size_t bytes);
void device_synchronize();
// The name of the current device ("NVIDIA H200").
std::string device_name();

}  // namespace flashmsa::cuda
