// The prefill instantiation of the index scoring kernel (one per file: builds parallelise).
#include "src/cuda/sm90/indexer/index_score_kernel.cuh"

namespace flashmsa::cuda {
template void launch_index_score<IndexScorePrefillTraits>(const IndexScoreParams&, DType, bool,
                                                          dim3, cudaStream_t);
}  // namespace flashmsa::cuda
