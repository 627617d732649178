// The CPU indexer against the fp64 oracle (spec section 4); tolerances in index_checks.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/ops.hpp"
#include "src/cpu/selection.hpp"
#include "tests/cpp/index_checks.hpp"

namespace flashmsa {
namespace {

using test::check_against_oracle;
using test::check_properties;
using test::IndexRun;
using test::Scenario;

class Indexer : public ::testing::TestWithParam<test::IndexCase> {};

// Prefill over the spec's edge grid of lengths (visible blocks 1, 15, 16, 17 included), ragged,
// with chunked requests (a cached prefix) for the long ones.
TEST_P(Indexer, PrefillMatchesOracleOverTheEdgeGrid) {
  const Config c = test::config_for(GetParam());
  const Scenario s = test::make_prefill(c, test::index_edge_grid(), 31);
  const IndexRun run = test::run_cpu_indexer(s, true);
  check_properties(s, run);
  const int near_ties = check_against_oracle(s, run);
  EXPECT_LE(near_ties, 2) << "near-ties among " << s.num_rows * 4 << " selections";
}

TEST_P(Indexer, DecodeMatchesOracleWithPaddingRows) {
  const Config c = test::config_for(GetParam());
  for (int q = 1; q <= 4; ++q) {
    const Scenario s = test::make_decode(c, {2049, 0, 1, 128, 3000, 0, 17 * 128}, q, 40 + q);
    const IndexRun run = test::run_cpu_indexer(s, true);
    check_properties(s, run);
    EXPECT_LE(check_against_oracle(s, run), 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, Indexer, ::testing::ValuesIn(test::index_cases()),
                         [](const ::testing::TestParamInfo<test::IndexCase>& param_info) {
                           return param_info.param.name;
                         });

TEST(Indexer, PrefillAndDecodeComputeTheSameFunction) {
  const Config c;
  // Decode rows at positions L-2, L-1 equal the last two rows of a prefill of the same request.
  test::Scenario d = test::make_decode(c, {3001}, 2, 7);
  test::Scenario p = test::make_decode(c, {3001}, 2, 7);  // same caches and queries
  p.decode_query_len = 0;
  p.cu_seqlens = {0, 2};
  const IndexRun a = test::run_cpu_indexer(d, true), b = test::run_cpu_indexer(p, true);
  EXPECT_EQ(a.topk, b.topk);
  EXPECT_EQ(a.scores, b.scores);
}

// Adversarial index keys: NaN and +/-Inf, exact ties and signed zeros.
TEST(Indexer, NanInfTiesAndSignedZeros) {
  Config c;
  c.topk_order = TopkOrder::kScoreDesc;
  test::Scenario s = test::make_prefill(c, {{3000, 4}}, 5);
  // Rewrite the index keys of chosen blocks of request 0.
  const IndexCacheView& ix = s.cm->index_cache();
  auto set_block = [&](std::int64_t block, float value) {
    const std::int64_t page = s.table().page(0, block);
    for (std::int64_t t = 0; t < 128; ++t) {
      auto* row = reinterpret_cast<std::uint16_t*>(ix.k.row(page, 0, t));
      for (std::int64_t d = 0; d < 128; ++d) row[d] = fmt::float_to_bf16(value);
    }
  };
  set_block(1, NAN);       // all-NaN block: ranks as -1e30
  set_block(2, INFINITY);  // +/-Inf dots (or NaN where q_d = 0 signs mix)
  set_block(3, 0.0f);      // exact zero scores: ties, broken by smaller id
  set_block(4, -0.0f);
  set_block(5, 0.0f);
  const IndexRun run = test::run_cpu_indexer(s, true);
  check_properties(s, run);
  check_against_oracle(s, run);
}

// The vectorised block max is rank_max applied along the row, bit for bit: rows drawn mostly
// from the values where the rank order is subtle (NaN against -1e30 and below, +0.0 against
// -0.0, infinities, ties), at every length across two vector widths and around a block's 128.
TEST(Indexer, BlockMaxIsTheRankMaxChain) {
  const float special[] = {NAN,      -1e30f,    -1e31f, 0.0f,  -0.0f,
                           INFINITY, -INFINITY, 1.5f,   -2.0f, 1.5f};
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<int> lengths;
  for (int n = 1; n <= 40; ++n) lengths.push_back(n);
  for (int n : {127, 128, 129}) lengths.push_back(n);
  int special_maxima = 0;  // rows whose answer needed the lookup of the first equal key
  for (int n : lengths) {
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<float> row(static_cast<std::size_t>(n));
      const int spread = 1 + trial % 4;  // more or fewer ordinary values
      for (float& x : row)
        x = static_cast<int>(rng() % 4) < spread - 1 ? normal(rng) : special[rng() % 10];
      if (trial % 5 == 0) {  // rows without a positive value: the max is a zero, -1e30 or NaN
        for (float& x : row) x = std::isnan(x) || x <= 0.0f ? x : -x;
      }
      float chain = row[0];
      for (int c = 1; c < n; ++c) chain = cpu::rank_max(chain, row[c]);
      const float got = cpu::block_rank_max(row.data(), n);
      special_maxima += chain == 0.0f || cpu::rank_key(chain) == -1e30f;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(chain))
          << "length " << n << ", trial " << trial;
    }
  }
  EXPECT_GT(special_maxima, 1000) << "the rows must reach the lookup path";
}

// With more candidate blocks equal than slots, the smaller ids win.
TEST(Indexer, ExactTiesGoToSmallerIds) {
  const test::Scenario s = test::make_tied_scenario(9);
  const IndexRun run = test::run_cpu_indexer(s, true);
  for (std::int64_t h = 0; h < 4; ++h) {
    const std::vector<std::int32_t> ids(run.topk.begin() + h * 4, run.topk.begin() + h * 4 + 4);
    EXPECT_EQ(ids, (std::vector<std::int32_t>{9, 0, 1, 2})) << "local first, then ties by id";
  }
}

TEST(Indexer, ArgumentErrors) {
  const Config c;
  test::Scenario s = test::make_prefill(c, {{0, 3}}, 1);
  std::vector<std::int32_t> topk(4 * 3 * 8);
  IndexOutputs out{TensorView::contiguous(topk.data(), DType::kInt32, {4, 3, 8})};
  try {
    index_prefill(c, s.index_q_view(), s.cm->index_cache(), s.prefill_batch(), out);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "topk must have shape [4, 3, 16], got [4, 3, 8]");
  }
  Config fp8 = c;
  fp8.set_index_cache_dtype(DType::kFp8E4m3);
  try {
    index_prefill(fp8, s.index_q_view(), s.cm->index_cache(), s.prefill_batch(), out);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(),
              "index_cache.dtype must be fp8_e4m3 (config.index_cache_dtype), got bf16");
  }
}

}  // namespace
}  // namespace flashmsa
