// The GPU reliability run (spec section 10): a randomized differential test of the CUDA indexer
// and attention against the CPU backend, a long soak of the decode step in a CUDA graph with the
// batch changing every step, and bitwise repeats of every op.
//
// Sizes come from the environment so the regular GPU suite runs a short version and
// `scripts/gpu_suite.sh --reliability` the full one: FLASHMSA_FUZZ_CASES (default 60; the full
// run 10000), FLASHMSA_SOAK_STEPS (default 2000; 100000), FLASHMSA_REPEATS (default 5; 100);
// FLASHMSA_FUZZ_SEED picks another stream of cases.
//
// Tolerances of the differential test (GPU against the CPU backend, which is itself held to the
// fp64 oracle by the CPU tests): selections equal except near-ties, a block chosen by one side
// only whose CPU score lies within 2^-12 (1 + max |score| of the row) of the k-th chosen score
// (the fp32 dot-product bound for 128 terms of N(0,1)-sized products, with margin); attention
// outputs within 2^-6 (1 + max |cpu| of the row) per element (P rounded to bf16 before P V on the
// GPU, 2^-8 relative, plus output rounding, with margin), the same non-finite elements, and
// log-sum-exp within 1e-3 (1 + |cpu|). Every 500th case is also checked against the fp64 oracle
// with the FlashAttention rule of attention_checks.hpp.
//
// Speed on the H200 (this version with an oracle check every 100th case): about 7.5 cases/s, so
// 10^4 cases take about 22 minutes: run them as shards of one device call each (the 10-minute
// limit), e.g. FLASHMSA_FUZZ_CASES=2500 with FLASHMSA_FUZZ_SEED=1..4.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashmsa/backend.hpp"
#include "flashmsa/error.hpp"
#include "flashmsa/formats.hpp"
#include "flashmsa/ops.hpp"
#include "tests/cpp/attention_checks.hpp"
#include "tests/cpp/cache_test_util.hpp"
#include "tests/cpp/gpu/device_scenario.hpp"
#include "tests/cpp/gpu/gpu_runners.hpp"
#include "tests/cpp/index_checks.hpp"
#include "tests/cpp/producer_checks.hpp"

