// Parameters of the indexer kernels (spec section 4) and the device reading of a batch's rows.
//
// The indexer runs as up to three launches per chunk of rows:
//   1. (prefill only) index_plan_kernel: each request's clamped row range and the chunk's
//      64-row query tiles, into the workspace;
//   2. index_score_kernel: tensor-core dots of a tile's index queries with one index-K page at a
//      time, the causal mask and the 128-key block max fused; only block scores reach memory
//      (workspace [Hidx, chunk rows, max_blocks] fp32);
//   3. the top-k (index_topk_kernel.cuh): group max, forcing and exact top-k of one (row, kv
//      head) per warp, or per CTA in tables wider than 1024 blocks.
#pragma once

#include <cstdint>

#include "flashmsa/config.hpp"
#include "flashmsa/dtype.hpp"
#include "src/cuda/common/device_plane.hpp"
#include "src/cuda/common/phase_clock.hpp"
#include "src/cuda/sm90/scheduler/row_map.hpp"

namespace flashmsa::cuda {

struct IndexScoreParams {
  const void* index_q = nullptr;                     // [T, Hidx, Di] bf16, or e4m3 (fp8 indexer)
  std::int64_t q_row_stride = 0, q_head_stride = 0;  // elements
  DevicePlane keys;        // index-K plane: (page, token) rows of Di values (head 0)
  DevicePlane key_scales;  // NVFP4 scale plane
  std::int64_t num_pages = 0;
  const std::int32_t* block_table = nullptr;  // [B, max_blocks]
  std::int64_t table_stride = 0;
  std::int32_t max_blocks = 0;
  std::int32_t num_index_heads = 0;
  // Blocks one CTA scores (grid.y splits the block range), at most kIndexScoreMaxSplitPages.
  std::int32_t pages_per_split = 0;
  RowMap rows;
  const std::int32_t* tile_offset = nullptr;  // prefill: [B + 1] first tile of each request
  IndexChunk chunk;
  float* scores = nullptr;  // [Hidx, chunk rows, max_blocks]
  PhaseClock clock;         // latency studies only (phase_clock.hpp)
};

struct IndexTopkParams {
  const float* scores = nullptr;  // [Hidx, chunk rows, max_blocks]
  RowMap rows;
  IndexChunk chunk;
  std::int32_t max_blocks = 0;
  std::int32_t group = 1;  // index heads per kv head (max-reduced before selecting)
  std::int32_t topk = 16, init = 0, local = 1;
  TopkOrder order = TopkOrder::kAscending;
  std::int32_t* topk_out = nullptr;  // [Hkv, T, topk] through strides
  std::int64_t topk_stride[3] = {};
  float* block_scores = nullptr;  // optional [Hkv, T, width]
  std::int64_t block_scores_stride[3] = {};
  std::int32_t block_scores_width = 0;
  PhaseClock clock;  // latency studies only (phase_clock.hpp)
};

}  // namespace flashmsa::cuda
