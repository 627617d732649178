// The CUDA sparse and dense attention under the CPU tests' own checks (attention_checks.hpp):
// the same scenarios, the fp64 oracle with the tensor-core rule for probabilities (P meets V in
// the MMA type, bf16 or fp16), canaries around every output, the caches and top-k lists never
// written. Plus what only the GPU has: decode splits, CUDA-graph replay after the batch changes
// in place, workspace errors.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/formats.hpp"
#include "flashmsa/ops.hpp"
#include "tests/cpp/attention_checks.hpp"
#include "tests/cpp/error_message.hpp"
#include "tests/cpp/gpu/device_scenario.hpp"
#include "tests/cpp/gpu/gpu_runners.hpp"

namespace flashmsa {
namespace {

using test::AttentionCall;
using test::kGpuBf16P;
using test::kGpuFp16P;
using test::Scenario;

// The MMA type: fp16 for fp16 caches (bf16 q converted), else bf16 (the tests' q is bf16).
const test::AttentionBackend& gpu_for(const test::AttnCase& c) {
  return c.kv_dtype == DType::kFp16 ? kGpuFp16P : kGpuBf16P;
}

class AttentionGpu : public ::testing::TestWithParam<test::AttnCase> {};

TEST_P(AttentionGpu, SparsePrefillMatchesOracle) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_sparse_prefill(GetParam(), gpu_for(GetParam()));
}

TEST_P(AttentionGpu, SparseDecodeWithPaddingMatchesOracle) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_sparse_decode(GetParam(), gpu_for(GetParam()), {1, 2, 3, 4, 16});
}

TEST_P(AttentionGpu, SparseDecodeOfMoreTilesThanSmsMatchesOracle) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_sparse_decode_of_many_requests(GetParam(), gpu_for(GetParam()));
}

// q handed over in fp16 (the scenario's bf16 values, which fp16 holds exactly but for values
// below 2^-14, off by at most 2^-25): 16-bit caches convert it to their own type on load, the
// 8- and 4-bit ones compute in fp16, so P meets V in fp16 there.
TEST_P(AttentionGpu, SparsePrefillOfFp16QueriesMatchesOracle) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const test::AttnCase& c = GetParam();
  test::AttentionBackend fp16_q = c.kv_dtype == DType::kBf16 ? kGpuBf16P : kGpuFp16P;
  fp16_q.run = [](const test::AttentionCall& call) {
    const auto* bf16 = static_cast<const std::uint16_t*>(call.q.data);
    std::vector<std::uint16_t> q(static_cast<std::size_t>(call.q.numel()));
    for (std::size_t i = 0; i < q.size(); ++i) {
      q[i] = fmt::float_to_fp16(fmt::bf16_to_float(bf16[i]));
    }
    test::AttentionCall converted = call;
    converted.q.data = q.data();
    converted.q.dtype = DType::kFp16;
    test::run_on_gpu(converted);
  };
  test::check_sparse_prefill(c, fp16_q);
}

INSTANTIATE_TEST_SUITE_P(CacheDtypesAndLayouts, AttentionGpu,
                         ::testing::ValuesIn(test::attention_cases()),
                         [](const ::testing::TestParamInfo<test::AttnCase>& p) {
                           return p.param.name;
                         });

// Tensor parallelism shapes: 8 q heads per kv head (M3 at TP 8 has Hq 8, Hkv 1), and 2.
TEST(AttentionGpuGroups, SmallerGqaGroups) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const test::AttnCase bf16{"bf16", DType::kBf16, KvLayout::kPacked, DType::kBf16};
  for (int kv_heads : {1, 4}) {
    Config c;
    c.num_attention_heads = 8;
    c.num_key_value_heads = kv_heads;
    c.sparse_num_index_heads = kv_heads;
    SCOPED_TRACE(::testing::Message() << "Hq 8, Hkv " << kv_heads);
    test::check_sparse_prefill(bf16, kGpuBf16P, c);
    test::check_sparse_decode(bf16, kGpuBf16P, {1, 3}, c);
  }
}

TEST(AttentionGpu, AdversarialTopkListsAreIgnoredNotRead) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_adversarial_topk(kGpuBf16P);
}

TEST(AttentionGpu, FullCoverageEqualsDense) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_full_coverage_equals_dense(kGpuBf16P);
}

TEST(AttentionGpu, Deterministic) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_deterministic(kGpuBf16P);
}

