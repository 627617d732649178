// The CUDA backend's entry points, called by src/ops.cpp after validation. A CPU-only build
// links src/cuda/no_cuda.cpp, whose versions throw Error(kUnsupported).
#pragma once

#include "flashmsa/ops.hpp"

namespace flashmsa::cuda {

// Insertion of K/V (or index-K) rows at slots; `stream` is a cudaStream_t.
void insert_kv(const KvCacheView& cache, const TensorView& k, const TensorView& v,
               const TensorView& slot_mapping, void* stream);
void insert_index_k(const IndexCacheView& cache, const TensorView& index_k,
                    const TensorView& slot_mapping, void* stream);

}  // namespace flashmsa::cuda
