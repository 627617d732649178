// The backends that execute FlashMSA's operations, what each declares it supports, and why a
// backend cannot serve a given layer. There is no silent fallback: an op asked to run on a
// backend that cannot serve its config throws Error(kUnsupported) with this reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashmsa/config.hpp"
#include "flashmsa/dtype.hpp"

namespace flashmsa {

enum class Backend {
  kCpu,       // plain C++, multithreaded; also the oracle every other backend is tested against
  kCudaSm90,  // CUDA kernels for Hopper (sm_90a: H100, H200)
};
std::string_view to_string(Backend backend) noexcept;  // "cpu", "cuda_sm90"
std::optional<Backend> parse_backend(std::string_view name) noexcept;

// What a backend's kernels accept: the one table of limits per backend, read by
// unsupported_reason (config values), the ops' argument checks (batch shapes), the `flashmsa`
// command and the docs. An empty list means "any value the config allows"; a 0 limit, none.
struct BackendCapabilities {
  std::vector<DType> kv_cache_dtypes;
  std::vector<DType> index_cache_dtypes;
  std::vector<int> block_sizes;
  std::vector<int> head_dims;
  std::vector<int> index_dims;
  int max_topk_blocks = 0;            // sparse_topk_blocks
  int max_q_heads_per_kv_head = 0;    // GQA group size
  int max_decode_query_len = 0;       // 1 + speculative tokens (DecodeBatch::decode_query_len)
  std::int64_t max_table_blocks = 0;  // block_table columns (logical blocks per request)
};
const BackendCapabilities& capabilities(Backend backend) noexcept;
// The table as text, one "name: value" line per limit (for `flashmsa info` and the docs).
std::string capabilities_string(Backend backend);

// Whether this build contains the backend, and (for CUDA) whether a suitable device is visible.
bool backend_compiled(Backend backend) noexcept;
std::optional<std::string> backend_unavailable_reason(Backend backend);

// The CPU backend's worker threads for a request of `requested` (0: one per core), and which
// library does its matrix products.
int cpu_worker_threads(int requested = 0) noexcept;
const char* cpu_matrix_library() noexcept;

// Why `backend` cannot serve `config` (invalid config, capability not declared, backend not built
// or no device); std::nullopt when it can.
std::optional<std::string> unsupported_reason(const Config& config, Backend backend,
                                              const ModelHeads& model = {});

}  // namespace flashmsa
