// The fused producer (spec section 3) on the CPU backend: the shared check (producer_checks.hpp)
// over every cache dtype and layout, and argument errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/ops.hpp"
#include "tests/cpp/cache_test_util.hpp"
#include "tests/cpp/producer_checks.hpp"

namespace flashmsa {
namespace {

using test::RandomCaches;

class Producer : public ::testing::TestWithParam<test::ProducerCase> {};

TEST_P(Producer, MatchesTheFp64OracleAndWritesOnlyItsRows) {
  test::check_producer_case(
      GetParam(),
      [](const Config& c, const ProducerInputs& in, const KvCacheView& kv, const IndexCacheView& ix,
         const ProducerOutputs& out) { produce_qkv_index(c, in, kv, ix, out); });
}

INSTANTIATE_TEST_SUITE_P(CacheDtypes, Producer, ::testing::ValuesIn(test::producer_cases()),
                         [](const ::testing::TestParamInfo<test::ProducerCase>& p) {
                           return p.param.name;
                         });

TEST(Producer, RejectsMismatchedCachesAndOutputs) {
  Config c;
  RandomCaches caches(KvLayout::kPacked, {2, 4, 128, 128}, DType::kFp16, DType::kBf16, 128, 1);
  const std::int64_t T = 2, width = 64 * 128 + 2 * 4 * 128 + 4 * 128 + 128;
  std::vector<std::uint16_t> input(T * width), w(128), q(T * 64 * 128), iq(T * 4 * 128);
  std::vector<std::int64_t> pos(T), slots(T);
  ProducerInputs in{TensorView::contiguous(input.data(), DType::kBf16, {T, width}),
                    TensorView::contiguous(w.data(), DType::kBf16, {128}),
                    TensorView::contiguous(w.data(), DType::kBf16, {128}),
                    TensorView::contiguous(w.data(), DType::kBf16, {128}),
                    TensorView::contiguous(w.data(), DType::kBf16, {128}),
                    TensorView::contiguous(pos.data(), DType::kInt64, {T}),
                    TensorView::contiguous(slots.data(), DType::kInt64, {T}),
                    {}};
  ProducerOutputs out{TensorView::contiguous(q.data(), DType::kBf16, {T, 64, 128}),
                      TensorView::contiguous(iq.data(), DType::kBf16, {T, 4, 128})};
  try {
    produce_qkv_index(c, in, caches.kv, caches.ix, out);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "kv_cache.dtype must be bf16 (config.kv_cache_dtype), got fp16");
  }
  c.kv_cache_dtype = DType::kFp16;
  EXPECT_NO_THROW(produce_qkv_index(c, in, caches.kv, caches.ix, out));
  in.qkv_index = TensorView::contiguous(input.data(), DType::kBf16, {T, width - 128});
  try {
    produce_qkv_index(c, in, caches.kv, caches.ix, out);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "qkv_index must have shape [*, 9856], got [2, 9728]");
  }
}

}  // namespace
}  // namespace flashmsa
