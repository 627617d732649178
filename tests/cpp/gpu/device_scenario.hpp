// A test Scenario mirrored to the GPU: the same cache bytes (garbage included), queries and
// batch arrays in device memory, and views of them, so a CUDA op runs on exactly the inputs the
// CPU backend and the oracle see.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "tests/cpp/gpu/gpu_test_util.cuh"
#include "tests/cpp/scenario.hpp"

namespace flashmsa::test {

// A poisoned device copy of host bytes (at least one byte, so empty inputs still get a pointer).
inline std::unique_ptr<DeviceBuffer<std::byte>> upload_bytes(const void* data, std::size_t bytes) {
  auto d = std::make_unique<DeviceBuffer<std::byte>>(std::max<std::size_t>(bytes, 1));
  if (bytes) FLASHMSA_CHECK_CUDA(cudaMemcpy(d->get(), data, bytes, cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> download(const void* device, std::size_t count) {
  std::vector<T> host(count);
  if (count) {
    FLASHMSA_CHECK_CUDA(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
  }
  return host;
}

struct DeviceScenario {
  std::vector<std::unique_ptr<DeviceBuffer<std::byte>>> buffers;
  IndexCacheView index_cache;
  TensorView index_q, q;
  PrefillBatch prefill;
  DecodeBatch decode;

  explicit DeviceScenario(const Scenario& s) {
    const IndexCacheView& ix = s.cm->index_cache();
    index_cache = ix;
    index_cache.device = Device::kCuda;
    index_cache.k.data = mirror(ix.k.data, IndexCacheView::buffer_bytes(ix.dtype, ix.num_pages,
                                                                         ix.index_dim, false,
                                                                         ix.page_size));
    if (ix.block_scale.data) {
      index_cache.block_scale.data =
          mirror(ix.block_scale.data,
                 IndexCacheView::buffer_bytes(ix.dtype, ix.num_pages, ix.index_dim, true,
                                              ix.page_size));
    }
    index_q = on_device(s.index_q_view());
    q = on_device(s.q_view());
    const PrefillBatch pb = s.prefill_batch();
    prefill = {on_device(pb.cu_seqlens_q), on_device(pb.seq_lens), on_device(pb.block_table)};
    decode = {prefill.seq_lens, prefill.block_table, s.decode_query_len};
  }

  void* mirror(const void* host, std::int64_t bytes) {
    buffers.push_back(upload_bytes(host, static_cast<std::size_t>(bytes)));
    return buffers.back()->get();
  }
  TensorView on_device(const TensorView& host) {
    TensorView d = host;
    d.data = mirror(host.data, host.numel() * dtype_bits(host.dtype) / 8);
    d.device = Device::kCuda;
    return d;
  }
  // A poisoned device tensor of the given shape (contiguous).
  TensorView output(DType dtype, std::initializer_list<std::int64_t> shape) {
    TensorView t = TensorView::contiguous(static_cast<void*>(nullptr), dtype, shape, Device::kCuda);
    buffers.push_back(std::make_unique<DeviceBuffer<std::byte>>(
        std::max<std::size_t>(1, static_cast<std::size_t>(t.numel() * dtype_bits(dtype) / 8))));
    t.data = buffers.back()->get();
    return t;
  }
};

}  // namespace flashmsa::test
