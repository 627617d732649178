// The layout of the device scratch the CUDA indexer needs (index_workspace_bytes): the plan of
// the batch's rows and the block scores of one chunk of rows. Rows are scored in chunks so the
// scratch stays bounded (256 MiB of scores) however long the prefill.
#pragma once

#include <algorithm>
#include <cstdint>

namespace flashmsa::detail {

inline constexpr std::int64_t kIndexScoreBudgetBytes = std::int64_t{256} << 20;
inline constexpr std::int64_t kIndexMinChunkRows = 2048;
// The (row, index head) vectors of one prefill scoring tile: a tile holds 256 / Hidx rows.
inline constexpr std::int64_t kIndexTileVectors = 256;

struct IndexWorkspaceLayout {
  std::int64_t chunk_rows = 0;  // rows scored per round (>= 1 whenever there are rows)
  std::int64_t request_begin = 0, request_end = 0, tile_offset = 0, tile_pages = 0,
               scores = 0;  // byte offsets
  std::int64_t bytes = 0;
};

constexpr std::int64_t align_up(std::int64_t x, std::int64_t a) {
  return (x + a - 1) / a * a;
}

constexpr IndexWorkspaceLayout index_workspace_layout(std::int64_t num_rows,
                                                      std::int64_t num_requests,
                                                      std::int64_t index_heads,
                                                      std::int64_t max_blocks) {
  IndexWorkspaceLayout l;
  const std::int64_t row_bytes = std::max<std::int64_t>(1, index_heads * max_blocks * 4);
  l.chunk_rows =
      std::min(num_rows, std::max(kIndexMinChunkRows, kIndexScoreBudgetBytes / row_bytes));
  l.request_begin = 0;
  l.request_end = align_up(4 * num_requests, 256);
  l.tile_offset = l.request_end + align_up(4 * num_requests, 256);
  l.tile_pages = l.tile_offset + align_up(4 * (num_requests + 1), 256);
  // A chunk's tiles: at most one partial tile a request besides the full ones.
  const std::int64_t tile_rows = std::max<std::int64_t>(1, kIndexTileVectors / index_heads);
  const std::int64_t max_tiles = (l.chunk_rows + tile_rows - 1) / tile_rows + num_requests;
  l.scores = l.tile_pages + align_up(4 * (max_tiles + 1), 256);
  l.bytes = l.scores + l.chunk_rows * row_bytes;
  return l;
}

}  // namespace flashmsa::detail
