#include "flashmsa/backend.hpp"

#include <algorithm>
#include <sstream>

#include "flashmsa/error.hpp"
#include "flashmsa/metadata.hpp"
#include "src/cpu/gemm.hpp"
#include "src/cpu/thread_pool.hpp"
#include "src/cuda/device_info.hpp"

namespace flashmsa {

std::string_view to_string(Backend backend) noexcept {
  switch (backend) {
    case Backend::kCpu: return "cpu";
    case Backend::kCudaSm90: return "cuda_sm90";
  }
  return "unknown";
}

std::optional<Backend> parse_backend(std::string_view name) noexcept {
  for (Backend b : {Backend::kCpu, Backend::kCudaSm90}) {
    if (to_string(b) == name) return b;
  }
  return std::nullopt;
}

const BackendCapabilities& capabilities(Backend backend) noexcept {
  static const BackendCapabilities kCpu = [] {
    BackendCapabilities caps;
    caps.kv_cache_dtypes = {DType::kBf16, DType::kFp16, DType::kFp8E4m3, DType::kFp8E5m2,
                            DType::kNvfp4};
    caps.index_cache_dtypes = {DType::kBf16, DType::kFp8E4m3, DType::kNvfp4};
    caps.max_topk_blocks = 1024;  // bounds the per-row selection scratch, not a kernel shape
    caps.max_decode_query_len = kMaxDecodeQueryLen;
    return caps;
  }();
  // The Hopper kernels are specialised for the MiniMax-M3 shapes.
  static const BackendCapabilities kCudaSm90 = [] {
    BackendCapabilities caps = kCpu;
    caps.block_sizes = {128};
    caps.head_dims = {128};
    caps.index_dims = {128};
    caps.max_topk_blocks = 64;          // the top-k and attention kernels' row arrays
    caps.max_q_heads_per_kv_head = 16;  // one kv head's q heads are the 16 MMA rows
    caps.max_table_blocks = 32768;      // one row's block keys in the top-k CTA's shared memory
    return caps;
  }();
  return backend == Backend::kCudaSm90 ? kCudaSm90 : kCpu;
}

std::string capabilities_string(Backend backend) {
  const BackendCapabilities& c = capabilities(backend);
  auto dtypes = [](const std::vector<DType>& list) {
    std::string s;
    for (DType d : list) s += (s.empty() ? "" : ", ") + std::string(to_string(d));
    return s;
  };
  auto ints = [](const auto& list) {
    std::string s;
    for (auto v : list) s += (s.empty() ? "" : ", ") + std::to_string(v);
    return s.empty() ? std::string("any") : s;
  };
  auto limit = [](std::int64_t v) { return v > 0 ? std::to_string(v) : std::string("none"); };
  std::ostringstream out;
  out << "kv_cache_dtype: " << dtypes(c.kv_cache_dtypes) << "\n"
      << "index_cache_dtype: " << dtypes(c.index_cache_dtypes) << "\n"
      << "sparse_block_size: " << (c.block_sizes.empty() ? "any power of two" : ints(c.block_sizes))
      << "\n"
      << "head_dim: " << (c.head_dims.empty() ? "any even" : ints(c.head_dims)) << "\n"
      << "sparse_index_dim: " << (c.index_dims.empty() ? "any even" : ints(c.index_dims)) << "\n"
      << "sparse_topk_blocks: <= " << limit(c.max_topk_blocks) << "\n"
      << "q heads per kv head: <= " << limit(c.max_q_heads_per_kv_head) << "\n"
      << "decode_query_len: 1..." << c.max_decode_query_len << "\n"
      << "block_table columns: <= " << limit(c.max_table_blocks) << "\n";
  return out.str();
}

int cpu_worker_threads(int requested) noexcept {
  const int all = cpu::hardware_threads();
  return requested > 0 ? std::min(requested, all) : all;
}

const char* cpu_matrix_library() noexcept {
  return cpu::gemm_library();
}

bool backend_compiled(Backend backend) noexcept {
  return backend == Backend::kCpu || cuda::compiled_with_cuda();
}

std::optional<std::string> backend_unavailable_reason(Backend backend) {
  if (backend == Backend::kCpu) return std::nullopt;
  if (!cuda::compiled_with_cuda()) {
    return "this FlashMSA build has no CUDA backend (configured with FLASHMSA_ENABLE_CUDA=OFF "
           "or without a CUDA toolkit)";
  }
  return cuda::sm90_device_unavailable_reason();
}

namespace {

template <class T>
bool allowed(const std::vector<T>& list, const T& value) {
  return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
}

template <class T>
std::string list_string(const std::vector<T>& list) {
  std::ostringstream out;
  for (size_t i = 0; i < list.size(); ++i) {
    if (i) out << ", ";
    if constexpr (std::is_same_v<T, DType>) {
      out << to_string(list[i]);
    } else {
      out << list[i];
    }
  }
  return out.str();
}

}  // namespace

std::optional<std::string> unsupported_reason(const Config& config, Backend backend,
                                              const ModelHeads& model) {
  const std::vector<ConfigProblem> problems = config.validate(model);
  if (!problems.empty()) {
    std::string reason = "invalid config: " + problems.front().to_string();
    if (problems.size() > 1) reason += detail::concat(" (and ", problems.size() - 1, " more)");
    return reason;
  }
  const BackendCapabilities& caps = capabilities(backend);
  const std::string name(to_string(backend));
  const ResolvedHeads heads = config.resolve_heads(model);
  if (!allowed(caps.kv_cache_dtypes, config.kv_cache_dtype)) {
    return detail::concat(name, " supports kv_cache_dtype ", list_string(caps.kv_cache_dtypes),
                          ", got ", to_string(config.kv_cache_dtype));
  }
  if (!allowed(caps.index_cache_dtypes, config.index_cache_dtype)) {
    return detail::concat(name, " supports index_cache_dtype ",
                          list_string(caps.index_cache_dtypes), ", got ",
                          to_string(config.index_cache_dtype));
  }
  if (!allowed(caps.block_sizes, config.sparse_block_size)) {
    return detail::concat(name, " supports sparse_block_size ", list_string(caps.block_sizes),
                          ", got ", config.sparse_block_size);
  }
  if (!allowed(caps.head_dims, config.head_dim)) {
    return detail::concat(name, " supports head_dim ", list_string(caps.head_dims), ", got ",
                          config.head_dim);
  }
  if (!allowed(caps.index_dims, config.sparse_index_dim)) {
    return detail::concat(name, " supports sparse_index_dim ", list_string(caps.index_dims),
                          ", got ", config.sparse_index_dim);
  }
  if (caps.max_topk_blocks > 0 && config.sparse_topk_blocks > caps.max_topk_blocks) {
    return detail::concat(name, " supports sparse_topk_blocks <= ", caps.max_topk_blocks, ", got ",
                          config.sparse_topk_blocks);
  }
  const int group = heads.num_attention_heads / heads.num_key_value_heads;
  if (caps.max_q_heads_per_kv_head > 0 && group > caps.max_q_heads_per_kv_head) {
    return detail::concat(name, " supports <= ", caps.max_q_heads_per_kv_head,
                          " q heads per kv head, got ", group);
  }
  return backend_unavailable_reason(backend);
}

}  // namespace flashmsa