TEST(AttentionGpu, Mxfp8DecodeOutputIsTheQuantizedBf16Output) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_mxfp8_decode(kGpuBf16P);
}

TEST(AttentionGpu, UnionBuildPastOneWindowOf2048Blocks) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_long_context_union(kGpuBf16P);
}

TEST(AttentionGpu, NonFiniteInputsAreNeverHidden) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_non_finite(kGpuBf16P);
}

TEST(AttentionGpu, QueriesOfAnyRangeOnFp8Caches) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  test::check_query_range(kGpuBf16P);
}

// Decode attention captured once in a CUDA graph, replayed after lengths, block table and top-k
// lists change in place: each replay equals the oracle for the current values.
TEST(AttentionGpuGraph, ReplaysAfterTheBatchChangesInPlace) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  Scenario s = test::make_decode(Config{}, {3000, 2000, 700, 0}, 2, 21);
  std::vector<std::int32_t> topk = test::indexer_topk(s);
  const std::int64_t T = s.num_rows, k = s.config.sparse_topk_blocks;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(T * 64 * 128 * 2));
  std::vector<float> lse(static_cast<std::size_t>(T * 64));
  const TensorView q = s.q_view();
  const DecodeBatch batch = s.decode_batch();
  const TensorView topk_view = TensorView::contiguous(topk.data(), DType::kInt32, {4, T, k});
  const TensorView out_view = TensorView::contiguous(out.data(), DType::kBf16, {T, 64, 128});
  const TensorView lse_view = TensorView::contiguous(lse.data(), DType::kFp32, {T, 64});
  test::DeviceMirror m;
  for (const TensorView* t :
       {&q, &batch.seq_lens, &batch.block_table, &topk_view, &out_view, &lse_view}) {
    m.add(*t);
  }
  m.add(s.cm->kv_cache());
  auto poison = [&] {
    std::fill(out.begin(), out.end(), 0xFF);
    std::fill(lse.begin(), lse.end(), 777.0f);
    m.refresh();
  };
  m.upload();
  test::DeviceBuffer<std::uint8_t> workspace(
      static_cast<std::size_t>(attention_workspace_bytes(s.config, 64, 32)));  // capacity
  AttentionOutputs dev_out{m.device(out_view), m.device(lse_view)};
  dev_out.workspace = test::workspace_view(workspace);
  const test::CapturedGraph graph([&](cudaStream_t stream) {
    sparse_attention_decode(s.config, m.device(q), m.device(s.cm->kv_cache()),
                            {m.device(batch.seq_lens), m.device(batch.block_table), 2},
                            m.device(topk_view), dev_out, {.stream = stream});
  });

  auto replay_and_check = [&](const char* what) {
    SCOPED_TRACE(what);
    poison();
    graph.replay();
    m.download();
    test::check_attention_output(s, topk, k, DType::kBf16, out, lse, DType::kBf16);
  };
  replay_and_check("as captured");

  // Shorter requests, a padding row turned live on request 1's pages, request 1 turned
  // padding, two pages of request 0 swapped; new top-k lists for the new lengths.
  test::change_decode_batch(s, {2500, 0, 650, 1500});
  const auto new_topk = test::indexer_topk(s);
  std::copy(new_topk.begin(), new_topk.end(), topk.begin());
  replay_and_check("after the batch changed");
}

