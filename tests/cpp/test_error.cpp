#include <gtest/gtest.h>

#include <string>

#include "flashmsa/error.hpp"

namespace flashmsa {
namespace {

void takes_positive(int num_pages) {
  FLASHMSA_CHECK_ARG(num_pages > 0, "num_pages must be > 0, got ", num_pages);
}

TEST(Error, CheckArgThrowsWithMessageKindAndLocation) {
  try {
    takes_positive(-3);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(e.message(), "num_pages must be > 0, got -3");
    EXPECT_NE(std::string(e.file()).find("test_error.cpp"), std::string::npos);
    EXPECT_GT(e.line(), 0u);
    const std::string what = e.what();
    EXPECT_NE(what.find("invalid argument: num_pages must be > 0, got -3"), std::string::npos);
    EXPECT_NE(what.find("test_error.cpp:"), std::string::npos);
  }
  EXPECT_NO_THROW(takes_positive(1));
}

TEST(Error, IsAStdRuntimeError) {
  EXPECT_THROW(FLASHMSA_CHECK_SUPPORTED(false, "nope"), std::runtime_error);
  try {
    FLASHMSA_CHECK_SUPPORTED(1 + 1 == 3, "block size ", 64, " is not supported");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_EQ(e.message(), "block size 64 is not supported");
  }
}

}  // namespace
}  // namespace flashmsa
