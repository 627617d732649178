// The CUDA producer under the CPU test's own check (producer_checks.hpp): the same inputs, the
// fp64 oracle, every cache byte outside the write set unchanged, every dtype and layout.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "flashmsa/ops.hpp"
#include "tests/cpp/gpu/gpu_runners.hpp"
#include "tests/cpp/producer_checks.hpp"

namespace flashmsa {
namespace {

void run_producer_on_gpu(const Config& c, const ProducerInputs& in, const KvCacheView& kv,
                         const IndexCacheView& ix, const ProducerOutputs& out) {
  test::DeviceMirror m;
  test::mirror_producer(m, in, kv, ix, out);
  m.upload();
  test::run_producer_on_device(m, c, in, kv, ix, out);
  m.download();
}

class ProducerGpu : public ::testing::TestWithParam<test::ProducerCase> {};

TEST_P(ProducerGpu, MatchesTheFp64OracleAndWritesOnlyItsRows) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_producer_case(GetParam(), run_producer_on_gpu);
}

INSTANTIATE_TEST_SUITE_P(CacheDtypes, ProducerGpu, ::testing::ValuesIn(test::producer_cases()),
                         [](const ::testing::TestParamInfo<test::ProducerCase>& p) {
                           return p.param.name;
                         });

}  // namespace
}  // namespace flashmsa
