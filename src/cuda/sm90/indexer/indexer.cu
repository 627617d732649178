// Host side of the CUDA indexer: validates what only the CUDA path needs, splits the rows into
// chunks that fit the workspace, and launches plan (prefill), score and top-k per chunk. No host
// synchronisation and no allocation: the decode path can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include <algorithm>

#include "flashmsa/error.hpp"
#include "src/cuda/cuda_ops.hpp"
#include "src/cuda/launch.hpp"
#include "src/cuda/sm90/indexer/index_prefill_launch.hpp"
#include "src/cuda/sm90/indexer/index_score_launch.hpp"
#include "src/cuda/sm90/indexer/index_topk_kernel.cuh"
#include "src/cuda/sm90/indexer/indexer_host.hpp"
#include "src/index_workspace.hpp"

namespace flashmsa::cuda {

namespace {

constexpr int kMaxTopkBlocks = 32768;  // keys of one row in the top-k CTA's shared memory

// The most pages one CTA of the decode scoring takes. Fewer, longer CTAs pay each CTA's start (its
// queries, its ring's first pages) less often, but past a few tens of pages the SMs finish unevenly
// and a grid of several waves balances better. Measured on the H200 (one machine, medians, dql 1):
// against the 16 x 132-CTA grid of before (8 pages a CTA at 64 x 32K, 1 at 8 x 32K), one wave with
// at most 32 pages scores bf16 64x32K in 128.7 us (was 132.3), 128x128K 980 (1005), 1x128K 15.0
// (20.8), fp8 8x32K 17.2 (20.8), fp8 64x32K 72.0 (74.3); one wave unbounded was 1-5% slower than
// that at 128 x 128K. NVFP4 (keys widened in registers) does best at 16 pages: 64x32K 86.8 us
// (32 pages: 89.2; before: 87.5), 32x128K 162.4 (164.5).
std::int64_t decode_split_pages(DType index_cache) {
  return index_cache == DType::kNvfp4 ? 16 : kIndexScoreMaxSplitPages;
}

struct Launch {
  IndexScoreParams score;
  IndexTopkParams topk;
  detail::IndexWorkspaceLayout layout;
  std::byte* workspace = nullptr;
  DType cache_dtype = DType::kBf16;
  bool query_fp8 = false;
  cudaStream_t stream = nullptr;
};

Launch common_setup(const Config& config, const TensorView& index_q, const IndexCacheView& cache,
                    const TensorView& block_table, std::int64_t num_requests,
                    const IndexOutputs& out, void* stream) {
  const std::int64_t hkv = config.resolve_heads().num_key_value_heads;
  const std::int64_t hidx = config.sparse_num_index_heads;
  FLASHMSA_CHECK_SUPPORTED(hidx >= 1 && hidx <= 16 && (hidx & (hidx - 1)) == 0,
                           "the CUDA indexer needs a power-of-two number of index heads <= 16, "
                           "got ",
                           hidx);
  FLASHMSA_CHECK_SUPPORTED(index_q.dtype == DType::kBf16 || index_q.dtype == DType::kFp8E4m3,
                           "the CUDA indexer takes bf16 or fp8_e4m3 index_q, got ",
                           to_string(index_q.dtype));
  const std::int64_t max_blocks = block_table.shape[1];
  FLASHMSA_CHECK_SUPPORTED(max_blocks <= kMaxTopkBlocks,
                           "the CUDA indexer supports block tables up to ", kMaxTopkBlocks,
                           " blocks wide, got ", max_blocks);
  const std::int64_t q_elem = dtype_bits(index_q.dtype) / 8;
  FLASHMSA_CHECK_ARG(aligned(index_q.data, 8 * q_elem) && (index_q.stride[0] * q_elem) % 16 == 0 &&
                         (index_q.stride[1] * q_elem) % (8 * q_elem) == 0 && index_q.stride[2] == 1,
                     "index_q must have contiguous, 16-byte aligned rows on the CUDA backend");
  const std::int64_t row_bytes = cache.dtype == DType::kBf16    ? 256
                                 : cache.dtype == DType::kNvfp4 ? 64
                                                                : 128;
  FLASHMSA_CHECK_ARG(cache.k.row_bytes == row_bytes && aligned(cache.k.data, 16) &&
                         cache.k.page_stride % 16 == 0 && cache.k.token_stride % 16 == 0,
                     "index_cache rows must be 16-byte aligned on the CUDA backend");
  if (cache.dtype == DType::kNvfp4) {
    FLASHMSA_CHECK_ARG(aligned(cache.block_scale.data, 8) &&
                           cache.block_scale.page_stride % 8 == 0 &&
                           cache.block_scale.token_stride % 8 == 0,
                       "index_cache scale rows must be 8-byte aligned on the CUDA backend");
  }

  Launch l;
  l.layout = detail::index_workspace_layout(index_q.shape[0], num_requests, hidx, max_blocks);
  l.workspace = checked_workspace(out.workspace, l.layout.bytes, "index_workspace_bytes");
  l.cache_dtype = cache.dtype;
  l.query_fp8 = index_q.dtype == DType::kFp8E4m3;
  l.stream = static_cast<cudaStream_t>(stream);

  IndexScoreParams& s = l.score;
  s.index_q = index_q.data;
  s.q_row_stride = index_q.stride[0];
  s.q_head_stride = index_q.stride[1];
  s.keys = device_plane(cache.k);
  s.key_scales = device_plane(cache.block_scale);
  s.num_pages = cache.num_pages;
  s.block_table = block_table.as<const std::int32_t>();
  s.table_stride = block_table.stride[0];
  s.max_blocks = static_cast<std::int32_t>(max_blocks);
  s.num_index_heads = static_cast<std::int32_t>(hidx);
  s.scores = reinterpret_cast<float*>(l.workspace + l.layout.scores);
  s.clock = phase_clock(PhaseKernel::kIndexScore);

  IndexTopkParams& k = l.topk;
  k.clock = phase_clock(PhaseKernel::kIndexTopk);
  k.scores = s.scores;
  k.max_blocks = s.max_blocks;
  k.group = static_cast<std::int32_t>(hidx / hkv);
  k.topk = config.sparse_topk_blocks;
  k.init = config.sparse_init_blocks;
  k.local = config.sparse_local_blocks;
  k.order = config.topk_order;
  k.topk_out = out.topk.as<std::int32_t>();
  for (int i = 0; i < 3; ++i) k.topk_stride[i] = out.topk.stride[i];
  if (out.block_scores.data) {
    k.block_scores = out.block_scores.as<float>();
    for (int i = 0; i < 3; ++i) k.block_scores_stride[i] = out.block_scores.stride[i];
    k.block_scores_width = static_cast<std::int32_t>(out.block_scores.shape[2]);
  }
  return l;
}

void launch_topk(const Launch& l, std::int64_t hkv) {
  if (l.topk.chunk.rows() == 0) return;
  const dim3 warp_grid(static_cast<unsigned>(ceil_div(l.topk.chunk.rows(), kWarpTopkWarps)),
                       static_cast<unsigned>(hkv));
  if (l.topk.max_blocks <= 8 * 32) {
    launch_dependent_kernel(index_topk_warp_kernel<8>, warp_grid, 32 * kWarpTopkWarps, 0, l.stream,
                            l.topk);
    return;
  }
  if (l.topk.max_blocks <= kWarpTopkMaxBlocks) {
    launch_dependent_kernel(index_topk_warp_kernel<32>, warp_grid, 32 * kWarpTopkWarps, 0, l.stream,
                            l.topk);
    return;
  }
  const int smem = topk_keys_bytes(l.topk.max_blocks);
  launch_dependent_kernel(
      index_topk_kernel,
      dim3(static_cast<unsigned>(l.topk.chunk.rows()), static_cast<unsigned>(hkv)),
      kIndexTopkThreads, smem, l.stream, l.topk);
}

}  // namespace

void index_prefill(const Config& config, const TensorView& index_q, const IndexCacheView& cache,
                   const PrefillBatch& batch, const IndexOutputs& out, void* stream) {
  index_prefill_phases(config, index_q, cache, batch, out, stream, true);
}

void index_prefill_phases(const Config& config, const TensorView& index_q,
                          const IndexCacheView& cache, const PrefillBatch& batch,
                          const IndexOutputs& out, void* stream, bool select) {
  const std::int64_t num_requests = batch.seq_lens.shape[0], num_rows = index_q.shape[0];
  Launch l = common_setup(config, index_q, cache, batch.block_table, num_requests, out, stream);
  const std::int64_t hkv = config.resolve_heads().num_key_value_heads;
  RowMap rows;
  rows.seq_lens = batch.seq_lens.as<const std::int32_t>();
  rows.seq_lens_stride = batch.seq_lens.stride[0];
  rows.num_requests = static_cast<std::int32_t>(num_requests);
  rows.request_begin = reinterpret_cast<const std::int32_t*>(l.workspace + l.layout.request_begin);
  rows.request_end = reinterpret_cast<const std::int32_t*>(l.workspace + l.layout.request_end);
  l.score.rows = l.topk.rows = rows;
  l.score.tile_offset = reinterpret_cast<const std::int32_t*>(l.workspace + l.layout.tile_offset);
  const int tile_rows = static_cast<int>(detail::kIndexTileVectors / l.score.num_index_heads);
  const CUtensorMap keys = index_prefill_keys_map(cache, l.query_fp8);

  IndexPlanParams plan;
  plan.cu_seqlens = batch.cu_seqlens_q.as<const std::int32_t>();
  plan.cu_stride = batch.cu_seqlens_q.stride[0];
  plan.num_requests = rows.num_requests;
  plan.num_rows = num_rows;
  plan.tile_rows = tile_rows;
  plan.request_begin = reinterpret_cast<std::int32_t*>(l.workspace + l.layout.request_begin);
  plan.request_end = reinterpret_cast<std::int32_t*>(l.workspace + l.layout.request_end);
  plan.tile_offset = reinterpret_cast<std::int32_t*>(l.workspace + l.layout.tile_offset);
  plan.tile_pages = reinterpret_cast<std::int32_t*>(l.workspace + l.layout.tile_pages);
  plan.seq_lens = rows.seq_lens;
  plan.seq_lens_stride = rows.seq_lens_stride;
  plan.max_blocks = l.score.max_blocks;

  const std::int64_t chunk_rows =
      l.layout.chunk_rows == num_rows ? num_rows : l.layout.chunk_rows / tile_rows * tile_rows;
  for (std::int64_t begin = 0; begin < num_rows; begin += chunk_rows) {
    const IndexChunk chunk{begin, std::min(num_rows, begin + chunk_rows)};
    plan.chunk = l.score.chunk = l.topk.chunk = chunk;
    if (num_requests > 0) {
      launch_index_plan(plan, l.stream);
      launch_index_prefill(keys, l.score, plan.tile_pages, l.cache_dtype, l.stream);
    }
    if (select) launch_topk(l, hkv);
  }
}

void index_decode(const Config& config, const TensorView& index_q, const IndexCacheView& cache,
                  const DecodeBatch& batch, const IndexOutputs& out, void* stream) {
  index_decode_phases(config, index_q, cache, batch, out, stream, true);
}

void index_decode_phases(const Config& config, const TensorView& index_q,
                         const IndexCacheView& cache, const DecodeBatch& batch,
                         const IndexOutputs& out, void* stream, bool select) {
  index_decode_run(config, index_q, cache, batch, out, stream,
                   select ? DecodeSelection::kHere : DecodeSelection::kNone);
}

std::optional<IndexTopkParams> index_decode_run(const Config& config, const TensorView& index_q,
                                                const IndexCacheView& cache,
                                                const DecodeBatch& batch, const IndexOutputs& out,
                                                void* stream, DecodeSelection selection) {
  const std::int64_t num_requests = batch.seq_lens.shape[0], num_rows = index_q.shape[0];
  Launch l = common_setup(config, index_q, cache, batch.block_table, num_requests, out, stream);
  const std::int64_t hkv = config.resolve_heads().num_key_value_heads;
  const int dql = batch.decode_query_len;
  RowMap rows;
  rows.seq_lens = batch.seq_lens.as<const std::int32_t>();
  rows.seq_lens_stride = batch.seq_lens.stride[0];
  rows.num_requests = static_cast<std::int32_t>(num_requests);
  rows.decode_query_len = dql;
  l.score.rows = l.topk.rows = rows;

  const std::int64_t vectors = std::int64_t{dql} * l.score.num_index_heads;
  const std::int64_t chunk_rows =
      l.layout.chunk_rows == num_rows ? num_rows : l.layout.chunk_rows / dql * dql;
  // The attention selects only from scores of every row at once.
  const bool defer = selection == DecodeSelection::kDeferred && chunk_rows >= num_rows;
  for (std::int64_t begin = 0; begin < num_rows; begin += chunk_rows) {
    const IndexChunk chunk{begin, std::min(num_rows, begin + chunk_rows)};
    l.score.chunk = l.topk.chunk = chunk;
    const std::int64_t requests = chunk.rows() / dql;
    // A fixed split of each request's block range (from the table width, never the lengths): as
    // many splits as fill one wave of the kernel's resident CTAs, but none longer than
    // decode_split_pages (decode_split_pages says why).
    auto launch = [&]<class Traits>() {
      const std::int64_t blocks = std::max<std::int64_t>(1, l.score.max_blocks);
      const std::int64_t slots = index_score_resident_ctas<Traits>(l.cache_dtype, l.query_fp8);
      const std::int64_t splits = std::clamp<std::int64_t>(
          std::max(slots / requests, ceil_div(blocks, decode_split_pages(l.cache_dtype))), 1,
          blocks);
      l.score.pages_per_split = static_cast<std::int32_t>(ceil_div(blocks, splits));
      const dim3 grid(static_cast<unsigned>(requests),
                      static_cast<unsigned>(ceil_div(blocks, l.score.pages_per_split)));
      launch_index_score<Traits>(l.score, l.cache_dtype, l.query_fp8, grid, l.stream);
    };
    if (requests > 0) {
      if (vectors <= IndexScoreDecodeTraits16::kVectors) {
        launch.template operator()<IndexScoreDecodeTraits16>();
      } else if (vectors <= IndexScoreDecodeTraits64::kVectors) {
        launch.template operator()<IndexScoreDecodeTraits64>();
      } else {
        launch.template operator()<IndexScoreDecodeTraits256>();
      }
    }
    if (selection != DecodeSelection::kNone && !defer) launch_topk(l, hkv);
  }
  if (!defer) return std::nullopt;
  l.topk.chunk = IndexChunk{0, num_rows};
  return l.topk;
}

}  // namespace flashmsa::cuda
