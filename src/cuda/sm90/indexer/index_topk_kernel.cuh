// The top-k kernels: index_topk_warp_kernel, one warp a (row, kv head), for tables of up to
// kWarpTopkMaxBlocks blocks (index_topk_warp.cuh); index_topk_kernel, one CTA a (row, kv head),
// for wider ones (index_topk_select.cuh).
#pragma once

#include "src/cuda/sm90/indexer/index_topk_select.cuh"
#include "src/cuda/sm90/indexer/index_topk_warp.cuh"

namespace flashmsa::cuda {

__global__ void __launch_bounds__(kIndexTopkThreads)
    index_topk_kernel(const __grid_constant__ IndexTopkParams p) {
  __shared__ TopkScratch<kIndexTopkThreads> scratch;
  extern __shared__ std::uint32_t keys[];  // topk_keys_bytes(max_blocks): key_slot(b)

  wait_for_previous_kernel();  // launched as a dependent of the scoring
  phase_stamp(p.clock, 0);
  const std::int64_t t = p.chunk.begin + blockIdx.x;
  const int kv_head = static_cast<int>(blockIdx.y);
  const int k = select_topk_row<kIndexTopkThreads>(p, t, kv_head, keys, scratch, true);
  allow_next_kernel();  // the attention's CTAs launch while the ids are written
  write_topk_row<kIndexTopkThreads>(p, t, kv_head, k, keys, scratch);
  phase_stamp(p.clock, 1);
}

// kMaxPerLane keys a lane at most: 8 for tables up to 256 blocks (32K tokens), 32 up to 1024.
// Registers are allocated for the largest variant a kernel holds: 64 a thread (8 keys a lane)
// give four CTAs an SM to hide the reductions' latency; 32 keys a lane need more than the 80 of
// three CTAs (the sorted path's ballots spilled there), so two (measured faster than three CTAs
// with the search alone at 128K: the top-k 1.45-1.53 ms against 1.63-1.65, H100).
template <int kMaxPerLane>
__global__ void __launch_bounds__(32 * kWarpTopkWarps, kMaxPerLane <= 8 ? 4 : 2)
    index_topk_warp_kernel(const __grid_constant__ IndexTopkParams p) {
  __shared__ WarpTopkScratch scratch[kWarpTopkWarps];

  wait_for_previous_kernel();  // launched as a dependent of the scoring
  phase_stamp(p.clock, 0);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t t = p.chunk.begin + std::int64_t{blockIdx.x} * kWarpTopkWarps + warp;
  const int kv_head = static_cast<int>(blockIdx.y);
  if (t < p.chunk.end) {
    const std::int64_t pos = p.rows.position(t);
    const int nvb = pos < 0 ? 0 : static_cast<int>(min64(pos / 128 + 1, p.max_blocks));
    // As few keys a lane as the row needs (a power of two).
    WarpTopkScratch& s = scratch[warp];
    if (nvb <= 32) {
      warp_topk_row<1>(p, t, kv_head, nvb, lane, s);
    } else if (nvb <= 64) {
      warp_topk_row<2>(p, t, kv_head, nvb, lane, s);
    } else if (nvb <= 128) {
      warp_topk_row<4>(p, t, kv_head, nvb, lane, s);
    } else if (kMaxPerLane == 8 || nvb <= 256) {
      warp_topk_row<8>(p, t, kv_head, nvb, lane, s);
    } else if constexpr (kMaxPerLane > 8) {
      if (nvb <= 512) {
        warp_topk_row<16>(p, t, kv_head, nvb, lane, s);
      } else {
        warp_topk_row<32>(p, t, kv_head, nvb, lane, s);
      }
    }
  }
  phase_stamp(p.clock, 1);
}

}  // namespace flashmsa::cuda
