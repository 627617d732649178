#include "flashmsa/config.hpp"

#include <cmath>
#include <sstream>

#include "flashmsa/error.hpp"

namespace flashmsa {

std::string_view to_string(TopkOrder order) noexcept {
  switch (order) {
    case TopkOrder::kAscending: return "ascending";
    case TopkOrder::kScoreDesc: return "score_desc";
    case TopkOrder::kLocalLast: return "local_last";
  }
  return "unknown";
}

std::optional<TopkOrder> parse_topk_order(std::string_view name) noexcept {
  for (TopkOrder order : {TopkOrder::kAscending, TopkOrder::kScoreDesc, TopkOrder::kLocalLast}) {
    if (to_string(order) == name) return order;
  }
  return std::nullopt;
}

std::string ConfigProblem::to_string() const {
  return detail::concat(field, " must be ", rule, ", got ", value);
}

ResolvedHeads Config::resolve_heads(const ModelHeads& model) const {
  const int q =
      num_attention_heads.value_or(model.num_attention_heads.value_or(kDefaultNumAttentionHeads));
  const int kv = num_key_value_heads.value_or(model.num_key_value_heads.value_or(q));
  return {q, kv};
}

void Config::set_index_cache_dtype(DType dtype) {
  index_cache_dtype = dtype;
  if (dtype == DType::kFp8E4m3) {
    indexer_kv_dtype = "fp8";
    implementation = "msa";
  } else {
    indexer_kv_dtype = "bf16";
  }
}

float Config::resolved_softmax_scale() const {
  return softmax_scale.value_or(1.0f / std::sqrt(static_cast<float>(head_dim)));
}

namespace {

bool is_power_of_two(int v) {
  return v > 0 && (v & (v - 1)) == 0;
}

std::string quoted(const std::string& s) {
  return detail::concat('"', s, '"');
}

// Collects problems; each rule is one line in validate().
class Findings {
 public:
  template <class V>
  void require(bool ok, std::string field, const V& value, std::string rule) {
    if (!ok) problems_.push_back({std::move(field), detail::concat(value), std::move(rule)});
  }
  std::vector<ConfigProblem> take() { return std::move(problems_); }

