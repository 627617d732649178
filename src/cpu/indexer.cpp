// The lightning indexer on the CPU: index-q x index-K dot products through BLAS, the causal
// block max, the group max over a kv head's index heads, forcing and exact top-k.
#include <algorithm>
#include <limits>
#include <vector>

#include "src/cpu/batch_rows.hpp"
#include "src/cpu/gemm.hpp"
#include "src/cpu/row_codec.hpp"
#include "src/cpu/selection.hpp"
#include "src/cpu/sparse_ops.hpp"
#include "src/cpu/thread_pool.hpp"
#include "src/cpu/vector_loops.hpp"

namespace flashmsa::cpu {

void TopkSelector::select(const float* scores, std::int64_t nvb, std::int32_t* out,
                          std::int64_t out_stride) const {
  const std::int64_t k = std::min<std::int64_t>(topk, nvb);
  keys_.resize(static_cast<std::size_t>(nvb));
  ids_.resize(static_cast<std::size_t>(nvb));
  for (std::int64_t b = 0; b < nvb; ++b) {
    keys_[b] = rank_key(scores[b]);
    ids_[b] = static_cast<std::int32_t>(b);
  }
  for (std::int64_t b = 0; b < std::min<std::int64_t>(init, nvb); ++b) keys_[b] = 1e30f;
  for (std::int64_t b = std::max<std::int64_t>(0, nvb - local); b < nvb; ++b) keys_[b] = 1e29f;
  const auto before = [&](std::int32_t a, std::int32_t b) {
    return keys_[a] > keys_[b] || (keys_[a] == keys_[b] && a < b);
  };
  std::partial_sort(ids_.begin(), ids_.begin() + k, ids_.end(), before);
  if (order != TopkOrder::kScoreDesc) {
    std::sort(ids_.begin(), ids_.begin() + k);
    if (order == TopkOrder::kLocalLast) {
      // The local blocks are the highest visible ids, so ascending order already ends with
      // them; the stable partition states the contract rather than relying on that.
      const std::int64_t first_local = std::max<std::int64_t>(0, nvb - local);
      std::stable_partition(ids_.begin(), ids_.begin() + k,
                            [&](std::int32_t id) { return id < first_local; });
    }
  }
  for (std::int64_t i = 0; i < topk; ++i) out[i * out_stride] = i < k ? ids_[i] : -1;
}

namespace {

// Rows a task: up to 64 (256 query vectors a product), down to 16 where that leaves each thread
// fewer than 4 tasks of a request.
constexpr std::int64_t kMinRowsPerTask = 16, kMaxRowsPerTask = 64;
constexpr std::int64_t kKeysPerTile = 1024;  // at least: a tile is whole blocks

// Dequantizes the index keys of blocks [0, num_blocks) of request r into fp32 [blocks * bs, Di];
// blocks without a page become NaN (never read, and rank last).
std::vector<float> gather_index_keys(const IndexCacheView& cache, const RowPlan& plan,
                                     std::int64_t r, std::int64_t num_blocks, int threads) {
  const std::int64_t bs = plan.block_size, di = cache.index_dim;
  std::vector<float> keys = allocate_scratch<float>(
      num_blocks * bs * di, "the CPU indexer's fp32 copy of one request's index keys");
  parallel_for(
      num_blocks,
      [&](std::int64_t b) {
        const std::int64_t page = plan.page(r, b);
        float* dst = keys.data() + b * bs * di;
        if (page < 0) {
          std::fill(dst, dst + bs * di, std::numeric_limits<float>::quiet_NaN());
          return;
        }
        for (std::int64_t t = 0; t < bs; ++t) {
          decode_cache_row(cache.dtype, cache.k.row(page, 0, t),
                           cache.block_scale.data ? cache.block_scale.row(page, 0, t) : nullptr, di,
                           1.0f, dst + t * di);
        }
      },
      threads);
  return keys;
}

}  // namespace

// The largest key is found in kVectorLanes lanes (vectorised; the order of a max does not change
// its value); it is the value itself unless it is 0 (+0.0 or -0.0) or -1e30 (that value or NaN),
// where the first value with that key is looked up.
FLASHMSA_VECTOR_CLONES
float block_rank_max(const float* row, std::int64_t n) {
  float lanes[kVectorLanes];
  for (float& l : lanes) l = -std::numeric_limits<float>::infinity();
  std::int64_t c = 0;
  for (; c + kVectorLanes <= n; c += kVectorLanes) {
    for (int j = 0; j < kVectorLanes; ++j) {
      const float key = rank_key(row[c + j]);
      lanes[j] = lanes[j] < key ? key : lanes[j];
    }
  }
  float best = lanes[0];
  for (int j = 1; j < kVectorLanes; ++j) best = best < lanes[j] ? lanes[j] : best;
  for (; c < n; ++c) best = best < rank_key(row[c]) ? rank_key(row[c]) : best;
  if (best != 0.0f && best != -1e30f) return best;
  c = 0;
  while (rank_key(row[c]) != best) ++c;  // best is the key of some value
  return row[c];
}

void index_rows(const Config& config, const TensorView& index_q, const IndexCacheView& cache,
                const RowPlan& plan, const IndexOutputs& outputs, int threads) {
  const std::int64_t hkv = config.resolve_heads().num_key_value_heads;
  const std::int64_t hidx = config.sparse_num_index_heads, group = hidx / hkv;
  const std::int64_t di = config.sparse_index_dim, bs = plan.block_size;
  const TopkSelector selector(config);
  const TensorView& topk = outputs.topk;
  const TensorView& scores_out = outputs.block_scores;
  const std::int64_t score_width = scores_out.data ? scores_out.shape[2] : 0;

  // Rows no request covers select nothing.
  for (std::int64_t t = 0; t < plan.num_rows(); ++t) {
    if (plan.visible_blocks(plan.position[t]) > 0) continue;
    for (std::int64_t h = 0; h < hkv; ++h) {
      selector.select(nullptr, 0, topk.as<std::int32_t>() + h * topk.stride[0] + t * topk.stride[1],
                      topk.stride[2]);
      for (std::int64_t b = 0; b < score_width; ++b) {
        scores_out.as<float>()[h * scores_out.stride[0] + t * scores_out.stride[1] + b] =
            -std::numeric_limits<float>::infinity();
      }
    }
  }

  const std::int64_t workers = worker_threads(threads);
  for (std::int64_t r = 0; r < plan.num_requests(); ++r) {
    const std::int64_t begin = plan.row_begin[r], end = plan.row_end[r];
    std::int64_t max_position = -1;
    for (std::int64_t t = begin; t < end; ++t)
      max_position = std::max(max_position, plan.position[t]);
    if (max_position < 0) continue;
    const std::int64_t num_blocks = plan.visible_blocks(max_position);
    const std::vector<float> keys = gather_index_keys(cache, plan, r, num_blocks, threads);
    const std::int64_t rows_per_task =
        std::clamp((end - begin) / (4 * workers), kMinRowsPerTask, kMaxRowsPerTask);
    const std::int64_t tasks = (end - begin + rows_per_task - 1) / rows_per_task;
    parallel_for(
        tasks,
        [&](std::int64_t task) {
          const TopkSelector task_selector(config);  // scratch per task: tasks run in parallel
          const std::int64_t t0 = begin + task * rows_per_task;
          const std::int64_t rows = std::min(rows_per_task, end - t0);
          std::int64_t p_max = -1;
          for (std::int64_t t = t0; t < t0 + rows; ++t) p_max = std::max(p_max, plan.position[t]);
          if (p_max < 0) return;
          const std::int64_t nb = plan.visible_blocks(p_max);
          // Queries [rows * hidx, di] in fp32.
          std::vector<float> q(static_cast<std::size_t>(rows * hidx * di));
          for (std::int64_t i = 0; i < rows; ++i) {
            for (std::int64_t h = 0; h < hidx; ++h) {
              const std::int64_t base = (t0 + i) * index_q.stride[0] + h * index_q.stride[1];
              for (std::int64_t d = 0; d < di; ++d) {
                q[(i * hidx + h) * di + d] = load_activation(index_q.dtype, index_q.data, base + d);
              }
            }
          }
          // Block scores per (row, index head, block), NaN ranking as -1e30.
          const float nan = std::numeric_limits<float>::quiet_NaN();
          std::vector<float> block =
              allocate_scratch<float>(rows * hidx * nb, "the CPU indexer's block scores");
          std::fill(block.begin(), block.end(), nan);
          // Tiles of whole blocks (block sizes are powers of two).
          const std::int64_t tile_keys = std::max(kKeysPerTile, bs);
          std::vector<float> s(static_cast<std::size_t>(rows * hidx * tile_keys));
          for (std::int64_t k0 = 0; k0 < nb * bs; k0 += tile_keys) {
            const std::int64_t nk = std::min(tile_keys, nb * bs - k0);
            gemm_nt(rows * hidx, nk, di, 1.0f, q.data(), di, keys.data() + k0 * di, di, 0.0f,
                    s.data(), nk);
            for (std::int64_t i = 0; i < rows; ++i) {
              const std::int64_t p = plan.position[t0 + i];
              const std::int64_t visible_keys = std::min(p + 1 - k0, nk);  // keys j <= p
              for (std::int64_t h = 0; h < hidx; ++h) {
                const float* row = s.data() + (i * hidx + h) * nk;
                for (std::int64_t c0 = 0; c0 < visible_keys; c0 += bs) {
                  const std::int64_t c1 = std::min(c0 + bs, visible_keys);
                  block[(i * hidx + h) * nb + (k0 + c0) / bs] = block_rank_max(row + c0, c1 - c0);
                }
              }
            }
          }
          std::vector<float> reduced(static_cast<std::size_t>(nb));
          for (std::int64_t i = 0; i < rows; ++i) {
            const std::int64_t t = t0 + i;
            const std::int64_t nvb = plan.visible_blocks(plan.position[t]);
            if (nvb == 0) continue;  // handled above
            for (std::int64_t h = 0; h < hkv; ++h) {
              for (std::int64_t b = 0; b < nvb; ++b) {
                float m = block[(i * hidx + h * group) * nb + b];
                for (std::int64_t g = 1; g < group; ++g) {
                  m = rank_max(m, block[(i * hidx + h * group + g) * nb + b]);
                }
                reduced[b] = m;
              }
              task_selector.select(
                  reduced.data(), nvb,
                  topk.as<std::int32_t>() + h * topk.stride[0] + t * topk.stride[1],
                  topk.stride[2]);
              if (score_width) {
                float* out =
                    scores_out.as<float>() + h * scores_out.stride[0] + t * scores_out.stride[1];
                for (std::int64_t b = 0; b < score_width; ++b) {
                  out[b * scores_out.stride[2]] =
                      b < nvb ? reduced[b] : -std::numeric_limits<float>::infinity();
                }
              }
            }
          }
        },
        threads);
  }
}

}  // namespace flashmsa::cpu
