// Host-side helpers every CUDA op shares: the checks of caller buffers the kernels rely on
// (alignment, the device workspace) and kernel launches with their error check. Only the host
// parts of the .cu files include this.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "flashmsa/cache.hpp"
#include "flashmsa/error.hpp"
#include "flashmsa/tensor.hpp"

namespace flashmsa::cuda {

inline bool aligned(const void* p, std::int64_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// The pointer and every stride of a cache plane are multiples of `alignment`.
inline bool plane_aligned(const CachePlane& c, std::int64_t alignment) {
  return aligned(c.data, alignment) && c.page_stride % alignment == 0 &&
         c.head_stride % alignment == 0 && c.token_stride % alignment == 0;
}

// The caller's device workspace: at least `bytes` (what `size_function` returns), 256-byte
// aligned (every region in it is laid out at 256-byte offsets).
inline std::byte* checked_workspace(const TensorView& workspace, std::int64_t bytes,
                                    const char* size_function) {
  FLASHMSA_CHECK_ARG(
      workspace.data != nullptr && workspace.shape[0] >= bytes && aligned(workspace.data, 256),
      "workspace must be a 256-byte aligned device buffer of at least ", bytes, " bytes (",
      size_function, ") on the CUDA backend, got ", workspace.data ? workspace.shape[0] : 0,
      " bytes");
  return static_cast<std::byte*>(workspace.data);
}

// Raises `kernel`'s dynamic shared-memory limit to `smem` bytes where it uses any (launches and
// occupancy queries above the default 48 KB need it).
template <class... Params>
void allow_dynamic_smem(void (*kernel)(Params...), int smem) {
  if (smem > 0) {
    FLASHMSA_CHECK_CUDA(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
}

// Launches `kernel` on `stream` (raising its dynamic shared-memory limit first when it uses
// any) and checks the launch.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, int smem, cudaStream_t stream,
                   Args&&... args) {
  allow_dynamic_smem(kernel, smem);
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  FLASHMSA_CHECK_LAUNCH();
}

// The same as a programmatic dependent of the stream's previous kernel: its CTAs may be launched
// while that kernel still runs (once every CTA of it has called allow_next_kernel() or exited),
// which hides the launch latency between the kernels of a decode step. The kernel must call
// wait_for_previous_kernel() before it reads or writes memory that earlier work touches. With a
// cluster shape other than 1 x 1 x 1 the CTAs run in thread-block clusters of that shape (grid
// divisible by it, at most 8 CTAs).
template <class... Params, class... Args>
void launch_dependent_cluster_kernel(void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block,
                                     int smem, cudaStream_t stream, Args&&... args) {
  allow_dynamic_smem(kernel, smem);
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = cluster.x;
  attrs[1].val.clusterDim.y = cluster.y;
  attrs[1].val.clusterDim.z = cluster.z;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = static_cast<std::size_t>(smem);
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = cluster.x * cluster.y * cluster.z > 1 ? 2 : 1;
  FLASHMSA_CHECK_CUDA(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// CTAs of `kernel` (block threads, dynamic shared memory) one SM holds at once: the occupancy
// calculator's answer, registers included (the kernels' register counts are only known to the
// compiled code). Host-side, no device synchronisation.
template <class... Params>
int ctas_per_sm(void (*kernel)(Params...), int threads, int smem) {
  allow_dynamic_smem(kernel, smem);
  int ctas = 0;
  FLASHMSA_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, smem));
  return ctas;
}

// Clusters of `size` CTAs of `kernel` (block threads, dynamic shared memory) the device runs at
// once: the occupancy calculator's answer, which knows how the SMs group into GPCs (a cluster
// never straddles two). Clusters along z, as launch_dependent_cluster_kernel's callers form them.
template <class... Params>
int clusters_at_once(void (*kernel)(Params...), int threads, int smem, int size) {
  allow_dynamic_smem(kernel, smem);
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = static_cast<unsigned>(size);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1, 1, static_cast<unsigned>(size));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<std::size_t>(smem);
  config.attrs = &cluster;
  config.numAttrs = 1;
  // A host-side query, safe whatever capture the thread is in (the first decode launch on a
  // device may be inside a caller's graph capture in global mode).
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  FLASHMSA_CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
  int clusters = 0;
  const cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  FLASHMSA_CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
  FLASHMSA_CHECK_CUDA(status);
  return clusters;
}

// The current device's SM count.
inline int sm_count() {
  int device = 0, sms = 0;
  FLASHMSA_CHECK_CUDA(cudaGetDevice(&device));
  FLASHMSA_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

template <class... Params, class... Args>
void launch_dependent_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, int smem,
                             cudaStream_t stream, Args&&... args) {
  launch_dependent_cluster_kernel(kernel, grid, dim3(1, 1, 1), block, smem, stream,
                                  std::forward<Args>(args)...);
}

}  // namespace flashmsa::cuda
