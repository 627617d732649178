// What the host code needs to know about the CUDA side of the build, callable from any .cpp
// (the CPU-only build links src/cuda/no_cuda.cpp instead of src/cuda/device_info.cu).
#pragma once

#include <optional>
#include <string>

namespace flashmsa::cuda {

bool compiled_with_cuda() noexcept;
int visible_device_count() noexcept;  // 0 when no driver or device
// Why no sm_90 device can run the CUDA backend now; std::nullopt when device 0 can.
std::optional<std::string> sm90_device_unavailable_reason();

}  // namespace flashmsa::cuda
