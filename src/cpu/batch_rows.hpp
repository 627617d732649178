// Which request and position each query row of a batch has, and the page of each of a
// request's logical blocks: the host-side reading of PrefillBatch / DecodeBatch that the CPU
// backend's indexer and attention share. Inconsistent device values never cause an access
// outside the caller's buffers: rows no request covers, and rows whose position would be
// negative, see nothing; block-table entries outside the cache read as "no page".
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "flashmsa/ops.hpp"

namespace flashmsa::cpu {

struct RowPlan {
  std::int64_t block_size = 128;
  std::vector<std::int64_t> position;            // per row; < 0: the row sees nothing
  std::vector<std::int64_t> row_begin, row_end;  // per request
  const std::int32_t* block_table = nullptr;
  std::int64_t table_row_stride = 0;  // elements
  std::int64_t max_blocks = 0;
  std::int64_t num_pages = 0;

  std::int64_t num_requests() const { return static_cast<std::int64_t>(row_begin.size()); }
  std::int64_t num_rows() const { return static_cast<std::int64_t>(position.size()); }
  // Blocks visible at position p, as far as the block table reaches: min(p / block + 1,
  // max_blocks), none for p < 0. So work is bounded by the table whatever seq_lens says (a
  // length beyond the table is bad input that the checked mode reports; the CUDA kernels clamp
  // the same way).
  std::int64_t visible_blocks(std::int64_t p) const {
    return p < 0 ? 0 : std::min(p / block_size + 1, max_blocks);
  }
  // The blocks position p needs, unclamped.
  std::int64_t needed_blocks(std::int64_t p) const { return p < 0 ? 0 : p / block_size + 1; }
  // Physical page of logical block b of request r, or -1 when the table has none there.
  std::int64_t page(std::int64_t r, std::int64_t b) const {
    if (b < 0 || b >= max_blocks) return -1;
    const std::int64_t p = block_table[r * table_row_stride + b];
    return p >= 0 && p < num_pages ? p : -1;
  }
};

RowPlan plan_rows(const PrefillBatch& batch, std::int64_t num_rows, std::int64_t block_size,
                  std::int64_t num_pages);
RowPlan plan_rows(const DecodeBatch& batch, std::int64_t num_rows, std::int64_t block_size,
                  std::int64_t num_pages);

}  // namespace flashmsa::cpu
