// Host side of the wgmma prefill attention: its applicability, the K and V tensor maps, and its
// instantiations (bf16 and fp16 caches, each under bf16 or fp16 q).
#include "flashmsa/error.hpp"
#include "src/cuda/sm90/attention/attention_traits.hpp"
#include "src/cuda/sm90/attention/prefill_attention_kernel.cuh"
#include "src/cuda/sm90/attention/prefill_attention_launch.hpp"
#include "src/cuda/sm90/tma.hpp"

namespace flashmsa::cuda {

static_assert(PrefillAttentionTraits::kTokens == AttentionPrefillTraits::kRows &&
                  PrefillAttentionTraits::kMaxTopk == AttentionPrefillTraits::kMaxTopk,
              "both prefill kernels take the planner's tiles (attention.cu plans them) and the "
              "same top-k widths");

void launch_prefill_attention(const AttentionParams& p, const KvCacheView& kv, DType q_dtype,
                              dim3 grid, cudaStream_t stream) {
  const bool bf16 = kv.dtype == DType::kBf16;
  FLASHMSA_CHECK_KIND(ErrorKind::kInternal, bf16 || kv.dtype == DType::kFp16,
                      "the wgmma prefill attention takes bf16 or fp16 caches, got ",
                      to_string(kv.dtype));
  const int heads = static_cast<int>(kv.shape.num_kv_heads);
  const auto k_map = page_plane_tensor_map(kv.k, kv.shape.num_pages, heads, 128, 2, 64);
  const auto v_map = page_plane_tensor_map(kv.v, kv.shape.num_pages, heads, 128, 2, 64);
  // The planes' rows and strides are 16-byte aligned (common_params): only a driver without the
  // tensor-map entry point, or strides past TMA's 2^40 bytes, end here.
  FLASHMSA_CHECK_SUPPORTED(k_map.has_value() && v_map.has_value(),
                           "the CUDA driver cannot describe this KV cache to the TMA unit (page "
                           "stride ",
                           kv.k.page_stride, " bytes, head stride ", kv.k.head_stride,
                           " bytes, token stride ", kv.k.token_stride, " bytes, ",
                           kv.shape.num_pages, " pages)");
  const PrefillAttentionParams params{*k_map, *v_map, p};
  // 16-bit caches compute in their own type, q converted (as attention_kernel does).
  auto launch = [&]<class Elem>() {
    if (q_dtype == DType::kFp16) {
      launch_prefill_attention_kernel<Elem, __half>(params, grid, stream);
    } else {
      launch_prefill_attention_kernel<Elem, __nv_bfloat16>(params, grid, stream);
    }
  };
  if (bf16) {
    launch.template operator()<__nv_bfloat16>();
  } else {
    launch.template operator()<__half>();
  }
}

}  // namespace flashmsa::cuda