namespace flashmsa {
namespace {

using test::AttentionCall;
using test::IndexRun;
using test::Scenario;

std::int64_t env_count(const char* name, std::int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

// ---- Random cases within the CUDA backend's limits table ----

struct FuzzCase {
  Config config;
  KvLayout layout = KvLayout::kPacked;
  DType out_dtype = DType::kBf16;
  int dql = 0;  // 0: prefill
  std::vector<RequestShape> prefill;
  std::vector<std::int64_t> decode_lens;
  bool adversarial_topk = false;
  std::string describe() const {
    std::string s = std::string(to_string(config.kv_cache_dtype)) + " kv, " +
                    std::string(to_string(config.index_cache_dtype)) + " index, Hq " +
                    std::to_string(*config.num_attention_heads) + "/Hkv " +
                    std::to_string(*config.num_key_value_heads) + "/Hidx " +
                    std::to_string(config.sparse_num_index_heads) + ", topk " +
                    std::to_string(config.sparse_topk_blocks) + " (init " +
                    std::to_string(config.sparse_init_blocks) + ", local " +
                    std::to_string(config.sparse_local_blocks) + ", " +
                    std::string(to_string(config.topk_order)) + "), layout " +
                    std::to_string(static_cast<int>(layout)) + ", out " +
                    std::string(to_string(out_dtype));
    if (dql) {
      s += ", decode dql " + std::to_string(dql) + " lens";
      for (auto l : decode_lens) s += " " + std::to_string(l);
    } else {
      s += ", prefill";
      for (const auto& r : prefill) {
        s += " (" + std::to_string(r.prefix_len) + "+" + std::to_string(r.query_len) + ")";
      }
    }
    return s + (adversarial_topk ? ", adversarial top-k" : "");
  }
};

FuzzCase random_case(std::mt19937_64& rng) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
  auto range = [&](std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  FuzzCase f;
  Config& c = f.config;
  // Head shapes: M3, and tensor-parallel ranks (groups 8 and 16).
  const int heads[][2] = {{64, 4}, {8, 1}, {16, 2}, {32, 2}};
  const auto& h = heads[pick(4)];
  c.num_attention_heads = h[0];
  c.num_key_value_heads = h[1];
  c.sparse_num_index_heads = h[1] * (pick(4) == 0 ? 2 : 1);
  const DType kv[] = {DType::kBf16, DType::kFp16, DType::kFp8E4m3, DType::kFp8E5m2, DType::kNvfp4};
  c.kv_cache_dtype = kv[pick(5)];
  const DType index[] = {DType::kBf16, DType::kFp8E4m3, DType::kNvfp4};
  c.set_index_cache_dtype(index[pick(3)]);
  if (c.indexer_kv_dtype == "fp8") c.implementation = "msa";
  c.sparse_topk_blocks = static_cast<int>(pick(3) == 0 ? range(1, 64) : range(4, 20));
  c.sparse_init_blocks = static_cast<int>(range(0, std::min(2, c.sparse_topk_blocks)));
  c.sparse_local_blocks =
      static_cast<int>(range(0, std::min(2, c.sparse_topk_blocks - c.sparse_init_blocks)));
  const TopkOrder orders[] = {TopkOrder::kAscending, TopkOrder::kScoreDesc, TopkOrder::kLocalLast};
  c.topk_order = orders[pick(3)];
  const KvLayout layouts[] = {KvLayout::kPacked, KvLayout::kSeparate, KvLayout::kStacked,
                              KvLayout::kTokenMajor};
  f.layout = layouts[pick(4)];
  const DType outs[] = {DType::kBf16, DType::kFp16, DType::kFp32};
  f.out_dtype = outs[pick(3)];
  f.adversarial_topk = pick(4) == 0;
  if (pick(2) == 0) {  // decode, with padding requests
    f.dql = static_cast<int>(pick(3) == 0 ? range(1, 16) : range(1, 4));
    const int b = static_cast<int>(range(1, 6));
    for (int r = 0; r < b; ++r) {
      f.decode_lens.push_back(pick(5) == 0 ? 0 : range(f.dql, pick(3) == 0 ? 4000 : 1500));
    }
  } else {  // ragged prefill, chunked (prefix > 0) or not
    const int b = static_cast<int>(range(1, 3));
    for (int r = 0; r < b; ++r) {
      f.prefill.push_back({pick(2) == 0 ? 0 : range(1, 2500), range(1, 80)});
    }
  }
  return f;
}

Scenario make_scenario(const FuzzCase& f, std::uint64_t seed) {
  return f.dql ? test::make_decode(f.config, f.decode_lens, f.dql, seed, f.layout)
               : test::make_prefill(f.config, f.prefill, seed, f.layout);
}

// ---- Comparisons ----

// GPU selections against the CPU's: the same ids in the same order, except near-ties (counted).
// Returns the number of rows that differ.
int compare_selections(const Scenario& s, const IndexRun& gpu, const IndexRun& cpu) {
  const std::int64_t hkv = s.config.resolve_heads().num_key_value_heads;
  const std::int64_t k = s.config.sparse_topk_blocks, w = cpu.width;
  int differing = 0;
  for (std::int64_t h = 0; h < hkv; ++h) {
    for (std::int64_t t = 0; t < s.num_rows; ++t) {
      const std::int32_t* g = gpu.topk.data() + (h * s.num_rows + t) * k;
      const std::int32_t* c = cpu.topk.data() + (h * s.num_rows + t) * k;
      if (std::equal(g, g + k, c)) continue;
      ++differing;
      const float* score = cpu.scores.data() + (h * s.num_rows + t) * w;
      float kth = std::numeric_limits<float>::infinity(), top = 0.0f;
      for (std::int64_t i = 0; i < k; ++i) {
        if (c[i] < 0) continue;
        const float sc = score[c[i]];
        if (std::isfinite(sc)) kth = std::min(kth, sc), top = std::max(top, std::fabs(sc));
      }
      const double tol = std::ldexp(1.0, -12) * (1.0 + top);
      std::vector<std::int32_t> gs(g, g + k), cs(c, c + k);
      std::sort(gs.begin(), gs.end());
      std::sort(cs.begin(), cs.end());
      std::vector<std::int32_t> diff;
      std::set_symmetric_difference(gs.begin(), gs.end(), cs.begin(), cs.end(),
                                    std::back_inserter(diff));
      for (std::int32_t b : diff) {
        if (b >= 0 && b < w && std::fabs(score[b] - kth) <= tol) continue;
        ADD_FAILURE() << "kv head " << h << " row " << t << ": block " << b
                      << " chosen by one backend only is no near-tie (score "
                      << (b >= 0 && b < w ? score[b] : NAN) << ", k-th " << kth << ")";
        return differing;
      }
      // Same set, different order: only score_desc orders by score, where near-equal scores
      // may swap.
      if (diff.empty() && s.config.topk_order != TopkOrder::kScoreDesc) {
        ADD_FAILURE() << "kv head " << h << " row " << t << ": same blocks in another order";
        return differing;
      }
    }
  }
  return differing;
}

struct AttnOut {
  std::vector<std::uint8_t> out;
  std::vector<float> lse;
};

float out_value(const std::vector<std::uint8_t>& out, DType dtype, std::int64_t i) {
  std::uint16_t b;
  switch (dtype) {
    case DType::kBf16: std::memcpy(&b, &out[2 * i], 2); return fmt::bf16_to_float(b);
    case DType::kFp16: std::memcpy(&b, &out[2 * i], 2); return fmt::fp16_to_float(b);
    default: {
      float f;
      std::memcpy(&f, &out[4 * i], 4);
      return f;
    }
  }
}

// Sparse attention over `topk` (dense attention when `dense`), outputs poisoned first.
AttnOut run_attention(const Scenario& s, const std::vector<std::int32_t>& topk, std::int64_t width,
                      DType out_dtype, const test::AttentionRunner& runner, bool dense = false) {
  const auto h = s.config.resolve_heads();
  const std::int64_t T = s.num_rows, hq = h.num_attention_heads, d = s.config.head_dim;
  AttnOut r;
  r.out.assign(static_cast<std::size_t>(T * hq * d * dtype_bits(out_dtype) / 8), 0xA7);
  r.lse.assign(static_cast<std::size_t>(T * hq), 12345.0f);
  AttentionCall call = test::scenario_call(s, dense);
  call.topk = TensorView::contiguous(const_cast<std::int32_t*>(topk.data()), DType::kInt32,
                                     {h.num_key_value_heads, T, width});
  call.out.out = TensorView::contiguous(r.out.data(), out_dtype, {T, hq, d});
  call.out.lse = TensorView::contiguous(r.lse.data(), DType::kFp32, {T, hq});
  runner(call);
  return r;
}

void compare_attention(const Scenario& s, const AttnOut& gpu, const AttnOut& cpu, DType dtype) {
  const auto h = s.config.resolve_heads();
  const std::int64_t hq = h.num_attention_heads, d = s.config.head_dim;
  for (std::int64_t row = 0; row < s.num_rows * hq; ++row) {
    float top = 0.0f;
    for (std::int64_t e = 0; e < d; ++e) {
      const float c = out_value(cpu.out, dtype, row * d + e);
      if (std::isfinite(c)) top = std::max(top, std::fabs(c));
    }
    const double tol = std::ldexp(1.0, -6) * (1.0 + top);
    for (std::int64_t e = 0; e < d; ++e) {
      const float g = out_value(gpu.out, dtype, row * d + e);
      const float c = out_value(cpu.out, dtype, row * d + e);
      const bool same_kind = std::isfinite(g) == std::isfinite(c);
      ASSERT_TRUE(same_kind && (!std::isfinite(c) || std::fabs(g - c) <= tol))
          << "row " << row / hq << " head " << row % hq << " element " << e << ": gpu " << g
          << ", cpu " << c;
    }
    const float gl = gpu.lse[row], cl = cpu.lse[row];
    ASSERT_TRUE((std::isnan(gl) && std::isnan(cl)) || gl == cl ||
                std::fabs(gl - cl) <= 1e-3 * (1.0 + std::fabs(cl)))
        << "log-sum-exp of row " << row / hq << " head " << row % hq << ": gpu " << gl << ", cpu "
        << cl;
  }
}

// Top-k lists as an engine might corrupt them: -1, duplicates, invisible and huge ids.
void corrupt(std::vector<std::int32_t>& topk, std::mt19937_64& rng) {
  for (auto& id : topk) {
    switch (rng() % 10) {
      case 0: id = -1; break;
      case 1: id = static_cast<std::int32_t>(rng() % 64); break;  // duplicates, invisible ids
      case 2: id = std::numeric_limits<std::int32_t>::max(); break;
      case 3: id = std::numeric_limits<std::int32_t>::min(); break;
      default: break;
    }
  }
}

TEST(GpuReliability, DifferentialAgainstTheCpuBackend) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const std::int64_t cases = env_count("FLASHMSA_FUZZ_CASES", 60);
  const std::uint64_t seed = static_cast<std::uint64_t>(env_count("FLASHMSA_FUZZ_SEED", 20261203));
  std::mt19937_64 rng(seed);
  std::int64_t rows = 0, differing = 0, oracle_checks = 0;
  for (std::int64_t i = 0; i < cases; ++i) {
    const FuzzCase f = random_case(rng);
    SCOPED_TRACE(::testing::Message() << "case " << i << ": " << f.describe());
    ASSERT_FALSE(unsupported_reason(f.config, Backend::kCudaSm90).has_value())
        << *unsupported_reason(f.config, Backend::kCudaSm90);
    const Scenario s = make_scenario(f, seed + static_cast<std::uint64_t>(i));
    const IndexRun gpu_index = test::run_gpu_indexer(s);
    const IndexRun cpu_index = test::run_cpu_indexer(s);
    test::check_properties(s, gpu_index);
    differing += compare_selections(s, gpu_index, cpu_index);
    rows += s.num_rows * s.config.resolve_heads().num_key_value_heads;
    if (::testing::Test::HasFailure()) return;

    std::vector<std::int32_t> topk = cpu_index.topk;
    if (f.adversarial_topk) corrupt(topk, rng);
    const std::int64_t k = s.config.sparse_topk_blocks;
    const test::AttentionBackend& gpu =
        f.config.kv_cache_dtype == DType::kFp16 ? test::kGpuFp16P : test::kGpuBf16P;
    const AttnOut g = run_attention(s, topk, k, f.out_dtype, gpu.run);
    const AttnOut c = run_attention(s, topk, k, f.out_dtype, test::run_attention_call);
    compare_attention(s, g, c, f.out_dtype);
    if (::testing::Test::HasFailure()) return;
    if (i % 500 == 0) {  // the fp64 oracle costs seconds a case: a sample
      test::check_attention_output(s, topk, k, f.out_dtype, g.out, g.lse, gpu.probabilities);
      ++oracle_checks;
    }
    if ((i + 1) % 200 == 0) {
      std::printf("differential: %lld cases passed so far\n", static_cast<long long>(i + 1));
      std::fflush(stdout);
    }
  }
  // Near-ties are rare with random data: a selection bug would show as many.
  EXPECT_LE(differing, std::max<std::int64_t>(2, rows / 500)) << "selections differing";
  std::printf("differential: %lld cases, %lld selections (%lld near-ties), %lld oracle checks\n",
              static_cast<long long>(cases), static_cast<long long>(rows),
              static_cast<long long>(differing), static_cast<long long>(oracle_checks));
}

// ---- Soak: the decode step in one CUDA graph, the batch changing before every replay ----

TEST(GpuReliability, DecodeGraphSoak) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const std::int64_t steps = env_count("FLASHMSA_SOAK_STEPS", 2000);
  constexpr int kDql = 2;
  const std::vector<std::int64_t> written{3000, 700, 1901, 129, 2500, 64, 1000, 4000};
  Scenario s = test::make_decode(Config{}, written, kDql, 77);
  const std::int64_t B = static_cast<std::int64_t>(written.size()), T = s.num_rows;
  const std::int64_t k = s.config.sparse_topk_blocks, W = s.max_blocks;
  const std::vector<std::int32_t> tables = s.block_table;  // each request's own row
  constexpr std::int64_t kGuard = 256;                     // canary elements on each side
  std::vector<std::int32_t> topk(static_cast<std::size_t>(4 * T * k + 2 * kGuard), -7);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(T * 64 * 128 + 2 * kGuard), 0x7FC1);
  std::vector<float> lse(static_cast<std::size_t>(T * 64 + 2 * kGuard), -3.0f);
  const TensorView q = s.q_view(), iq = s.index_q_view();
  const DecodeBatch batch = s.decode_batch();
  const TensorView topk_all =
      TensorView::contiguous(topk.data(), DType::kInt32, {static_cast<std::int64_t>(topk.size())});
  const TensorView out_all =
      TensorView::contiguous(out.data(), DType::kBf16, {static_cast<std::int64_t>(out.size())});
  const TensorView lse_all =
      TensorView::contiguous(lse.data(), DType::kFp32, {static_cast<std::int64_t>(lse.size())});
  test::DeviceMirror m;
  for (const TensorView* t :
       {&q, &iq, &batch.seq_lens, &batch.block_table, &topk_all, &out_all, &lse_all}) {
    m.add(*t);
  }
  m.add(s.cm->kv_cache());
  m.add(s.cm->index_cache());
  m.upload();
  auto* dev_topk = static_cast<std::int32_t*>(m.device(topk.data()));
  auto* dev_out = static_cast<std::uint16_t*>(m.device(out.data()));
  auto* dev_lse = static_cast<float*>(m.device(lse.data()));
  test::DeviceBuffer<std::uint8_t> workspace(
      static_cast<std::size_t>(decode_workspace_bytes(s.config, B, kDql, W)));
  const TensorView ws = test::workspace_view(workspace);
  const DecodeBatch dev_batch{m.device(batch.seq_lens), m.device(batch.block_table), kDql};
  IndexOutputs index_out{
      TensorView::contiguous(dev_topk + kGuard, DType::kInt32, {4, T, k}, Device::kCuda)};
  index_out.workspace = ws;
  AttentionOutputs attention_out{
      TensorView::contiguous(dev_out + kGuard, DType::kBf16, {T, 64, 128}, Device::kCuda),
      TensorView::contiguous(dev_lse + kGuard, DType::kFp32, {T, 64}, Device::kCuda)};
  attention_out.workspace = ws;
  const test::CapturedGraph graph([&](cudaStream_t stream) {
    index_decode(s.config, m.device(iq), m.device(s.cm->index_cache()), dev_batch, index_out,
                 {.stream = stream});
    sparse_attention_decode(s.config, m.device(q), m.device(s.cm->kv_cache()), dev_batch,
                            index_out.topk, attention_out, {.stream = stream});
  });
  const auto kv_before = s.cm->kv_cache();
  std::mt19937_64 rng(5);
  const std::int64_t check_every = std::max<std::int64_t>(1, steps / 20);
  for (std::int64_t step = 0; step < steps; ++step) {
    // Each slot serves a random request (or is padding), at a random length it holds.
    for (std::int64_t r = 0; r < B; ++r) {
      const std::int64_t src = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(B));
      const bool padding = rng() % 6 == 0;
      s.seq_lens[r] = padding ? 0
                              : static_cast<std::int32_t>(
                                    kDql + rng() % static_cast<std::uint64_t>(written[src] - 1));
      std::copy_n(tables.begin() + src * W, W, s.block_table.begin() + r * W);
    }
    FLASHMSA_CHECK_CUDA(
        cudaMemcpy(m.device(s.seq_lens.data()), s.seq_lens.data(), B * 4, cudaMemcpyHostToDevice));
    FLASHMSA_CHECK_CUDA(cudaMemcpy(m.device(s.block_table.data()), s.block_table.data(), B * W * 4,
                                   cudaMemcpyHostToDevice));
    const bool check = step % check_every == check_every - 1 || step == steps - 1;
    if (check) {  // poisoned outputs: anything the step fails to write shows
      FLASHMSA_CHECK_CUDA(cudaMemset(dev_out + kGuard, 0xFF, T * 64 * 128 * 2));
      FLASHMSA_CHECK_CUDA(cudaMemset(dev_lse + kGuard, 0xFF, T * 64 * 4));
    }
    graph.replay();
    if (!check) continue;
    SCOPED_TRACE(::testing::Message() << "step " << step);
    m.download();
    for (std::int64_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(topk[i], -7);
      ASSERT_EQ(topk[topk.size() - 1 - i], -7);
      ASSERT_EQ(out[i], 0x7FC1);
      ASSERT_EQ(out[out.size() - 1 - i], 0x7FC1);
      ASSERT_EQ(lse[i], -3.0f);
      ASSERT_EQ(lse[lse.size() - 1 - i], -3.0f);
    }
    s.rows = ref::decode_rows(s.seq_lens, kDql);
    const std::vector<std::int32_t> gpu_topk(topk.begin() + kGuard, topk.end() - kGuard);
    const std::vector<std::uint8_t> out_bytes(
        reinterpret_cast<const std::uint8_t*>(out.data() + kGuard),
        reinterpret_cast<const std::uint8_t*>(out.data() + out.size() - kGuard));
    const std::vector<float> lse_rows(lse.begin() + kGuard, lse.end() - kGuard);
    // The attention against the oracle over the graph's own selections; the selections against
    // the CPU indexer's.
    test::check_attention_output(s, gpu_topk, k, DType::kBf16, out_bytes, lse_rows, DType::kBf16);
    IndexRun gpu_run;
    gpu_run.topk = gpu_topk;
    const IndexRun cpu_run = test::run_cpu_indexer(s);
    gpu_run.width = cpu_run.width;
    EXPECT_LE(compare_selections(s, gpu_run, cpu_run), 2);
    if (::testing::Test::HasFailure()) return;
  }
  // The caches are inputs: the device copies still hold the host bytes.
  const std::vector<std::byte> host_kv(
      static_cast<const std::byte*>(kv_before.k.data),
      static_cast<const std::byte*>(kv_before.k.data) +
          KvCacheView::buffer_bytes(KvLayout::kPacked, kv_before.dtype, kv_before.shape));
  m.download();
  EXPECT_EQ(std::memcmp(host_kv.data(), kv_before.k.data, host_kv.size()), 0);
  std::printf("soak: %lld decode steps in one graph, %lld checked against the oracle\n",
              static_cast<long long>(steps), static_cast<long long>(steps / check_every));
}

