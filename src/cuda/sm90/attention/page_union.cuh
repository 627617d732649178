// The union of a tile's selected pages: the distinct blocks its rows selected, ascending, each with
// its page and a bitmask of the rows that selected it. Shared by the attention kernels that read
// top-k lists (a page loaded once serves every row of the tile that chose it).
#pragma once

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/sm90/attention/attention_params.hpp"
#include "src/cuda/sm90/scheduler/tiles.cuh"

namespace flashmsa::cuda {

// The block table of a tile's request: page_of(b) is block b's page, or -1 where b or its page
// is out of range (never dereferenced); `blocks` counts the blocks the tile's last row sees.
struct TileTable {
  const std::int32_t* row;
  std::int32_t max_blocks;
  std::int64_t num_pages;
  std::int64_t blocks;
  __device__ std::int64_t page_of(std::int64_t b) const {
    if (b < 0 || b >= max_blocks) return -1;
    const std::int64_t page = row[b];
    return page >= 0 && page < num_pages ? page : -1;
  }
};
__device__ inline TileTable tile_table(const AttentionParams& p, const AttentionTile& tile) {
  const std::int64_t last_pos = tile.position(tile.rows - 1);
  return {p.block_table + tile.request * p.table_stride, p.max_blocks, p.num_pages,
          last_pos < 0 ? 0 : last_pos / 128 + 1};
}

// Shared memory the builder borrows (free until the caller's page ring starts): the marks of one
// window of kWindow blocks and the scan's storage.
template <int kThreads, int kWindow>
constexpr int page_union_scratch_bytes() {
  return kWindow * 4 +
         static_cast<int>(sizeof(typename cub::BlockScan<int, kThreads>::TempStorage));
}

// Builds the union of the selections of the tile's `rows` rows (at most 32: a bit each in the
// mask) into union_block / union_page / union_mask and returns its length, the same in every
// thread of the CTA, all of which call it (a CTA barrier ends it).
// selected_block(row, j) is row's j-th entry where it counts (visible, with a page), else -1;
// page_of(block) the block's page. Blocks are marked a window of kWindow at a time (tile_blocks
// may be far more than the union holds), then each thread compacts a run of consecutive blocks,
// so the union comes out ascending.
template <int kThreads, int kWindow, class Selected, class PageOf>
__device__ int build_page_union(int rows, int width, std::int64_t tile_blocks,
                                Selected&& selected_block, PageOf&& page_of, std::byte* scratch,
                                std::int32_t* union_block, std::int32_t* union_page,
                                std::uint32_t* union_mask) {
  using Scan = cub::BlockScan<int, kThreads>;
  auto* marks = reinterpret_cast<std::uint32_t*>(scratch);
  auto* scan_storage = reinterpret_cast<typename Scan::TempStorage*>(marks + kWindow);
  __shared__ int carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  const int candidates = rows * width;
  for (std::int64_t w0 = 0; w0 < tile_blocks; w0 += kWindow) {
    const int window = static_cast<int>(min64(kWindow, tile_blocks - w0));
    for (int i = threadIdx.x; i < window; i += kThreads) marks[i] = 0;
    __syncthreads();
    for (int c = threadIdx.x; c < candidates; c += kThreads) {
      const std::int64_t b = selected_block(c / width, c % width);
      if (b >= w0 && b < w0 + window) atomicOr(&marks[b - w0], 1u << (c / width));
    }
    __syncthreads();
    const int per_thread = (window + kThreads - 1) / kThreads;
    const int first = threadIdx.x * per_thread;
    const int last = min(window, first + per_thread);
    int count = 0;
    for (int i = first; i < last; ++i) count += marks[i] != 0;
    int offset, total;
    Scan(*scan_storage).ExclusiveSum(count, offset, total);
    offset += carry;
    for (int i = first; i < last; ++i) {
      const std::uint32_t m = marks[i];
      if (m == 0) continue;
      const std::int64_t b = w0 + i;
      union_block[offset] = static_cast<std::int32_t>(b);
      union_page[offset] = static_cast<std::int32_t>(page_of(b));
      union_mask[offset] = m;
      ++offset;
    }
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  return carry;
}

}  // namespace flashmsa::cuda
