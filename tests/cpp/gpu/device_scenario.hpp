// A test Scenario mirrored to the GPU: the same cache bytes (garbage included), queries and
// batch arrays in device memory, and views of them, so a CUDA op runs on exactly the inputs the
// CPU backend and the oracle see.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
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

// A device byte buffer as the uint8 workspace tensor the CUDA ops take.
inline TensorView workspace_view(const DeviceBuffer<std::uint8_t>& buffer) {
  return TensorView::contiguous(buffer.get(), DType::kUint8,
                                {static_cast<std::int64_t>(buffer.size())}, Device::kCuda);
}

// Mirrors arbitrary host memory (tensors, cache planes, overlapping or not) to the device, runs
// an op on the translated views and copies everything back: any host-view test becomes a GPU
// test of the same bytes.
class DeviceMirror {
 public:
  void add(const void* host, std::int64_t bytes) {
    if (host && bytes > 0) spans_.push_back({static_cast<const std::byte*>(host), bytes});
  }
  void add(const TensorView& t) {
    if (!t.data || t.numel() == 0) return;
    std::int64_t last = 0;
    for (int i = 0; i < t.rank; ++i) last += (t.shape[i] - 1) * t.stride[i];
    add(t.data, (last + 1) * dtype_bits(t.dtype) / 8);
  }
  void add(const CachePlane& p, std::int64_t pages, std::int64_t heads, std::int64_t tokens) {
    if (!p.data) return;
    add(p.data, (pages - 1) * p.page_stride + (heads - 1) * p.head_stride +
                    (tokens - 1) * p.token_stride + p.row_bytes);
  }
  void add(const KvCacheView& kv) {
    for (const CachePlane* p : {&kv.k, &kv.v, &kv.k_block_scale, &kv.v_block_scale}) {
      add(*p, kv.shape.num_pages, kv.shape.num_kv_heads, kv.shape.page_size);
    }
  }
  void add(const IndexCacheView& ix) {
    add(ix.k, ix.num_pages, 1, ix.page_size);
    add(ix.block_scale, ix.num_pages, 1, ix.page_size);
  }

  // Merges overlapping spans and copies them to the device.
  void upload() {
    std::sort(spans_.begin(), spans_.end(),
              [](const Span& a, const Span& b) { return a.start < b.start; });
    for (const Span& s : spans_) {
      if (!regions_.empty() && s.start <= regions_.back().start + regions_.back().bytes) {
        Region& r = regions_.back();
        r.bytes = std::max(r.bytes, static_cast<std::int64_t>(s.start - r.start) + s.bytes);
      } else {
        regions_.push_back({s.start, s.bytes, nullptr});
      }
    }
    for (Region& r : regions_) r.device = upload_bytes(r.start, static_cast<std::size_t>(r.bytes));
  }
  // Copies the host bytes to the device again (after the test changed them in place).
  void refresh() const {
    for (const Region& r : regions_) {
      FLASHMSA_CHECK_CUDA(cudaMemcpy(r.device->get(), r.start, static_cast<std::size_t>(r.bytes),
                                     cudaMemcpyHostToDevice));
    }
  }
  void download() const {
    for (const Region& r : regions_) {
      FLASHMSA_CHECK_CUDA(cudaMemcpy(const_cast<std::byte*>(r.start), r.device->get(),
                                     static_cast<std::size_t>(r.bytes), cudaMemcpyDeviceToHost));
    }
  }
  // The host bytes of every mirrored region (after upload), and writing such bytes back: a test
  // that runs an op repeatedly from one starting state restores it with set_host_bytes and
  // refresh().
  std::vector<std::byte> host_bytes() const {
    std::vector<std::byte> bytes;
    for (const Region& r : regions_) bytes.insert(bytes.end(), r.start, r.start + r.bytes);
    return bytes;
  }
  void set_host_bytes(const std::vector<std::byte>& bytes) const {
    const std::byte* from = bytes.data();
    for (const Region& r : regions_) {
      std::memcpy(const_cast<std::byte*>(r.start), from, static_cast<std::size_t>(r.bytes));
      from += r.bytes;
    }
  }
  void* device(const void* host) const {
    if (!host) return nullptr;
    const auto* h = static_cast<const std::byte*>(host);
    for (const Region& r : regions_) {
      if (h >= r.start && h < r.start + r.bytes) return r.device->get() + (h - r.start);
    }
    throw Error(ErrorKind::kInternal, "DeviceMirror: pointer not mirrored");
  }
  TensorView device(const TensorView& t) const {
    TensorView d = t;
    d.data = device(t.data);
    d.device = Device::kCuda;
    return d;
  }
  CachePlane device(const CachePlane& p) const {
    CachePlane d = p;
    d.data = device(p.data);
    return d;
  }
  KvCacheView device(const KvCacheView& kv) const {
    KvCacheView d = kv;
    d.device = Device::kCuda;
    d.k = device(kv.k), d.v = device(kv.v);
    d.k_block_scale = device(kv.k_block_scale), d.v_block_scale = device(kv.v_block_scale);
    return d;
  }
  IndexCacheView device(const IndexCacheView& ix) const {
    IndexCacheView d = ix;
    d.device = Device::kCuda;
    d.k = device(ix.k), d.block_scale = device(ix.block_scale);
    return d;
  }

 private:
  struct Span {
    const std::byte* start;
    std::int64_t bytes;
  };
  struct Region {
    const std::byte* start;
    std::int64_t bytes;
    std::unique_ptr<DeviceBuffer<std::byte>> device;
  };
  std::vector<Span> spans_;
  std::vector<Region> regions_;
};

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
    index_cache.k.data = mirror(
        ix.k.data,
        IndexCacheView::buffer_bytes(ix.dtype, ix.num_pages, ix.index_dim, false, ix.page_size));
    if (ix.block_scale.data) {
      index_cache.block_scale.data = mirror(
          ix.block_scale.data,
          IndexCacheView::buffer_bytes(ix.dtype, ix.num_pages, ix.index_dim, true, ix.page_size));
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
