// FlashMSA's operations. Each validates its arguments on the host (throwing Error that names the
// argument, the expected and the actual value), then runs on the backend that matches the
// tensors' device: CPU tensors on the CPU backend, CUDA tensors on the CUDA backend. Values
// inside tensors (slots, positions) are never trusted: an out-of-range slot writes nothing.
#pragma once

#include "flashmsa/cache.hpp"
#include "flashmsa/config.hpp"
#include "flashmsa/tensor.hpp"

namespace flashmsa {

struct OpOptions {
  // Validate values inside the tensors (slots, positions) before running, and throw naming the
  // first offending entry instead of skipping it. Costs a host synchronisation on CUDA.
  bool checked = false;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors; ignored on the CPU
};

// Writes K and V rows ([T, Hkv, D] each, bf16 / fp16 / fp32) into the main cache at
// slot_mapping[t] (int64 [T]; page = slot / page_size, offset = slot % page_size), quantizing to
// the cache dtype: fp8 as e4m3/e5m2_satfinite(x / scale), NVFP4 per group of 16 (spec 6).
// Negative slots are skipped; slots at or beyond the cache capacity write nothing.
void insert_kv(const KvCacheView& cache, const TensorView& k, const TensorView& v,
               const TensorView& slot_mapping, const OpOptions& options = {});

// Writes index-K rows ([T, Di]) into the index cache, likewise.
void insert_index_k(const IndexCacheView& cache, const TensorView& index_k,
                    const TensorView& slot_mapping, const OpOptions& options = {});

struct ProducerInputs {
  // [T, Hq*D + 2*Hkv*D + Hidx*Di + Di] bf16: [q | k | v | index_q | index_k] per token.
  TensorView qkv_index;
  TensorView q_norm_weight;        // [D]  bf16 or fp32 (Gemma: y = x * rms^-1 * (1 + w))
  TensorView k_norm_weight;        // [D]
  TensorView index_q_norm_weight;  // [Di]
  TensorView index_k_norm_weight;  // [Di]
  TensorView positions;            // [T] int32 or int64: absolute position of each row
  TensorView slot_mapping;         // [T] int64: main-cache slot, negative = do not write
  TensorView index_slot_mapping;   // [T] int64, or empty (no data) to use slot_mapping
};

struct ProducerOutputs {
  TensorView q;        // [T, Hq, D] bf16 or fp16
  TensorView index_q;  // [T, Hidx, Di] bf16 or fp16; fp8_e4m3 for the fp8 indexer
};

// The fused pre-processing of spec section 3: Gemma RMSNorm on q, k, index-q and index-k heads,
// partial NeoX RoPE on dims [0, rope_dim), one rounding at each store; q and index-q to their
// outputs, k and v into the main cache and index-k into the index cache.
//
// RoPE angles follow the engines' fp32 cos/sin caches: angle = float(p) * inv_freq[i] in fp32,
// inv_freq[i] = theta^(-2i/rope_dim) rounded to fp32; cos and sin of that angle are exact.
void produce_qkv_index(const Config& config, const ProducerInputs& inputs,
                       const KvCacheView& kv_cache, const IndexCacheView& index_cache,
                       const ProducerOutputs& outputs, const OpOptions& options = {});

}  // namespace flashmsa
