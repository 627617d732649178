#include "tests/cpp/attention_checks.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "flashmsa/formats.hpp"

namespace flashmsa::test {
namespace {

constexpr std::int64_t kCanaryBytes = 256;  // poisoned bytes before and after every output
constexpr std::uint8_t kPoison = 0xA7;

// A poisoned host buffer with canaries; `data()` is the output proper.
struct Guarded {
  std::vector<std::uint8_t> bytes;
  std::int64_t size;
  explicit Guarded(std::int64_t n, std::uint8_t fill = kPoison)
      : bytes(static_cast<std::size_t>(n + 2 * kCanaryBytes), kPoison), size(n) {
    std::fill_n(bytes.begin() + kCanaryBytes, n, fill);
  }
  std::uint8_t* data() { return bytes.data() + kCanaryBytes; }
  std::pair<void*, std::int64_t> span() { return {bytes.data(), std::int64_t(bytes.size())}; }
  std::vector<std::uint8_t> checked_contents(const char* what) const {
    for (std::int64_t i = 0; i < kCanaryBytes; ++i) {
      EXPECT_EQ(bytes[i], kPoison) << what << ": canary before the output changed at " << i;
      EXPECT_EQ(bytes[kCanaryBytes + size + i], kPoison)
          << what << ": canary after the output changed at " << i;
    }
    return {bytes.begin() + kCanaryBytes, bytes.begin() + kCanaryBytes + size};
  }
};

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
                      std::int64_t topk_width, DType out_dtype, const AttentionRunner& runner,
                      const OpOptions& options = {}) {
  const auto h = s.config.resolve_heads();
  const std::int64_t T = s.num_rows, hq = h.num_attention_heads, d = s.config.head_dim;
  Guarded out(T * hq * d * (dtype_bits(out_dtype) / 8), 0xFF);
  Guarded lse(T * hq * 4);
  AttentionCall call = scenario_call(s, kind == Kind::kDense);
  call.out.out = TensorView::contiguous(out.data(), out_dtype, {T, hq, d});
  call.out.lse = TensorView::contiguous(lse.data(), DType::kFp32, {T, hq});
  call.guarded = {out.span(), lse.span()};
  call.options = options;
  if (topk) {
    call.topk = TensorView::contiguous(const_cast<std::int32_t*>(topk->data()), DType::kInt32,
                                       {h.num_key_value_heads, T, topk_width});
  }
  runner(call);
  AttnRun run;
  run.dtype = out_dtype;
  run.out = out.checked_contents("out");
  const auto lse_bytes = lse.checked_contents("lse");
  run.lse.resize(static_cast<std::size_t>(T * hq));
  std::memcpy(run.lse.data(), lse_bytes.data(), lse_bytes.size());
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

// What a (row, q head) must give when the inputs hold NaN or Inf (spec section 5).
enum class Expect : std::uint8_t { kFinite, kNanRow, kNanValues };

// The FlashAttention-rule comparison of a run with the oracle, every element; `expect` (one entry
// per (row, q head), or none: all finite) marks the rows that must be NaN instead.
void check_against_oracle(const Scenario& s, const AttnRun& run,
                          const std::vector<std::int32_t>* topk, std::int64_t width,
                          DType probabilities, const std::vector<Expect>* expect = nullptr) {
  const auto h = s.config.resolve_heads();
  const std::int64_t hq = h.num_attention_heads, d = s.config.head_dim;
  const std::int64_t group = hq / h.num_key_value_heads;
  double err = 0, honest = 0, lse_err = 0, lse_honest = 0;
  std::int64_t empty_rows = 0;
  for (std::int64_t t = 0; t < s.num_rows; ++t) {
    for (std::int64_t head = 0; head < hq; ++head) {
      const Expect want_kind = expect ? (*expect)[t * hq + head] : Expect::kFinite;
      if (want_kind != Expect::kFinite) {
        for (std::int64_t e = 0; e < d; ++e) {
          ASSERT_TRUE(std::isnan(run.value((t * hq + head) * d + e)))
              << "row " << t << " head " << head << " element " << e << " must be NaN";
        }
        if (want_kind == Expect::kNanRow) {
          ASSERT_TRUE(std::isnan(run.lse[t * hq + head])) << "row " << t << " head " << head;
          continue;
        }
      }
      const auto blocks = blocks_of(s, topk, width, head / group, t);
      const ref::AttentionRow want =
          ref::attention(s.config, s.q_row(t, head), head / group, s.rows.position[t],
                         s.rows.request[t], blocks, s.kv(), s.table(), probabilities);
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
      for (std::int64_t e = 0; e < d && want_kind == Expect::kFinite; ++e) {
        const double w = want.out[e];
        const double got = run.value((t * hq + head) * d + e);
        ASSERT_TRUE(std::isfinite(got)) << "row " << t << " head " << head;
        err = std::max(err, std::fabs(got - w));
        honest = std::max(honest, std::fabs(round_to(run.dtype, w) - w));
        honest = std::max(honest, std::fabs(want.honest[e] - w));
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

const std::vector<RequestShape> kGrid{{0, 1},    {0, 127},  {0, 129}, {100, 157},
                                      {1900, 3}, {2040, 9}, {4000, 5}};

}  // namespace

AttentionCall scenario_call(const Scenario& s, bool dense) {
  AttentionCall call;
  call.op = dense                ? AttentionCall::Op::kDense
            : s.decode_query_len ? AttentionCall::Op::kDecode
                                 : AttentionCall::Op::kPrefill;
  call.config = s.config;
  call.q = s.q_view();
  call.kv = s.kv();
  call.prefill = s.prefill_batch();
  if (s.decode_query_len) call.decode = s.decode_batch();
  return call;
}

std::vector<std::int32_t> indexer_topk(const Scenario& s) {
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

void check_attention_output(const Scenario& s, const std::vector<std::int32_t>& topk,
                            std::int64_t width, DType out_dtype,
                            const std::vector<std::uint8_t>& out, const std::vector<float>& lse,
                            DType probabilities) {
  AttnRun run{out, lse, out_dtype};
  check_against_oracle(s, run, &topk, width, probabilities);
}

void run_attention_call(const AttentionCall& c) {
  switch (c.op) {
    case AttentionCall::Op::kPrefill:
      sparse_attention_prefill(c.config, c.q, c.kv, c.prefill, c.topk, c.out, c.options);
      break;
    case AttentionCall::Op::kDecode:
      sparse_attention_decode(c.config, c.q, c.kv, c.decode, c.topk, c.out, c.options);
      break;
    case AttentionCall::Op::kDense:
      dense_attention(c.config, c.q, c.kv, c.prefill, c.out, c.options);
      break;
  }
}

std::vector<AttnCase> attention_cases() {
  return {
      {"bf16_packed_bf16", DType::kBf16, KvLayout::kPacked, DType::kBf16},
      {"bf16_token_major_fp32", DType::kBf16, KvLayout::kTokenMajor, DType::kFp32},
      {"fp16_separate_fp16", DType::kFp16, KvLayout::kSeparate, DType::kFp16},
      {"e4m3_stacked_bf16", DType::kFp8E4m3, KvLayout::kStacked, DType::kBf16},
      {"e5m2_packed_bf16", DType::kFp8E5m2, KvLayout::kPacked, DType::kBf16},
      {"nvfp4_packed_bf16", DType::kNvfp4, KvLayout::kPacked, DType::kBf16},
      {"nvfp4_separate_fp32", DType::kNvfp4, KvLayout::kSeparate, DType::kFp32},
      {"e4m3_scaled_token_major_bf16", DType::kFp8E4m3, KvLayout::kTokenMajor, DType::kBf16, 0.5f,
       3.0f},
      {"e5m2_scaled_separate_fp16", DType::kFp8E5m2, KvLayout::kSeparate, DType::kFp16, 2.0f,
       0.25f},
  };
}

namespace {

// The case's scales on the scenario, the indexer's selection, then the oracle check.
void check_sparse_case(Scenario& s, const AttnCase& ac, const AttentionBackend& b) {
  s.k_scale = ac.k_scale;
  s.v_scale = ac.v_scale;
  const auto topk = indexer_topk(s);
  const std::int64_t width = s.config.sparse_topk_blocks;
  const AttnRun run = run_attention(s, Kind::kSparse, &topk, width, ac.out_dtype, b.run);
  check_against_oracle(s, run, &topk, width, b.probabilities);
}

}  // namespace

void check_sparse_prefill(const AttnCase& ac, const AttentionBackend& b, Config base) {
  Config c = base;
  c.kv_cache_dtype = ac.kv_dtype;
  Scenario s = make_prefill(c, kGrid, 61, ac.layout);
  check_sparse_case(s, ac, b);
}

void check_sparse_decode(const AttnCase& ac, const AttentionBackend& b, std::vector<int> dqls,
                         Config base) {
  Config c = base;
  c.kv_cache_dtype = ac.kv_dtype;
  for (int q : dqls) {
    SCOPED_TRACE(::testing::Message() << "decode_query_len " << q);
    Scenario s = make_decode(c, {2049, 0, 1, 300, 17 * 128 + 5}, q, 70 + q, ac.layout);
    check_sparse_case(s, ac, b);
  }
}

void check_sparse_decode_of_many_requests(const AttnCase& ac, const AttentionBackend& b) {
  Config c;
  c.kv_cache_dtype = ac.kv_dtype;
  std::vector<std::int64_t> lens(40);
  for (std::size_t i = 0; i < lens.size(); ++i) lens[i] = (1237 * i) % 6000 + i % 3;
  Scenario s = make_decode(c, lens, 1, 90, ac.layout);
  check_sparse_case(s, ac, b);
}

void check_adversarial_topk(const AttentionBackend& b) {
  const Config c;
  Scenario s = make_prefill(c, {{1000, 6}, {0, 3}}, 5);
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
    row[1] = std::numeric_limits<std::int32_t>::min();
  }
  const auto cache_bytes = [&] {
    const auto& kv = s.cm->kv_cache();
    const auto* p = static_cast<const std::uint8_t*>(kv.k.data);
    return std::vector<std::uint8_t>(
        p, p + KvCacheView::buffer_bytes(KvLayout::kPacked, kv.dtype, kv.shape));
  };
  const auto before = cache_bytes();
  const auto topk_before = topk;
  const AttnRun run = run_attention(s, Kind::kSparse, &topk, width, DType::kBf16, b.run);
  check_against_oracle(s, run, &topk, width, b.probabilities);
  EXPECT_EQ(cache_bytes(), before) << "attention wrote into the cache";
  EXPECT_EQ(topk, topk_before) << "attention wrote into the top-k lists";
  // Row 4 had no valid id: zeros and -inf.
  EXPECT_EQ(run.lse[4 * 64], -std::numeric_limits<float>::infinity());

  // Decode (dql 1 and 2), lists 40 wide: repeats within the list's first 32 entries and across
  // them, ids past the row's position or the table, a table entry outside the cache, a row with
  // nothing valid; bf16 and E4M3 caches (on the GPU, the shared-memory and the per-warp register
  // decode paths).
  for (const DType kv : {DType::kBf16, DType::kFp8E4m3}) {
    for (const int dql : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << to_string(kv) << ", decode_query_len " << dql);
      Config cd = c;
      cd.kv_cache_dtype = kv;
      Scenario d = make_decode(cd, {2000, 0, 300, 4000}, dql, 17 + dql);
      d.block_table[3 * d.max_blocks + 6] = 1 << 30;
      const std::int64_t w = 40;
      std::vector<std::int32_t> ids(static_cast<std::size_t>(hkv * d.num_rows * w));
      for (auto& id : ids) id = static_cast<std::int32_t>(rng() % 40) - 3;  // -3 .. 36
      for (std::int64_t h = 0; h < hkv; ++h) {
        std::int32_t* row = ids.data() + h * d.num_rows * w;  // request 0: blocks 5 and 7, repeated
        std::fill(row, row + w, 5);
        row[39] = 7;
        row[33] = 7;
        row = ids.data() + (h * d.num_rows + 2 * dql) * w;  // request 2: nothing valid
        std::fill(row, row + w, -1);
        row[0] = 9999;
        row[35] = std::numeric_limits<std::int32_t>::min();
        row[36] = 3;  // past its 300 tokens' 3 blocks
      }
      const auto ids_before = ids;
      const AttnRun dr = run_attention(d, Kind::kSparse, &ids, w, DType::kBf16, b.run);
      check_against_oracle(d, dr, &ids, w, b.probabilities);
      EXPECT_EQ(ids, ids_before) << "attention wrote into the top-k lists";
      EXPECT_EQ(dr.lse[2 * dql * 64], -std::numeric_limits<float>::infinity());
    }
  }
}

void check_full_coverage_equals_dense(const AttentionBackend& b) {
  Config c;
  c.sparse_topk_blocks = 40;
  const Scenario s = make_prefill(c, {{0, 200}, {4000, 7}, {300, 2}, {1100, 30}}, 8);
  EXPECT_TRUE(selects_every_block(c, 4007));  // the longest request: 32 blocks of 40
  const auto topk = indexer_topk(s);
  const AttnRun sparse = run_attention(s, Kind::kSparse, &topk, 40, DType::kBf16, b.run);
  const AttnRun dense = run_attention(s, Kind::kDense, nullptr, 0, DType::kBf16, b.run);
  EXPECT_EQ(sparse.out, dense.out);
  EXPECT_EQ(sparse.lse, dense.lse);
  check_against_oracle(s, dense, nullptr, 0, b.probabilities);
}

void check_deterministic(const AttentionBackend& b) {
  const Config c;
  const Scenario s = make_prefill(c, {{2000, 70}, {0, 50}}, 12);
  const auto topk = indexer_topk(s);
  const AttnRun x = run_attention(s, Kind::kSparse, &topk, 16, DType::kBf16, b.run);
  const AttnRun y = run_attention(s, Kind::kSparse, &topk, 16, DType::kBf16, b.run);
  EXPECT_EQ(x.out, y.out);
  EXPECT_EQ(x.lse, y.lse);
}

void check_mxfp8_decode(const AttentionBackend& b) {
  const Config c;
  for (int dql : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "decode_query_len " << dql);
    const Scenario s = make_decode(c, {3000, 0, 129, 1000}, dql, 4);
    const auto topk = indexer_topk(s);
    const AttnRun bf16 = run_attention(s, Kind::kSparse, &topk, 16, DType::kBf16, b.run);
    const std::int64_t T = s.num_rows, cols = 64 * 128, scale_cols = cols / 32;
    for (auto rule : {fmt::Mxfp8ScaleRule::kRceil, fmt::Mxfp8ScaleRule::kFloor}) {
      for (auto layout : {fmt::ScaleLayout::kRowMajor, fmt::ScaleLayout::kSwizzled128x4}) {
        const std::int64_t scale_bytes = fmt::mxfp8_scale_buffer_size(T, scale_cols, layout);
        Guarded codes(T * cols, 0xAA), scales(scale_bytes, 0xAA);
        AttentionCall call = scenario_call(s);
        call.topk = TensorView::contiguous(const_cast<std::int32_t*>(topk.data()), DType::kInt32,
                                           {4, T, 16});
        call.out.out = TensorView::contiguous(codes.data(), DType::kFp8E4m3, {T, cols});
        call.out.mxfp8_scales =
            layout == fmt::ScaleLayout::kRowMajor
                ? TensorView::contiguous(scales.data(), DType::kUint8, {T, scale_cols})
                : TensorView::contiguous(scales.data(), DType::kUint8, {scale_bytes});
        call.out.mxfp8_scale_layout = layout;
        call.out.mxfp8_scale_rule = rule;
        // The MXFP8 rule's corner, finite input never giving a NaN code, is in the format tests
        // (shared by both backends: the kernels call the same quantizer).
        call.guarded = {codes.span(), scales.span()};
        b.run(call);
        std::vector<std::uint8_t> want_codes(static_cast<std::size_t>(T * cols));
        std::vector<std::uint8_t> want_scales(static_cast<std::size_t>(scale_bytes), 0xAA);
        fmt::mxfp8_quantize_rows(reinterpret_cast<const std::uint16_t*>(bf16.out.data()), T, cols,
                                 cols, want_codes.data(), want_scales.data(), layout, rule);
        EXPECT_EQ(codes.checked_contents("codes"), want_codes);
        EXPECT_EQ(scales.checked_contents("scales"), want_scales);
      }
    }
  }
}

namespace {

// A key of the cache to poison: K (+Inf for 16-bit caches, the NaN code for E4M3) or V (NaN).
struct Poison {
  bool value;
  std::int64_t request, position, kv_head;
};

void write_non_finite(Scenario& s, const Poison& p) {
  const KvCacheView kv = s.cm->kv_cache();
  const std::int64_t bs = s.config.sparse_block_size;
  const std::int64_t page = s.block_table[p.request * s.max_blocks + p.position / bs];
  const CachePlane& plane = p.value ? kv.v : kv.k;
  std::byte* row = plane.row(page, p.kv_head, p.position % bs);
  for (std::int64_t e = 0; e < kv.shape.head_dim; ++e) {
    if (kv.dtype == DType::kBf16) {
      const std::uint16_t bits = p.value ? 0x7FC0 : 0x7F80;  // NaN, +Inf
      std::memcpy(row + 2 * e, &bits, 2);
    } else {
      row[e] = std::byte{0x7F};  // E4M3 NaN
    }
  }
}

void check_non_finite_scenario(Scenario& s, const AttentionBackend& b, DType out_dtype) {
  const auto h = s.config.resolve_heads();
  const std::int64_t hq = h.num_attention_heads, group = hq / h.num_key_value_heads;
  const std::int64_t bs = s.config.sparse_block_size, d = s.config.head_dim;
  const auto topk = indexer_topk(s);  // selected on the clean index cache
  const std::int64_t width = s.config.sparse_topk_blocks;
  // Per request: a NaN value at its last position and a non-finite key two before it, on
  // different kv heads; then one NaN query element in the first row of every request.
  std::vector<Poison> poisons;
  std::vector<std::int64_t> first_row;
  for (std::int64_t r = 0; r < static_cast<std::int64_t>(s.seq_lens.size()); ++r) {
    const std::int64_t len = s.seq_lens[r];
    if (len < 3) continue;
    poisons.push_back({true, r, len - 1, r % 4});
    poisons.push_back({false, r, len - 3, (r + 1) % 4});
  }
  for (const Poison& p : poisons) write_non_finite(s, p);
  std::vector<Expect> expect(static_cast<std::size_t>(s.num_rows * hq), Expect::kFinite);
  std::vector<char> seen_request(s.seq_lens.size(), 0);
  for (std::int64_t t = 0; t < s.num_rows; ++t) {
    const std::int64_t r = s.rows.request[t], pos = s.rows.position[t];
    if (r < 0 || pos < 0) continue;
    if (!seen_request[r]) {  // a NaN in one query element: that (row, head) is NaN
      seen_request[r] = 1;
      const std::int64_t head = (7 * r + 3) % hq;
      s.q[(t * hq + head) * d + 5] = 0x7FC0;
      s.q_values[(t * hq + head) * d + 5] = std::numeric_limits<double>::quiet_NaN();
      expect[t * hq + head] = Expect::kNanRow;
    }
    for (const Poison& p : poisons) {
      if (p.request != r || p.position > pos) continue;
      const auto blocks = blocks_of(s, &topk, width, p.kv_head, t);
      if (std::find(blocks.begin(), blocks.end(), p.position / bs) == blocks.end()) continue;
      for (std::int64_t g = 0; g < group; ++g) {
        Expect& e = expect[t * hq + p.kv_head * group + g];
        if (e != Expect::kNanRow) e = p.value ? Expect::kNanValues : Expect::kNanRow;
      }
    }
  }
  std::int64_t nan_rows = 0, finite_rows = 0;
  for (Expect e : expect) (e == Expect::kFinite ? finite_rows : nan_rows)++;
  ASSERT_GT(nan_rows, 0);
  ASSERT_GT(finite_rows, 0);
  const AttnRun run = run_attention(s, Kind::kSparse, &topk, width, out_dtype, b.run);
  check_against_oracle(s, run, &topk, width, b.probabilities, &expect);
}

}  // namespace

void check_long_context_union(const AttentionBackend& b) {
  const Config c;
  const std::int64_t len = 300000, dql = 4;  // 2344 blocks: two windows of the union build
  Scenario s = make_decode(c, {len}, dql, 31);
  const std::int64_t hkv = 4, width = 16, last = (len - 1) / 128;
  std::vector<std::int32_t> topk(static_cast<std::size_t>(hkv * dql * width));
  std::mt19937 rng(17);
  for (std::int64_t h = 0; h < hkv; ++h) {
    for (std::int64_t t = 0; t < dql; ++t) {
      std::int32_t* row = topk.data() + (h * dql + t) * width;
      // The window edges, both windows, the local block; the rest random over the context.
      const std::int32_t fixed[] = {0, 2046, 2047, 2048, 2049, static_cast<std::int32_t>(last)};
      std::copy(std::begin(fixed), std::end(fixed), row);
      for (std::int64_t i = 6; i < width; ++i) {
        row[i] = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(last + 1));
      }
    }
  }
  const AttnRun run = run_attention(s, Kind::kSparse, &topk, width, DType::kBf16, b.run);
  check_against_oracle(s, run, &topk, width, b.probabilities);
}

void check_query_range(const AttentionBackend& b) {
  // Per-head binary exponents (each head's N(0, 1) query times 2^shift); kZero: all zeros;
  // kSpread: element e times 2^-(e % 41), so one head spans 40 binades.
  constexpr int kZero = 1000, kSpread = 1001;
  const int shifts[] = {0, -100, 2, kZero, -30, kSpread, -131, 1};
  for (DType kv : {DType::kFp8E4m3, DType::kFp8E5m2}) {
    SCOPED_TRACE(::testing::Message() << "kv cache " << to_string(kv));
    Config c;
    c.kv_cache_dtype = kv;
    for (int dql : {0, 1, 4}) {  // 0: prefill
      SCOPED_TRACE(::testing::Message() << "decode_query_len " << dql);
      Scenario s = dql == 0 ? make_prefill(c, {{0, 130}, {2000, 7}}, 95)
                            : make_decode(c, {2049, 300, 17 * 128 + 5}, dql, 96 + dql);
      s.k_scale = 0.5f;
      const std::int64_t hq = c.resolve_heads().num_attention_heads, d = c.head_dim;
      for (std::int64_t t = 0; t < s.num_rows; ++t) {
        for (std::int64_t head = 0; head < hq; ++head) {
          const int shift = shifts[(head + t) % 8];
          for (std::int64_t e = 0; e < d; ++e) {
            const std::size_t i = static_cast<std::size_t>((t * hq + head) * d + e);
            const int by = shift == kSpread ? -static_cast<int>(e % 41) : shift;
            const float x =
                shift == kZero ? 0.0f : static_cast<float>(std::ldexp(s.q_values[i], by));
            s.q[i] = fmt::float_to_bf16(x);  // rounded where 2^-131 makes it subnormal
            s.q_values[i] = fmt::bf16_to_float(s.q[i]);
          }
        }
      }
      const auto topk = indexer_topk(s);
      const std::int64_t width = c.sparse_topk_blocks;
      const AttnRun run = run_attention(s, Kind::kSparse, &topk, width, DType::kFp32, b.run);
      check_against_oracle(s, run, &topk, width, b.probabilities);
    }
  }
}

void check_non_finite(const AttentionBackend& b) {
  for (DType kv : {DType::kBf16, DType::kFp8E4m3}) {
    SCOPED_TRACE(::testing::Message() << "kv cache " << to_string(kv));
    Config c;
    c.kv_cache_dtype = kv;
    {
      SCOPED_TRACE("prefill");
      Scenario s = make_prefill(c, {{0, 200}, {300, 40}, {2040, 9}}, 91);
      check_non_finite_scenario(s, b, DType::kBf16);
    }
    for (int dql : {1, 4}) {
      SCOPED_TRACE(::testing::Message() << "decode_query_len " << dql);
      Scenario s = make_decode(c, {2049, 0, 300, 17 * 128 + 5}, dql, 92 + dql);
      check_non_finite_scenario(s, b, DType::kFp32);
    }
  }
}

}  // namespace flashmsa::test
