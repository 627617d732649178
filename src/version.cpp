#include "flashmsa/version.hpp"

#include "flashmsa/error.hpp"
#include "src/cuda/device_info.hpp"

#ifndef FLASHMSA_CUDA_GENCODES
#define FLASHMSA_CUDA_GENCODES "none"
#endif

namespace flashmsa {

const char* version() noexcept {
  return "0.1.0";
}

std::string build_info() {
  return detail::concat("flashmsa ", version(),
                        "\ncuda: ", cuda::compiled_with_cuda() ? "on" : "off",
                        "\ncuda targets: ", FLASHMSA_CUDA_GENCODES, "\ncompiler: ",
#if defined(__clang__)
                        "clang ", __clang_version__
#elif defined(__GNUC__)
                        "gcc ", __VERSION__
#else
                        "unknown"
#endif
  );
}

}  // namespace flashmsa