// The whole decode step (indexer, top-k, attention) in one graph on one workspace sized by
// capacity (decode_workspace_bytes), replayed after the lengths change: the attention equals the
// oracle over the top-k lists the graph itself produced.
TEST(AttentionGpuGraph, WholeDecodeStepOnOneWorkspace) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  // The cache holds 1901 tokens of the last request: the replays step it from 1900 to 1901 (a
  // decode step's growth) while the others shrink; positions past the cache are never visible.
  Scenario s = test::make_decode(Config{}, {3000, 700, 0, 1901}, 3, 23);
  const std::int64_t T = s.num_rows, k = s.config.sparse_topk_blocks;
  std::vector<std::int32_t> topk(static_cast<std::size_t>(4 * T * k), -5);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(T * 64 * 128 * 2));
  std::vector<float> lse(static_cast<std::size_t>(T * 64));
  const TensorView q = s.q_view(), iq = s.index_q_view();
  const DecodeBatch batch = s.decode_batch();
  const TensorView topk_view = TensorView::contiguous(topk.data(), DType::kInt32, {4, T, k});
  const TensorView out_view = TensorView::contiguous(out.data(), DType::kBf16, {T, 64, 128});
  const TensorView lse_view = TensorView::contiguous(lse.data(), DType::kFp32, {T, 64});
  test::DeviceMirror m;
  for (const TensorView* t :
       {&q, &iq, &batch.seq_lens, &batch.block_table, &topk_view, &out_view, &lse_view}) {
    m.add(*t);
  }
  m.add(s.cm->kv_cache());
  m.add(s.cm->index_cache());
  m.upload();
  test::DeviceBuffer<std::uint8_t> workspace(static_cast<std::size_t>(
      decode_workspace_bytes(s.config, 16, 4, s.max_blocks)));  // capacity: 16 x dql 4
  const TensorView ws = test::workspace_view(workspace);
  const DecodeBatch dev_batch{m.device(batch.seq_lens), m.device(batch.block_table), 3};
  IndexOutputs index_out{m.device(topk_view)};
  index_out.workspace = ws;
  AttentionOutputs attention_out{m.device(out_view), m.device(lse_view)};
  attention_out.workspace = ws;
  const test::CapturedGraph graph([&](cudaStream_t stream) {
    index_decode(s.config, m.device(iq), m.device(s.cm->index_cache()), dev_batch, index_out,
                 {.stream = stream});
    sparse_attention_decode(s.config, m.device(q), m.device(s.cm->kv_cache()), dev_batch,
                            index_out.topk, attention_out, {.stream = stream});
  });
  for (const std::vector<std::int32_t>& lens :
       {std::vector<std::int32_t>{3000, 700, 0, 1900}, {2200, 0, 0, 1901}}) {
    SCOPED_TRACE(::testing::Message() << "seq_lens " << lens[0] << ", " << lens[1] << ", "
                                      << lens[2] << ", " << lens[3]);
    s.seq_lens = lens;
    s.rows = ref::decode_rows(s.seq_lens, 3);
    std::fill(out.begin(), out.end(), 0xFF);
    std::fill(lse.begin(), lse.end(), 777.0f);
    m.refresh();
    graph.replay();
    m.download();
    test::check_attention_output(s, topk, k, DType::kBf16, out, lse, DType::kBf16);
  }
}

