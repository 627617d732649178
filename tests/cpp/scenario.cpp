#include "tests/cpp/scenario.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace flashmsa::test {
namespace {

void fill_plane_garbage(const CachePlane& plane, std::int64_t pages, std::int64_t heads,
                        std::int64_t tokens, std::mt19937_64& rng) {
  if (!plane.data) return;
  for (std::int64_t p = 0; p < pages; ++p) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t t = 0; t < tokens; ++t) {
        std::byte* row = plane.row(p, h, t);
        for (std::int64_t i = 0; i < plane.row_bytes; ++i) row[i] = static_cast<std::byte>(rng());
      }
    }
  }
}

std::vector<std::uint16_t> random_bf16(std::size_t n, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> normal;
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = fmt::float_to_bf16(normal(rng) * scale);
  return v;
}

// Builds the manager, writes every request's tokens, and the random queries.
Scenario build(const Config& config, const std::vector<std::int64_t>& lengths,
               const std::vector<std::int64_t>& query_lens, std::uint64_t seed, KvLayout layout) {
  Scenario s;
  s.config = config;
  const auto heads = config.resolve_heads();
  const std::int64_t hq = heads.num_attention_heads, hkv = heads.num_key_value_heads;
  const std::int64_t d = config.head_dim, di = config.sparse_index_dim;
  const std::int64_t hidx = config.sparse_num_index_heads, bs = config.sparse_block_size;
  std::int64_t pages = 2;
  for (std::int64_t l : lengths) pages += (l + bs - 1) / bs;
  s.cm = std::make_unique<CacheManager>(
      config, CacheManagerOptions{.num_pages = pages + 3, .layout = layout, .shuffle_seed = seed});
  std::mt19937_64 rng(seed);
  const KvCacheView& kv = s.cm->kv_cache();
  for (const CachePlane* p : {&kv.k, &kv.v, &kv.k_block_scale, &kv.v_block_scale}) {
    fill_plane_garbage(*p, kv.shape.num_pages, hkv, bs, rng);
  }
  const IndexCacheView& ix = s.cm->index_cache();
  fill_plane_garbage(ix.k, ix.num_pages, 1, bs, rng);
  fill_plane_garbage(ix.block_scale, ix.num_pages, 1, bs, rng);

  for (std::int64_t l : lengths) {
    const auto id = l > 0 ? s.cm->add_request() : CacheManager::kPaddingRequest;
    s.ids.push_back(id);
    s.max_blocks = std::max(s.max_blocks, (l + bs - 1) / bs);
    if (l == 0) continue;
    s.cm->append(id, l);
    const auto k = random_bf16(static_cast<std::size_t>(l * hkv * d), rng, 1.0f);
    const auto v = random_bf16(k.size(), rng, 1.0f);
    const auto ik = random_bf16(static_cast<std::size_t>(l * di), rng, 1.0f);
    const auto slots = s.cm->slot_mapping(id, 0, l);
    insert_kv(kv, TensorView::contiguous(k.data(), DType::kBf16, {l, hkv, d}),
              TensorView::contiguous(v.data(), DType::kBf16, {l, hkv, d}),
              TensorView::contiguous(slots.data(), DType::kInt64, {l}));
    insert_index_k(ix, TensorView::contiguous(ik.data(), DType::kBf16, {l, di}),
                   TensorView::contiguous(slots.data(), DType::kInt64, {l}));
  }
  s.max_blocks += 1;  // one spare column of -1, as engines pad tables
  s.block_table = s.cm->block_table(s.ids, s.max_blocks);
  for (std::int64_t l : lengths) s.seq_lens.push_back(static_cast<std::int32_t>(l));
  s.cu_seqlens.push_back(0);
  for (std::int64_t q : query_lens) {
    s.cu_seqlens.push_back(static_cast<std::int32_t>(s.cu_seqlens.back() + q));
  }
  s.num_rows = s.cu_seqlens.back();
  s.q = random_bf16(static_cast<std::size_t>(s.num_rows * hq * d), rng, 1.0f);
  for (auto b : s.q) s.q_values.push_back(fmt::bf16_to_float(b));
  const auto iq = random_bf16(static_cast<std::size_t>(s.num_rows * hidx * di), rng, 1.0f);
  for (auto b : iq) {
    if (s.index_q_dtype() == DType::kFp8E4m3) {
      const std::uint8_t e = fmt::float_to_e4m3(fmt::bf16_to_float(b));
      s.index_q.push_back(e);
      s.index_q_values.push_back(fmt::e4m3_to_float(e));
    } else {
      s.index_q.push_back(static_cast<std::uint8_t>(b & 0xFF));
      s.index_q.push_back(static_cast<std::uint8_t>(b >> 8));
      s.index_q_values.push_back(fmt::bf16_to_float(b));
    }
  }
  return s;
}

}  // namespace

