// The tiles of rows each CTA takes, from the row map and the planner's tile offsets: the
// attention's (decode tiles of up to kRows rows of one request; prefill tiles longest-first) and
// the index scoring's (one request per decode CTA; prefill tiles within the chunk).
#pragma once

#include <cstdint>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/sm90/scheduler/row_map.hpp"

namespace flashmsa::cuda {

// The query rows a CTA owns: rows [row, row + rows) of `request`, at positions pos, pos + 1, ...
// A negative position (padding, or lengths shorter than the rows) sees nothing.
struct AttentionTile {
  std::int32_t request = -1;
  std::int64_t row = 0, pos = -1;
  int rows = 0;
  bool padding = false;
  __device__ std::int64_t position(int i) const { return padding ? -1 : pos + i; }
};

// kRows rows per tile; decode tiles split each request's dql rows, prefill tiles come from the
// planner's tile_offset.
// Prefill: CTA `cta` of the grid (default: this one) takes tile total - 1 - cta.
template <int kRows>
__device__ AttentionTile attention_tile(const RowMap& m, const std::int32_t* tile_offset,
                                        unsigned cta = blockIdx.x) {
  AttentionTile tile;
  if (m.decode_query_len > 0) {
    const int dql = m.decode_query_len;
    const int tiles_per_request = (dql + kRows - 1) / kRows;
    const std::int64_t r = blockIdx.x / tiles_per_request;
    const int sub = static_cast<int>(blockIdx.x % tiles_per_request) * kRows;
    if (r >= m.num_requests) return tile;
    tile.request = static_cast<std::int32_t>(r);
    tile.row = r * dql + sub;
    tile.rows = min(kRows, dql - sub);
    const std::int64_t len = m.seq_lens[r * m.seq_lens_stride];
    tile.padding = len <= 0;
    tile.pos = len - dql + sub;
    return tile;
  }
  // Prefill: the last tiles (longest rows) first, so the heaviest CTAs start in the first wave.
  const std::int32_t total = tile_offset[m.num_requests];
  const std::int32_t i = total - 1 - static_cast<std::int32_t>(cta);
  if (i < 0) return tile;
  const std::int32_t lo = m.request_of_tile(tile_offset, i);
  const std::int64_t begin = m.request_begin[lo], end = m.request_end[lo];
  tile.request = lo;
  tile.row = begin + std::int64_t{i - tile_offset[lo]} * kRows;
  tile.rows = static_cast<int>(min64(kRows, end - tile.row));
  tile.pos = m.seq_lens[lo * m.seq_lens_stride] - (end - begin) + (tile.row - begin);
  return tile;
}

// The tile a CTA scores: request, first row, row count, position of the first row.
struct IndexTile {
  std::int32_t request = -1;
  std::int64_t row = 0, pos = 0;
  int rows = 0;
};

// Prefill tile i of the chunk (none past the last).
__device__ inline IndexTile index_prefill_tile(const RowMap& m, const std::int32_t* tile_offset,
                                               const IndexChunk& chunk, int rows_per_tile,
                                               std::int32_t i) {
  IndexTile tile;
  if (i >= tile_offset[m.num_requests]) return tile;
  const std::int32_t lo = m.request_of_tile(tile_offset, i);
  const std::int64_t begin = m.request_begin[lo], end = m.request_end[lo];
  const std::int64_t first = max64(begin, chunk.begin), last = min64(end, chunk.end);
  tile.request = lo;
  tile.row = first + std::int64_t{i - tile_offset[lo]} * rows_per_tile;
  tile.rows = static_cast<int>(min64(rows_per_tile, last - tile.row));
  tile.pos = m.seq_lens[lo * m.seq_lens_stride] - (end - begin) + (tile.row - begin);
  return tile;
}

// The prefill scoring's order of a chunk's tiles: a short one and a long one in turn (position 2j
// is tile j, position 2j + 1 tile tiles - 1 - j). Causal rows make a request's block counts grow
// with the tile index, so an even share of the (tile, block) pairs in this order spans a few
// tiles, never the dozens of one-block tiles at a request's start (each tile change reloads the
// query vectors).
__device__ inline IndexTile index_prefill_tile_in_order(const RowMap& m,
                                                        const std::int32_t* tile_offset,
                                                        const IndexChunk& chunk, int rows_per_tile,
                                                        std::int32_t position) {
  const std::int32_t tiles = tile_offset[m.num_requests];
  const std::int32_t i = position % 2 == 0 ? position / 2 : tiles - 1 - position / 2;
  return index_prefill_tile(m, tile_offset, chunk, rows_per_tile, i);
}

// The decode scoring's tile: one request per CTA (padding requests score nothing).
__device__ inline IndexTile index_decode_tile(const RowMap& m, const IndexChunk& chunk) {
  IndexTile tile;
  const std::int64_t r = chunk.begin / m.decode_query_len + blockIdx.x;
  if (r >= m.num_requests) return tile;
  const std::int64_t len = m.seq_lens[r * m.seq_lens_stride];
  if (len <= 0) return tile;  // padding: selects nothing
  tile.request = static_cast<std::int32_t>(r);
  tile.row = r * m.decode_query_len;
  tile.rows = m.decode_query_len;
  tile.pos = len - m.decode_query_len;
  return tile;
}

// The blocks a tile sees: through its last row's own block (0 for an empty tile).
__device__ inline std::int64_t index_tile_blocks(const IndexTile& tile, std::int64_t max_blocks) {
  const std::int64_t last_pos = tile.pos + tile.rows - 1;
  if (tile.request < 0 || tile.rows <= 0 || last_pos < 0) return 0;
  return min64(last_pos / 128 + 1, max_blocks);
}

}  // namespace flashmsa::cuda