// sparse_decode_step (the attention makes each 1-row tile's selection itself) leaves exactly what
// index_decode then sparse_attention_decode leave: top-k lists, block scores, output and LSE bit
// for bit (same selection, same union order), and the attention equals the oracle. Rows of 24 to
// 313 blocks (the direct ranking and the radix passes, here with 256 threads), one of 157 blocks
// on three pages (three groups of equal scores, decided by id, the top-k kernel's 128 threads
// against the attention's 256), a padding request, a forced local block whose table entry is
// outside the cache (selected, never attended), split and unsplit tiles; score order with block
// scores on two cases (direct ranks as the score order); and a batch of 4-row tiles and one of
// more CTAs than two an SM, where the step falls back to the top-k kernel.
TEST(AttentionGpu, FusedDecodeStepEqualsIndexerThenAttention) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  struct Case {
    DType kv;
    int dql;
    std::vector<std::int64_t> lens;
    bool score_order;
    bool attention_selects;  // else the step falls back to the two ops
    // If set, a substring of the mangled name of the attention kernel the step must launch (the
    // two ops then launch the list-reading two-per-SM kernel).
    const char* attention_traits = nullptr;
  };
  // (bf16 dql 2 takes 1-row tiles for 4 requests, 4-row tiles for 5: attention_decode_tile_rows.)
  const std::vector<std::int64_t> four = {3000, 700, 0, 40000}, five = {3000, 700, 0, 40000, 20000};
  // More attention CTAs than two an SM (the top-k kernel selects): 280 > 2 x 132.
  std::vector<std::int64_t> seventy(70);
  for (std::size_t i = 0; i < seventy.size(); ++i) seventy[i] = 100 + 97 * i;
  // 16-bit caches: more 1-row tiles (160) than SMs (H100 / H200) take the two-CTAs-an-SM kernels
  // (AttentionDecode1TwoPerSm{,Select}Traits: AttentionTraits<1, 8, 3, true, *, true>), which
  // select at up to two CTAs an SM (160) and read the top-k kernel's lists beyond (280).
  std::vector<std::int64_t> forty(40);
  for (std::size_t i = 0; i < forty.size(); ++i) forty[i] = (1237 * i) % 6000 + i % 3;
  constexpr const char* kTwoPerSmSelect = "AttentionTraitsILi1ELi8ELi3ELb1ELb1ELb1E";
  constexpr const char* kTwoPerSmLists = "AttentionTraitsILi1ELi8ELi3ELb1ELb0ELb1E";

  // bf16 dql 4 over 9 requests takes 4-row tiles (attention_decode_tile_rows): a fallback too.
  for (const Case& c :
       {Case{DType::kBf16, 1, five, false, true}, Case{DType::kBf16, 2, four, true, true},
        Case{DType::kFp8E4m3, 1, five, false, true}, Case{DType::kFp8E4m3, 3, five, false, true},
        Case{DType::kNvfp4, 1, five, true, true},
        Case{DType::kBf16, 4, {900, 0, 5000, 300, 2600, 128, 1, 7000, 40}, false, false},
        Case{DType::kFp8E4m3, 1, seventy, false, false},
        Case{DType::kBf16, 1, forty, false, true, kTwoPerSmSelect},
        Case{DType::kFp16, 1, forty, true, true, kTwoPerSmSelect},
        Case{DType::kBf16, 1, seventy, false, false, kTwoPerSmLists}}) {
    SCOPED_TRACE(::testing::Message()
                 << to_string(c.kv) << ", dql " << c.dql << ", " << c.lens.size() << " requests");
    Config config;
    config.kv_cache_dtype = c.kv;
    if (c.kv != DType::kBf16) config.set_index_cache_dtype(DType::kFp8E4m3);
    if (c.score_order) config.topk_order = TopkOrder::kScoreDesc;
    Scenario s = test::make_decode(config, c.lens, c.dql, 41 + c.dql);
    if (c.lens == four || c.lens == five) s.block_table[3 * s.max_blocks + 40000 / 128] = 1 << 30;
    if (c.lens == five) {  // request 4's full blocks on the pages of its blocks 0, 1, 2
      std::int32_t* table = s.block_table.data() + 4 * s.max_blocks;
      for (std::int64_t b = 3; b < 20000 / 128; ++b) table[b] = table[b % 3];
    }
    const std::int64_t T = s.num_rows, k = s.config.sparse_topk_blocks, w = s.max_blocks;
    // [0]: the two ops, [1]: the fused step; poisoned.
    std::vector<std::int32_t> topk[2];
    std::vector<float> scores[2], lse[2];
    std::vector<std::uint8_t> out[2];
    for (int i = 0; i < 2; ++i) {
      topk[i].assign(static_cast<std::size_t>(4 * T * k), -5);
      scores[i].assign(static_cast<std::size_t>(4 * T * w), 555.0f);
      out[i].assign(static_cast<std::size_t>(T * 64 * 128 * 2), 0xFF);
      lse[i].assign(static_cast<std::size_t>(T * 64), 777.0f);
    }
    const TensorView q = s.q_view(), iq = s.index_q_view();
    const DecodeBatch batch = s.decode_batch();
    std::vector<TensorView> views = {q, iq, batch.seq_lens, batch.block_table};
    IndexOutputs index_out[2];
    AttentionOutputs attention_out[2];
    for (int i = 0; i < 2; ++i) {
      index_out[i].topk = TensorView::contiguous(topk[i].data(), DType::kInt32, {4, T, k});
      if (c.score_order) {
        index_out[i].block_scores =
            TensorView::contiguous(scores[i].data(), DType::kFp32, {4, T, w});
      }
      attention_out[i].out = TensorView::contiguous(out[i].data(), DType::kBf16, {T, 64, 128});
      attention_out[i].lse = TensorView::contiguous(lse[i].data(), DType::kFp32, {T, 64});
      for (const TensorView* t : {&index_out[i].topk, &index_out[i].block_scores,
                                  &attention_out[i].out, &attention_out[i].lse}) {
        views.push_back(*t);
      }
    }
    test::DeviceMirror m;
    for (const TensorView& t : views) m.add(t);
    m.add(s.kv());
    m.add(s.cm->index_cache());
    m.upload();
    test::DeviceBuffer<std::uint8_t> workspace(static_cast<std::size_t>(
        decode_workspace_bytes(s.config, static_cast<std::int64_t>(c.lens.size()), c.dql, w)));
    const DecodeBatch dev_batch{m.device(batch.seq_lens), m.device(batch.block_table), c.dql};
    for (int i = 0; i < 2; ++i) {
      index_out[i] = {m.device(index_out[i].topk),
                      c.score_order ? m.device(index_out[i].block_scores) : TensorView{},
                      test::workspace_view(workspace)};
      attention_out[i].out = m.device(attention_out[i].out);
      attention_out[i].lse = m.device(attention_out[i].lse);
      attention_out[i].workspace = test::workspace_view(workspace);
    }
    index_decode(s.config, m.device(iq), m.device(s.cm->index_cache()), dev_batch, index_out[0]);
    sparse_attention_decode(s.config, m.device(q), m.device(s.kv()), dev_batch, index_out[0].topk,
                            attention_out[0]);
    auto step = [&](const OpOptions& options) {
      sparse_decode_step(s.config, m.device(iq), m.device(s.cm->index_cache()), m.device(q),
                         m.device(s.kv()), dev_batch, index_out[1], attention_out[1], options);
    };
    step({});
    FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
    // Which path the step took: captured (not run), it launches one kernel fewer than the two ops
    // where the attention selects (no top-k kernel), as many where it falls back.
    const test::CapturedGraph two_ops([&](cudaStream_t stream) {
      OpOptions options;
      options.stream = stream;
      index_decode(s.config, m.device(iq), m.device(s.cm->index_cache()), dev_batch, index_out[0],
                   options);
      sparse_attention_decode(s.config, m.device(q), m.device(s.kv()), dev_batch, index_out[0].topk,
                              attention_out[0], options);
    });
    const test::CapturedGraph one_step([&](cudaStream_t stream) {
      OpOptions options;
      options.stream = stream;
      step(options);
    });
    EXPECT_EQ(one_step.kernel_nodes(), two_ops.kernel_nodes() - (c.attention_selects ? 1 : 0));
    if (c.attention_traits) {
      const auto launches = [&](const test::CapturedGraph& g, const char* traits) {
        const std::vector<std::string> names = g.kernel_names();
        return std::any_of(names.begin(), names.end(), [&](const std::string& name) {
          return name.find(traits) != std::string::npos;
        });
      };
      EXPECT_TRUE(launches(one_step, c.attention_traits)) << c.attention_traits;
      EXPECT_TRUE(launches(two_ops, kTwoPerSmLists)) << kTwoPerSmLists;
    }
    m.download();
    EXPECT_EQ(topk[1], topk[0]);
    EXPECT_EQ(0, std::memcmp(scores[1].data(), scores[0].data(), scores[0].size() * 4));
    EXPECT_EQ(out[1], out[0]);
    EXPECT_EQ(0, std::memcmp(lse[1].data(), lse[0].data(), lse[0].size() * 4));
    test::check_attention_output(s, topk[1], k, DType::kBf16, out[1], lse[1],
                                 c.kv == DType::kFp16 ? DType::kFp16 : DType::kBf16);
  }
}

