// Host-side validation of every operation's arguments, then dispatch to the backend.
#include "flashmsa/ops.hpp"

#include <algorithm>
#include <climits>
#include <vector>

#include "flashmsa/backend.hpp"
#include "flashmsa/error.hpp"
#include "flashmsa/formats.hpp"
#include "flashmsa/metadata.hpp"
#include "src/attention_workspace.hpp"
#include "src/cpu/cpu_ops.hpp"
#include "src/cpu/sparse_ops.hpp"
#include "src/cuda/cuda_ops.hpp"
#include "src/index_workspace.hpp"

namespace flashmsa {
namespace {

constexpr std::initializer_list<DType> kActivationDtypes{DType::kBf16, DType::kFp16, DType::kFp32};

// The checked mode reads device values on the host: a copy, after one synchronisation.
struct HostTensor {
  std::vector<std::byte> bytes;
  TensorView view;
  HostTensor(const TensorView& t, void* stream) : view(t) {
    if (t.device == Device::kCuda) {
      bytes = cuda::copy_to_host(t, stream);
      view.data = bytes.data();
      view.device = Device::kCpu;
    }
  }
};

// The checked mode: the first slot at or beyond the capacity is an error (negative slots mean
// "do not write" and are fine).
void check_slot_values(const TensorView& device_slots, std::int64_t capacity, const char* name,
                       void* stream) {
  const HostTensor host(device_slots, stream);
  const TensorView& slots = host.view;
  for (std::int64_t t = 0; t < slots.shape[0]; ++t) {
    const std::int64_t s = slots.integer_at(t);
    FLASHMSA_CHECK_ARG(s < capacity, name, "[", t, "] = ", s, " is beyond the cache capacity of ",
                       capacity, " slots");
  }
}

// The checked mode: positions (the RoPE angles' index) must be token positions, [0, 2^31).
void check_position_values(const TensorView& device_positions, void* stream) {
  const HostTensor host(device_positions, stream);
  for (std::int64_t t = 0; t < host.view.shape[0]; ++t) {
    const std::int64_t p = host.view.integer_at(t);
    FLASHMSA_CHECK_ARG(p >= 0 && p <= INT32_MAX, "positions[", t, "] = ", p,
                       " is not a token position in [0, 2^31)");
  }
}

}  // namespace

void insert_kv(const KvCacheView& cache, const TensorView& k, const TensorView& v,
               const TensorView& slot_mapping, const OpOptions& options) {
  cache.validate();
  const std::int64_t h = cache.shape.num_kv_heads, d = cache.shape.head_dim;
  check_tensor(k, "k", kActivationDtypes, cache.device, {-1, h, d});
  const std::int64_t num_tokens = k.shape[0];
  check_tensor(v, "v", kActivationDtypes, cache.device, {num_tokens, h, d});
  check_tensor(slot_mapping, "slot_mapping", DType::kInt64, cache.device, {num_tokens});
  if (options.checked)
    check_slot_values(slot_mapping, cache.capacity_tokens(), "slot_mapping", options.stream);
  if (cache.device == Device::kCuda) {
    cuda::insert_kv(cache, k, v, slot_mapping, options.stream);
    return;
  }
  cpu::insert_kv(cache, k, v, slot_mapping);
}

void insert_index_k(const IndexCacheView& cache, const TensorView& index_k,
                    const TensorView& slot_mapping, const OpOptions& options) {
  cache.validate();
  check_tensor(index_k, "index_k", kActivationDtypes, cache.device, {-1, cache.index_dim});
  check_tensor(slot_mapping, "slot_mapping", DType::kInt64, cache.device, {index_k.shape[0]});
  if (options.checked)
    check_slot_values(slot_mapping, cache.capacity_tokens(), "slot_mapping", options.stream);
  if (cache.device == Device::kCuda) {
    cuda::insert_index_k(cache, index_k, slot_mapping, options.stream);
    return;
  }
  cpu::insert_index_k(cache, index_k, slot_mapping);
}

void produce_qkv_index(const Config& config, const ProducerInputs& in, const KvCacheView& kv_cache,
                       const IndexCacheView& index_cache, const ProducerOutputs& out,
                       const OpOptions& options) {
  config.check();
  kv_cache.validate();
  index_cache.validate();
  const ResolvedHeads heads = config.resolve_heads();
  const std::int64_t hq = heads.num_attention_heads, hkv = heads.num_key_value_heads;
  const std::int64_t hidx = config.sparse_num_index_heads;
  const std::int64_t d = config.head_dim, di = config.sparse_index_dim;
  const Device device = kv_cache.device;

  FLASHMSA_CHECK_ARG(kv_cache.dtype == config.kv_cache_dtype, "kv_cache.dtype must be ",
                     to_string(config.kv_cache_dtype), " (config.kv_cache_dtype), got ",
                     to_string(kv_cache.dtype));
  FLASHMSA_CHECK_ARG(kv_cache.shape.num_kv_heads == hkv && kv_cache.shape.head_dim == d &&
                         kv_cache.shape.page_size == config.sparse_block_size,
                     "kv_cache must have ", hkv, " kv heads, head_dim ", d, " and page_size ",
                     config.sparse_block_size, " as the config says, got ",
                     kv_cache.shape.num_kv_heads, ", ", kv_cache.shape.head_dim, " and ",
                     kv_cache.shape.page_size);
  FLASHMSA_CHECK_ARG(index_cache.dtype == config.index_cache_dtype, "index_cache.dtype must be ",
                     to_string(config.index_cache_dtype), " (config.index_cache_dtype), got ",
                     to_string(index_cache.dtype));
  FLASHMSA_CHECK_ARG(
      index_cache.index_dim == di && index_cache.page_size == config.sparse_block_size,
      "index_cache must have index_dim ", di, " and page_size ", config.sparse_block_size, ", got ",
      index_cache.index_dim, " and ", index_cache.page_size);
  FLASHMSA_CHECK_ARG(index_cache.device == device, "index_cache must be on ", to_string(device),
                     " like kv_cache, got ", to_string(index_cache.device));

  const std::int64_t width = hq * d + 2 * hkv * d + hidx * di + di;
  check_tensor(in.qkv_index, "qkv_index", kActivationDtypes, device, {-1, width});
  const std::int64_t num_tokens = in.qkv_index.shape[0];
  check_tensor(in.q_norm_weight, "q_norm_weight", {DType::kBf16, DType::kFp32}, device, {d});
  check_tensor(in.k_norm_weight, "k_norm_weight", {DType::kBf16, DType::kFp32}, device, {d});
  check_tensor(in.index_q_norm_weight, "index_q_norm_weight", {DType::kBf16, DType::kFp32}, device,
               {di});
  check_tensor(in.index_k_norm_weight, "index_k_norm_weight", {DType::kBf16, DType::kFp32}, device,
               {di});
  check_tensor(in.positions, "positions", {DType::kInt32, DType::kInt64}, device, {num_tokens});
  check_tensor(in.slot_mapping, "slot_mapping", DType::kInt64, device, {num_tokens});
  const bool own_index_slots = in.index_slot_mapping.data != nullptr;
  if (own_index_slots) {
    check_tensor(in.index_slot_mapping, "index_slot_mapping", DType::kInt64, device, {num_tokens});
  }
  check_output_tensor(out.q, "q", {DType::kBf16, DType::kFp16}, device, {num_tokens, hq, d});
  if (config.indexer_kv_dtype == "fp8") {
    check_output_tensor(out.index_q, "index_q", DType::kFp8E4m3, device, {num_tokens, hidx, di});
  } else {
    check_output_tensor(out.index_q, "index_q", {DType::kBf16, DType::kFp16}, device,
                        {num_tokens, hidx, di});
  }
  if (options.checked) {
    check_position_values(in.positions, options.stream);
    check_slot_values(in.slot_mapping, kv_cache.capacity_tokens(), "slot_mapping", options.stream);
    check_slot_values(
        own_index_slots ? in.index_slot_mapping : in.slot_mapping, index_cache.capacity_tokens(),
        own_index_slots ? "index_slot_mapping" : "slot_mapping (index cache)", options.stream);
  }
  if (device == Device::kCuda) {
    cuda::produce_qkv_index(config, in, kv_cache, index_cache, out, options.stream);
    return;
  }
  cpu::produce_qkv_index(config, in, kv_cache, index_cache, out, options.num_threads);
}

}  // namespace flashmsa

