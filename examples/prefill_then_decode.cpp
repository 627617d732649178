// A MiniMax-M3 sparse attention layer through FlashMSA's C++ API, as an engine calls it: a
// 300-token prompt is prefilled, then one token is decoded (the C++ twin of
// prefill_then_decode.py). On the CPU here; with a CacheManager on Device::kCuda, device tensors,
// a workspace and a stream the same calls run on the GPU.
//
//   build/examples/flashmsa_example_prefill_then_decode
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "flashmsa/flashmsa.hpp"

using namespace flashmsa;

namespace {

constexpr std::int64_t kHq = 64, kHkv = 4, kD = 128, kHidx = 4, kDi = 128, kMaxBlocks = 8;
constexpr std::int64_t kWidth = kHq * kD + 2 * kHkv * kD + kHidx * kDi + kDi;

std::vector<std::uint16_t> random_bf16(std::size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = fmt::float_to_bf16(scale * normal(rng));
  return v;
}

struct Layer {
  Config config;  // MiniMax-M3: top-16 of 128-token blocks
  CacheManager cm{config, {.num_pages = 16}};
  std::mt19937 rng{0};
  std::vector<std::uint16_t> norms = random_bf16(2 * kD + 2 * kDi, 0.1f, rng);

  // The producer for `count` new tokens at positions first.. of `id`: fills the caches and
  // writes q [count, 64, 128] and index-q [count, 4, 128] (bf16).
  void produce(CacheManager::RequestId id, std::int64_t first, std::int64_t count,
               std::vector<std::uint16_t>& q, std::vector<std::uint16_t>& iq) {
    const auto hidden = random_bf16(static_cast<std::size_t>(count * kWidth), 1.0f, rng);
    std::vector<std::int64_t> positions(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) positions[i] = first + i;
    const auto slots = cm.slot_mapping(id, first, count);
    q.assign(static_cast<std::size_t>(count * kHq * kD), 0);
    iq.assign(static_cast<std::size_t>(count * kHidx * kDi), 0);
    ProducerInputs in;
    in.qkv_index = TensorView::contiguous(hidden.data(), DType::kBf16, {count, kWidth});
    in.q_norm_weight = TensorView::contiguous(norms.data(), DType::kBf16, {kD});
    in.k_norm_weight = TensorView::contiguous(norms.data() + kD, DType::kBf16, {kD});
    in.index_q_norm_weight = TensorView::contiguous(norms.data() + 2 * kD, DType::kBf16, {kDi});
    in.index_k_norm_weight =
        TensorView::contiguous(norms.data() + 2 * kD + kDi, DType::kBf16, {kDi});
    in.positions = TensorView::contiguous(positions.data(), DType::kInt64, {count});
    in.slot_mapping = TensorView::contiguous(slots.data(), DType::kInt64, {count});
    produce_qkv_index(config, in, cm.kv_cache(), cm.index_cache(),
                      {TensorView::contiguous(q.data(), DType::kBf16, {count, kHq, kD}),
                       TensorView::contiguous(iq.data(), DType::kBf16, {count, kHidx, kDi})});
  }
};

}  // namespace

int main() {
  try {
    Layer layer;
    const Config& config = layer.config;
    const std::int64_t prompt = 300, k = config.sparse_topk_blocks;

    // ---- Prefill: one request, a 300-token prompt ----
    const auto id = layer.cm.add_request();
    layer.cm.append(id, prompt);
    std::vector<std::uint16_t> q, iq;
    layer.produce(id, 0, prompt, q, iq);
    std::vector<std::int32_t> table = layer.cm.block_table({&id, 1}, kMaxBlocks);
    std::vector<std::int32_t> cu{0, static_cast<std::int32_t>(prompt)};
    std::vector<std::int32_t> lens{static_cast<std::int32_t>(prompt)};
    const PrefillBatch prefill{
        TensorView::contiguous(cu.data(), DType::kInt32, {2}),
        TensorView::contiguous(lens.data(), DType::kInt32, {1}),
        TensorView::contiguous(table.data(), DType::kInt32, {1, kMaxBlocks})};
    std::vector<std::int32_t> topk(static_cast<std::size_t>(kHkv * prompt * k));
    const TensorView topk_view =
        TensorView::contiguous(topk.data(), DType::kInt32, {kHkv, prompt, k});
    index_prefill(config, TensorView::contiguous(iq.data(), DType::kBf16, {prompt, kHidx, kDi}),
                  layer.cm.index_cache(), prefill, {topk_view});
    std::vector<std::uint16_t> out(q.size());
    sparse_attention_prefill(config,
                             TensorView::contiguous(q.data(), DType::kBf16, {prompt, kHq, kD}),
                             layer.cm.kv_cache(), prefill, topk_view,
                             {TensorView::contiguous(out.data(), DType::kBf16, {prompt, kHq, kD})});
    std::printf("prefill: %lld tokens, the last row chose blocks", static_cast<long long>(prompt));
    for (std::int64_t i = 0; i < k; ++i) {
      const std::int32_t b = topk[(prompt - 1) * k + i];
      if (b >= 0) std::printf(" %d", b);
    }
    std::printf("\n");

    // ---- Decode: one new token ----
    layer.cm.append(id, 1);
    layer.produce(id, prompt, 1, q, iq);
    table = layer.cm.block_table({&id, 1}, kMaxBlocks);
    lens = {static_cast<std::int32_t>(prompt + 1)};
    const DecodeBatch decode{TensorView::contiguous(lens.data(), DType::kInt32, {1}),
                             TensorView::contiguous(table.data(), DType::kInt32, {1, kMaxBlocks}),
                             1};
    std::vector<std::int32_t> topk1(static_cast<std::size_t>(kHkv * k));
    const TensorView topk1_view = TensorView::contiguous(topk1.data(), DType::kInt32, {kHkv, 1, k});
    const TensorView q1 = TensorView::contiguous(q.data(), DType::kBf16, {1, kHq, kD});
    index_decode(config, TensorView::contiguous(iq.data(), DType::kBf16, {1, kHidx, kDi}),
                 layer.cm.index_cache(), decode, {topk1_view});
    std::vector<std::uint16_t> out1(static_cast<std::size_t>(kHq * kD)), dense(out1.size());
    sparse_attention_decode(config, q1, layer.cm.kv_cache(), decode, topk1_view,
                            {TensorView::contiguous(out1.data(), DType::kBf16, {1, kHq, kD})});

    // 3 visible blocks (<= 16): every block is selected, so sparse equals dense attention, bit
    // for bit on the CPU.
    cu = {0, 1};
    const PrefillBatch one_row{TensorView::contiguous(cu.data(), DType::kInt32, {2}),
                               decode.seq_lens, decode.block_table};
    dense_attention(config, q1, layer.cm.kv_cache(), one_row,
                    {TensorView::contiguous(dense.data(), DType::kBf16, {1, kHq, kD})});
    if (dense != out1) {
      std::fprintf(stderr, "sparse decode differs from dense attention\n");
      return 1;
    }
    double norm = 0;
    for (std::uint16_t b : out1) norm += std::pow(fmt::bf16_to_float(b), 2.0);
    std::printf("decode: token %lld, output norm %.3f, equal to dense attention\n",
                static_cast<long long>(prompt), std::sqrt(norm));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "flashmsa: %s\n", e.what());
    return 1;
  }
}
