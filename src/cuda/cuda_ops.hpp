// The CUDA backend's entry points, called by src/ops.cpp after validation. A CPU-only build
// links src/cuda/no_cuda.cpp, whose versions throw Error(kUnsupported).
#pragma once

#include <cstddef>
#include <vector>

#include "flashmsa/ops.hpp"
#include "flashmsa/projection.hpp"

namespace flashmsa::cuda {

// The bytes a device tensor spans (from its data pointer to its last element), copied to the
// host after synchronising `stream`: the checked mode's reading of device values.
std::vector<std::byte> copy_to_host(const TensorView& t, void* stream);

// Insertion of K/V (or index-K) rows at slots; `stream` is a cudaStream_t.
void insert_kv(const KvCacheView& cache, const TensorView& k, const TensorView& v,
               const TensorView& slot_mapping, void* stream);
void insert_index_k(const IndexCacheView& cache, const TensorView& index_k,
                    const TensorView& slot_mapping, void* stream);

// The fused norm / RoPE / cast / insert producer (spec section 3).
void produce_qkv_index(const Config& config, const ProducerInputs& in, const KvCacheView& kv,
                       const IndexCacheView& ix, const ProducerOutputs& out, void* stream);

// The indexer (spec section 4): score, block max and top-k; arguments validated by src/ops.cpp.
void index_prefill(const Config& config, const TensorView& index_q, const IndexCacheView& cache,
                   const PrefillBatch& batch, const IndexOutputs& out, void* stream);
void index_decode(const Config& config, const TensorView& index_q, const IndexCacheView& cache,
                  const DecodeBatch& batch, const IndexOutputs& out, void* stream);
// The indexers with the top-k selection optional (select = false: block scores only, into the
// workspace): let the benchmark time scoring and selection apart. Not part of the API.
void index_prefill_phases(const Config& config, const TensorView& index_q,
                          const IndexCacheView& cache, const PrefillBatch& batch,
                          const IndexOutputs& out, void* stream, bool select);
void index_decode_phases(const Config& config, const TensorView& index_q,
                         const IndexCacheView& cache, const DecodeBatch& batch,
                         const IndexOutputs& out, void* stream, bool select);

// Sparse and dense attention (spec sections 5 and 7); arguments validated by src/ops.cpp.
void sparse_attention_prefill(const Config& config, const TensorView& q, const KvCacheView& kv,
                              const PrefillBatch& batch, const TensorView& topk,
                              const AttentionOutputs& out, void* stream);
void sparse_attention_decode(const Config& config, const TensorView& q, const KvCacheView& kv,
                             const DecodeBatch& batch, const TensorView& topk,
                             const AttentionOutputs& out, void* stream);
// The decode step of one sparse layer (flashmsa::sparse_decode_step): index_decode, then
// sparse_attention_decode over its top-k, with the same outputs; where the attention's tiles hold
// one row, its grid at most two CTAs an SM and every row fits one scoring chunk, the attention
// makes each row's selection itself and no top-k kernel runs.
void sparse_decode_step(const Config& config, const TensorView& index_q,
                        const IndexCacheView& index_cache, const TensorView& q,
                        const KvCacheView& kv, const DecodeBatch& batch,
                        const IndexOutputs& index_out, const AttentionOutputs& out, void* stream);
void dense_attention(const Config& config, const TensorView& q, const KvCacheView& kv,
                     const PrefillBatch& batch, const AttentionOutputs& out, void* stream);

// The fused Q/K/V + index projection: per-token E4M3 quantization, then the cuBLASLt FP8 GEMM
// (include/flashmsa/projection.hpp); arguments validated by src/projection.cpp.
void project_qkv_index(const ProjectionWeightView& weights, const TensorView& hidden,
                       const TensorView& out, const TensorView& workspace, void* stream);

}  // namespace flashmsa::cuda
