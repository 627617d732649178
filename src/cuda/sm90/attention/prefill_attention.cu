// Host side of the wgmma prefill attention: its applicability, the K and V tensor maps, and its
// instantiations (bf16 and fp16 caches, each under bf16 or fp16 q).
#include "src/cuda/sm90/attention/attention_traits.hpp"
#include "src/cuda/sm90/attention/prefill_attention_kernel.cuh"
#include "src/cuda/sm90/attention/prefill_attention_launch.hpp"
#include "src/cuda/sm90/tma.hpp"

namespace flashmsa::cuda {

static_assert(PrefillAttentionTraits::kTokens == AttentionPrefillTraits::kRows &&
                  PrefillAttentionTraits::kMaxTopk == AttentionPrefillTraits::kMaxTopk,
              "both prefill kernels take the planner's tiles (attention.cu plans them) and the "
              "same top-k widths");

bool launch_prefill_attention(const AttentionParams& p, const KvCacheView& kv, DType q_dtype,
                              dim3 grid, cudaStream_t stream) {
  const bool bf16 = kv.dtype == DType::kBf16;
  if ((!bf16 && kv.dtype != DType::kFp16) || kv.shape.head_dim != 128 ||
      kv.shape.page_size != 128) {
    return false;
  }
  const int heads = static_cast<int>(kv.shape.num_kv_heads);
  const auto k_map = page_plane_tensor_map(kv.k, kv.shape.num_pages, heads, 128, 2, 64);
  const auto v_map = page_plane_tensor_map(kv.v, kv.shape.num_pages, heads, 128, 2, 64);
  if (!k_map || !v_map) return false;
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
  return true;
}

}  // namespace flashmsa::cuda
