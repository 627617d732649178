#include <gtest/gtest.h>

#include <string>

#include "flashmsa/backend.hpp"
#include "flashmsa/version.hpp"
#include "src/cuda/device_info.hpp"

namespace flashmsa {
namespace {

TEST(Backend, CpuServesEveryValidConfig) {
  Config c;
  EXPECT_EQ(unsupported_reason(c, Backend::kCpu), std::nullopt);
  for (DType d : {DType::kBf16, DType::kFp16, DType::kFp8E4m3, DType::kFp8E5m2, DType::kNvfp4}) {
    c.kv_cache_dtype = d;
    EXPECT_EQ(unsupported_reason(c, Backend::kCpu), std::nullopt) << to_string(d);
  }
  c = Config{};
  c.sparse_block_size = 64;
  c.head_dim = 64;
  c.rope_dim = 32;
  EXPECT_EQ(unsupported_reason(c, Backend::kCpu), std::nullopt);
}

TEST(Backend, InvalidConfigIsAReason) {
  Config c;
  c.sparse_score_type = "sum";
  const auto reason = unsupported_reason(c, Backend::kCpu);
  ASSERT_TRUE(reason.has_value());
  EXPECT_NE(reason->find("sparse_score_type"), std::string::npos) << *reason;
}

TEST(Backend, CudaDeclaresM3ShapesOnly) {
  Config c;
  c.sparse_block_size = 64;
  auto reason = unsupported_reason(c, Backend::kCudaSm90);
  ASSERT_TRUE(reason.has_value());
  EXPECT_EQ(*reason, "cuda_sm90 supports sparse_block_size 128, got 64");
  c = Config{};
  c.head_dim = 64;
  c.rope_dim = 32;
  reason = unsupported_reason(c, Backend::kCudaSm90);
  ASSERT_TRUE(reason.has_value());
  EXPECT_EQ(*reason, "cuda_sm90 supports head_dim 128, got 64");
  c = Config{};
  c.sparse_topk_blocks = 65;
  reason = unsupported_reason(c, Backend::kCudaSm90);
  ASSERT_TRUE(reason.has_value());
  EXPECT_EQ(*reason, "cuda_sm90 supports sparse_topk_blocks <= 64, got 65");
}

TEST(Backend, CudaAvailabilityIsReportedNotAssumed) {
  const Config c;
  const auto reason = unsupported_reason(c, Backend::kCudaSm90);
  if (!cuda::compiled_with_cuda()) {
    ASSERT_TRUE(reason.has_value());
    EXPECT_NE(reason->find("no CUDA backend"), std::string::npos) << *reason;
  } else if (cuda::visible_device_count() == 0) {
    ASSERT_TRUE(reason.has_value());
    EXPECT_NE(reason->find("CUDA device"), std::string::npos) << *reason;
  }
  EXPECT_EQ(backend_unavailable_reason(Backend::kCpu), std::nullopt);
  EXPECT_EQ(parse_backend("cuda_sm90"), Backend::kCudaSm90);
  EXPECT_EQ(parse_backend("cpu"), Backend::kCpu);
  EXPECT_FALSE(parse_backend("gpu").has_value());
}

TEST(Backend, BuildInfoNamesVersionAndCuda) {
  const std::string info = build_info();
  EXPECT_NE(info.find(version()), std::string::npos);
  EXPECT_NE(info.find(cuda::compiled_with_cuda() ? "cuda: on" : "cuda: off"), std::string::npos);
}

}  // namespace
}  // namespace flashmsa
