// The attention tests (spec sections 5 and 7) as checks any backend runs: the same scenarios,
// the same fp64 oracle and the same acceptance rule, whoever computes the outputs.
//
// Tolerance (FlashAttention rule): over each output tensor, max |ours - fp64| must be at most
// 2x the max error of an honest low-precision computation of the same thing, plus 1e-6. The
// honest computation is the fp64 result rounded once to the output dtype, and, for a backend
// that feeds probabilities to P V in a 16-bit type (the tensor-core kernels: spec 5 allows it),
// the fp64 result with each probability rounded to that type; for fp32 outputs at least an fp32
// computation's error (64 ulps at magnitude 1). The log-sum-exp follows the same rule against an
// honest fp32 value. MXFP8 must equal quantizing the same backend's bf16 output bit for bit.
// Every output element is checked; outputs are poisoned before the run and guarded by canaries.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "flashmsa/ops.hpp"
#include "tests/cpp/scenario.hpp"

namespace flashmsa::test {

// One attention op call on host views.
struct AttentionCall {
  enum class Op { kPrefill, kDecode, kDense } op = Op::kPrefill;
  Config config;
  TensorView q;
  KvCacheView kv;
  PrefillBatch prefill;
  DecodeBatch decode;
  TensorView topk;
  AttentionOutputs out;
  OpOptions options;
  // Host memory the op may write around its outputs (canaries): a device runner mirrors it too.
  std::vector<std::pair<void*, std::int64_t>> guarded;
};

// The call of a scenario's op (sparse prefill or decode as the scenario is, or dense), without
// top-k lists or outputs.
AttentionCall scenario_call(const Scenario& s, bool dense = false);

// Runs the call; a GPU runner mirrors every view to the device, runs there and copies back.
using AttentionRunner = std::function<void(const AttentionCall&)>;
void run_attention_call(const AttentionCall& call);  // the views as given (CPU)

// How a backend computes: what `AttentionRunner` to use and in which type P meets V.
struct AttentionBackend {
  AttentionRunner run = run_attention_call;
  DType probabilities = DType::kFp32;
};

struct AttnCase {
  std::string name;
  DType kv_dtype;
  KvLayout layout;
  DType out_dtype;
  float k_scale = 1.0f, v_scale = 1.0f;  // fp8 dequantization scales of the main cache
};
inline void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << c.name;
}
// Every cache dtype and layout, bf16 / fp16 / fp32 outputs, fp8 with scales.
std::vector<AttnCase> attention_cases();

// Prefill edge grid with the indexer's selection, against the oracle (`base`: heads, top-k).
void check_sparse_prefill(const AttnCase& c, const AttentionBackend& b, Config base = {});
// Decode (the given query lengths, padding rows) with the indexer's selection, against the oracle.
void check_sparse_decode(const AttnCase& c, const AttentionBackend& b, std::vector<int> dqls,
                         Config base = {});
// Decode (dql 1) of 40 requests (lengths 0 .. 6K, partial pages): on the GPU more 1-row tiles
// (160) than an H100 / H200 has SMs, which 16-bit caches run two CTAs an SM.
void check_sparse_decode_of_many_requests(const AttnCase& c, const AttentionBackend& b);
// Hand-made top-k lists: -1, out-of-range, invisible and repeated ids, a block-table entry
// outside the cache, a row with nothing valid; the cache is never written. Prefill, then decode
// (dql 1 and 2, lists 40 wide) on bf16 and E4M3 caches.
void check_adversarial_topk(const AttentionBackend& b);
// Full coverage: sparse equals dense bit for bit, and dense matches the oracle.
void check_full_coverage_equals_dense(const AttentionBackend& b);
// Two runs give identical bytes.
void check_deterministic(const AttentionBackend& b);
// MXFP8 decode output equals quantizing the bf16 output, in both scale layouts and both rules.
void check_mxfp8_decode(const AttentionBackend& b);
// A context past the union build's 2048-block window (a 300K-token request, decode of 4 rows):
// hand-made selections in both windows and at the window edges, against the oracle. Large
// (about 700 MB of host cache): run where memory allows (the GPU suite).
void check_long_context_union(const AttentionBackend& b);
// Non-finite inputs are never hidden (spec section 5), for prefill and decode (dql 1 and 4), on a
// bf16 and an E4M3 cache: a NaN query gives a NaN row and log-sum-exp; a key whose K is +Inf
// (bf16) or NaN (E4M3) makes every row that sees it NaN, log-sum-exp included; a NaN value makes
// the rows that see its key NaN (their log-sum-exp stays finite). Rows that do not see the key
// (earlier positions of the same block, other heads, unselected blocks) match the oracle.
void check_non_finite(const AttentionBackend& b);

// Queries of any range on E4M3 / E5M2 caches (k scale 0.5), prefill and decode (dql 1 and 4):
// heads scaled by 2^-131 (bf16 subnormals), 2^-100, 2^-30, 1, 2, 4, all zero, and one head whose
// elements span 40 binades; fp32 outputs against the oracle. (The 1-row GPU decode tiles scale
// each head's queries by a power of two into f16 for QK^T: this is the range they must keep.)
void check_query_range(const AttentionBackend& b);

// The CPU indexer's top-k lists for a scenario ([Hkv, T, topk]).
std::vector<std::int32_t> indexer_topk(const Scenario& s);
// The oracle check of raw outputs ([T, Hq, D] of `out_dtype`, lse [T, Hq]) of a sparse run over
// `topk` ([Hkv, T, width]).
void check_attention_output(const Scenario& s, const std::vector<std::int32_t>& topk,
                            std::int64_t width, DType out_dtype,
                            const std::vector<std::uint8_t>& out, const std::vector<float>& lse,
                            DType probabilities);

}  // namespace flashmsa::test
