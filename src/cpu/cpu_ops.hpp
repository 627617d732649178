// The CPU backend's entry points. Arguments arrive validated (src/ops.cpp).
#pragma once

#include "flashmsa/ops.hpp"

namespace flashmsa::cpu {

void insert_kv(const KvCacheView& cache, const TensorView& k, const TensorView& v,
               const TensorView& slot_mapping);
void insert_index_k(const IndexCacheView& cache, const TensorView& index_k,
                    const TensorView& slot_mapping);
void produce_qkv_index(const Config& config, const ProducerInputs& inputs,
                       const KvCacheView& kv_cache, const IndexCacheView& index_cache,
                       const ProducerOutputs& outputs, int threads);

}  // namespace flashmsa::cpu
