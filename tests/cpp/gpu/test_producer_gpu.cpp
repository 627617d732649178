// The CUDA producer under the CPU test's own check (producer_checks.hpp): the same inputs, the
// fp64 oracle, every cache byte outside the write set unchanged, every dtype and layout.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "flashmsa/ops.hpp"
#include "tests/cpp/gpu/device_scenario.hpp"
#include "tests/cpp/producer_checks.hpp"

namespace flashmsa {
namespace {

void run_on_gpu(const Config& c, const ProducerInputs& in, const KvCacheView& kv,
                const IndexCacheView& ix, const ProducerOutputs& out) {
  test::DeviceMirror m;
  for (const TensorView* t : {&in.qkv_index, &in.q_norm_weight, &in.k_norm_weight,
                              &in.index_q_norm_weight, &in.index_k_norm_weight, &in.positions,
                              &in.slot_mapping, &in.index_slot_mapping, &out.q, &out.index_q}) {
    m.add(*t);
  }
  m.add(kv);
  m.add(ix);
  m.upload();
  ProducerInputs d = in;
  for (TensorView* t : {&d.qkv_index, &d.q_norm_weight, &d.k_norm_weight, &d.index_q_norm_weight,
                        &d.index_k_norm_weight, &d.positions, &d.slot_mapping}) {
    *t = m.device(*t);
  }
  if (in.index_slot_mapping.data) d.index_slot_mapping = m.device(in.index_slot_mapping);
  produce_qkv_index(c, d, m.device(kv), m.device(ix), {m.device(out.q), m.device(out.index_q)});
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
  m.download();
}

class ProducerGpu : public ::testing::TestWithParam<test::ProducerCase> {};

TEST_P(ProducerGpu, MatchesTheFp64OracleAndWritesOnlyItsRows) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_producer_case(GetParam(), run_on_gpu);
}

INSTANTIATE_TEST_SUITE_P(CacheDtypes, ProducerGpu, ::testing::ValuesIn(test::producer_cases()),
                         [](const ::testing::TestParamInfo<test::ProducerCase>& p) {
                           return p.param.name;
                         });

}  // namespace
}  // namespace flashmsa