// ---- Bitwise repeats ----

TEST(GpuReliability, EveryOpRepeatsBitForBit) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const std::int64_t repeats = env_count("FLASHMSA_REPEATS", 5);
  Config c;
  const Scenario prefill = test::make_prefill(c, {{2000, 70}, {0, 50}, {300, 9}}, 12);
  const Scenario decode = test::make_decode(c, {30000, 0, 700}, 3, 13);  // splits: few requests
  for (const Scenario* s : {&prefill, &decode}) {
    SCOPED_TRACE(s->decode_query_len ? "decode" : "prefill");
    const IndexRun first = test::run_gpu_indexer(*s);
    const std::int64_t k = s->config.sparse_topk_blocks;
    const AttnOut first_attention =
        run_attention(*s, first.topk, k, DType::kBf16, test::kGpuBf16P.run);
    const AttnOut first_dense =
        run_attention(*s, first.topk, k, DType::kBf16, test::kGpuBf16P.run, !s->decode_query_len);
    for (std::int64_t i = 1; i < repeats; ++i) {
      const IndexRun again = test::run_gpu_indexer(*s);
      ASSERT_EQ(again.topk, first.topk) << "index repeat " << i;
      ASSERT_EQ(std::memcmp(again.scores.data(), first.scores.data(), 4 * first.scores.size()), 0)
          << "block scores, repeat " << i;
      const AttnOut a = run_attention(*s, first.topk, k, DType::kBf16, test::kGpuBf16P.run);
      ASSERT_EQ(a.out, first_attention.out) << "attention repeat " << i;
      ASSERT_EQ(std::memcmp(a.lse.data(), first_attention.lse.data(), 4 * a.lse.size()), 0)
          << "log-sum-exp, repeat " << i;
      if (!s->decode_query_len) {
        const AttnOut dense =
            run_attention(*s, first.topk, k, DType::kBf16, test::kGpuBf16P.run, true);
        ASSERT_EQ(dense.out, first_dense.out) << "dense attention repeat " << i;
      }
    }
  }
}

