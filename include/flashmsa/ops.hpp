// FlashMSA's operations. Each validates its arguments on the host (throwing Error that names the
// argument, the expected and the actual value), then runs on the backend that matches the
// tensors' device: CPU tensors on the CPU backend, CUDA tensors on the CUDA backend. Values
// inside tensors (slots, positions) are never trusted: an out-of-range slot writes nothing.
#pragma once

#include "flashmsa/cache.hpp"
#include "flashmsa/config.hpp"
#include "flashmsa/formats/block_scaled.hpp"
#include "flashmsa/tensor.hpp"

namespace flashmsa {

struct OpOptions {
  // Validate values inside the tensors (slots, positions) before running, and throw naming the
  // first offending entry instead of skipping it. Costs a host synchronisation on CUDA. On host
  // tensors, a prefill batch's cu_seqlens_q (0 first, non-decreasing, the row count last) is
  // checked in every call: it is free there.
  bool checked = false;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors; ignored on the CPU
  int num_threads = 0;     // CPU backend: worker threads (0: one per core)
};

// Writes K and V rows ([T, Hkv, D] each, bf16 / fp16 / fp32) into the main cache at
// slot_mapping[t] (int64 [T]; page = slot / page_size, offset = slot % page_size), quantizing to
// the cache dtype: fp8 as e4m3/e5m2_satfinite(x / scale), NVFP4 per group of 16 (spec 6).
// Negative slots are skipped; slots at or beyond the cache capacity write nothing.
void insert_kv(const KvCacheView& cache, const TensorView& k, const TensorView& v,
               const TensorView& slot_mapping, const OpOptions& options = {});

// Writes index-K rows ([T, Di]) into the index cache, likewise.
void insert_index_k(const IndexCacheView& cache, const TensorView& index_k,
                    const TensorView& slot_mapping, const OpOptions& options = {});

struct ProducerInputs {
  // [T, Hq*D + 2*Hkv*D + Hidx*Di + Di] bf16: [q | k | v | index_q | index_k] per token.
  TensorView qkv_index;
  TensorView q_norm_weight;        // [D]  bf16 or fp32 (Gemma: y = x * rms^-1 * (1 + w))
  TensorView k_norm_weight;        // [D]
  TensorView index_q_norm_weight;  // [Di]
  TensorView index_k_norm_weight;  // [Di]
  TensorView positions;            // [T] int32 or int64: absolute position of each row
  TensorView slot_mapping;         // [T] int64: main-cache slot, negative = do not write
  TensorView index_slot_mapping;   // [T] int64, or empty (no data) to use slot_mapping
};

struct ProducerOutputs {
  TensorView q;        // [T, Hq, D] bf16 or fp16
  TensorView index_q;  // [T, Hidx, Di] bf16 or fp16; fp8_e4m3 for the fp8 indexer
};

// The fused pre-processing of spec section 3: Gemma RMSNorm on q, k, index-q and index-k heads,
// partial NeoX RoPE on dims [0, rope_dim), one rounding at each store; q and index-q to their
// outputs, k and v into the main cache and index-k into the index cache.
//
// RoPE angles follow the engines' fp32 cos/sin caches: angle = float(p) * inv_freq[i] in fp32,
// inv_freq[i] = theta^(-2i/rope_dim) rounded to fp32; cos and sin of that angle are exact.
void produce_qkv_index(const Config& config, const ProducerInputs& inputs,
                       const KvCacheView& kv_cache, const IndexCacheView& index_cache,
                       const ProducerOutputs& outputs, const OpOptions& options = {});

// ---- Batches -------------------------------------------------------------------------------

// Ragged query rows (prefill, chunked prefill): request r owns rows [cu_seqlens_q[r],
// cu_seqlens_q[r+1]); its row i sits at position seq_lens[r] - Q_r + i (Q_r = its row count).
struct PrefillBatch {
  TensorView cu_seqlens_q;  // [B + 1] int32, starts at 0
  TensorView seq_lens;      // [B] int32: L_r = prefix + new tokens
  TensorView block_table;   // [B, max_blocks] int32: logical block -> physical page
};

// Uniform query rows (decode with 1 + speculative tokens): row r * decode_query_len + i sits at
// position seq_lens[r] - decode_query_len + i. A padding row has seq_lens 0 and selects nothing.
struct DecodeBatch {
  TensorView seq_lens;     // [B] int32
  TensorView block_table;  // [B, max_blocks] int32
  int decode_query_len = 1;
};

// ---- Indexer (spec section 4) ---------------------------------------------------------------

struct IndexOutputs {
  // int32 [Hkv, T, topk] (token-major [T, Hkv, topk] through strides): logical block ids of the
  // min(topk, nvb) selected blocks in the config's topk_order, then -1.
  TensorView topk;
  // Optional fp32 [Hkv, T, max_blocks]: each block's raw score (max over its visible keys of the
  // index dot, max over a kv head's index heads), -inf for blocks not visible. No forcing.
  TensorView block_scores;
  // CUDA backend only: uint8 device scratch of at least index_workspace_bytes(...) bytes,
  // 256-byte aligned (block scores between the scoring and selection kernels, and the batch
  // plan). Ignored on the CPU. Sized by capacity, it makes the decode indexer graph-safe.
  TensorView workspace;
};

// Bytes of `IndexOutputs::workspace` the CUDA indexer needs for `num_rows` query rows of
// `num_requests` requests with block tables `max_blocks` wide. Bounded (rows are scored in
// chunks); a buffer sized for the largest batch serves every smaller one.
std::int64_t index_workspace_bytes(const Config& config, std::int64_t num_rows,
                                   std::int64_t num_requests, std::int64_t max_blocks);

// index_q: [T, Hidx, Di] bf16 / fp16, or fp8_e4m3 with the fp8 indexer. The batch's block table
// addresses the index cache (the main table unless the index cache has its own).
void index_prefill(const Config& config, const TensorView& index_q,
                   const IndexCacheView& index_cache, const PrefillBatch& batch,
                   const IndexOutputs& outputs, const OpOptions& options = {});
void index_decode(const Config& config, const TensorView& index_q,
                  const IndexCacheView& index_cache, const DecodeBatch& batch,
                  const IndexOutputs& outputs, const OpOptions& options = {});

// ---- Attention (spec sections 5 and 7) ------------------------------------------------------

struct AttentionOutputs {
  // [T, Hq, D] bf16 (default), fp16 or fp32. For MXFP8 (decode only): fp8_e4m3 [T, Hq * D]
  // codes, with `mxfp8_scales` holding the E8M0 scales.
  TensorView out;
  TensorView lse;  // optional fp32 [T, Hq]: natural-log log-sum-exp, -inf for empty rows
  // uint8: [T, Hq * D / 32] row-major, or [mxfp8_scale_buffer_size(...)] swizzled.
  TensorView mxfp8_scales;
  fmt::ScaleLayout mxfp8_scale_layout = fmt::ScaleLayout::kRowMajor;
  fmt::Mxfp8ScaleRule mxfp8_scale_rule = fmt::Mxfp8ScaleRule::kRceil;
  // CUDA backend only: uint8 device scratch of at least attention_workspace_bytes(...) bytes,
  // 256-byte aligned (the prefill row plan; decode needs none). Ignored on the CPU. The
  // indexer's workspace may be reused: the ops of one stream never overlap.
  TensorView workspace;
};

// Bytes of `AttentionOutputs::workspace` the CUDA attention needs for any prefill, dense or
// decode batch of at most `num_requests` requests and `num_rows` query rows (top-k lists up to
// 64 wide): prefill's row plan (decode merges its splits without scratch), so a buffer sized for
// the capacity serves every step and every captured graph.
std::int64_t attention_workspace_bytes(const Config& config, std::int64_t num_rows,
                                       std::int64_t num_requests);

// The decode plan by capacity: bytes of one device buffer that serves as the workspace of a whole
// decode step (index_decode, then sparse_attention_decode, on one stream) for every batch of at
// most `max_requests` requests (padding included), decode query length at most
// `max_decode_query_len` and block tables at most `max_blocks` wide. Allocate it once, pass it to
// both ops, capture the step in a CUDA graph per batch shape.
std::int64_t decode_workspace_bytes(const Config& config, std::int64_t max_requests,
                                    std::int64_t max_decode_query_len, std::int64_t max_blocks);

// Sparse GQA attention of q [T, Hq, D] (bf16 / fp16) over the blocks each (kv head, row) selected
// in `topk` (int32 [Hkv, T, topk] as index_* writes it; ids that are -1, out of range, not
// visible or repeated are ignored and never dereferenced).
void sparse_attention_prefill(const Config& config, const TensorView& q,
                              const KvCacheView& kv_cache, const PrefillBatch& batch,
                              const TensorView& topk, const AttentionOutputs& outputs,
                              const OpOptions& options = {});
void sparse_attention_decode(const Config& config, const TensorView& q, const KvCacheView& kv_cache,
                             const DecodeBatch& batch, const TensorView& topk,
                             const AttentionOutputs& outputs, const OpOptions& options = {});

// ---- The decode step (spec sections 4 and 5) ------------------------------------------------

// One sparse layer's decode step in one call: index_decode, then sparse_attention_decode over the
// top-k lists it writes, with the same outputs, bit for bit. Both caches are addressed by the
// batch's one block table; index_q and q hold the same rows. On the CUDA backend the attention
// makes each row's selection itself where its tiles hold one row and its grid at most two CTAs an
// SM (no top-k launch between the scoring and the attention; up to 66 requests at dql 1 on an
// H200), and runs the two ops elsewhere; `index_outputs.workspace` and `outputs.workspace` may be
// one buffer of decode_workspace_bytes(...). With `options.checked` it runs the two checked ops.
void sparse_decode_step(const Config& config, const TensorView& index_q,
                        const IndexCacheView& index_cache, const TensorView& q,
                        const KvCacheView& kv_cache, const DecodeBatch& batch,
                        const IndexOutputs& index_outputs, const AttentionOutputs& outputs,
                        const OpOptions& options = {});

// Whether every row of a batch whose requests hold at most `max_seq_len` tokens each (prefix
// included) selects all of its visible blocks: ceil(max_seq_len / sparse_block_size) <=
// sparse_topk_blocks, spec section 5's full coverage. Then dense_attention writes exactly the rows
// the indexer and the sparse attention would, without the indexer's scoring and selection, which
// a caller can skip (the index-K still goes into the side cache for later steps); `flashmsa run`
// says so in its fidelity report. Longer contexts: the sparse path, faster than this library's
// dense attention at every measured shape (docs/performance.md).
bool selects_every_block(const Config& config, std::int64_t max_seq_len);

// Causal GQA attention over every visible key of the same paged cache: the cross-check that
// sparse attention with full coverage must equal, and the dense baseline.
void dense_attention(const Config& config, const TensorView& q, const KvCacheView& kv_cache,
                     const PrefillBatch& batch, const AttentionOutputs& outputs,
                     const OpOptions& options = {});

}  // namespace flashmsa
