// Parameters of the CUDA attention kernels (spec sections 5 and 7).
//
// Sparse and dense attention run as up to two launches:
//   1. (prefill only) index_plan_kernel (the scheduler's, shared with the indexer): each request's
//      clamped row range and its tiles of attention_kernel's row count;
//   2. attention_kernel (decode, and prefill of 8- and 4-bit caches): one CTA per (tile of query
//      rows of one request, kv head, split). It gathers the union of the pages its rows selected
//      (each with a bitmask of the rows that selected it), streams those pages through shared
//      memory and lets each warp attend with its own row's 16 query heads to the pages that row
//      selected. Decode with splits > 1 runs a tile's splits as one cluster that merges them
//      (log-sum-exp weights) in its epilogue. Prefill of 16-bit caches runs
//      prefill_attention_kernel instead (the same tiles and union, on wgmma: its header).
// Prefill rows that no request covers get their empty output from attention_empty_rows_kernel.
#pragma once

#include <cstdint>

#include "flashmsa/dtype.hpp"
#include "flashmsa/formats/block_scaled.hpp"
#include "src/cuda/common/device_plane.hpp"
#include "src/cuda/common/phase_clock.hpp"
#include "src/cuda/sm90/indexer/indexer_params.hpp"
#include "src/cuda/sm90/scheduler/row_map.hpp"

namespace flashmsa::cuda {

// Where and how final output vectors are stored (bf16 / fp16 / fp32 rows, or MXFP8).
struct AttentionStore {
  void* out = nullptr;
  DType dtype = DType::kBf16;                    // bf16, fp16, fp32, or fp8_e4m3 for MXFP8
  std::int64_t row_stride = 0, head_stride = 0;  // elements (MXFP8: bytes of a row; head = D)
  float* lse = nullptr;                          // optional [T, Hq]
  std::int64_t lse_row_stride = 0, lse_head_stride = 0;
  std::uint8_t* mxfp8_scales = nullptr;
  std::int64_t mxfp8_scale_cols = 0;
  fmt::ScaleLayout mxfp8_layout = fmt::ScaleLayout::kRowMajor;
  fmt::Mxfp8ScaleRule mxfp8_rule = fmt::Mxfp8ScaleRule::kRceil;
};

struct AttentionParams {
  const void* q = nullptr;                           // [T, Hq, D] bf16 or fp16
  std::int64_t q_row_stride = 0, q_head_stride = 0;  // elements
  DevicePlane k, v, k_scales, v_scales;              // scales: NVFP4 only
  std::int64_t num_pages = 0;
  const std::int32_t* block_table = nullptr;  // [B, max_blocks]
  std::int64_t table_stride = 0;
  std::int32_t max_blocks = 0;
  std::int32_t group = 16;  // q heads per kv head (<= 16: one warp's MMA rows)
  std::int32_t num_q_heads = 64;
  float score_scale_log2 = 0;  // softmax scale * k_scale * log2(e): scores in log2 units
  float v_scale = 1.0f;
  RowMap rows;
  const std::int32_t* tile_offset = nullptr;  // prefill: [B + 1] first tile of each request
  std::int64_t num_rows = 0;
  // Selection: topk [Hkv, T, width] through strides; nullptr means dense (every visible block).
  const std::int32_t* topk = nullptr;
  std::int64_t topk_stride[3] = {};
  std::int32_t topk_width = 0;
  std::int32_t splits = 1;  // grid.z and the cluster: each split takes a share of the pages
  // Traits::kSelects (decode 1-row tiles): each tile makes its row's selection itself from the
  // indexer's block scores (select_topk_row, as index_topk_kernel makes it; split 0 writes the
  // top-k list and the block scores): one launch and one programmatic wait fewer a step. topk is
  // then unused.
  IndexTopkParams select;
  AttentionStore store;  // final outputs
  PhaseClock clock;      // latency studies only (phase_clock.hpp)
};

}  // namespace flashmsa::cuda
