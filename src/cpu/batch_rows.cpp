#include "src/cpu/batch_rows.hpp"

#include <algorithm>

namespace flashmsa::cpu {
namespace {

RowPlan base_plan(const TensorView& block_table, std::int64_t num_rows, std::int64_t block_size,
                  std::int64_t num_pages) {
  RowPlan plan;
  plan.block_size = block_size;
  plan.position.assign(static_cast<std::size_t>(num_rows), -1);
  plan.block_table = block_table.as<const std::int32_t>();
  plan.table_row_stride = block_table.stride[0];
  plan.max_blocks = block_table.shape[1];
  plan.num_pages = num_pages;
  return plan;
}

}  // namespace

RowPlan plan_rows(const PrefillBatch& batch, std::int64_t num_rows, std::int64_t block_size,
                  std::int64_t num_pages) {
  RowPlan plan = base_plan(batch.block_table, num_rows, block_size, num_pages);
  const auto* cu = batch.cu_seqlens_q.as<const std::int32_t>();
  const auto* lens = batch.seq_lens.as<const std::int32_t>();
  const std::int64_t num_requests = batch.seq_lens.shape[0];
  for (std::int64_t r = 0; r < num_requests; ++r) {
    // Clamp to the rows that exist and that no earlier request claimed.
    const std::int64_t prev_end = r ? plan.row_end.back() : 0;
    const std::int64_t begin =
        std::clamp<std::int64_t>(cu[r * batch.cu_seqlens_q.stride[0]], prev_end, num_rows);
    const std::int64_t end =
        std::clamp<std::int64_t>(cu[(r + 1) * batch.cu_seqlens_q.stride[0]], begin, num_rows);
    const std::int64_t len = lens[r * batch.seq_lens.stride[0]];
    plan.row_begin.push_back(begin);
    plan.row_end.push_back(end);
    for (std::int64_t t = begin; t < end; ++t) plan.position[t] = len - (end - begin) + (t - begin);
  }
  return plan;
}

RowPlan plan_rows(const DecodeBatch& batch, std::int64_t num_rows, std::int64_t block_size,
                  std::int64_t num_pages) {
  RowPlan plan = base_plan(batch.block_table, num_rows, block_size, num_pages);
  const auto* lens = batch.seq_lens.as<const std::int32_t>();
  const std::int64_t q = batch.decode_query_len;
  for (std::int64_t r = 0; r < batch.seq_lens.shape[0]; ++r) {
    const std::int64_t len = lens[r * batch.seq_lens.stride[0]];
    plan.row_begin.push_back(r * q);
    plan.row_end.push_back((r + 1) * q);
    // A padding row (length 0) gets negative positions and sees nothing.
    for (std::int64_t i = 0; i < q; ++i) plan.position[r * q + i] = len > 0 ? len - q + i : -1;
  }
  return plan;
}

}  // namespace flashmsa::cpu