TEST(AttentionGpuErrors, WorkspaceAndWidth) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const Config c;
  const Scenario s = test::make_prefill(c, {{0, 3}}, 1);
  test::DeviceScenario d(s);
  std::vector<std::int32_t> topk(4 * 3 * 65, -1);
  const TensorView tk = d.on_device(TensorView::contiguous(topk.data(), DType::kInt32, {4, 3, 65}));
  const TensorView tk16 =
      d.on_device(TensorView::contiguous(topk.data(), DType::kInt32, {4, 3, 16}));
  test::DeviceMirror m;
  m.add(s.cm->kv_cache());
  m.upload();
  const KvCacheView kv = m.device(s.cm->kv_cache());
  AttentionOutputs o{d.output(DType::kBf16, {3, 64, 128})};
  EXPECT_EQ(test::error_message([&] { sparse_attention_prefill(c, d.q, kv, d.prefill, tk16, o); }),
            "workspace must be a 256-byte aligned device buffer of at least 768 bytes "
            "(attention_workspace_bytes) on the CUDA backend, got 0 bytes");
  o.workspace = d.output(DType::kUint8, {attention_workspace_bytes(c, 3, 1)});
  EXPECT_EQ(test::error_message([&] { sparse_attention_prefill(c, d.q, kv, d.prefill, tk, o); }),
            "the CUDA attention takes top-k lists of at most 64 blocks, got 65");
}

}  // namespace
}  // namespace flashmsa
