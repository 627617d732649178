// The speculative-decode (dql >= 2) instantiations of attention_kernel (one traits per file:
// builds parallelise).
#include "src/cuda/sm90/attention/attention_kernel.cuh"

namespace flashmsa::cuda {
template void launch_attention<AttentionDecodeSpecTraits>(const AttentionParams&, DType, DType,
                                                          dim3, cudaStream_t);
}  // namespace flashmsa::cuda
