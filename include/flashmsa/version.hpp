// FlashMSA's version and how this copy was built.
#pragma once

#include <string>

#define FLASHMSA_VERSION_MAJOR 0
#define FLASHMSA_VERSION_MINOR 1
#define FLASHMSA_VERSION_PATCH 0

namespace flashmsa {

const char* version() noexcept;  // "0.1.0"
// One line per build option: CUDA on or off, target architectures, compiler.
std::string build_info();

}  // namespace flashmsa
