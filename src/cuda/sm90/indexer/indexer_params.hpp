// Parameters of the indexer kernels (spec section 4) and the device reading of a batch's rows.
//
// The indexer runs as up to three launches per chunk of rows:
//   1. (prefill only) index_plan_kernel: each request's clamped row range and the chunk's
//      64-row query tiles, into the workspace;
//   2. index_score_kernel: tensor-core dots of a tile's index queries with one index-K page at a
//      time, the causal mask and the 128-key block max fused; only block scores reach memory
//      (workspace [Hidx, chunk rows, max_blocks] fp32);
//   3. index_topk_kernel: group max, forcing and exact top-k of one (row, kv head) per CTA.
#pragma once

#include <cstdint>

#include "flashmsa/config.hpp"
#include "flashmsa/dtype.hpp"

namespace flashmsa::cuda {

// Which request and absolute position each query row has: the device twin of cpu::RowPlan.
// Decode rows are uniform (row r * dql + i of request r); prefill rows use the request ranges
// index_plan_kernel computed with the CPU backend's clamping. A negative position sees nothing.
struct RowMap {
  const std::int32_t* seq_lens = nullptr;  // [B] L_r
  std::int64_t seq_lens_stride = 1;
  std::int32_t num_requests = 0;
  std::int32_t decode_query_len = 0;            // > 0: uniform decode rows
  const std::int32_t* request_begin = nullptr;  // prefill: [B] first row (workspace)
  const std::int32_t* request_end = nullptr;    // prefill: [B] one past the last row

#ifdef __CUDACC__
  // Request owning row t, or -1.
  __device__ std::int32_t request_of(std::int64_t t) const {
    if (decode_query_len > 0) {
      const std::int64_t r = t / decode_query_len;
      return r < num_requests ? static_cast<std::int32_t>(r) : -1;
    }
    std::int32_t lo = 0, hi = num_requests;  // first request whose end is past t
    while (lo < hi) {
      const std::int32_t mid = (lo + hi) / 2;
      if (request_end[mid] > t) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo < num_requests && request_begin[lo] <= t ? lo : -1;
  }
  // Prefill tiles: the request owning tile i, given each request's first tile
  // (tile_offset [B + 1], non-decreasing; i < tile_offset[B]).
  __device__ std::int32_t request_of_tile(const std::int32_t* tile_offset, std::int32_t i) const {
    std::int32_t lo = 0, hi = num_requests;  // last request whose first tile is <= i
    while (hi - lo > 1) {
      const std::int32_t mid = (lo + hi) / 2;
      if (tile_offset[mid] <= i) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return lo;
  }
  __device__ std::int64_t position(std::int64_t t) const {
    const std::int32_t r = request_of(t);
    if (r < 0) return -1;
    const std::int64_t len = seq_lens[r * seq_lens_stride];
    if (decode_query_len > 0) {
      return len > 0 ? len - decode_query_len + (t - std::int64_t{r} * decode_query_len) : -1;
    }
    const std::int64_t begin = request_begin[r], end = request_end[r];
    return len - (end - begin) + (t - begin);
  }
#endif
};

// Rows [chunk_begin, chunk_end) of the batch are scored and selected by one round of launches.
struct IndexChunk {
  std::int64_t begin = 0, end = 0;
  constexpr std::int64_t rows() const { return end - begin; }
};

struct IndexScoreParams {
  const void* index_q = nullptr;                     // [T, Hidx, Di] bf16, or e4m3 (fp8 indexer)
  std::int64_t q_row_stride = 0, q_head_stride = 0;  // elements
  const std::byte* keys = nullptr;  // index-K plane: (page, token) rows of Di values
  std::int64_t key_page_stride = 0, key_token_stride = 0;  // bytes
  const std::byte* key_scales = nullptr;                   // NVFP4 scale plane
  std::int64_t scale_page_stride = 0, scale_token_stride = 0;
  std::int64_t num_pages = 0;
  const std::int32_t* block_table = nullptr;  // [B, max_blocks]
  std::int64_t table_stride = 0;
  std::int32_t max_blocks = 0;
  std::int32_t num_index_heads = 0;
  std::int32_t pages_per_split = 0;  // blocks one CTA scores (grid.y splits the block range)
  RowMap rows;
  const std::int32_t* tile_offset = nullptr;  // prefill: [B + 1] first tile of each request
  IndexChunk chunk;
  float* scores = nullptr;  // [Hidx, chunk rows, max_blocks]
};

struct IndexPlanParams {
  const std::int32_t* cu_seqlens = nullptr;  // [B + 1]
  std::int64_t cu_stride = 1;
  std::int32_t num_requests = 0;
  std::int64_t num_rows = 0;
  IndexChunk chunk;
  std::int32_t tile_rows = 0;
  std::int32_t* request_begin = nullptr;  // [B]
  std::int32_t* request_end = nullptr;    // [B]
  std::int32_t* tile_offset = nullptr;    // [B + 1], tiles of the chunk
};

#ifdef __CUDACC__
// Launches index_plan_kernel (defined with the indexer; the attention plans its tiles with it).
void launch_index_plan(const IndexPlanParams& plan, cudaStream_t stream);
#endif

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
};

}  // namespace flashmsa::cuda
