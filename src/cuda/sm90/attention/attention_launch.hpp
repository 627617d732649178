// The attention kernels this build compiled (the generated list of cmake/sm90_kernels.cmake) and
// the run-time choice among them: traits by the caller, then cache format and MMA type from the
// cache and q dtypes. A combination left out of the build (FLASHMSA_SM90_KERNELS) is an
// unsupported error naming it, never a missing symbol.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "flashmsa/dtype.hpp"
#include "flashmsa/error.hpp"
#include "src/cuda/sm90/attention/attention_params.hpp"
#include "src/cuda/sm90/attention/attention_traits.hpp"

namespace flashmsa::cuda {

template <class Traits, KvFormat kFormat, class Elem, class QElem>
void launch_attention_kernel(const AttentionParams& p, dim3 grid, cudaStream_t stream);

template <class Traits, KvFormat kFormat, class Elem, class QElem>
inline constexpr bool kAttentionCompiled = false;

#define FLASHMSA_SM90_ATTENTION(Traits, Format, Elem, QElem)                              \
  template <>                                                                             \
  inline constexpr bool kAttentionCompiled<Traits, KvFormat::Format, Elem, QElem> = true; \
  extern template void launch_attention_kernel<Traits, KvFormat::Format, Elem, QElem>(    \
      const AttentionParams&, dim3, cudaStream_t);
#define FLASHMSA_SM90_INDEX_SCORE(Traits, Format, QueryFp8)
#include "sm90_kernels.inc"  // generated
#undef FLASHMSA_SM90_ATTENTION
#undef FLASHMSA_SM90_INDEX_SCORE

// Launches the traits' kernel for the cache dtype and q dtype: 16-bit caches compute in their own
// type (q converted), 8- and 4-bit ones in q's type.
template <class Traits>
void launch_attention(const AttentionParams& p, DType cache, DType q, dim3 grid,
                      cudaStream_t stream) {
  auto run = [&]<KvFormat kFormat, class Elem, class QElem>() {
    if constexpr (kAttentionCompiled<Traits, kFormat, Elem, QElem>) {
      launch_attention_kernel<Traits, kFormat, Elem, QElem>(p, grid, stream);
    } else {
      throw Error(
          ErrorKind::kUnsupported,
          detail::concat("this build left out the CUDA attention kernel for a ", to_string(cache),
                         " cache and ", to_string(q), " q (FLASHMSA_SM90_KERNELS)"));
    }
  };
  auto by_q = [&]<KvFormat kFormat>() {
    if (q == DType::kFp16) {
      run.template operator()<kFormat, __half, __half>();
    } else {
      run.template operator()<kFormat, __nv_bfloat16, __nv_bfloat16>();
    }
  };
  auto native = [&]<class CacheElem>() {
    if (q == DType::kFp16) {
      run.template operator()<KvFormat::kNative16, CacheElem, __half>();
    } else {
      run.template operator()<KvFormat::kNative16, CacheElem, __nv_bfloat16>();
    }
  };
  switch (cache) {
    case DType::kBf16: native.template operator()<__nv_bfloat16>(); break;
    case DType::kFp16: native.template operator()<__half>(); break;
    case DType::kFp8E4m3: by_q.template operator()<KvFormat::kE4m3>(); break;
    case DType::kFp8E5m2: by_q.template operator()<KvFormat::kE5m2>(); break;
    case DType::kNvfp4: by_q.template operator()<KvFormat::kNvfp4>(); break;
    default:
      throw Error(
          ErrorKind::kUnsupported,
          detail::concat("the CUDA attention has no kernel for a cache of ", to_string(cache)));
  }
}

}  // namespace flashmsa::cuda
