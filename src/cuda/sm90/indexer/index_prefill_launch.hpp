// The prefill indexer's scoring (index_prefill_kernel.cuh) as the host sees it: the TMA tensor
// map of the index-K plane, and the launch.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "flashmsa/cache.hpp"
#include "src/cuda/sm90/indexer/indexer_params.hpp"

namespace flashmsa::cuda {

// The tensor map of the index-K plane for the configuration's pairings (bf16 or NVFP4 keys under
// bf16 queries, E4M3 keys under E4M3 queries): an unused empty map where no page is read by TMA
// (NVFP4 keys, widened by the kernel's own loads; a cache of no pages).
CUtensorMap index_prefill_keys_map(const IndexCacheView& cache, bool query_fp8);

// Launches the scoring over the planner's tiles (tile_pages: their running block counts in
// the scoring's order), one persistent CTA an SM.
void launch_index_prefill(const CUtensorMap& keys, const IndexScoreParams& score,
                          const std::int32_t* tile_pages, DType cache, cudaStream_t stream);

}  // namespace flashmsa::cuda
