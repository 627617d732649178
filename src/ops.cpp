// Host-side validation of every operation's arguments, then dispatch to the backend.
#include "flashmsa/ops.hpp"

#include "flashmsa/error.hpp"
#include "src/cpu/cpu_ops.hpp"

namespace flashmsa {
namespace {

constexpr std::initializer_list<DType> kActivationDtypes{DType::kBf16, DType::kFp16,
                                                         DType::kFp32};

void require_same_device(Device expected, const TensorView& t, const char* name) {
  FLASHMSA_CHECK_ARG(t.device == expected, name, " must be on ", to_string(expected),
                     " like the cache, got ", to_string(t.device));
}

// Host-readable int32/int64 entry i of a 1-d tensor.
std::int64_t host_index(const TensorView& t, std::int64_t i) {
  return t.dtype == DType::kInt32 ? t.as<const std::int32_t>()[i * t.stride[0]]
                                  : t.as<const std::int64_t>()[i * t.stride[0]];
}

// The checked mode: the first slot at or beyond the capacity is an error (negative slots mean
// "do not write" and are fine).
void check_slot_values(const TensorView& slots, std::int64_t capacity, const char* name) {
  FLASHMSA_CHECK_SUPPORTED(slots.device == Device::kCpu,
                           "checked mode for CUDA tensors is not implemented yet");
  for (std::int64_t t = 0; t < slots.shape[0]; ++t) {
    const std::int64_t s = host_index(slots, t);
    FLASHMSA_CHECK_ARG(s < capacity, name, "[", t, "] = ", s,
                       " is beyond the cache capacity of ", capacity, " slots");
  }
}

[[noreturn]] void cuda_not_available(const char* op) {
  throw Error(ErrorKind::kUnsupported,
              detail::concat(op, ": CUDA tensors are not supported yet (the CUDA backend of this "
                                 "operation is not implemented); use CPU tensors"));
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
  if (options.checked) check_slot_values(slot_mapping, cache.capacity_tokens(), "slot_mapping");
  if (cache.device == Device::kCuda) cuda_not_available("insert_kv");
  cpu::insert_kv(cache, k, v, slot_mapping);
}

void insert_index_k(const IndexCacheView& cache, const TensorView& index_k,
                    const TensorView& slot_mapping, const OpOptions& options) {
  cache.validate();
  check_tensor(index_k, "index_k", kActivationDtypes, cache.device, {-1, cache.index_dim});
  check_tensor(slot_mapping, "slot_mapping", DType::kInt64, cache.device, {index_k.shape[0]});
  if (options.checked) check_slot_values(slot_mapping, cache.capacity_tokens(), "slot_mapping");
  if (cache.device == Device::kCuda) cuda_not_available("insert_index_k");
  cpu::insert_index_k(cache, index_k, slot_mapping);
}

void produce_qkv_index(const Config& config, const ProducerInputs& in,
                       const KvCacheView& kv_cache, const IndexCacheView& index_cache,
                       const ProducerOutputs& out, const OpOptions& options) {
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
  FLASHMSA_CHECK_ARG(index_cache.index_dim == di &&
                         index_cache.page_size == config.sparse_block_size,
                     "index_cache must have index_dim ", di, " and page_size ",
                     config.sparse_block_size, ", got ", index_cache.index_dim, " and ",
                     index_cache.page_size);
  FLASHMSA_CHECK_ARG(index_cache.device == device, "index_cache must be on ", to_string(device),
                     " like kv_cache, got ", to_string(index_cache.device));

  const std::int64_t width = hq * d + 2 * hkv * d + hidx * di + di;
  check_tensor(in.qkv_index, "qkv_index", kActivationDtypes, device, {-1, width});
  const std::int64_t num_tokens = in.qkv_index.shape[0];
  check_tensor(in.q_norm_weight, "q_norm_weight", {DType::kBf16, DType::kFp32}, device, {d});
  check_tensor(in.k_norm_weight, "k_norm_weight", {DType::kBf16, DType::kFp32}, device, {d});
  check_tensor(in.index_q_norm_weight, "index_q_norm_weight", {DType::kBf16, DType::kFp32},
               device, {di});
  check_tensor(in.index_k_norm_weight, "index_k_norm_weight", {DType::kBf16, DType::kFp32},
               device, {di});
  check_tensor(in.positions, "positions", {DType::kInt32, DType::kInt64}, device, {num_tokens});
  check_tensor(in.slot_mapping, "slot_mapping", DType::kInt64, device, {num_tokens});
  const bool own_index_slots = in.index_slot_mapping.data != nullptr;
  if (own_index_slots) {
    check_tensor(in.index_slot_mapping, "index_slot_mapping", DType::kInt64, device,
                 {num_tokens});
  }
  check_tensor(out.q, "q", {DType::kBf16, DType::kFp16}, device, {num_tokens, hq, d});
  if (config.indexer_kv_dtype == "fp8") {
    check_tensor(out.index_q, "index_q", DType::kFp8E4m3, device, {num_tokens, hidx, di});
  } else {
    check_tensor(out.index_q, "index_q", {DType::kBf16, DType::kFp16}, device,
                 {num_tokens, hidx, di});
  }
  require_same_device(device, out.q, "q");
  if (options.checked) {
    check_slot_values(in.slot_mapping, kv_cache.capacity_tokens(), "slot_mapping");
    check_slot_values(own_index_slots ? in.index_slot_mapping : in.slot_mapping,
                      index_cache.capacity_tokens(),
                      own_index_slots ? "index_slot_mapping" : "slot_mapping (index cache)");
  }
  if (device == Device::kCuda) cuda_not_available("produce_qkv_index");
  cpu::produce_qkv_index(config, in, kv_cache, index_cache, out);
}

}  // namespace flashmsa
