// index_plan_kernel: one CTA turns cu_seqlens into each request's row range (clamped exactly as
// the CPU backend clamps inconsistent values: begin_r = min(T, max(0, cu[0..r])), end_r likewise
// with r + 1), numbers the tiles of the chunk's rows, request by request, and (where asked) counts
// the blocks each tile sees (in the scoring's order, index_prefill_tile_in_order), for the prefill
// scoring's even split of the chunk's pages.
#pragma once

#include <cub/block/block_scan.cuh>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/sm90/scheduler/row_map.hpp"
#include "src/cuda/sm90/scheduler/tiles.cuh"

namespace flashmsa::cuda {

// 512, not 1024: at 1024 threads the 64-register cap made the int64 scans spill.
constexpr int kIndexPlanThreads = 512;

struct MaxOp {
  __device__ std::int64_t operator()(std::int64_t a, std::int64_t b) const { return a > b ? a : b; }
};

__global__ void __launch_bounds__(kIndexPlanThreads)
    index_plan_kernel(const __grid_constant__ IndexPlanParams p) {
  using Scan = cub::BlockScan<std::int64_t, kIndexPlanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ std::int64_t carry_max, carry_tiles, carry_pages;
  __shared__ std::int64_t warp_last[kIndexPlanThreads / 32];
  if (threadIdx.x == 0) {
    carry_max = max(std::int64_t{0}, std::int64_t{p.cu_seqlens[0]});
    carry_tiles = 0;
    carry_pages = 0;
    p.tile_offset[0] = 0;
  }
  __syncthreads();
  for (std::int32_t base = 0; base < p.num_requests; base += kIndexPlanThreads) {
    const std::int32_t r = base + static_cast<std::int32_t>(threadIdx.x);
    const bool live = r < p.num_requests;
    // Running max of cu[0..r+1]; begin_r is the running max of cu[0..r] = end_{r-1}.
    const std::int64_t cu_next = live ? p.cu_seqlens[(r + 1) * p.cu_stride] : 0;
    std::int64_t running;
    Scan(scan_storage).InclusiveScan(cu_next, running, MaxOp());
    running = max(running, carry_max);
    const std::int64_t end = min(running, p.num_rows);
    __syncthreads();
    std::int64_t previous = __shfl_up_sync(0xffffffffu, running, 1);
    if (threadIdx.x % 32 == 31) warp_last[threadIdx.x / 32] = running;
    __syncthreads();
    if (threadIdx.x % 32 == 0)
      previous = threadIdx.x == 0 ? carry_max : warp_last[threadIdx.x / 32 - 1];
    const std::int64_t begin = min(max(previous, std::int64_t{0}), p.num_rows);
    std::int64_t tiles = 0;
    if (live) {
      p.request_begin[r] = static_cast<std::int32_t>(begin);
      p.request_end[r] = static_cast<std::int32_t>(end);
      const std::int64_t first = max64(begin, p.chunk.begin), last = min64(end, p.chunk.end);
      tiles = last > first ? (last - first + p.tile_rows - 1) / p.tile_rows : 0;
    }
    std::int64_t tiles_through;
    __syncthreads();
    Scan(scan_storage).InclusiveSum(tiles, tiles_through);
    if (live) p.tile_offset[r + 1] = static_cast<std::int32_t>(carry_tiles + tiles_through);
    __syncthreads();
    if (threadIdx.x == kIndexPlanThreads - 1) {
      carry_max = running;
      carry_tiles += tiles_through;
    }
    __syncthreads();
  }
  if (p.tile_pages == nullptr) return;

  // tile_pages: the running count of the blocks the chunk's tiles see, in the scoring's order. The
  // request ranges and tile offsets above are this CTA's own global writes, visible after the
  // barrier.
  RowMap m;
  m.seq_lens = p.seq_lens;
  m.seq_lens_stride = p.seq_lens_stride;
  m.num_requests = p.num_requests;
  m.request_begin = p.request_begin;
  m.request_end = p.request_end;
  const std::int32_t tiles = p.tile_offset[p.num_requests];
  if (threadIdx.x == 0) p.tile_pages[0] = 0;
  for (std::int32_t base = 0; base < tiles; base += kIndexPlanThreads) {
    const std::int32_t i = base + static_cast<std::int32_t>(threadIdx.x);
    std::int64_t pages = 0;
    if (i < tiles) {
      pages = index_tile_blocks(
          index_prefill_tile_in_order(m, p.tile_offset, p.chunk, p.tile_rows, i), p.max_blocks);
    }
    std::int64_t pages_through;
    Scan(scan_storage).InclusiveSum(pages, pages_through);
    if (i < tiles) p.tile_pages[i + 1] = static_cast<std::int32_t>(carry_pages + pages_through);
    __syncthreads();
    if (threadIdx.x == kIndexPlanThreads - 1) carry_pages += pages_through;
    __syncthreads();
  }
}

}  // namespace flashmsa::cuda
