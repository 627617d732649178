#include <vector>

#include "src/cpu/cpu_ops.hpp"
#include "src/cpu/row_codec.hpp"

namespace flashmsa::cpu {
namespace {

// Reads row (t, h) of a [T, H, dim] activation tensor into floats.
void load_row(const TensorView& x, std::int64_t t, std::int64_t h, std::int64_t dim, float* out) {
  const std::int64_t base = t * x.stride[0] + h * (x.rank == 3 ? x.stride[1] : 0);
  for (std::int64_t d = 0; d < dim; ++d) out[d] = load_activation(x.dtype, x.data, base + d);
}

}  // namespace

void insert_kv(const KvCacheView& cache, const TensorView& k, const TensorView& v,
               const TensorView& slot_mapping) {
  const std::int64_t num_tokens = k.shape[0];
  const std::int64_t heads = cache.shape.num_kv_heads, dim = cache.shape.head_dim;
  const std::int64_t page_size = cache.shape.page_size;
  const auto* slots = slot_mapping.as<const std::int64_t>();
  std::vector<float> row(static_cast<std::size_t>(dim));
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    const std::int64_t slot = slots[t * slot_mapping.stride[0]];
    if (slot < 0 || slot >= cache.capacity_tokens()) continue;  // padding or out of range
    const std::int64_t page = slot / page_size, offset = slot % page_size;
    for (std::int64_t h = 0; h < heads; ++h) {
      load_row(k, t, h, dim, row.data());
      encode_cache_row(
          cache.dtype, row.data(), dim, cache.k.row(page, h, offset),
          cache.k_block_scale.data ? cache.k_block_scale.row(page, h, offset) : nullptr,
          cache.k_scale);
      load_row(v, t, h, dim, row.data());
      encode_cache_row(
          cache.dtype, row.data(), dim, cache.v.row(page, h, offset),
          cache.v_block_scale.data ? cache.v_block_scale.row(page, h, offset) : nullptr,
          cache.v_scale);
    }
  }
}

void insert_index_k(const IndexCacheView& cache, const TensorView& index_k,
                    const TensorView& slot_mapping) {
  const std::int64_t num_tokens = index_k.shape[0];
  const auto* slots = slot_mapping.as<const std::int64_t>();
  std::vector<float> row(static_cast<std::size_t>(cache.index_dim));
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    const std::int64_t slot = slots[t * slot_mapping.stride[0]];
    if (slot < 0 || slot >= cache.capacity_tokens()) continue;
    const std::int64_t page = slot / cache.page_size, offset = slot % cache.page_size;
    load_row(index_k, t, 0, cache.index_dim, row.data());
    encode_cache_row(cache.dtype, row.data(), cache.index_dim, cache.k.row(page, 0, offset),
                     cache.block_scale.data ? cache.block_scale.row(page, 0, offset) : nullptr,
                     1.0f);
  }
}

}  // namespace flashmsa::cpu
