// The wgmma prefill indexer (index_prefill_kernel.cuh) as the host sees it: which index-cache
// and query pairings it runs, the TMA tensor map of the index-K plane, and the launch.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <optional>

#include "flashmsa/cache.hpp"
#include "src/cuda/sm90/indexer/indexer_params.hpp"

namespace flashmsa::cuda {

// The tensor map of the index-K plane where the wgmma kernel scores this pairing (bf16 or NVFP4
// keys with bf16 queries, E4M3 keys with E4M3 queries) and, for the TMA-read ones, TMA can
// describe the plane (NVFP4: an unused empty map); nullopt: the pairing takes
// index_score_kernel.
std::optional<CUtensorMap> index_prefill_wgmma_keys(const IndexCacheView& cache, bool query_fp8);

// Launches the wgmma kernel over the planner's tiles (tile_pages: their running block counts in
// the scoring's order), one persistent CTA an SM.
void launch_index_prefill_wgmma(const CUtensorMap& keys, const IndexScoreParams& score,
                                const std::int32_t* tile_pages, DType cache, cudaStream_t stream);

}  // namespace flashmsa::cuda