TensorView Scenario::q_view() const {
  const auto h = config.resolve_heads();
  return TensorView::contiguous(q.data(), DType::kBf16,
                                {num_rows, h.num_attention_heads, config.head_dim});
}

TensorView Scenario::index_q_view() const {
  return TensorView::contiguous(index_q.data(), index_q_dtype(),
                                {num_rows, config.sparse_num_index_heads, config.sparse_index_dim});
}

PrefillBatch Scenario::prefill_batch() const {
  const auto b = static_cast<std::int64_t>(seq_lens.size());
  return {TensorView::contiguous(cu_seqlens.data(), DType::kInt32, {b + 1}),
          TensorView::contiguous(seq_lens.data(), DType::kInt32, {b}),
          TensorView::contiguous(block_table.data(), DType::kInt32, {b, max_blocks})};
}

DecodeBatch Scenario::decode_batch() const {
  const auto b = static_cast<std::int64_t>(seq_lens.size());
  return {TensorView::contiguous(seq_lens.data(), DType::kInt32, {b}),
          TensorView::contiguous(block_table.data(), DType::kInt32, {b, max_blocks}),
          decode_query_len};
}

std::vector<double> Scenario::q_row(std::int64_t t, std::int64_t hq) const {
  const std::int64_t d = config.head_dim, heads = config.resolve_heads().num_attention_heads;
  return {q_values.begin() + (t * heads + hq) * d, q_values.begin() + (t * heads + hq + 1) * d};
}

Scenario make_prefill(const Config& config, const std::vector<RequestShape>& requests,
                      std::uint64_t seed, KvLayout layout) {
  std::vector<std::int64_t> lengths, queries;
  for (const auto& r : requests) {
    lengths.push_back(r.prefix_len + r.query_len);
    queries.push_back(r.query_len);
  }
  Scenario s = build(config, lengths, queries, seed, layout);
  s.rows = ref::prefill_rows(s.cu_seqlens, s.seq_lens);
  return s;
}

Scenario make_decode(const Config& config, const std::vector<std::int64_t>& seq_lens,
                     int decode_query_len, std::uint64_t seed, KvLayout layout) {
  std::vector<std::int64_t> queries(seq_lens.size(), decode_query_len);
  Scenario s = build(config, seq_lens, queries, seed, layout);
  s.decode_query_len = decode_query_len;
  s.rows = ref::decode_rows(s.seq_lens, decode_query_len);
  return s;
}

void change_decode_batch(Scenario& s, const std::vector<std::int32_t>& seq_lens) {
  s.seq_lens.assign(seq_lens.begin(), seq_lens.end());  // same size: the buffer stays in place
  std::swap(s.block_table[0], s.block_table[1]);
  const std::int64_t w = s.max_blocks;
  for (std::int64_t b = 0; b < w; ++b) s.block_table[3 * w + b] = s.block_table[1 * w + b];
  s.rows = ref::decode_rows(s.seq_lens, s.decode_query_len);
}

}  // namespace flashmsa::test
