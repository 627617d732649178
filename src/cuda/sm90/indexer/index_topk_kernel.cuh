// index_topk_kernel: one CTA a (row, kv head) makes its exact top-k (index_topk_select.cuh).
#pragma once

#include "src/cuda/sm90/indexer/index_topk_select.cuh"

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

}  // namespace flashmsa::cuda
