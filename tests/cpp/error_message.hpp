// The message of the flashmsa::Error that `f` throws, or "no error".
#pragma once

#include <string>

#include "flashmsa/error.hpp"

namespace flashmsa::test {

template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

}  // namespace flashmsa::test