// Runs `op` on the device copies of an uploaded mirror `repeats` times, each from the same
// starting bytes; every run must leave the same bytes in every mirrored region, and change some.
void expect_repeats_bit_for_bit(const test::DeviceMirror& m, std::int64_t repeats,
                                const std::function<void()>& op) {
  const std::vector<std::byte> start = m.host_bytes();
  std::vector<std::byte> first;
  for (std::int64_t i = 0; i < repeats; ++i) {
    m.set_host_bytes(start);
    m.refresh();
    op();
    FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
    m.download();
    if (i == 0) {
      first = m.host_bytes();
      ASSERT_NE(first, start) << "the op wrote nothing";
    } else {
      ASSERT_TRUE(m.host_bytes() == first) << "repeat " << i << " differs from the first run";
    }
  }
}

// The producer's repeats, under the producer test's own check of the last run (fp64 oracle,
// bytes outside the write set unchanged).
TEST(GpuReliability, ProducerRepeatsBitForBit) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const std::int64_t repeats = env_count("FLASHMSA_REPEATS", 5);
  for (const test::ProducerCase& pc : test::producer_cases()) {
    SCOPED_TRACE(pc.name);
    test::check_producer_case(
        pc, [&](const Config& c, const ProducerInputs& in, const KvCacheView& kv,
                const IndexCacheView& ix, const ProducerOutputs& out) {
          test::DeviceMirror m;
          test::mirror_producer(m, in, kv, ix, out);
          m.upload();
          expect_repeats_bit_for_bit(m, repeats,
                                     [&] { test::run_producer_on_device(m, c, in, kv, ix, out); });
        });
    if (::testing::Test::HasFailure()) return;
  }
}

