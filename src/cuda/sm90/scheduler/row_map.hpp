// The tile scheduler's shared parts: which request and position each query row has (RowMap),
// the chunk of rows one round of launches covers, and the device planner (plan_kernel.cuh) that
// turns cu_seqlens into request row ranges and tiles. The indexer and the attention both build
// their tiles from these.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

namespace flashmsa::cuda {

#ifdef __CUDACC__
// The last i in [0, n) with a[i] <= x, for a non-decreasing a with a[0] <= x (a request's or a
// tile's first entry in a table of running offsets).
__device__ inline std::int32_t last_at_or_below(const std::int32_t* a, std::int32_t n,
                                                std::int64_t x) {
  std::int32_t lo = 0, hi = n;
  while (hi - lo > 1) {
    const std::int32_t mid = (lo + hi) / 2;
    if (a[mid] <= x) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}
#endif

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
    return last_at_or_below(tile_offset, num_requests, i);
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
  // Optional (the prefill scoring's work list): tile_pages [tiles + 1], the running count of the
  // blocks the chunk's tiles see (index_tile_blocks) in index_prefill_tile_in_order's order; needs
  // seq_lens and max_blocks.
  std::int32_t* tile_pages = nullptr;
  const std::int32_t* seq_lens = nullptr;  // [B] L_r
  std::int64_t seq_lens_stride = 1;
  std::int32_t max_blocks = 0;
};

#ifdef __CUDACC__
// Launches index_plan_kernel (scheduler/plan.cu).
void launch_index_plan(const IndexPlanParams& plan, cudaStream_t stream);
#endif

}  // namespace flashmsa::cuda
