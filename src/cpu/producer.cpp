#include <cmath>
#include <vector>

#include "src/cpu/cpu_ops.hpp"
#include "src/cpu/row_codec.hpp"
#include "src/cpu/thread_pool.hpp"

namespace flashmsa::cpu {
namespace {

std::vector<float> load_vector(const TensorView& t) {
  std::vector<float> out(static_cast<std::size_t>(t.shape[0]));
  for (std::int64_t i = 0; i < t.shape[0]; ++i) {
    out[i] = load_activation(t.dtype, t.data, i * t.stride[0]);
  }
  return out;
}

// Gemma RMSNorm (x * rsqrt(mean(x^2) + eps) * (1 + w)) and partial NeoX RoPE, in place, fp32.
struct HeadTransform {
  std::vector<float> one_plus_w;
  float eps;

  void apply(float* x, std::int64_t dim, const std::vector<float>& cos_a,
             const std::vector<float>& sin_a) const {
    float sum_sq = 0.0f;
    for (std::int64_t d = 0; d < dim; ++d) sum_sq += x[d] * x[d];
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
    for (std::int64_t d = 0; d < dim; ++d) x[d] = x[d] * inv_rms * one_plus_w[d];
    const auto half = static_cast<std::int64_t>(cos_a.size());
    for (std::int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * cos_a[i] - b * sin_a[i];
      x[i + half] = b * cos_a[i] + a * sin_a[i];
    }
  }
};

}  // namespace

void produce_qkv_index(const Config& config, const ProducerInputs& in, const KvCacheView& kv_cache,
                       const IndexCacheView& index_cache, const ProducerOutputs& out, int threads) {
  const ResolvedHeads heads = config.resolve_heads();
  const std::int64_t hq = heads.num_attention_heads, hkv = heads.num_key_value_heads;
  const std::int64_t hidx = config.sparse_num_index_heads;
  const std::int64_t d = config.head_dim, di = config.sparse_index_dim;
  const std::int64_t k_off = hq * d, v_off = k_off + hkv * d, iq_off = v_off + hkv * d;
  const std::int64_t ik_off = iq_off + hidx * di;
  const std::int64_t half = config.rope_dim / 2;

  std::vector<float> inv_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    inv_freq[i] = static_cast<float>(
        std::pow(config.rope_theta, -2.0 * static_cast<double>(i) / config.rope_dim));
  }
  const auto eps = static_cast<float>(config.rms_norm_eps);
  auto transform = [&](const TensorView& w) {
    HeadTransform tr{load_vector(w), eps};
    for (float& v : tr.one_plus_w) v = 1.0f + v;
    return tr;
  };
  const HeadTransform q_tr = transform(in.q_norm_weight), k_tr = transform(in.k_norm_weight);
  const HeadTransform iq_tr = transform(in.index_q_norm_weight);
  const HeadTransform ik_tr = transform(in.index_k_norm_weight);
  const TensorView& index_slots =
      in.index_slot_mapping.data ? in.index_slot_mapping : in.slot_mapping;

  const std::int64_t num_tokens = in.qkv_index.shape[0];
  constexpr std::int64_t kTokensPerTask = 64;
  parallel_for(
      (num_tokens + kTokensPerTask - 1) / kTokensPerTask,
      [&](std::int64_t task) {
        std::vector<float> cos_a(static_cast<std::size_t>(half)), sin_a(cos_a.size());
        std::vector<float> x(static_cast<std::size_t>(std::max(d, di)));
        for (std::int64_t t = task * kTokensPerTask;
             t < std::min(num_tokens, (task + 1) * kTokensPerTask); ++t) {
          // The engines' fp32 angle: float(position) * inv_freq in fp32.
          const auto p = static_cast<float>(in.positions.integer_at(t));
          for (std::int64_t i = 0; i < half; ++i) {
            const float angle = p * inv_freq[i];
            cos_a[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
            sin_a[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
          }
          const std::int64_t row = t * in.qkv_index.stride[0];
          auto load = [&](std::int64_t offset, std::int64_t dim) {
            for (std::int64_t e = 0; e < dim; ++e) {
              x[e] = load_activation(in.qkv_index.dtype, in.qkv_index.data, row + offset + e);
            }
          };
          auto store = [&](const TensorView& o, std::int64_t h, std::int64_t dim) {
            const std::int64_t base = t * o.stride[0] + h * o.stride[1];
            for (std::int64_t e = 0; e < dim; ++e)
              store_activation(o.dtype, o.data, base + e, x[e]);
          };
          for (std::int64_t h = 0; h < hq; ++h) {
            load(h * d, d);
            q_tr.apply(x.data(), d, cos_a, sin_a);
            store(out.q, h, d);
          }
          for (std::int64_t h = 0; h < hidx; ++h) {
            load(iq_off + h * di, di);
            iq_tr.apply(x.data(), di, cos_a, sin_a);
            store(out.index_q, h, di);
          }
          const std::int64_t slot = in.slot_mapping.integer_at(t);
          if (slot >= 0 && slot < kv_cache.capacity_tokens()) {
            const std::int64_t page = slot / kv_cache.shape.page_size;
            const std::int64_t offset = slot % kv_cache.shape.page_size;
            for (std::int64_t h = 0; h < hkv; ++h) {
              load(k_off + h * d, d);
              k_tr.apply(x.data(), d, cos_a, sin_a);
              encode_cache_row(kv_cache.dtype, x.data(), d, kv_cache.k.row(page, h, offset),
                               kv_cache.k_block_scale.data
                                   ? kv_cache.k_block_scale.row(page, h, offset)
                                   : nullptr,
                               kv_cache.k_scale);
              load(v_off + h * d, d);  // V is neither normalised nor rotated
              encode_cache_row(kv_cache.dtype, x.data(), d, kv_cache.v.row(page, h, offset),
                               kv_cache.v_block_scale.data
                                   ? kv_cache.v_block_scale.row(page, h, offset)
                                   : nullptr,
                               kv_cache.v_scale);
            }
          }
          const std::int64_t index_slot = index_slots.integer_at(t);
          if (index_slot >= 0 && index_slot < index_cache.capacity_tokens()) {
            const std::int64_t page = index_slot / index_cache.page_size;
            const std::int64_t offset = index_slot % index_cache.page_size;
            load(ik_off, di);
            ik_tr.apply(x.data(), di, cos_a, sin_a);
            encode_cache_row(index_cache.dtype, x.data(), di, index_cache.k.row(page, 0, offset),
                             index_cache.block_scale.data
                                 ? index_cache.block_scale.row(page, 0, offset)
                                 : nullptr,
                             1.0f);
          }
        }
      },
      threads);
}

}  // namespace flashmsa::cpu
