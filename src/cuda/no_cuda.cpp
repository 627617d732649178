// The CUDA entry points of a build without CUDA.
#include "src/cuda/device_info.hpp"

namespace flashmsa::cuda {

bool compiled_with_cuda() noexcept { return false; }
int visible_device_count() noexcept { return 0; }
std::optional<std::string> sm90_device_unavailable_reason() {
  return "this FlashMSA build has no CUDA backend";
}

}  // namespace flashmsa::cuda
