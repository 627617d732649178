#include "tests/cpp/index_checks.hpp"

#include "flashmsa/ops.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <set>

namespace flashmsa::test {
namespace {
constexpr double kFp32DotBound = 128.0 / (1 << 24);  // n * u for n = 128 fp32 products
// The fp8 indexer (E4M3 queries and keys) may sum on the fp8 tensor cores (spec section 4,
// "Exception, the fp8 indexer"): each score within 2^-10 sum |q_i k_i| of the fp32 sum, which
// dwarfs the fp32 bound above. Near-ties are judged against it for that pairing alone.
constexpr double kFp8TensorCoreBound = 1.0 / (1 << 10);

double dot_bound(const Scenario& s) {
  return s.index_q_dtype() == DType::kFp8E4m3 && s.config.index_cache_dtype == DType::kFp8E4m3
             ? kFp8TensorCoreBound + kFp32DotBound
             : kFp32DotBound;
}

}  // namespace

int check_against_oracle(const Scenario& s, const IndexRun& run) {
  const Config& c = s.config;
  const std::int64_t hkv = c.resolve_heads().num_key_value_heads, k = c.sparse_topk_blocks;
  int near_ties = 0;
  const double bound = dot_bound(s);
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
          EXPECT_LE(std::fabs(w - g), bound * want.magnitude[h * want.nvb + b] + 1e-30)
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
      // Near-ties only: every block chosen here but not by the oracle could have outranked every
      // block the oracle chose instead, given each score's error bound (both scores within the
      // bounds of their dot products' magnitudes).
      const std::set<std::int32_t> a(ours.begin(), ours.end()), b(expected.begin(), expected.end());
      std::vector<std::int32_t> only_ours, only_expected;
      std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only_ours));
      std::set_difference(b.begin(), b.end(), a.begin(), a.end(),
                          std::back_inserter(only_expected));
      auto scored = [&](std::int32_t id) { return id >= 0 && !std::isnan(scores[id]); };
      bool ok = !only_ours.empty() || c.topk_order == TopkOrder::kScoreDesc;
      for (std::int32_t x : only_ours) {
        for (std::int32_t y : only_expected) {
          ok = ok && scored(x) && scored(y) &&
               scores[y] - scores[x] <=
                   bound * (want.magnitude[h * want.nvb + x] + want.magnitude[h * want.nvb + y]);
        }
      }
      ok = ok && only_ours.size() == only_expected.size();
      EXPECT_TRUE(ok) << "row " << t << " head " << h << " position " << p
                      << ": selection differs beyond near-ties";
      ++near_ties;
    }
  }
  return near_ties;
}

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
      // score_desc puts the forced blocks first; the local ones share one forced score, so
      // they come in ascending order (ties go to the smaller id).
      if (c.topk_order == TopkOrder::kScoreDesc && c.sparse_init_blocks == 0) {
        const std::int64_t first_local = std::max<std::int64_t>(0, nvb - c.sparse_local_blocks);
        for (std::int64_t i = 0; i < std::min<std::int64_t>(n, nvb - first_local); ++i) {
          ASSERT_EQ(ids[i], first_local + i)
              << "forced local blocks first in score_desc, row " << t;
        }
      }
    }
  }
}

std::vector<IndexCase> index_cases() {
  return {IndexCase{"bf16_ascending", DType::kBf16, TopkOrder::kAscending, 0, 1, 4},
          IndexCase{"e4m3_score_desc", DType::kFp8E4m3, TopkOrder::kScoreDesc, 0, 1, 4},
          IndexCase{"nvfp4_local_last", DType::kNvfp4, TopkOrder::kLocalLast, 0, 1, 4},
          IndexCase{"bf16_init1_local2", DType::kBf16, TopkOrder::kAscending, 1, 2, 4},
          IndexCase{"bf16_group2", DType::kBf16, TopkOrder::kScoreDesc, 0, 1, 8}};
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

std::vector<RequestShape> index_edge_grid() {
  return {{0, 1},    {0, 127},  {0, 128},  {0, 129},   {100, 155}, {0, 256},
          {200, 57}, {1900, 8}, {2040, 7}, {2000, 48}, {2040, 9},  {4000, 97}};
}

IndexRun run_cpu_indexer(const Scenario& s, bool checked) {
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
                 {.checked = checked});
  } else {
    index_prefill(s.config, s.index_q_view(), s.cm->index_cache(), s.prefill_batch(), out,
                  {.checked = checked});
  }
  return run;
}

Scenario make_tied_scenario(std::int64_t blocks) {
  Config c;
  c.sparse_topk_blocks = 4;
  c.topk_order = TopkOrder::kScoreDesc;
  Scenario s = make_prefill(c, {{128 * blocks, 1}}, 9);
  const IndexCacheView& ix = s.cm->index_cache();
  for (std::int64_t b = 0; b <= blocks; ++b) {
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
  return s;
}

}  // namespace flashmsa::test