// insert_kv for every cache dtype and layout and insert_index_k for every index dtype: bf16 rows
// at scattered slots, a padding slot and one beyond the capacity among them.
TEST(GpuReliability, InsertsRepeatBitForBit) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const std::int64_t repeats = env_count("FLASHMSA_REPEATS", 5);
  const KvCacheShape shape{5, 4, 128, 128};
  const std::int64_t T = 200, capacity = shape.num_pages * shape.page_size;
  std::mt19937_64 rng(31);
  std::normal_distribution<float> normal;
  std::vector<std::uint16_t> rows(static_cast<std::size_t>(T * 4 * 128 * 2));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    rows[i] = fmt::float_to_bf16(normal(rng) * std::exp2(static_cast<float>(i % 9) - 4.0f));
  }
  std::vector<std::int64_t> slots(static_cast<std::size_t>(capacity));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(static_cast<std::size_t>(T));
  slots[3] = -1;
  slots[7] = capacity + 5;
  const TensorView k = TensorView::contiguous(rows.data(), DType::kBf16, {T, 4, 128});
  const TensorView v = TensorView::contiguous(rows.data() + T * 4 * 128, DType::kBf16, {T, 4, 128});
  const TensorView index_k = TensorView::contiguous(rows.data(), DType::kBf16, {T, 128});
  const TensorView slot_view = TensorView::contiguous(slots.data(), DType::kInt64, {T});
  const DType index_dtypes[] = {DType::kBf16, DType::kFp8E4m3, DType::kNvfp4};
  int variant = 0;
  for (DType dtype :
       {DType::kBf16, DType::kFp16, DType::kFp8E4m3, DType::kFp8E5m2, DType::kNvfp4}) {
    for (KvLayout layout :
         {KvLayout::kPacked, KvLayout::kSeparate, KvLayout::kStacked, KvLayout::kTokenMajor}) {
      const DType index_dtype = index_dtypes[variant++ % 3];
      SCOPED_TRACE(::testing::Message() << to_string(dtype) << " layout " << int(layout) << ", "
                                        << to_string(index_dtype) << " index");
      test::RandomCaches caches(layout, shape, dtype, index_dtype, 128, 7);
      caches.kv.k_scale = 0.5f;
      caches.kv.v_scale = 2.0f;
      test::DeviceMirror m;
      for (const TensorView* t : {&k, &v, &slot_view}) m.add(*t);
      m.add(caches.kv);
      m.add(caches.ix);
      m.upload();
      const KvCacheView kv = m.device(caches.kv);
      const IndexCacheView ix = m.device(caches.ix);
      expect_repeats_bit_for_bit(
          m, repeats, [&] { insert_kv(kv, m.device(k), m.device(v), m.device(slot_view)); });
      expect_repeats_bit_for_bit(
          m, repeats, [&] { insert_index_k(ix, m.device(index_k), m.device(slot_view)); });
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace flashmsa
