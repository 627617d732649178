// The device planner's launch (shared by the indexer and the attention prefill).
#include "src/cuda/launch.hpp"
#include "src/cuda/sm90/scheduler/plan_kernel.cuh"

namespace flashmsa::cuda {

void launch_index_plan(const IndexPlanParams& plan, cudaStream_t stream) {
  launch_kernel(index_plan_kernel, dim3(1), kIndexPlanThreads, 0, stream, plan);
}

}  // namespace flashmsa::cuda
