// FlashMSA's single exception type and the checks that raise it.
//
// Every problem a caller can cause (bad argument, unsupported configuration, CUDA failure, out of
// resources) is reported by throwing flashmsa::Error; the library never exits or aborts on user
// input. The message names the argument, the expected and the actual value; the location says
// where in FlashMSA the check fired.
#pragma once

#include <cstdint>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace flashmsa {

enum class ErrorKind {
  kInvalidArgument,  // the caller passed something wrong (Python: ValueError)
  kUnsupported,      // valid, but this build or backend cannot serve it (Python: RuntimeError)
  kCuda,             // a CUDA runtime call failed
  kOutOfResources,   // e.g. the cache manager has no free page
  kInternal,         // a FlashMSA bug
};

std::string_view to_string(ErrorKind kind) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message,
        std::source_location where = std::source_location::current());

  ErrorKind kind() const noexcept { return kind_; }
  // The message without the location suffix that what() carries.
  const std::string& message() const noexcept { return message_; }
  const char* file() const noexcept { return file_; }
  std::uint32_t line() const noexcept { return line_; }
  const char* function() const noexcept { return function_; }

 private:
  ErrorKind kind_;
  std::string message_;
  const char* file_;
  std::uint32_t line_;
  const char* function_;
};

namespace detail {

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace detail
}  // namespace flashmsa

// Throws flashmsa::Error(kind) with the streamed message parts when `cond` is false.
#define FLASHMSA_CHECK_KIND(kind, cond, ...)                                    \
  do {                                                                          \
    if (!(cond)) [[unlikely]] {                                                 \
      throw ::flashmsa::Error((kind), ::flashmsa::detail::concat(__VA_ARGS__)); \
    }                                                                           \
  } while (0)

// Argument checks: FLASHMSA_CHECK_ARG(n > 0, "num_pages must be > 0, got ", n);
#define FLASHMSA_CHECK_ARG(cond, ...) \
  FLASHMSA_CHECK_KIND(::flashmsa::ErrorKind::kInvalidArgument, cond, __VA_ARGS__)

#define FLASHMSA_CHECK_SUPPORTED(cond, ...) \
  FLASHMSA_CHECK_KIND(::flashmsa::ErrorKind::kUnsupported, cond, __VA_ARGS__)

// Wraps a CUDA runtime call; only usable where <cuda_runtime.h> is included.
#define FLASHMSA_CHECK_CUDA(expr)                                                                 \
  do {                                                                                            \
    const cudaError_t flashmsa_cuda_status_ = (expr);                                             \
    if (flashmsa_cuda_status_ != cudaSuccess) [[unlikely]] {                                      \
      throw ::flashmsa::Error(                                                                    \
          ::flashmsa::ErrorKind::kCuda,                                                           \
          ::flashmsa::detail::concat(#expr, " failed: ", cudaGetErrorName(flashmsa_cuda_status_), \
                                     " (", cudaGetErrorString(flashmsa_cuda_status_), ")"));      \
    }                                                                                             \
  } while (0)

// After a kernel launch: reports launch-configuration errors without synchronising.
#define FLASHMSA_CHECK_LAUNCH() FLASHMSA_CHECK_CUDA(cudaGetLastError())
