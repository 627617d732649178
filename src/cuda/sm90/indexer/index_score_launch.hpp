// The index scoring kernels this build compiled (the generated list of cmake/sm90_kernels.cmake)
// and the run-time choice among them by index-cache format and query dtype. A combination left
// out of the build (FLASHMSA_SM90_KERNELS) is an unsupported error naming it.
#pragma once

#include <cuda_runtime.h>

#include "flashmsa/dtype.hpp"
#include "flashmsa/error.hpp"
#include "src/cuda/sm90/indexer/index_score_traits.hpp"
#include "src/cuda/sm90/indexer/indexer_params.hpp"

namespace flashmsa::cuda {

template <class Traits, KvFormat kFormat, bool kQueryFp8>
void launch_index_score_kernel(const IndexScoreParams& p, dim3 grid, cudaStream_t stream);

template <class Traits, KvFormat kFormat, bool kQueryFp8>
inline constexpr bool kIndexScoreCompiled = false;

#define FLASHMSA_SM90_ATTENTION(Traits, Format, Elem, QElem)
#define FLASHMSA_SM90_INDEX_SCORE(Traits, Format, QueryFp8)                             \
  template <>                                                                           \
  inline constexpr bool kIndexScoreCompiled<Traits, KvFormat::Format, QueryFp8> = true; \
  extern template void launch_index_score_kernel<Traits, KvFormat::Format, QueryFp8>(   \
      const IndexScoreParams&, dim3, cudaStream_t);
#include "sm90_kernels.inc"  // generated
#undef FLASHMSA_SM90_ATTENTION
#undef FLASHMSA_SM90_INDEX_SCORE

// Launches the traits' kernel for the index cache dtype and the query dtype.
template <class Traits>
void launch_index_score(const IndexScoreParams& p, DType cache, bool query_fp8, dim3 grid,
                        cudaStream_t stream) {
  auto run = [&]<KvFormat kFormat, bool kQueryFp8>() {
    if constexpr (kIndexScoreCompiled<Traits, kFormat, kQueryFp8>) {
      launch_index_score_kernel<Traits, kFormat, kQueryFp8>(p, grid, stream);
    } else {
      throw Error(ErrorKind::kUnsupported,
                  detail::concat("this build left out the CUDA index scoring kernel for a ",
                                 to_string(cache), " index cache and ", query_fp8 ? "fp8" : "bf16",
                                 " index_q (FLASHMSA_SM90_KERNELS)"));
    }
  };
  auto by_query = [&]<KvFormat kFormat>() {
    if (query_fp8) {
      run.template operator()<kFormat, true>();
    } else {
      run.template operator()<kFormat, false>();
    }
  };
  switch (cache) {
    case DType::kBf16: by_query.template operator()<KvFormat::kNative16>(); break;
    case DType::kFp8E4m3: by_query.template operator()<KvFormat::kE4m3>(); break;
    case DType::kNvfp4: by_query.template operator()<KvFormat::kNvfp4>(); break;
    default:
      throw Error(ErrorKind::kUnsupported,
                  detail::concat("the CUDA indexer has no kernel for an index cache of ",
                                 to_string(cache)));
  }
}

}  // namespace flashmsa::cuda