 private:
  std::vector<ConfigProblem> problems_;
};

bool finite_positive(double v) {
  return std::isfinite(v) && v > 0.0;
}

}  // namespace

std::vector<ConfigProblem> Config::validate(const ModelHeads& model) const {
  Findings f;
  f.require(algorithm == "minimax_m3", "algorithm", quoted(algorithm), "\"minimax_m3\"");
  f.require(sparse_num_index_heads > 0, "sparse_num_index_heads", sparse_num_index_heads, "> 0");
  f.require(sparse_index_dim > 0, "sparse_index_dim", sparse_index_dim, "> 0");
  f.require(is_power_of_two(sparse_block_size), "sparse_block_size", sparse_block_size,
            "a power of two (128 is the fast path)");
  f.require(sparse_topk_blocks > 0, "sparse_topk_blocks", sparse_topk_blocks, "> 0");
  f.require(sparse_init_blocks >= 0, "sparse_init_blocks", sparse_init_blocks, ">= 0");
  f.require(sparse_local_blocks >= 0, "sparse_local_blocks", sparse_local_blocks, ">= 0");
  f.require(sparse_init_blocks + sparse_local_blocks <= sparse_topk_blocks,
            "sparse_init_blocks + sparse_local_blocks", sparse_init_blocks + sparse_local_blocks,
            detail::concat("<= sparse_topk_blocks (", sparse_topk_blocks, ")"));
  f.require(sparse_score_type == "max", "sparse_score_type", quoted(sparse_score_type),
            "\"max\" (the only block score MiniMax-M3 defines)");
  f.require(sparse_disable_index_value, "sparse_disable_index_value", "false",
            "true (the index value branch is not supported)");
  const bool fp8_indexer = indexer_kv_dtype == "fp8";
  f.require(fp8_indexer || indexer_kv_dtype == "bf16", "indexer_kv_dtype", quoted(indexer_kv_dtype),
            "\"bf16\" or \"fp8\"");
  const bool msa = implementation == "msa";
  f.require(msa || implementation == "triton", "implementation", quoted(implementation),
            "\"triton\" or \"msa\"");
  // TensorRT-LLM's dependencies between the fp8 indexer, the fused projection and "msa".
  f.require(!fp8_indexer || msa, "implementation", quoted(implementation),
            "\"msa\" when indexer_kv_dtype is \"fp8\"");
  f.require(!msa || sparse_block_size == 128, "sparse_block_size", sparse_block_size,
            "128 when implementation is \"msa\"");
  if (fuse_qkv_index_projection) {
    f.require(msa, "implementation", quoted(implementation),
              "\"msa\" when fuse_qkv_index_projection is true");
    f.require(fp8_indexer, "indexer_kv_dtype", quoted(indexer_kv_dtype),
              "\"fp8\" when fuse_qkv_index_projection is true");
    f.require(kv_cache_dtype == DType::kFp8E4m3, "kv_cache_dtype", to_string(kv_cache_dtype),
              "fp8_e4m3 when fuse_qkv_index_projection is true");
  }

  const ResolvedHeads heads = resolve_heads(model);
  f.require(heads.num_attention_heads > 0, "num_attention_heads", heads.num_attention_heads, "> 0");
  f.require(heads.num_key_value_heads > 0, "num_key_value_heads", heads.num_key_value_heads, "> 0");
  if (heads.num_attention_heads > 0 && heads.num_key_value_heads > 0) {
    f.require(
        heads.num_attention_heads % heads.num_key_value_heads == 0, "num_attention_heads",
        heads.num_attention_heads,
        detail::concat("a multiple of num_key_value_heads (", heads.num_key_value_heads, ")"));
    f.require(
        sparse_num_index_heads <= 0 || sparse_num_index_heads % heads.num_key_value_heads == 0,
        "sparse_num_index_heads", sparse_num_index_heads,
        detail::concat("equal to or a multiple of num_key_value_heads (", heads.num_key_value_heads,
                       ")"));
  }

  f.require(head_dim > 0 && head_dim % 2 == 0, "head_dim", head_dim, "even and > 0");
  f.require(sparse_index_dim <= 0 || sparse_index_dim % 2 == 0, "sparse_index_dim",
            sparse_index_dim, "even");
  f.require(
      rope_dim >= 0 && rope_dim % 2 == 0 && rope_dim <= head_dim && rope_dim <= sparse_index_dim,
      "rope_dim", rope_dim,
      detail::concat("even, >= 0 and <= head_dim (", head_dim, ") and sparse_index_dim (",
                     sparse_index_dim, ")"));
  const bool kv_dtype_ok = kv_cache_dtype == DType::kBf16 || kv_cache_dtype == DType::kFp16 ||
                           kv_cache_dtype == DType::kFp8E4m3 || kv_cache_dtype == DType::kFp8E5m2 ||
                           kv_cache_dtype == DType::kNvfp4;
  f.require(kv_dtype_ok, "kv_cache_dtype", to_string(kv_cache_dtype),
            "one of bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4");
  const bool index_dtype_ok = index_cache_dtype == DType::kBf16 ||
                              index_cache_dtype == DType::kFp8E4m3 ||
                              index_cache_dtype == DType::kNvfp4;
  f.require(index_dtype_ok, "index_cache_dtype", to_string(index_cache_dtype),
            "one of bf16, fp8_e4m3, nvfp4");
  if (index_dtype_ok) {
    // The fp8 indexer scores E4M3 keys; the bf16 indexer reads bf16 or dequantized NVFP4 keys.
    f.require(fp8_indexer == (index_cache_dtype == DType::kFp8E4m3), "index_cache_dtype",
              to_string(index_cache_dtype),
              fp8_indexer ? "fp8_e4m3 when indexer_kv_dtype is \"fp8\""
                          : "bf16 or nvfp4 when indexer_kv_dtype is \"bf16\"");
  }
  f.require(kv_cache_dtype != DType::kNvfp4 || head_dim % 16 == 0, "head_dim", head_dim,
            "a multiple of 16 for an nvfp4 kv cache");
  f.require(index_cache_dtype != DType::kNvfp4 || sparse_index_dim % 16 == 0, "sparse_index_dim",
            sparse_index_dim, "a multiple of 16 for an nvfp4 index cache");
  if (softmax_scale) {
    f.require(finite_positive(*softmax_scale), "softmax_scale", *softmax_scale, "finite and > 0");
  }
  f.require(finite_positive(rope_theta), "rope_theta", rope_theta, "finite and > 0");
  f.require(finite_positive(rms_norm_eps), "rms_norm_eps", rms_norm_eps, "finite and > 0");
  f.require(parse_topk_order(to_string(topk_order)).has_value(), "topk_order",
            static_cast<int>(topk_order), "ascending, score_desc or local_last");
  return f.take();
}

void Config::check(const ModelHeads& model) const {
  const std::vector<ConfigProblem> problems = validate(model);
  if (problems.empty()) return;
  std::ostringstream message;
  message << "invalid flashmsa::Config (" << problems.size() << " problem"
          << (problems.size() == 1 ? "" : "s") << "):";
  for (const ConfigProblem& p : problems) message << "\n  - " << p.to_string();
  throw Error(ErrorKind::kInvalidArgument, message.str());
}

TensorParallelRank Config::for_tensor_parallel(int tp_size, int rank,
                                               const ModelHeads& model) const {
  check(model);
  FLASHMSA_CHECK_ARG(tp_size > 0, "tp_size must be > 0, got ", tp_size);
  FLASHMSA_CHECK_ARG(rank >= 0 && rank < tp_size, "rank must be in [0, tp_size=", tp_size,
                     "), got ", rank);
  const ResolvedHeads heads = resolve_heads(model);
  const int q = heads.num_attention_heads;
  const int kv = heads.num_key_value_heads;
  FLASHMSA_CHECK_ARG(q % tp_size == 0, "tp_size must divide num_attention_heads (", q,
                     ") so q heads split evenly, got tp_size ", tp_size);
  int kv_per_rank;
  int first_kv;
  if (kv >= tp_size) {
    FLASHMSA_CHECK_ARG(kv % tp_size == 0, "tp_size must divide num_key_value_heads (", kv,
                       ") when tp_size <= num_key_value_heads, got tp_size ", tp_size);
    kv_per_rank = kv / tp_size;
    first_kv = rank * kv_per_rank;
  } else {
    // Replicated kv heads: each must serve the same number of ranks.
    FLASHMSA_CHECK_ARG(tp_size % kv == 0, "num_key_value_heads (", kv,
                       ") must divide tp_size when tp_size > num_key_value_heads, got tp_size ",
                       tp_size);
    kv_per_rank = 1;
    first_kv = rank / (tp_size / kv);
  }
  const int index_per_kv = sparse_num_index_heads / kv;
  TensorParallelRank out{*this, rank * (q / tp_size), first_kv, first_kv * index_per_kv};
  out.config.num_attention_heads = q / tp_size;
  out.config.num_key_value_heads = kv_per_rank;
  out.config.sparse_num_index_heads = kv_per_rank * index_per_kv;
  return out;
}

}  // namespace flashmsa
