// The attention kernels this build compiled (the generated list of cmake/sm90_kernels.cmake) and
// the run-time choice among them: traits by the caller, then cache format and MMA type from the
// cache and q dtypes. A combination left out of the build (FLASHMSA_SM90_KERNELS) is an
// unsupported error naming it, never a missing symbol.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

#include "flashmsa/dtype.hpp"
#include "flashmsa/error.hpp"
#include "src/cuda/sm90/attention/attention_params.hpp"
#include "src/cuda/sm90/attention/attention_traits.hpp"

namespace flashmsa::cuda {

template <class Traits, KvFormat kFormat, class Elem, class QElem>
void launch_attention_kernel(const AttentionParams& p, dim3 grid, cudaStream_t stream);
template <class Traits, KvFormat kFormat, class Elem, class QElem>
int attention_kernel_clusters_at_once(int size);

template <class Traits, KvFormat kFormat, class Elem, class QElem>
inline constexpr bool kAttentionCompiled = false;

#define FLASHMSA_SM90_ATTENTION(Traits, Format, Elem, QElem)                              \
  template <>                                                                             \
  inline constexpr bool kAttentionCompiled<Traits, KvFormat::Format, Elem, QElem> = true; \
  extern template void launch_attention_kernel<Traits, KvFormat::Format, Elem, QElem>(    \
      const AttentionParams&, dim3, cudaStream_t);                                        \
  extern template int attention_kernel_clusters_at_once<Traits, KvFormat::Format, Elem, QElem>(int);
#define FLASHMSA_SM90_INDEX_SCORE(Traits, Format, QueryFp8)
#include "sm90_kernels.inc"  // generated
#undef FLASHMSA_SM90_ATTENTION
#undef FLASHMSA_SM90_INDEX_SCORE

// Returns f.template operator()<kFormat, Elem, QElem>() (of type R) for the traits' kernel of the
// cache dtype and q dtype: 16-bit caches compute in their own type (q converted), 8- and 4-bit
// ones in q's type. For a kernel left out of the build, missing() instead.
template <class Traits, class R, class F, class Missing>
R with_attention_kernel(DType cache, DType q, F&& f, Missing&& missing) {
  auto run = [&]<KvFormat kFormat, class Elem, class QElem>() -> R {
    if constexpr (kAttentionCompiled<Traits, kFormat, Elem, QElem>) {
      return f.template operator()<kFormat, Elem, QElem>();
    } else {
      return missing();
    }
  };
  auto by_q = [&]<KvFormat kFormat>() -> R {
    if (q == DType::kFp16) return run.template operator()<kFormat, __half, __half>();
    return run.template operator()<kFormat, __nv_bfloat16, __nv_bfloat16>();
  };
  auto native = [&]<class CacheElem>() -> R {
    if (q == DType::kFp16) return run.template operator()<KvFormat::kNative16, CacheElem, __half>();
    return run.template operator()<KvFormat::kNative16, CacheElem, __nv_bfloat16>();
  };
  switch (cache) {
    case DType::kBf16: return native.template operator()<__nv_bfloat16>();
    case DType::kFp16: return native.template operator()<__half>();
    case DType::kFp8E4m3: return by_q.template operator()<KvFormat::kE4m3>();
    case DType::kFp8E5m2: return by_q.template operator()<KvFormat::kE5m2>();
    case DType::kNvfp4: return by_q.template operator()<KvFormat::kNvfp4>();
    default:
      throw Error(
          ErrorKind::kUnsupported,
          detail::concat("the CUDA attention has no kernel for a cache of ", to_string(cache)));
  }
}

// The same; a kernel left out of the build is an unsupported error naming it.
template <class Traits, class R, class F>
R with_attention_kernel(DType cache, DType q, F&& f) {
  return with_attention_kernel<Traits, R>(cache, q, std::forward<F>(f), [&]() -> R {
    throw Error(
        ErrorKind::kUnsupported,
        detail::concat("this build left out the CUDA attention kernel for a ", to_string(cache),
                       " cache and ", to_string(q), " q (FLASHMSA_SM90_KERNELS)"));
  });
}

// Whether this build has the traits' kernel for the cache dtype and q dtype.
template <class Traits>
bool attention_compiled(DType cache, DType q) {
  return with_attention_kernel<Traits, bool>(
      cache, q, [&]<KvFormat, class, class>() { return true; }, [&] { return false; });
}

// Launches the traits' kernel for the cache dtype and q dtype.
template <class Traits>
void launch_attention(const AttentionParams& p, DType cache, DType q, dim3 grid,
                      cudaStream_t stream) {
  with_attention_kernel<Traits, void>(cache, q, [&]<KvFormat kFormat, class Elem, class QElem>() {
    launch_attention_kernel<Traits, kFormat, Elem, QElem>(p, grid, stream);
  });
}

}  // namespace flashmsa::cuda
