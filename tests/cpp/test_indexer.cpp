// The CPU indexer against the fp64 oracle (spec section 4).
//
// Tolerances: a block score is an fp32 dot product of 128 exact products, so it may differ from
// the fp64 value by the standard bound n * 2^-24 * sum|q_d k_d| (n = 128); the test allows that
// bound. Selection must match the oracle exactly, except where a block that one side chose and
// the other did not has a score within those bounds of the k-th selected score (a near-tie:
// accumulation order decides it). The count of near-ties is reported and must stay tiny.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/ops.hpp"
#include "tests/cpp/scenario.hpp"

namespace flashmsa {
namespace {

using test::Scenario;

struct IndexRun {
  std::vector<std::int32_t> topk;  // [Hkv, T, topk]
  std::vector<float> scores;       // [Hkv, T, width]
  std::int64_t width = 0;
};

IndexRun run_indexer(const Scenario& s) {
  const std::int64_t hkv = s.config.resolve_heads().num_key_value_heads;
  const std::int64_t k = s.config.sparse_topk_blocks;
  IndexRun run;
  run.width = s.max_blocks + 2;
  run.topk.assign(static_cast<std::size_t>(hkv * s.num_rows * k), 0x5A5A5A5A);  // poison
  run.scores.assign(static_cast<std::size_t>(hkv * s.num_rows * run.width), 12345.0f);
  IndexOutputs out{
      TensorView::contiguous(run.topk.data(), DType::kInt32, {hkv, s.num_rows, k}),
      TensorView::contiguous(run.scores.data(), DType::kFp32, {hkv, s.num_rows, run.width})};
  if (s.decode_query_len) {
    index_decode(s.config, s.index_q_view(), s.cm->index_cache(), s.decode_batch(), out,
                 {.checked = true});
  } else {
    index_prefill(s.config, s.index_q_view(), s.cm->index_cache(), s.prefill_batch(), out,
                  {.checked = true});
  }
  return run;
}

constexpr double kDotBound = 128.0 / (1 << 24);  // n * u for n = 128 fp32 products

// Checks every row and kv head against the oracle; returns the number of near-ties accepted.
int check_against_oracle(const Scenario& s, const IndexRun& run) {
  const Config& c = s.config;
  const std::int64_t hkv = c.resolve_heads().num_key_value_heads, k = c.sparse_topk_blocks;
  int near_ties = 0;
  for (std::int64_t t = 0; t < s.num_rows; ++t) {
    const std::int64_t p = s.rows.position[t];
    const ref::IndexScores want = ref::index_scores(c, s.index_q_values, t, p, s.rows.request[t],
                                                    s.cm->index_cache(), s.table());
    for (std::int64_t h = 0; h < hkv; ++h) {
      const std::int32_t* got = &run.topk[(h * s.num_rows + t) * k];
      const float* got_scores = &run.scores[(h * s.num_rows + t) * run.width];
      std::vector<double> scores(want.score.begin() + h * want.nvb,
                                 want.score.begin() + (h + 1) * want.nvb);
      // Raw scores, within the dot-product bound; -inf past the visible blocks.
      for (std::int64_t b = 0; b < run.width; ++b) {
        if (b >= want.nvb) {
          EXPECT_EQ(got_scores[b], -std::numeric_limits<float>::infinity()) << t << "," << b;
          continue;
        }
        const double w = scores[b], g = got_scores[b];
        if (std::isnan(w) || std::isnan(g)) {
          EXPECT_EQ(std::isnan(w), std::isnan(g)) << "row " << t << " block " << b;
        } else if (std::isinf(w) || std::isinf(g)) {
          EXPECT_EQ(w, g) << "row " << t << " block " << b;
        } else {
          EXPECT_LE(std::fabs(w - g), kDotBound * want.magnitude[h * want.nvb + b] + 1e-30)
              << "row " << t << " head " << h << " block " << b;
        }
      }
      const std::vector<std::int32_t> expected = ref::select_topk(c, scores, want.nvb);
      const std::vector<std::int32_t> ours(got, got + k);
      if (c.topk_order == TopkOrder::kScoreDesc) {
        // Our own order must follow our own exposed scores under the spec's total order (the
        // oracle's order may differ only where scores nearly tie, checked below as a set).
        auto key = [&](std::int32_t b) {
          if (b < c.sparse_init_blocks) return 1e30;
          if (b >= want.nvb - c.sparse_local_blocks) return 1e29;
          return std::isnan(got_scores[b]) ? -1e30 : static_cast<double>(got_scores[b]);
        };
        for (std::int64_t i = 1; i < k && ours[i] >= 0; ++i) {
          const double a = key(ours[i - 1]), b = key(ours[i]);
          EXPECT_TRUE(a > b || (a == b && ours[i - 1] < ours[i]))
              << "row " << t << " head " << h << ": score_desc order broken at " << i;
        }
      }
      if (ours == expected) continue;
      // Near-ties only: every block in one selection but not the other scores within the bound
      // of the k-th selected score.
      const std::set<std::int32_t> a(ours.begin(), ours.end()), b(expected.begin(), expected.end());
      std::vector<std::int32_t> diff;
      std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(),
                                    std::back_inserter(diff));
      double kth = std::numeric_limits<double>::infinity(), kth_mag = 0;
      for (std::int32_t id : expected) {
        if (id >= 0 && scores[id] < kth) {
          kth = scores[id];
          kth_mag = want.magnitude[h * want.nvb + id];
        }
      }
      bool ok = !diff.empty() || c.topk_order == TopkOrder::kScoreDesc;
      for (std::int32_t id : diff) {
        ok = ok && id >= 0 && !std::isnan(scores[id]) &&
             std::fabs(scores[id] - kth) <=
                 kDotBound * (want.magnitude[h * want.nvb + id] + kth_mag);
      }
      EXPECT_TRUE(ok) << "row " << t << " head " << h << " position " << p
                      << ": selection differs beyond near-ties";
      ++near_ties;
    }
  }
  return near_ties;
}

// Properties that hold whatever the scores: the local block(s) are chosen, ids are unique and
// visible, min(topk, nvb) of them, -1 after, in the configured order.
void check_properties(const Scenario& s, const IndexRun& run) {
  const Config& c = s.config;
  const std::int64_t hkv = c.resolve_heads().num_key_value_heads, k = c.sparse_topk_blocks;
  for (std::int64_t t = 0; t < s.num_rows; ++t) {
    const std::int64_t nvb = ref::visible_blocks(s.rows.position[t], c.sparse_block_size);
    for (std::int64_t h = 0; h < hkv; ++h) {
      const std::int32_t* ids = &run.topk[(h * s.num_rows + t) * k];
      const std::int64_t n = std::min<std::int64_t>(k, nvb);
      std::set<std::int32_t> seen;
      for (std::int64_t i = 0; i < k; ++i) {
        if (i >= n) {
          ASSERT_EQ(ids[i], -1) << "row " << t;
          continue;
        }
        ASSERT_GE(ids[i], 0);
        ASSERT_LT(ids[i], nvb);
        ASSERT_TRUE(seen.insert(ids[i]).second) << "duplicate id in row " << t;
        if (c.topk_order != TopkOrder::kScoreDesc && i > 0) {
          ASSERT_LT(ids[i - 1], ids[i]);
        }
      }
      for (std::int64_t b = std::max<std::int64_t>(0, nvb - c.sparse_local_blocks); b < nvb; ++b) {
        ASSERT_TRUE(seen.count(static_cast<std::int32_t>(b))) << "local block missing, row " << t;
      }
      for (std::int64_t b = 0; b < std::min<std::int64_t>(c.sparse_init_blocks, nvb); ++b) {
        ASSERT_TRUE(seen.count(static_cast<std::int32_t>(b))) << "init block missing, row " << t;
      }
      if (c.topk_order == TopkOrder::kScoreDesc && n > 0 && c.sparse_local_blocks > 0 &&
          c.sparse_init_blocks == 0) {
        ASSERT_EQ(ids[0], nvb - 1) << "forced local block first in score_desc";
      }
    }
  }
}

struct IndexCase {
  std::string name;
  DType index_dtype;
  TopkOrder order;
  int init, local, index_heads;
};

void PrintTo(const IndexCase& c, std::ostream* os) {
  *os << c.name;
}

Config config_for(const IndexCase& ic) {
  Config c;
  c.set_index_cache_dtype(ic.index_dtype);
  c.topk_order = ic.order;
  c.sparse_init_blocks = ic.init;
  c.sparse_local_blocks = ic.local;
  c.sparse_num_index_heads = ic.index_heads;
  return c;
}

class Indexer : public ::testing::TestWithParam<IndexCase> {};

// Prefill over the spec's edge grid of lengths (visible blocks 1, 15, 16, 17 included), ragged,
// with chunked requests (a cached prefix) for the long ones.
TEST_P(Indexer, PrefillMatchesOracleOverTheEdgeGrid) {
  const Config c = config_for(GetParam());
  const std::vector<RequestShape> requests{{0, 1},     {0, 127},   {0, 128},  {0, 129},
                                           {100, 155}, {0, 256},   {200, 57}, {1900, 8},
                                           {2040, 7},  {2000, 48}, {2040, 9}, {4000, 97}};
  const Scenario s = test::make_prefill(c, requests, 31);
  const IndexRun run = run_indexer(s);
  check_properties(s, run);
  const int near_ties = check_against_oracle(s, run);
  EXPECT_LE(near_ties, 2) << "near-ties among " << s.num_rows * 4 << " selections";
}

TEST_P(Indexer, DecodeMatchesOracleWithPaddingRows) {
  const Config c = config_for(GetParam());
  for (int q = 1; q <= 4; ++q) {
    const Scenario s = test::make_decode(c, {2049, 0, 1, 128, 3000, 0, 17 * 128}, q, 40 + q);
    const IndexRun run = run_indexer(s);
    check_properties(s, run);
    EXPECT_LE(check_against_oracle(s, run), 2);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, Indexer,
    ::testing::Values(IndexCase{"bf16_ascending", DType::kBf16, TopkOrder::kAscending, 0, 1, 4},
                      IndexCase{"e4m3_score_desc", DType::kFp8E4m3, TopkOrder::kScoreDesc, 0, 1, 4},
                      IndexCase{"nvfp4_local_last", DType::kNvfp4, TopkOrder::kLocalLast, 0, 1, 4},
                      IndexCase{"bf16_init1_local2", DType::kBf16, TopkOrder::kAscending, 1, 2, 4},
                      IndexCase{"bf16_group2", DType::kBf16, TopkOrder::kScoreDesc, 0, 1, 8}),
    [](const ::testing::TestParamInfo<IndexCase>& param_info) { return param_info.param.name; });

TEST(Indexer, PrefillAndDecodeComputeTheSameFunction) {
  const Config c;
  // Decode rows at positions L-2, L-1 equal the last two rows of a prefill of the same request.
  test::Scenario d = test::make_decode(c, {3001}, 2, 7);
  test::Scenario p = test::make_decode(c, {3001}, 2, 7);  // same caches and queries
  p.decode_query_len = 0;
  p.cu_seqlens = {0, 2};
  const IndexRun a = run_indexer(d), b = run_indexer(p);
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
  const IndexRun run = run_indexer(s);
  check_properties(s, run);
  check_against_oracle(s, run);
}

// With more candidate blocks equal than slots, the smaller ids win.
TEST(Indexer, ExactTiesGoToSmallerIds) {
  Config c;
  c.sparse_topk_blocks = 4;
  c.topk_order = TopkOrder::kScoreDesc;
  test::Scenario s = test::make_prefill(c, {{128 * 9, 1}}, 9);
  const IndexCacheView& ix = s.cm->index_cache();
  for (std::int64_t b = 0; b < 10; ++b) {
    const std::int64_t page = s.table().page(0, b);
    for (std::int64_t t = 0; t < 128; ++t) {
      auto* row = reinterpret_cast<std::uint16_t*>(ix.k.row(page, 0, t));
      for (std::int64_t d = 0; d < 128; ++d) row[d] = fmt::float_to_bf16(d == 0 ? 1.0f : 0.0f);
    }
  }
  for (auto& byte : s.index_q) byte = 0;
  for (std::int64_t h = 0; h < 4; ++h) {
    reinterpret_cast<std::uint16_t*>(s.index_q.data())[h * 128] = fmt::float_to_bf16(2.0f);
  }
  const IndexRun run = run_indexer(s);
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
