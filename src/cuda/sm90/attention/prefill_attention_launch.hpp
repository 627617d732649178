// The wgmma prefill attention (prefill_attention_kernel.cuh) seen from attention.cu: whether it
// takes a call, and its launch.
#pragma once

#include <cuda_runtime.h>

#include "flashmsa/cache.hpp"
#include "flashmsa/dtype.hpp"
#include "src/cuda/sm90/attention/attention_params.hpp"

namespace flashmsa::cuda {

// Launches prefill_attention_kernel for the planned tiles of p (grid: tiles x kv heads): every
// prefill of a bf16 or fp16 cache (q bf16 or fp16, converted to the cache's type). A cache whose
// planes the TMA unit cannot describe is an unsupported error naming its strides.
void launch_prefill_attention(const AttentionParams& p, const KvCacheView& kv, DType q_dtype,
                              dim3 grid, cudaStream_t stream);

}  // namespace flashmsa::cuda
