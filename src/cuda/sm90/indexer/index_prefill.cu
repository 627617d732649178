// Host side of the prefill indexer's scoring: its instantiations, their choice by cache dtype,
// and the index-K tensor map.
#include "src/cuda/sm90/indexer/index_prefill_kernel.cuh"
#include "src/cuda/sm90/indexer/index_prefill_launch.hpp"
#include "src/cuda/sm90/tma.hpp"

namespace flashmsa::cuda {

CUtensorMap index_prefill_keys_map(const IndexCacheView& cache, bool query_fp8) {
  // Config::validate pairs E4M3 queries exactly with E4M3 keys (spec section 4).
  FLASHMSA_CHECK_KIND(ErrorKind::kInternal, query_fp8 == (cache.dtype == DType::kFp8E4m3),
                      "the prefill indexer pairs E4M3 queries with E4M3 keys only, got ",
                      query_fp8 ? "fp8_e4m3" : "bf16", " queries and ", to_string(cache.dtype),
                      " keys");
  if (cache.dtype == DType::kNvfp4 || cache.num_pages < 1) return CUtensorMap{};
  const bool fp8 = cache.dtype == DType::kFp8E4m3;
  const std::optional<CUtensorMap> map =
      page_plane_tensor_map(cache.k, cache.num_pages, 0, 128, fp8 ? 1 : 2, fp8 ? 128 : 64);
  // The plane's rows and strides are 16-byte aligned (common_setup): only a driver without the
  // tensor-map entry point, or strides past TMA's 2^40 bytes, end here.
  FLASHMSA_CHECK_SUPPORTED(map.has_value(),
                           "the CUDA driver cannot describe this index cache to the TMA unit "
                           "(page stride ",
                           cache.k.page_stride, " bytes, ", cache.num_pages, " pages)");
  return *map;
}

void launch_index_prefill(const CUtensorMap& keys, const IndexScoreParams& score,
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
