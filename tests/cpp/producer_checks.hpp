// The producer test (spec section 3) as a check any backend runs: the same inputs, the same
// per-element fp64 oracle and the same tolerances, whoever computes the outputs.
//
// Tolerances, by the FlashAttention rule (error against fp64 at most 2x that of doing the same
// computation honestly in the low precision): each stored value is rounded once, so an honest
// implementation is within half an ulp of the fp64 value; we accept one ulp of the stored format
// (times the fp8 scale). NVFP4 rounds per group with a shared scale: a group's largest error may
// be at most twice that of quantizing the fp64 values' fp32 rounding. V is stored unchanged and
// must match bit for bit.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "flashmsa/ops.hpp"

namespace flashmsa::test {

struct ProducerCase {
  std::string name;
  DType kv_dtype;
  DType index_dtype;
  KvLayout layout;
  float k_scale, v_scale;
  bool separate_index_slots;
};

inline void PrintTo(const ProducerCase& c, std::ostream* os) {
  *os << c.name;
}

// Every cache dtype, each layout, fp8 scales, own index slots.
std::vector<ProducerCase> producer_cases();

// Runs produce_qkv_index on host views; a GPU runner mirrors them to the device and back.
using ProducerRunner = std::function<void(const Config&, const ProducerInputs&, const KvCacheView&,
                                          const IndexCacheView&, const ProducerOutputs&)>;

// Scattered slots, a padding row and a slot beyond the capacity; checks every output element
// against the oracle and every cache byte outside the write set against its old value.
void check_producer_case(const ProducerCase& pc, const ProducerRunner& run);

}  // namespace flashmsa::test
