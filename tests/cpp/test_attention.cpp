// CPU sparse and dense attention against the fp64 oracle (spec section 5), and MXFP8 output
// (spec section 7).
//
// Tolerance (FlashAttention rule): over each output tensor, max |ours - fp64| must be at most
// 2x the max error of an honest low-precision computation of the same thing, plus 1e-6: here
// the honest computation is the fp64 result rounded once to the output dtype (for fp32 output,
// an fp32 computation with fp32 probabilities), evaluated by the test itself. The log-sum-exp
// follows the same rule against an fp32 honest value. MXFP8 must equal quantizing our own bf16
// output bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/formats.hpp"
#include "flashmsa/ops.hpp"
#include "tests/cpp/error_message.hpp"
#include "tests/cpp/scenario.hpp"

namespace flashmsa {
namespace {

using test::Scenario;

struct AttnRun {
  std::vector<std::uint8_t> out;  // raw bytes of the [T, Hq, D] output
  std::vector<float> lse;
  DType dtype;
  float value(std::int64_t i) const {
    switch (dtype) {
      case DType::kBf16:
        return fmt::bf16_to_float(reinterpret_cast<const std::uint16_t*>(out.data())[i]);
      case DType::kFp16:
        return fmt::fp16_to_float(reinterpret_cast<const std::uint16_t*>(out.data())[i]);
      default: return reinterpret_cast<const float*>(out.data())[i];
    }
  }
};

enum class Kind { kSparse, kDense };

AttnRun run_attention(const Scenario& s, Kind kind, const std::vector<std::int32_t>* topk,
                      std::int64_t topk_width, DType out_dtype) {
  const auto h = s.config.resolve_heads();
  const std::int64_t T = s.num_rows, hq = h.num_attention_heads, d = s.config.head_dim;
  AttnRun run;
  run.dtype = out_dtype;
  run.out.assign(static_cast<std::size_t>(T * hq * d * (dtype_bits(out_dtype) / 8)), 0xFF);
  run.lse.assign(static_cast<std::size_t>(T * hq), 777.0f);
  AttentionOutputs out{TensorView::contiguous(run.out.data(), out_dtype, {T, hq, d}),
                       TensorView::contiguous(run.lse.data(), DType::kFp32, {T, hq})};
  const KvCacheView& kv = s.cm->kv_cache();
  if (kind == Kind::kDense) {
    dense_attention(s.config, s.q_view(), kv, s.prefill_batch(), out, {.checked = true});
    return run;
  }
  const auto tk =
      TensorView::contiguous(topk->data(), DType::kInt32, {h.num_key_value_heads, T, topk_width});
  if (s.decode_query_len) {
    sparse_attention_decode(s.config, s.q_view(), kv, s.decode_batch(), tk, out);
  } else {
    sparse_attention_prefill(s.config, s.q_view(), kv, s.prefill_batch(), tk, out);
  }
  return run;
}

// The blocks (kv head, row) attends to under `topk` (or all visible ones for dense).
std::vector<std::int32_t> blocks_of(const Scenario& s, const std::vector<std::int32_t>* topk,
                                    std::int64_t width, std::int64_t h, std::int64_t t) {
  if (!topk) {
    std::vector<std::int32_t> all;
    const std::int64_t nvb = ref::visible_blocks(s.rows.position[t], s.config.sparse_block_size);
    for (std::int64_t b = 0; b < nvb; ++b) all.push_back(static_cast<std::int32_t>(b));
    return all;
  }
  const std::int32_t* p = topk->data() + (h * s.num_rows + t) * width;
  return {p, p + width};
}

// Rounds like storing to `dtype` would.
double round_to(DType dtype, double x) {
  switch (dtype) {
    case DType::kBf16: return fmt::bf16_to_float(fmt::float_to_bf16(static_cast<float>(x)));
    case DType::kFp16: return fmt::fp16_to_float(fmt::float_to_fp16(static_cast<float>(x)));
    default: return static_cast<float>(x);
  }
}

// The FlashAttention-rule comparison of a run with the oracle, every element.
void check_against_oracle(const Scenario& s, const AttnRun& run,
                          const std::vector<std::int32_t>* topk, std::int64_t width) {
  const auto h = s.config.resolve_heads();
  const std::int64_t hq = h.num_attention_heads, d = s.config.head_dim;
  const std::int64_t group = hq / h.num_key_value_heads;
  double err = 0, honest = 0, lse_err = 0, lse_honest = 0;
  std::int64_t empty_rows = 0;
  for (std::int64_t t = 0; t < s.num_rows; ++t) {
    for (std::int64_t head = 0; head < hq; ++head) {
      const auto blocks = blocks_of(s, topk, width, head / group, t);
      const ref::AttentionRow want =
          ref::attention(s.config, s.q_row(t, head), head / group, s.rows.position[t],
                         s.rows.request[t], blocks, s.cm->kv_cache(), s.table());
      const float got_lse = run.lse[t * hq + head];
      if (std::isinf(want.lse)) {  // empty: exact zeros and -inf
        ++empty_rows;
        ASSERT_EQ(got_lse, -std::numeric_limits<float>::infinity()) << "row " << t;
        for (std::int64_t e = 0; e < d; ++e) {
          const float v = run.value((t * hq + head) * d + e);
          ASSERT_TRUE(v == 0.0f && !std::signbit(v)) << "row " << t << " not zero: " << v;
        }
        continue;
      }
      for (std::int64_t e = 0; e < d; ++e) {
        const double w = want.out[e];
        const double got = run.value((t * hq + head) * d + e);
        ASSERT_TRUE(std::isfinite(got)) << "row " << t << " head " << head;
        err = std::max(err, std::fabs(got - w));
        honest = std::max(honest, std::fabs(round_to(run.dtype, w) - w));
      }
      lse_err = std::max(lse_err, std::fabs(got_lse - want.lse));
      lse_honest = std::max(lse_honest, std::fabs(static_cast<float>(want.lse) - want.lse));
    }
  }
  // fp32 outputs: rounding alone understates an honest fp32 computation, whose error is that of
  // its accumulated sums; 64 ulps at magnitude 1 (outputs here are averages of N(0,1) values)
  // bound it.
  if (run.dtype == DType::kFp32) honest = std::max(honest, 64 * std::ldexp(1.0, -24));
  EXPECT_LE(err, 2 * honest + 1e-6) << "output error vs fp64 (honest " << honest << ")";
  // An honest fp32 log-sum-exp errs by its final rounding plus the fp32 sum of exponentials
  // (a few ulps); 8 ulps of |lse| <= 16 (these tests' range) bound the latter.
  EXPECT_LE(lse_err, 2 * std::max(lse_honest, 8 * std::ldexp(1.0, -24) * 16) + 1e-6)
      << "log-sum-exp error vs fp64";
  ::testing::Test::RecordProperty("empty_rows", static_cast<int>(empty_rows));
}

std::vector<std::int32_t> run_indexer_topk(const Scenario& s) {
  const std::int64_t hkv = s.config.resolve_heads().num_key_value_heads;
  const std::int64_t k = s.config.sparse_topk_blocks;
  std::vector<std::int32_t> topk(static_cast<std::size_t>(hkv * s.num_rows * k));
  IndexOutputs out{TensorView::contiguous(topk.data(), DType::kInt32, {hkv, s.num_rows, k})};
  if (s.decode_query_len) {
    index_decode(s.config, s.index_q_view(), s.cm->index_cache(), s.decode_batch(), out);
  } else {
    index_prefill(s.config, s.index_q_view(), s.cm->index_cache(), s.prefill_batch(), out);
  }
  return topk;
}

struct AttnCase {
  std::string name;
  DType kv_dtype;
  KvLayout layout;
  DType out_dtype;
};
void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << c.name;
}

class Attention : public ::testing::TestWithParam<AttnCase> {};

const std::vector<RequestShape> kGrid{{0, 1},    {0, 127},  {0, 129}, {100, 157},
                                      {1900, 3}, {2040, 9}, {4000, 5}};

TEST_P(Attention, SparsePrefillWithIndexerSelectionMatchesOracle) {
  const AttnCase& ac = GetParam();
  Config c;
  c.kv_cache_dtype = ac.kv_dtype;
  const Scenario s = test::make_prefill(c, kGrid, 61, ac.layout);
  const auto topk = run_indexer_topk(s);
  const AttnRun run = run_attention(s, Kind::kSparse, &topk, c.sparse_topk_blocks, ac.out_dtype);
  check_against_oracle(s, run, &topk, c.sparse_topk_blocks);
}

TEST_P(Attention, SparseDecodeWithPaddingMatchesOracle) {
  const AttnCase& ac = GetParam();
  Config c;
  c.kv_cache_dtype = ac.kv_dtype;
  for (int q : {1, 3}) {
    const Scenario s = test::make_decode(c, {2049, 0, 1, 300, 17 * 128 + 5}, q, 70 + q, ac.layout);
    const auto topk = run_indexer_topk(s);
    const AttnRun run = run_attention(s, Kind::kSparse, &topk, c.sparse_topk_blocks, ac.out_dtype);
    check_against_oracle(s, run, &topk, c.sparse_topk_blocks);
  }
}

INSTANTIATE_TEST_SUITE_P(
    CacheDtypesAndLayouts, Attention,
    ::testing::Values(
        AttnCase{"bf16_packed_bf16", DType::kBf16, KvLayout::kPacked, DType::kBf16},
        AttnCase{"bf16_token_major_fp32", DType::kBf16, KvLayout::kTokenMajor, DType::kFp32},
        AttnCase{"fp16_separate_fp16", DType::kFp16, KvLayout::kSeparate, DType::kFp16},
        AttnCase{"e4m3_stacked_bf16", DType::kFp8E4m3, KvLayout::kStacked, DType::kBf16},
        AttnCase{"e5m2_packed_bf16", DType::kFp8E5m2, KvLayout::kPacked, DType::kBf16},
        AttnCase{"nvfp4_packed_bf16", DType::kNvfp4, KvLayout::kPacked, DType::kBf16}),
    [](const ::testing::TestParamInfo<AttnCase>& param_info) { return param_info.param.name; });

// Hand-made top-k lists: -1, out-of-range, invisible and repeated ids, rows with nothing valid.
TEST(Attention, AdversarialTopkListsAreIgnoredNotRead) {
  const Config c;
  Scenario s = test::make_prefill(c, {{1000, 6}, {0, 3}}, 5);
  // A block-table entry pointing outside the cache: that block must be skipped, not read.
  s.block_table[3] = 1 << 30;
  const std::int64_t width = 7, hkv = 4;
  std::vector<std::int32_t> topk(static_cast<std::size_t>(hkv * s.num_rows * width));
  std::mt19937 rng(3);
  for (auto& id : topk) id = static_cast<std::int32_t>(rng() % 14) - 3;  // -3 .. 10
  for (std::int64_t h = 0; h < hkv; ++h) {
    std::int32_t* row = topk.data() + (h * s.num_rows + 2) * width;  // row 2: duplicates
    std::fill(row, row + width, 5);
    row = topk.data() + (h * s.num_rows + 4) * width;  // row 4: nothing valid
    std::fill(row, row + width, -1);
    row[0] = 9999;
  }
  const auto cache_bytes = [&] {
    const auto& kv = s.cm->kv_cache();
    const auto* p = static_cast<const std::uint8_t*>(kv.k.data);
    return std::vector<std::uint8_t>(
        p, p + KvCacheView::buffer_bytes(KvLayout::kPacked, kv.dtype, kv.shape));
  };
  const auto before = cache_bytes();
  const AttnRun run = run_attention(s, Kind::kSparse, &topk, width, DType::kBf16);
  check_against_oracle(s, run, &topk, width);
  EXPECT_EQ(cache_bytes(), before) << "attention wrote into the cache";
  // Row 4 had no valid id: zeros and -inf.
  EXPECT_EQ(run.lse[4 * 64], -std::numeric_limits<float>::infinity());
}

// Full coverage (topk >= every row's visible blocks): sparse equals dense, bit for bit, and
// dense matches the oracle.
TEST(Attention, FullCoverageEqualsDense) {
  Config c;
  c.sparse_topk_blocks = 40;
  const Scenario s = test::make_prefill(c, {{0, 200}, {4000, 7}, {300, 2}}, 8);
  const auto topk = run_indexer_topk(s);
  const AttnRun sparse = run_attention(s, Kind::kSparse, &topk, 40, DType::kBf16);
  const AttnRun dense = run_attention(s, Kind::kDense, nullptr, 0, DType::kBf16);
  EXPECT_EQ(sparse.out, dense.out);
  EXPECT_EQ(sparse.lse, dense.lse);
  check_against_oracle(s, dense, nullptr, 0);
}

// Two runs give identical bytes (no dependence on thread scheduling).
TEST(Attention, Deterministic) {
  const Config c;
  const Scenario s = test::make_prefill(c, {{2000, 70}, {0, 50}}, 12);
  const auto topk = run_indexer_topk(s);
  const AttnRun a = run_attention(s, Kind::kSparse, &topk, 16, DType::kBf16);
  const AttnRun b = run_attention(s, Kind::kSparse, &topk, 16, DType::kBf16);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
}

// MXFP8 decode output equals quantizing the bf16 output, in both scale layouts.
TEST(Attention, Mxfp8DecodeOutputIsTheQuantizedBf16Output) {
  const Config c;
  const Scenario s = test::make_decode(c, {3000, 0, 129, 1000}, 2, 4);
  const auto topk = run_indexer_topk(s);
  const AttnRun bf16 = run_attention(s, Kind::kSparse, &topk, 16, DType::kBf16);
  const std::int64_t T = s.num_rows, cols = 64 * 128, scale_cols = cols / 32;
  for (auto layout : {fmt::ScaleLayout::kRowMajor, fmt::ScaleLayout::kSwizzled128x4}) {
    const std::int64_t scale_bytes = fmt::mxfp8_scale_buffer_size(T, scale_cols, layout);
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(T * cols), 0xAA);
    std::vector<std::uint8_t> scales(static_cast<std::size_t>(scale_bytes), 0xAA);
    AttentionOutputs out;
    out.out = TensorView::contiguous(codes.data(), DType::kFp8E4m3, {T, cols});
    out.mxfp8_scales = layout == fmt::ScaleLayout::kRowMajor
                           ? TensorView::contiguous(scales.data(), DType::kUint8, {T, scale_cols})
                           : TensorView::contiguous(scales.data(), DType::kUint8, {scale_bytes});
    out.mxfp8_scale_layout = layout;
    sparse_attention_decode(c, s.q_view(), s.cm->kv_cache(), s.decode_batch(),
                            TensorView::contiguous(topk.data(), DType::kInt32, {4, T, 16}), out);
    std::vector<std::uint8_t> want_codes(codes.size()), want_scales(scales.size(), 0xAA);
    fmt::mxfp8_quantize_rows(reinterpret_cast<const std::uint16_t*>(bf16.out.data()), T, cols, cols,
                             want_codes.data(), want_scales.data(), layout);
    EXPECT_EQ(codes, want_codes);
    EXPECT_EQ(scales, want_scales);
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

}  // namespace
}  // namespace flashmsa
