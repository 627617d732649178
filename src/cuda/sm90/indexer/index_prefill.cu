// Host side of the wgmma prefill indexer: its instantiations, their choice by cache dtype, and
// the index-K tensor map.
#include "src/cuda/sm90/indexer/index_prefill_kernel.cuh"
#include "src/cuda/sm90/indexer/index_prefill_launch.hpp"
#include "src/cuda/sm90/tma.hpp"

namespace flashmsa::cuda {

std::optional<CUtensorMap> index_prefill_wgmma_keys(const IndexCacheView& cache, bool query_fp8) {
  // The configuration's pairings only (E4M3 queries exactly under E4M3 keys).
  if (query_fp8 != (cache.dtype == DType::kFp8E4m3)) return std::nullopt;
  if (cache.dtype == DType::kBf16)
    return page_plane_tensor_map(cache.k, cache.num_pages, 128, 2, 64);
  if (cache.dtype == DType::kFp8E4m3) {
    return page_plane_tensor_map(cache.k, cache.num_pages, 128, 1, 128);
  }
  // NVFP4 pages are widened by the kernel's own loads: no tensor map to read.
  if (cache.dtype == DType::kNvfp4) return CUtensorMap{};
  return std::nullopt;
}

void launch_index_prefill_wgmma(const CUtensorMap& keys, const IndexScoreParams& score,
                                const std::int32_t* tile_pages, DType cache, cudaStream_t stream) {
  IndexPrefillParams p{keys, score, tile_pages};
  const dim3 grid(static_cast<unsigned>(sm_count()));
  if (cache == DType::kFp8E4m3) {
    launch_index_prefill_kernel<KvFormat::kE4m3>(p, grid, stream);
  } else if (cache == DType::kNvfp4) {
    launch_index_prefill_kernel<KvFormat::kNvfp4>(p, grid, stream);
  } else {
    launch_index_prefill_kernel<KvFormat::kNative16>(p, grid, stream);
  }
}

}  // namespace flashmsa::cuda
