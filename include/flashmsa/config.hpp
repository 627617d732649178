// The configuration of one MiniMax-M3 sparse attention layer (spec section 9).
//
// The first block of fields mirrors TensorRT-LLM's MiniMaxM3SparseAttentionConfig field by field,
// names, literal values and defaults included, so an engine can copy its config across. The
// second block holds what FlashMSA needs beyond it. Defaults are the MiniMax-M3 values.
//
//   flashmsa::Config config;                       // MiniMax-M3
//   config.kv_cache_dtype = flashmsa::DType::kFp8E4m3;
//   config.check();                                // throws one Error listing every problem
//   auto rank = config.for_tensor_parallel(8, 3);  // what rank 3 of 8 serves
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashmsa/dtype.hpp"

namespace flashmsa {

// Order of the ids within one top-k row; the chosen set is the same in all three (spec 4.5).
enum class TopkOrder {
  kAscending,  // ascending block id (TensorRT-LLM, FlashInfer); the default
  kScoreDesc,  // forced blocks first, then by descending score (vLLM Triton)
  kLocalLast,  // ascending, with the local block(s) moved to the end (MSA library)
};
std::string_view to_string(TopkOrder order) noexcept;
std::optional<TopkOrder> parse_topk_order(std::string_view name) noexcept;

// Head counts a model checkpoint declares; used when the config leaves them unset.
struct ModelHeads {
  std::optional<int> num_attention_heads;
  std::optional<int> num_key_value_heads;
};

struct ResolvedHeads {
  int num_attention_heads;
  int num_key_value_heads;
};

// One validation finding: which field, its value, and the rule it breaks.
struct ConfigProblem {
  std::string field;
  std::string value;
  std::string rule;
  std::string to_string() const;  // "<field> must be <rule>, got <value>"
};

struct TensorParallelRank;

struct Config {
  // ---- TensorRT-LLM MiniMaxM3SparseAttentionConfig ----
  std::string algorithm = "minimax_m3";
  int sparse_num_index_heads = 4;
  int sparse_index_dim = 128;
  int sparse_block_size = 128;
  int sparse_topk_blocks = 16;
  int sparse_init_blocks = 0;
  int sparse_local_blocks = 1;
  std::string sparse_score_type = "max";   // only "max"
  bool sparse_disable_index_value = true;  // the index value branch is not implemented
  std::string indexer_kv_dtype = "bf16";   // "bf16" or "fp8" (unscaled E4M3, fp32 accumulate)
  bool fuse_qkv_index_projection = false;
  // Unset means: take the model's value, then the default (64 q heads; kv heads = q heads).
  std::optional<int> num_attention_heads = 64;
  std::optional<int> num_key_value_heads = 4;
  std::string implementation = "triton";  // "triton" or "msa"; recorded for parity only

  // ---- FlashMSA ----
  int head_dim = 128;                      // D of q, k and v
  DType kv_cache_dtype = DType::kBf16;     // bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4
  DType index_cache_dtype = DType::kBf16;  // bf16, fp8_e4m3, nvfp4
  std::optional<float> softmax_scale;      // unset: 1 / sqrt(head_dim)
  int rope_dim = 64;                       // partial NeoX RoPE on dims [0, rope_dim)
  double rope_theta = 5.0e6;
  double rms_norm_eps = 1.0e-6;
  TopkOrder topk_order = TopkOrder::kAscending;

  static constexpr int kDefaultNumAttentionHeads = 64;

  // Sets index_cache_dtype together with what it implies: the fp8 indexer (indexer_kv_dtype
  // "fp8", which TensorRT-LLM allows only with implementation "msa") for fp8_e4m3, else bf16.
  void set_index_cache_dtype(DType dtype);

  bool operator==(const Config&) const = default;  // field by field

  // Config value, then the model's, then the default; kv heads fall back to the q heads.
  ResolvedHeads resolve_heads(const ModelHeads& model = {}) const;
  float resolved_softmax_scale() const;

  // Every problem at once (empty when valid). `model` feeds head-count resolution.
  std::vector<ConfigProblem> validate(const ModelHeads& model = {}) const;
  // Throws Error(kInvalidArgument) whose message lists every problem.
  void check(const ModelHeads& model = {}) const;

  // The layer as rank `rank` of `tp_size` serves it (spec section 1): q heads split evenly; kv
  // heads split when Hkv >= tp and are replicated otherwise; index heads shard like kv heads; the
  // single index-K head is on every rank. Throws Error naming the impossible split.
  TensorParallelRank for_tensor_parallel(int tp_size, int rank, const ModelHeads& model = {}) const;
};

struct TensorParallelRank {
  Config config;             // per-rank head counts, everything else unchanged
  int first_q_head = 0;      // global index of this rank's first q head
  int first_kv_head = 0;     // global index of this rank's (first) kv head
  int first_index_head = 0;  // global index of this rank's first index head
};

}  // namespace flashmsa
