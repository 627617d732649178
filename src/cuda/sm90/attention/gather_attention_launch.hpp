// The key-stationary prefill attention (gather_attention_kernel.cuh) seen from attention.cu.
#pragma once

#include <cuda_runtime.h>

#include "flashmsa/cache.hpp"
#include "flashmsa/dtype.hpp"
#include "src/cuda/sm90/attention/attention_params.hpp"

namespace flashmsa::cuda {

// Whether the key-stationary path takes this sparse prefill (16-bit caches, q of the cache's
// type, 16 q heads a kv head; opted into with FLASHMSA_PREFILL_GATHER=1 while it is measured).
bool gather_attention_applies(const AttentionParams& p, DType cache, DType q_dtype);

// Runs it over p's rows (the planner's row map must be in place), window by window.
void launch_gather_attention(const AttentionParams& p, const KvCacheView& kv, cudaStream_t stream);

}  // namespace flashmsa::cuda
