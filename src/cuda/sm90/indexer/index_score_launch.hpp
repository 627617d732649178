// The index scoring kernels this build compiled (the generated list of cmake/sm90_kernels.cmake)
// and the run-time choice among them by index-cache format and query dtype. A combination left
// out of the build (FLASHMSA_SM90_KERNELS) is an unsupported error naming it.
#pragma once

#include <cuda_runtime.h>

#include "flashmsa/dtype.hpp"
#include "flashmsa/error.hpp"
#include "src/cuda/launch.hpp"
#include "src/cuda/sm90/indexer/index_score_traits.hpp"
#include "src/cuda/sm90/indexer/indexer_params.hpp"

namespace flashmsa::cuda {

template <class Traits, KvFormat kFormat, bool kQueryFp8>
void launch_index_score_kernel(const IndexScoreParams& p, dim3 grid, cudaStream_t stream);
template <class Traits, KvFormat kFormat, bool kQueryFp8>
int index_score_kernel_ctas_per_sm();

template <class Traits, KvFormat kFormat, bool kQueryFp8>
inline constexpr bool kIndexScoreCompiled = false;

#define FLASHMSA_SM90_ATTENTION(Traits, Format, Elem, QElem)
#define FLASHMSA_SM90_INDEX_SCORE(Traits, Format, QueryFp8)                             \
  template <>                                                                           \
  inline constexpr bool kIndexScoreCompiled<Traits, KvFormat::Format, QueryFp8> = true; \
  extern template void launch_index_score_kernel<Traits, KvFormat::Format, QueryFp8>(   \
      const IndexScoreParams&, dim3, cudaStream_t);                                     \
  extern template int index_score_kernel_ctas_per_sm<Traits, KvFormat::Format, QueryFp8>();
#include "sm90_kernels.inc"  // generated
#undef FLASHMSA_SM90_ATTENTION
#undef FLASHMSA_SM90_INDEX_SCORE

// Returns f.template operator()<kFormat, kQueryFp8>() (of type R) for the traits' instantiation
// of the index cache dtype and the query dtype; an instantiation left out of the build is an
// unsupported error naming it.
template <class Traits, class R, class F>
R with_index_score_kernel(DType cache, bool query_fp8, F&& f) {
  auto run = [&]<KvFormat kFormat, bool kQueryFp8>() -> R {
    if constexpr (kIndexScoreCompiled<Traits, kFormat, kQueryFp8>) {
      return f.template operator()<kFormat, kQueryFp8>();
    } else {
      throw Error(ErrorKind::kUnsupported,
                  detail::concat("this build left out the CUDA index scoring kernel for a ",
                                 to_string(cache), " index cache and ", query_fp8 ? "fp8" : "bf16",
                                 " index_q (FLASHMSA_SM90_KERNELS)"));
    }
  };
  auto by_query = [&]<KvFormat kFormat>() -> R {
    if (query_fp8) return run.template operator()<kFormat, true>();
    return run.template operator()<kFormat, false>();
  };
  switch (cache) {
    case DType::kBf16: return by_query.template operator()<KvFormat::kNative16>();
    case DType::kFp8E4m3: return by_query.template operator()<KvFormat::kE4m3>();
    case DType::kNvfp4: return by_query.template operator()<KvFormat::kNvfp4>();
    default:
      throw Error(ErrorKind::kUnsupported,
                  detail::concat("the CUDA indexer has no kernel for an index cache of ",
                                 to_string(cache)));
  }
}

// Launches the traits' kernel for the index cache dtype and the query dtype.
template <class Traits>
void launch_index_score(const IndexScoreParams& p, DType cache, bool query_fp8, dim3 grid,
                        cudaStream_t stream) {
  FLASHMSA_CHECK_KIND(ErrorKind::kInternal,
                      p.pages_per_split >= 1 && p.pages_per_split <= kIndexScoreMaxSplitPages,
                      "index scoring: pages_per_split must be in [1, ", kIndexScoreMaxSplitPages,
                      "], got ", p.pages_per_split);
  with_index_score_kernel<Traits, void>(cache, query_fp8, [&]<KvFormat kFormat, bool kQueryFp8>() {
    launch_index_score_kernel<Traits, kFormat, kQueryFp8>(p, grid, stream);
  });
}

// The CTAs of that kernel the device holds at once: the largest one-wave grid.
template <class Traits>
int index_score_resident_ctas(DType cache, bool query_fp8) {
  return with_index_score_kernel<Traits, int>(
      cache, query_fp8, [&]<KvFormat kFormat, bool kQueryFp8>() {
        return index_score_kernel_ctas_per_sm<Traits, kFormat, kQueryFp8>() * sm_count();
      });
}

}  // namespace flashmsa::cuda
