// Shared helpers of the GPU tests: skipping without a device, and device buffers.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "flashmsa/error.hpp"
#include "src/cuda/device_info.hpp"

// Skips the current test, with the reason, where no sm_90 device can run it.
#define FLASHMSA_REQUIRE_SM90_OR_SKIP()                                     \
  do {                                                                      \
    if (auto reason = ::flashmsa::cuda::sm90_device_unavailable_reason()) { \
      GTEST_SKIP() << "GPU test skipped: " << *reason;                      \
    }                                                                       \
  } while (0)

namespace flashmsa::test {

// A device array filled with a poison byte, so anything a kernel fails to write shows.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n, unsigned char poison = 0xA5) : n_(n) {
    FLASHMSA_CHECK_CUDA(cudaMalloc(&ptr_, bytes()));
    FLASHMSA_CHECK_CUDA(cudaMemset(ptr_, poison, bytes()));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    FLASHMSA_CHECK_CUDA(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  std::vector<T> to_host() const {
    std::vector<T> host(n_);
    FLASHMSA_CHECK_CUDA(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// Work captured once into a CUDA graph on its own stream, replayed (and waited for) on demand.
class CapturedGraph {
 public:
  explicit CapturedGraph(const std::function<void(cudaStream_t)>& work) {
    FLASHMSA_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FLASHMSA_CHECK_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    work(stream_);
    FLASHMSA_CHECK_CUDA(cudaStreamEndCapture(stream_, &graph_));
    FLASHMSA_CHECK_CUDA(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    cudaStreamDestroy(stream_);
  }
  // The tests change inputs between replays with cudaMemcpy / cudaMemset on the legacy default
  // stream, which a non-blocking stream does not wait for (and a pageable cudaMemcpy can return
  // before its copy has landed): wait for the whole device first.
  void replay() const {
    FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
    FLASHMSA_CHECK_CUDA(cudaGraphLaunch(exec_, stream_));
    FLASHMSA_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }
  // How many kernels one replay launches (which path an op took, seen from outside).
  int kernel_nodes() const { return static_cast<int>(kernel_names().size()); }
  // The (mangled) names of the kernels one replay launches (which kernel an op chose).
  std::vector<std::string> kernel_names() const {
    size_t n = 0;
    FLASHMSA_CHECK_CUDA(cudaGraphGetNodes(graph_, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    FLASHMSA_CHECK_CUDA(cudaGraphGetNodes(graph_, nodes.data(), &n));
    std::vector<std::string> names;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type;
      FLASHMSA_CHECK_CUDA(cudaGraphNodeGetType(node, &type));
      if (type != cudaGraphNodeTypeKernel) continue;
      cudaKernelNodeParams params;
      FLASHMSA_CHECK_CUDA(cudaGraphKernelNodeGetParams(node, &params));
      const char* name = nullptr;
      FLASHMSA_CHECK_CUDA(cudaFuncGetName(&name, params.func));
      names.emplace_back(name);
    }
    return names;
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace flashmsa::test
