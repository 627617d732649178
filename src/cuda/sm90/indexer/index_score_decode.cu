// The decode instantiations of the index scoring kernel: tiles of 16 and 64 (row, head) pairs.
#include "src/cuda/sm90/indexer/index_score_kernel.cuh"

namespace flashmsa::cuda {
template void launch_index_score<IndexScoreDecodeTraits16>(const IndexScoreParams&, DType, bool,
                                                           dim3, cudaStream_t);
template void launch_index_score<IndexScoreDecodeTraits64>(const IndexScoreParams&, DType, bool,
                                                           dim3, cudaStream_t);
}  // namespace flashmsa::cuda
