// The prefill instantiations of attention_kernel (one traits per file: builds parallelise).
#include "src/cuda/sm90/attention/attention_kernel.cuh"

namespace flashmsa::cuda {
template void launch_attention<AttentionPrefillTraits>(const AttentionParams&, DType, DType, dim3,
                                                       cudaStream_t);
}  // namespace flashmsa::cuda