// ---- Indexer and attention ----------------------------------------------------------------

namespace flashmsa {
namespace {

struct Shapes {
  std::int64_t hq, hkv, hidx, d, di, block;
};

Backend backend_of(Device device) {
  return device == Device::kCuda ? Backend::kCudaSm90 : Backend::kCpu;
}

// The config, checked against the backend that the tensors' device selects.
Shapes checked_config(const Config& config, Device device) {
  config.check();
  const Backend backend = backend_of(device);
  if (auto reason = unsupported_reason(config, backend)) {
    throw Error(ErrorKind::kUnsupported, *reason);
  }
  const ResolvedHeads h = config.resolve_heads();
  return {h.num_attention_heads, h.num_key_value_heads,   config.sparse_num_index_heads,
          config.head_dim,       config.sparse_index_dim, config.sparse_block_size};
}

void check_block_table(const TensorView& table, Device device, std::int64_t num_requests) {
  check_tensor(table, "batch.block_table", DType::kInt32, device, {num_requests, -1});
  const std::int64_t limit = capabilities(backend_of(device)).max_table_blocks;
  FLASHMSA_CHECK_SUPPORTED(limit == 0 || table.shape[1] <= limit, "batch.block_table: the ",
                           to_string(backend_of(device)), " backend takes up to ", limit,
                           " blocks per request (columns), got ", table.shape[1]);
}

// Validates a batch's arrays; returns B.
std::int64_t check_prefill_batch(const PrefillBatch& b, Device device) {
  check_tensor(b.seq_lens, "batch.seq_lens", DType::kInt32, device, {-1});
  const std::int64_t num_requests = b.seq_lens.shape[0];
  check_tensor(b.cu_seqlens_q, "batch.cu_seqlens_q", DType::kInt32, device, {num_requests + 1});
  check_block_table(b.block_table, device, num_requests);
  return num_requests;
}

std::int64_t check_decode_batch(const DecodeBatch& b, Device device, std::int64_t num_rows) {
  const int max_dql = capabilities(backend_of(device)).max_decode_query_len;
  FLASHMSA_CHECK_ARG(b.decode_query_len >= 1 && b.decode_query_len <= max_dql,
                     "batch.decode_query_len must be in [1, ", max_dql, "], got ",
                     b.decode_query_len);
  check_tensor(b.seq_lens, "batch.seq_lens", DType::kInt32, device, {-1});
  const std::int64_t num_requests = b.seq_lens.shape[0];
  check_block_table(b.block_table, device, num_requests);
  FLASHMSA_CHECK_ARG(num_rows == num_requests * b.decode_query_len,
                     "decode rows must number batch size x decode_query_len (", num_requests, " x ",
                     b.decode_query_len, " = ", num_requests * b.decode_query_len, "), got ",
                     num_rows);
  return num_requests;
}

// cu_seqlens_q splits the rows among the requests: it starts at 0, never decreases and ends at
// the row count. The checked mode checks it; on host tensors every call does (it costs nothing).
void check_cu_seqlens(const TensorView& cu_seqlens, std::int64_t num_rows) {
  const auto* cu = cu_seqlens.as<const std::int32_t>();
  const std::int64_t n = cu_seqlens.shape[0];
  const std::int64_t stride = cu_seqlens.stride[0];
  FLASHMSA_CHECK_ARG(cu[0] == 0, "batch.cu_seqlens_q[0] must be 0, got ", cu[0]);
  for (std::int64_t r = 1; r < n; ++r) {
    FLASHMSA_CHECK_ARG(cu[r * stride] >= cu[(r - 1) * stride],
                       "batch.cu_seqlens_q must be non-decreasing, entry ", r, " is ",
                       cu[r * stride]);
  }
  FLASHMSA_CHECK_ARG(cu[(n - 1) * stride] == num_rows,
                     "batch.cu_seqlens_q[B] must equal the number of rows ", num_rows, ", got ",
                     cu[(n - 1) * stride]);
}

// The checked mode's view of a batch: every device value consistent, or the first bad entry.
// `prefill`: rows are a prefill batch's (whose rows must all be real positions).
void check_plan_values(const cpu::RowPlan& plan, bool prefill) {
  for (std::int64_t r = 0; r < plan.num_requests(); ++r) {
    std::int64_t p_max = -1;
    for (std::int64_t t = plan.row_begin[r]; t < plan.row_end[r]; ++t) {
      p_max = std::max(p_max, plan.position[t]);
      FLASHMSA_CHECK_ARG(!prefill || plan.position[t] >= 0, "request ", r,
                         ": seq_lens is smaller than its query rows");
    }
    FLASHMSA_CHECK_ARG(plan.needed_blocks(p_max) <= plan.max_blocks, "batch.seq_lens[", r,
                       "] reaches position ", p_max, ", which needs ", plan.needed_blocks(p_max),
                       " blocks, but batch.block_table has ", plan.max_blocks, " columns");
    for (std::int64_t b = 0; b < plan.visible_blocks(p_max); ++b) {
      FLASHMSA_CHECK_ARG(
          plan.page(r, b) >= 0, "batch.block_table[", r, "][", b, "] must be a page in [0, ",
          plan.num_pages, ") for a visible block, got ",
          b < plan.max_blocks ? plan.block_table[r * plan.table_row_stride + b] : -1);
    }
  }
}

// Host copies of a batch's arrays for the checked mode.
struct HostBatch {
  HostTensor cu_seqlens, seq_lens, block_table;
  PrefillBatch prefill;
  DecodeBatch decode;
  HostBatch(const PrefillBatch& b, void* stream)
      : cu_seqlens(b.cu_seqlens_q, stream),
        seq_lens(b.seq_lens, stream),
        block_table(b.block_table, stream),
        prefill{cu_seqlens.view, seq_lens.view, block_table.view} {}
  HostBatch(const DecodeBatch& b, void* stream)
      : cu_seqlens(TensorView{}, stream),
        seq_lens(b.seq_lens, stream),
        block_table(b.block_table, stream),
        decode{seq_lens.view, block_table.view, b.decode_query_len} {}
};

void check_index_args(const Config& config, const Shapes& s, const TensorView& index_q,
                      const IndexCacheView& cache, const IndexOutputs& out) {
  cache.validate();
  FLASHMSA_CHECK_ARG(cache.dtype == config.index_cache_dtype, "index_cache.dtype must be ",
                     to_string(config.index_cache_dtype), " (config.index_cache_dtype), got ",
                     to_string(cache.dtype));
  FLASHMSA_CHECK_ARG(cache.index_dim == s.di && cache.page_size == s.block,
                     "index_cache must have index_dim ", s.di, " and page_size ", s.block, ", got ",
                     cache.index_dim, " and ", cache.page_size);
  if (config.indexer_kv_dtype == "fp8") {
    check_tensor(index_q, "index_q", DType::kFp8E4m3, cache.device, {-1, s.hidx, s.di});
  } else {
    check_tensor(index_q, "index_q", {DType::kBf16, DType::kFp16}, cache.device,
                 {-1, s.hidx, s.di});
  }
  const std::int64_t rows = index_q.shape[0];
  check_output_tensor(out.topk, "topk", DType::kInt32, cache.device,
                      {s.hkv, rows, config.sparse_topk_blocks});
  if (out.block_scores.data) {
    check_output_tensor(out.block_scores, "block_scores", DType::kFp32, cache.device,
                        {s.hkv, rows, -1});
  }
  if (cache.device == Device::kCuda) {
    check_tensor(out.workspace, "workspace", DType::kUint8, cache.device, {-1});
  }
}

void check_attention_args(const Config& config, const Shapes& s, const TensorView& q,
                          const KvCacheView& kv, const TensorView* topk,
                          const AttentionOutputs& out, bool allow_mxfp8) {
  kv.validate();
  FLASHMSA_CHECK_ARG(kv.dtype == config.kv_cache_dtype, "kv_cache.dtype must be ",
                     to_string(config.kv_cache_dtype), " (config.kv_cache_dtype), got ",
                     to_string(kv.dtype));
  FLASHMSA_CHECK_ARG(
      kv.shape.num_kv_heads == s.hkv && kv.shape.head_dim == s.d && kv.shape.page_size == s.block,
      "kv_cache must have ", s.hkv, " kv heads, head_dim ", s.d, " and page_size ", s.block,
      ", got ", kv.shape.num_kv_heads, ", ", kv.shape.head_dim, " and ", kv.shape.page_size);
  check_tensor(q, "q", {DType::kBf16, DType::kFp16}, kv.device, {-1, s.hq, s.d});
  const std::int64_t rows = q.shape[0];
  if (topk) check_tensor(*topk, "topk", DType::kInt32, kv.device, {s.hkv, rows, -1});
  if (out.out.dtype == DType::kFp8E4m3) {
    FLASHMSA_CHECK_ARG(allow_mxfp8, "out: MXFP8 output (fp8_e4m3) is for decode only");
    const std::int64_t cols = s.hq * s.d;
    FLASHMSA_CHECK_ARG(cols % fmt::kMxfp8GroupSize == 0, "MXFP8 output needs Hq * D (", cols,
                       ") to be a multiple of 32");
    check_output_tensor(out.out, "out", DType::kFp8E4m3, kv.device, {rows, cols});
    const std::int64_t scale_cols = cols / fmt::kMxfp8GroupSize;
    if (out.mxfp8_scale_layout == fmt::ScaleLayout::kRowMajor) {
      check_output_tensor(out.mxfp8_scales, "mxfp8_scales", DType::kUint8, kv.device,
                          {rows, scale_cols});
      FLASHMSA_CHECK_ARG(rows <= 1 || out.mxfp8_scales.stride[0] == scale_cols,
                         "mxfp8_scales must be contiguous, got row stride ",
                         out.mxfp8_scales.stride[0]);
    } else {
      check_output_tensor(out.mxfp8_scales, "mxfp8_scales", DType::kUint8, kv.device,
                          {fmt::mxfp8_scale_buffer_size(rows, scale_cols, out.mxfp8_scale_layout)});
    }
  } else {
    check_output_tensor(out.out, "out", {DType::kBf16, DType::kFp16, DType::kFp32}, kv.device,
                        {rows, s.hq, s.d});
  }
  if (out.lse.data) check_output_tensor(out.lse, "lse", DType::kFp32, kv.device, {rows, s.hq});
  if (kv.device == Device::kCuda && out.workspace.data) {
    check_tensor(out.workspace, "workspace", DType::kUint8, kv.device, {-1});
  }
}

// Selection from a top-k tensor: valid ids only, each once.
cpu::BlockSelection topk_selection(const TensorView& topk) {
  return [&topk](std::int64_t h, std::int64_t t, std::int64_t nvb, std::vector<std::int32_t>& out) {
    const auto* ids = topk.as<const std::int32_t>() + h * topk.stride[0] + t * topk.stride[1];
    for (std::int64_t i = 0; i < topk.shape[2]; ++i) {
      const std::int32_t b = ids[i * topk.stride[2]];
      if (b >= 0 && b < nvb) out.push_back(b);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  };
}

void check_topk_values(const TensorView& topk, const cpu::RowPlan& plan) {
  for (std::int64_t h = 0; h < topk.shape[0]; ++h) {
    for (std::int64_t t = 0; t < topk.shape[1]; ++t) {
      const std::int64_t nvb = plan.visible_blocks(plan.position[t]);
      for (std::int64_t i = 0; i < topk.shape[2]; ++i) {
        const std::int32_t b =
            topk.as<const std::int32_t>()[h * topk.stride[0] + t * topk.stride[1] +
                                          i * topk.stride[2]];
        FLASHMSA_CHECK_ARG(b == -1 || (b >= 0 && b < nvb), "topk[", h, "][", t, "][", i, "] = ", b,
                           " is neither -1 nor a visible block (< ", nvb, ")");
      }
    }
  }
}

// The checked mode for CUDA tensors: the batch (and top-k lists) copied to the host after one
// synchronisation, then the CPU backend's checks.
void check_device_values(const PrefillBatch& batch, const TensorView* topk, std::int64_t rows,
                         std::int64_t block, std::int64_t pages, void* stream) {
  const HostBatch host(batch, stream);
  const auto plan = cpu::plan_rows(host.prefill, rows, block, pages);
  check_cu_seqlens(host.prefill.cu_seqlens_q, rows);
  check_plan_values(plan, true);
  if (topk) check_topk_values(HostTensor(*topk, stream).view, plan);
}
void check_device_values(const DecodeBatch& batch, const TensorView* topk, std::int64_t rows,
                         std::int64_t block, std::int64_t pages, void* stream) {
  const HostBatch host(batch, stream);
  const auto plan = cpu::plan_rows(host.decode, rows, block, pages);
  check_plan_values(plan, false);
  if (topk) check_topk_values(HostTensor(*topk, stream).view, plan);
}

}  // namespace

std::int64_t index_workspace_bytes(const Config& config, std::int64_t num_rows,
                                   std::int64_t num_requests, std::int64_t max_blocks) {
  return detail::index_workspace_layout(num_rows, num_requests, config.sparse_num_index_heads,
                                        max_blocks)
      .bytes;
}

std::int64_t attention_workspace_bytes(const Config&, std::int64_t, std::int64_t num_requests) {
  // Prefill's row plan; decode needs none (its splits merge inside a cluster).
  return detail::attention_prefill_layout(num_requests).bytes;
}

bool selects_every_block(const Config& config, std::int64_t max_seq_len) {
  config.check();
  FLASHMSA_CHECK_ARG(max_seq_len >= 0, "max_seq_len must be >= 0, got ", max_seq_len);
  const std::int64_t block = config.sparse_block_size;
  return (max_seq_len + block - 1) / block <= config.sparse_topk_blocks;
}

std::int64_t decode_workspace_bytes(const Config& config, std::int64_t max_requests,
                                    std::int64_t max_decode_query_len, std::int64_t max_blocks) {
  const std::int64_t rows = max_requests * max_decode_query_len;
  return std::max(index_workspace_bytes(config, rows, max_requests, max_blocks),
                  attention_workspace_bytes(config, rows, max_requests));
}

void index_prefill(const Config& config, const TensorView& index_q,
                   const IndexCacheView& index_cache, const PrefillBatch& batch,
                   const IndexOutputs& outputs, const OpOptions& options) {
  const Shapes s = checked_config(config, index_cache.device);
  check_index_args(config, s, index_q, index_cache, outputs);
  check_prefill_batch(batch, index_cache.device);
  if (index_cache.device == Device::kCuda) {
    if (options.checked) {
      check_device_values(batch, nullptr, index_q.shape[0], s.block, index_cache.num_pages,
                          options.stream);
    }
    cuda::index_prefill(config, index_q, index_cache, batch, outputs, options.stream);
    return;
  }
  check_cu_seqlens(batch.cu_seqlens_q, index_q.shape[0]);
  const auto plan = cpu::plan_rows(batch, index_q.shape[0], s.block, index_cache.num_pages);
  if (options.checked) check_plan_values(plan, true);
  cpu::index_rows(config, index_q, index_cache, plan, outputs, options.num_threads);
}

void index_decode(const Config& config, const TensorView& index_q,
                  const IndexCacheView& index_cache, const DecodeBatch& batch,
                  const IndexOutputs& outputs, const OpOptions& options) {
  const Shapes s = checked_config(config, index_cache.device);
  check_index_args(config, s, index_q, index_cache, outputs);
  check_decode_batch(batch, index_cache.device, index_q.shape[0]);
  if (index_cache.device == Device::kCuda) {
    if (options.checked) {
      check_device_values(batch, nullptr, index_q.shape[0], s.block, index_cache.num_pages,
                          options.stream);
    }
    cuda::index_decode(config, index_q, index_cache, batch, outputs, options.stream);
    return;
  }
  const auto plan = cpu::plan_rows(batch, index_q.shape[0], s.block, index_cache.num_pages);
  if (options.checked) check_plan_values(plan, false);
  cpu::index_rows(config, index_q, index_cache, plan, outputs, options.num_threads);
}

void sparse_attention_prefill(const Config& config, const TensorView& q,
                              const KvCacheView& kv_cache, const PrefillBatch& batch,
                              const TensorView& topk, const AttentionOutputs& outputs,
                              const OpOptions& options) {
  const Shapes s = checked_config(config, kv_cache.device);
  check_attention_args(config, s, q, kv_cache, &topk, outputs, false);
  check_prefill_batch(batch, kv_cache.device);
  if (kv_cache.device == Device::kCuda) {
    if (options.checked) {
      check_device_values(batch, &topk, q.shape[0], s.block, kv_cache.shape.num_pages,
                          options.stream);
    }
    cuda::sparse_attention_prefill(config, q, kv_cache, batch, topk, outputs, options.stream);
    return;
  }
  check_cu_seqlens(batch.cu_seqlens_q, q.shape[0]);
  const auto plan = cpu::plan_rows(batch, q.shape[0], s.block, kv_cache.shape.num_pages);
  if (options.checked) {
    check_plan_values(plan, true);
    check_topk_values(topk, plan);
  }
  cpu::attention_rows(config, q, kv_cache, plan, topk_selection(topk), outputs,
                      options.num_threads);
}

void sparse_attention_decode(const Config& config, const TensorView& q, const KvCacheView& kv_cache,
                             const DecodeBatch& batch, const TensorView& topk,
                             const AttentionOutputs& outputs, const OpOptions& options) {
  const Shapes s = checked_config(config, kv_cache.device);
  check_attention_args(config, s, q, kv_cache, &topk, outputs, true);
  check_decode_batch(batch, kv_cache.device, q.shape[0]);
  if (kv_cache.device == Device::kCuda) {
    if (options.checked) {
      check_device_values(batch, &topk, q.shape[0], s.block, kv_cache.shape.num_pages,
                          options.stream);
    }
    cuda::sparse_attention_decode(config, q, kv_cache, batch, topk, outputs, options.stream);
    return;
  }
  const auto plan = cpu::plan_rows(batch, q.shape[0], s.block, kv_cache.shape.num_pages);
  if (options.checked) {
    check_plan_values(plan, false);
    check_topk_values(topk, plan);
  }
  cpu::attention_rows(config, q, kv_cache, plan, topk_selection(topk), outputs,
                      options.num_threads);
}

void sparse_decode_step(const Config& config, const TensorView& index_q,
                        const IndexCacheView& index_cache, const TensorView& q,
                        const KvCacheView& kv_cache, const DecodeBatch& batch,
                        const IndexOutputs& index_outputs, const AttentionOutputs& outputs,
                        const OpOptions& options) {
  FLASHMSA_CHECK_ARG(index_cache.device == kv_cache.device,
                     "index_cache and kv_cache must be on the same device, got ",
                     to_string(index_cache.device), " and ", to_string(kv_cache.device));
  if (kv_cache.device != Device::kCuda || options.checked) {
    index_decode(config, index_q, index_cache, batch, index_outputs, options);
    sparse_attention_decode(config, q, kv_cache, batch, index_outputs.topk, outputs, options);
    return;
  }
  const Shapes s = checked_config(config, kv_cache.device);
  check_index_args(config, s, index_q, index_cache, index_outputs);
  check_attention_args(config, s, q, kv_cache, &index_outputs.topk, outputs, true);
  FLASHMSA_CHECK_ARG(index_q.shape[0] == q.shape[0], "index_q and q must hold the same rows, got ",
                     index_q.shape[0], " and ", q.shape[0]);
  check_decode_batch(batch, kv_cache.device, q.shape[0]);
  cuda::sparse_decode_step(config, index_q, index_cache, q, kv_cache, batch, index_outputs, outputs,
                           options.stream);
}

void dense_attention(const Config& config, const TensorView& q, const KvCacheView& kv_cache,
                     const PrefillBatch& batch, const AttentionOutputs& outputs,
                     const OpOptions& options) {
  const Shapes s = checked_config(config, kv_cache.device);
  check_attention_args(config, s, q, kv_cache, nullptr, outputs, false);
  check_prefill_batch(batch, kv_cache.device);
  if (kv_cache.device == Device::kCuda) {
    if (options.checked) {
      check_device_values(batch, nullptr, q.shape[0], s.block, kv_cache.shape.num_pages,
                          options.stream);
    }
    cuda::dense_attention(config, q, kv_cache, batch, outputs, options.stream);
    return;
  }
  check_cu_seqlens(batch.cu_seqlens_q, q.shape[0]);
  const auto plan = cpu::plan_rows(batch, q.shape[0], s.block, kv_cache.shape.num_pages);
  if (options.checked) check_plan_values(plan, true);
  const cpu::BlockSelection all = [](std::int64_t, std::int64_t, std::int64_t nvb,
                                     std::vector<std::int32_t>& out) {
    for (std::int64_t b = 0; b < nvb; ++b) out.push_back(static_cast<std::int32_t>(b));
  };
  cpu::attention_rows(config, q, kv_cache, plan, all, outputs, options.num_threads);
}

}  // namespace flashmsa
