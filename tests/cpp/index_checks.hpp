// Checks of an indexer run against the fp64 oracle, shared by the CPU tests and the GPU tests
// (the same scenarios and the same acceptance rule on every backend).
//
// Tolerances: a block score is an fp32 dot product of 128 exact products, so it may differ from
// the fp64 value by the standard bound n * 2^-24 * sum|q_d k_d| (n = 128); the check allows that
// bound (the fp8 indexer, E4M3 queries and keys, 2^-10 sum|q_d k_d| more: the spec lets it sum on
// the fp8 tensor cores). Selection must match the oracle exactly, except on near-ties: every block
// one side chose and the other did not could have outranked each block it displaced within the
// two scores' bounds (accumulation order decides it). The count of near-ties is returned and
// must stay tiny.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "tests/cpp/scenario.hpp"

namespace flashmsa::test {

struct IndexRun {
  std::vector<std::int32_t> topk;  // [Hkv, T, topk]
  std::vector<float> scores;       // [Hkv, T, width]
  std::int64_t width = 0;
};

// The CPU backend's run (checked mode on request), with poisoned outputs and 2 spare score
// columns past the table width.
IndexRun run_cpu_indexer(const Scenario& s, bool checked = false);

// The indexer configurations every backend is tested over: index dtypes, orders, init/local,
// a group of 2 index heads per kv head.
struct IndexCase {
  std::string name;
  DType index_dtype;
  TopkOrder order;
  int init, local, index_heads;
};
inline void PrintTo(const IndexCase& c, std::ostream* os) {
  *os << c.name;
}
std::vector<IndexCase> index_cases();
Config config_for(const IndexCase& ic);

// Prefill edge grid of (prefix, query) lengths: visible blocks 1, 15, 16, 17, ragged, chunked.
std::vector<RequestShape> index_edge_grid();

// One request of `blocks` + 1 blocks whose every key scores the same for every index head
// (exact ties); score_desc order, top-k 4. The expected selection: the local block, then 0, 1, 2.
Scenario make_tied_scenario(std::int64_t blocks);

// Checks every row and kv head against the oracle; returns the number of near-ties accepted.
int check_against_oracle(const Scenario& s, const IndexRun& run);

// Properties that hold whatever the scores: the local block(s) are chosen, ids are unique and
// visible, min(topk, nvb) of them, -1 after, in the configured order.
void check_properties(const Scenario& s, const IndexRun& run);

}  // namespace flashmsa::test
