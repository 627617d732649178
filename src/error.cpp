#include "flashmsa/error.hpp"

namespace flashmsa {

std::string_view to_string(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kCuda: return "CUDA error";
    case ErrorKind::kOutOfResources: return "out of resources";
    case ErrorKind::kInternal: return "internal error";
  }
  return "error";
}

namespace {
std::string with_location(ErrorKind kind, const std::string& message,
                          const std::source_location& where) {
  std::string_view file = where.file_name();
  // Trim the build machine's path prefix so messages read the same everywhere.
  if (auto pos = file.rfind("/src/"); pos != std::string_view::npos) file.remove_prefix(pos + 1);
  if (auto pos = file.rfind("/include/"); pos != std::string_view::npos)
    file.remove_prefix(pos + 1);
  return detail::concat("flashmsa: ", to_string(kind), ": ", message, " [", file, ":", where.line(),
                        "]");
}
}  // namespace

Error::Error(ErrorKind kind, std::string message, std::source_location where)
    : std::runtime_error(with_location(kind, message, where)),
      kind_(kind),
      message_(std::move(message)),
      file_(where.file_name()),
      line_(where.line()),
      function_(where.function_name()) {}

}  // namespace flashmsa
