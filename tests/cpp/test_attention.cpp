// CPU sparse and dense attention against the fp64 oracle (spec section 5), and MXFP8 output
// (spec section 7). The checks and their tolerances live in attention_checks.hpp, shared with
// the GPU tests.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "flashmsa/ops.hpp"
#include "src/attention_workspace.hpp"
#include "tests/cpp/attention_checks.hpp"
#include "tests/cpp/error_message.hpp"
#include "tests/cpp/scenario.hpp"

namespace flashmsa {
namespace {

using test::Scenario;

const test::AttentionBackend kCpu{};  // fp32 probabilities throughout

class Attention : public ::testing::TestWithParam<test::AttnCase> {};

TEST_P(Attention, SparsePrefillWithIndexerSelectionMatchesOracle) {
  test::check_sparse_prefill(GetParam(), kCpu);
}

TEST_P(Attention, SparseDecodeWithPaddingMatchesOracle) {
  test::check_sparse_decode(GetParam(), kCpu, {1, 3});
}

INSTANTIATE_TEST_SUITE_P(CacheDtypesAndLayouts, Attention,
                         ::testing::ValuesIn(test::attention_cases()),
                         [](const ::testing::TestParamInfo<test::AttnCase>& param_info) {
                           return param_info.param.name;
                         });

TEST(Attention, AdversarialTopkListsAreIgnoredNotRead) {
  test::check_adversarial_topk(kCpu);
}

TEST(Attention, FullCoverageEqualsDense) {
  test::check_full_coverage_equals_dense(kCpu);
}

// Full coverage: every row of requests of up to sparse_topk_blocks x sparse_block_size tokens
// selects all its blocks (FullCoverageEqualsDense checks what that buys).
TEST(Attention, SelectsEveryBlockUpToTopkBlocks) {
  Config c;  // top-16 of 128-token blocks
  EXPECT_TRUE(selects_every_block(c, 0));
  EXPECT_TRUE(selects_every_block(c, 1));
  EXPECT_TRUE(selects_every_block(c, 2048));
  EXPECT_FALSE(selects_every_block(c, 2049));
  c.sparse_topk_blocks = 40;
  EXPECT_TRUE(selects_every_block(c, 40 * 128));
  EXPECT_FALSE(selects_every_block(c, 40 * 128 + 1));
  EXPECT_EQ(test::error_message([&] { selects_every_block(c, -1); }),
            "max_seq_len must be >= 0, got -1");
}

TEST(Attention, Deterministic) {
  test::check_deterministic(kCpu);
}

TEST(Attention, Mxfp8DecodeOutputIsTheQuantizedBf16Output) {
  test::check_mxfp8_decode(kCpu);
}

TEST(Attention, NonFiniteInputsAreNeverHidden) {
  test::check_non_finite(kCpu);
}

TEST(Attention, QueriesOfAnyRangeOnFp8Caches) {
  test::check_query_range(kCpu);
}

// The decode plan by capacity: one buffer serves the indexer and the attention of every smaller
// decode batch (the CUDA ops require exactly these sizes; the GPU graph test runs on such a
// buffer). The decode attention itself needs none: its splits merge inside a cluster.
TEST(Attention, DecodeWorkspaceSizedByCapacityServesEverySmallerBatch) {
  const Config c;
  const std::int64_t capacity = decode_workspace_bytes(c, 48, 4, 300);
  for (std::int64_t b = 1; b <= 48; ++b) {
    for (std::int64_t dql = 1; dql <= 4; ++dql) {
      for (std::int64_t width : {1, 17, 300}) {
        EXPECT_GE(capacity, index_workspace_bytes(c, b * dql, b, width)) << b << " " << dql;
        EXPECT_GE(capacity, attention_workspace_bytes(c, b * dql, b)) << b << " " << dql;
      }
    }
  }
}

// Splits of a decode row tile: the most whose clusters all run at once (the H200's cluster waves,
// measured with cudaOccupancyMaxActiveClusters), never more than a cluster (8) nor more than the
// pages the tile can select.
TEST(Attention, DecodeSplitsFillOneWaveOfClusters) {
  constexpr detail::DecodeClusterWave one_an_sm = {0, 132, 66, 39, 30, 22, 17, 15, 15};
  constexpr detail::DecodeClusterWave two_an_sm = {0, 264, 132, 79, 62, 47, 39, 32, 30};
  auto splits = [&](std::int64_t b, std::int64_t dql, std::int64_t width, bool register_tiles) {
    return detail::attention_decode_splits(b, dql, 4, width, register_tiles,
                                           register_tiles ? two_an_sm : one_an_sm);
  };
  EXPECT_EQ(splits(1, 1, 16, false), 8);   // 4 tiles: 15 clusters of 8 at once
  EXPECT_EQ(splits(1, 1, 3, false), 3);    // 3 pages at most
  EXPECT_EQ(splits(8, 1, 16, false), 3);   // 32 tiles: 39 clusters of 3, 30 of 4
  EXPECT_EQ(splits(16, 1, 16, false), 2);  // 64 tiles: 66 clusters of 2
  EXPECT_EQ(splits(32, 1, 16, false), 1);  // 128 tiles: not 2 waves of 8 pages
  EXPECT_EQ(splits(64, 1, 16, false), 1);  // 256 tiles: the GPU is full
  // Speculative rows: 1-row tiles while 4-row tiles could not fill the GPU within 8 splits.
  EXPECT_EQ(detail::attention_decode_tile_rows(1, 4, 4, false), 1);
  EXPECT_EQ(splits(1, 4, 16, false), 6);  // 16 tiles: 15 clusters of 7 or 8, 17 of 6
  EXPECT_EQ(detail::attention_decode_tile_rows(8, 4, 4, false), 4);
  EXPECT_EQ(splits(8, 4, 16, false), 3);  // 32 tiles
  EXPECT_EQ(detail::attention_decode_tile_rows(64, 1, 4, false), 1);
  // Register tiles (two CTAs an SM): 1-row tiles at every query length.
  EXPECT_EQ(detail::attention_decode_tile_rows(64, 4, 4, true), 1);
  EXPECT_EQ(splits(8, 1, 16, true), 7);   // 32 tiles: 32 clusters of 7, 30 of 8
  EXPECT_EQ(splits(16, 1, 16, true), 3);  // 64 tiles: 79 clusters of 3, 62 of 4
  EXPECT_EQ(splits(32, 1, 16, true), 2);  // 128 tiles: 132 clusters of 2
  EXPECT_EQ(splits(64, 1, 16, true), 1);  // 256 tiles
  EXPECT_EQ(splits(8, 4, 16, true), 2);   // 128 tiles
  for (const bool register_tiles : {false, true}) {
    const detail::DecodeClusterWave& wave = register_tiles ? two_an_sm : one_an_sm;
    for (std::int64_t b = 1; b <= 300; ++b) {
      for (std::int64_t dql = 1; dql <= 16; ++dql) {
        const std::int64_t s = splits(b, dql, 16, register_tiles);
        const std::int64_t rows = detail::attention_decode_tile_rows(b, dql, 4, register_tiles);
        const std::int64_t tiles = b * ((dql + rows - 1) / rows) * 4;
        EXPECT_GE(s, 1);
        EXPECT_LE(s, detail::kAttentionDecodeMaxSplits);
        // One wave of clusters, unless there are no clusters; no more splits would fit.
        EXPECT_TRUE(s == 1 || tiles <= wave[s]) << b << " " << dql << " " << register_tiles;
        if (s < detail::kAttentionDecodeMaxSplits) {
          EXPECT_GT(tiles, wave[s + 1]) << b << " " << dql << " " << register_tiles;
        }
      }
    }
  }
}

TEST(Attention, ArgumentErrors) {
  const Config c;
  const Scenario s = test::make_prefill(c, {{0, 3}}, 1);
  std::vector<std::int32_t> topk(4 * 3 * 16, -1);
  std::vector<std::uint8_t> out(3 * 64 * 128 * 2);
  AttentionOutputs o{TensorView::contiguous(out.data(), DType::kBf16, {3, 64, 64})};
  const auto tk = TensorView::contiguous(topk.data(), DType::kInt32, {4, 3, 16});
  EXPECT_EQ(test::error_message([&] {
              sparse_attention_prefill(c, s.q_view(), s.cm->kv_cache(), s.prefill_batch(), tk, o);
            }),
            "out must have shape [3, 64, 128], got [3, 64, 64]");
  o.out = TensorView::contiguous(out.data(), DType::kFp8E4m3, {3, 64 * 128});
  EXPECT_EQ(test::error_message([&] {
              sparse_attention_prefill(c, s.q_view(), s.cm->kv_cache(), s.prefill_batch(), tk, o);
            }),
            "out: MXFP8 output (fp8_e4m3) is for decode only");
  topk[5] = 1;  // row 0 sees only block 0
  o.out = TensorView::contiguous(out.data(), DType::kBf16, {3, 64, 128});
  EXPECT_EQ(test::error_message([&] {
              sparse_attention_prefill(c, s.q_view(), s.cm->kv_cache(), s.prefill_batch(), tk, o,
                                       {.checked = true});
            }),
            "topk[0][0][5] = 1 is neither -1 nor a visible block (< 1)");
}

// The decode step in one call equals index_decode then sparse_attention_decode, bit for bit: top-k
// lists, block scores, output and LSE (bf16 and E4M3 caches, speculative rows, a padding request,
// score order); and the caches on different devices are refused by name.
TEST(Attention, DecodeStepEqualsIndexerThenAttention) {
  for (const DType kv : {DType::kBf16, DType::kFp8E4m3}) {
    for (const int dql : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << to_string(kv) << ", dql " << dql);
      Config c;
      c.kv_cache_dtype = kv;
      if (kv != DType::kBf16) c.set_index_cache_dtype(DType::kFp8E4m3);
      c.topk_order = dql == 3 ? TopkOrder::kScoreDesc : TopkOrder::kAscending;
      const Scenario s = test::make_decode(c, {2500, 0, 700}, dql, 31 + dql);
      const std::int64_t T = s.num_rows, k = c.sparse_topk_blocks, w = s.max_blocks;
      std::vector<std::int32_t> topk[2];
      std::vector<float> scores[2], lse[2];
      std::vector<std::uint16_t> out[2];
      IndexOutputs index_out[2];
      AttentionOutputs attention_out[2];
      for (int i = 0; i < 2; ++i) {
        topk[i].assign(static_cast<std::size_t>(4 * T * k), -5);
        scores[i].assign(static_cast<std::size_t>(4 * T * w), 555.0f);
        out[i].assign(static_cast<std::size_t>(T * 64 * 128), 0xFFFF);
        lse[i].assign(static_cast<std::size_t>(T * 64), 777.0f);
        index_out[i].topk = TensorView::contiguous(topk[i].data(), DType::kInt32, {4, T, k});
        index_out[i].block_scores =
            TensorView::contiguous(scores[i].data(), DType::kFp32, {4, T, w});
        attention_out[i].out = TensorView::contiguous(out[i].data(), DType::kBf16, {T, 64, 128});
        attention_out[i].lse = TensorView::contiguous(lse[i].data(), DType::kFp32, {T, 64});
      }
      const DecodeBatch batch = s.decode_batch();
      index_decode(c, s.index_q_view(), s.cm->index_cache(), batch, index_out[0]);
      sparse_attention_decode(c, s.q_view(), s.kv(), batch, index_out[0].topk, attention_out[0]);
      sparse_decode_step(c, s.index_q_view(), s.cm->index_cache(), s.q_view(), s.kv(), batch,
                         index_out[1], attention_out[1]);
      EXPECT_EQ(topk[1], topk[0]);
      EXPECT_EQ(0, std::memcmp(scores[1].data(), scores[0].data(), scores[0].size() * 4));
      EXPECT_EQ(out[1], out[0]);
      EXPECT_EQ(0, std::memcmp(lse[1].data(), lse[0].data(), lse[0].size() * 4));
      EXPECT_NE(topk[1][0], -5);  // written
    }
  }
  const Scenario s = test::make_decode(Config{}, {300}, 1, 5);
  std::vector<std::int32_t> topk(4 * 16);
  std::vector<std::uint16_t> out(64 * 128);
  IndexCacheView elsewhere = s.cm->index_cache();
  elsewhere.device = Device::kCuda;
  EXPECT_EQ(test::error_message([&] {
              sparse_decode_step(
                  Config{}, s.index_q_view(), elsewhere, s.q_view(), s.kv(), s.decode_batch(),
                  IndexOutputs{TensorView::contiguous(topk.data(), DType::kInt32, {4, 1, 16})},
                  AttentionOutputs{TensorView::contiguous(out.data(), DType::kBf16, {1, 64, 128})});
            }),
            "index_cache and kv_cache must be on the same device, got cuda and cpu");
}

}  // namespace
}  // namespace flashmsa
