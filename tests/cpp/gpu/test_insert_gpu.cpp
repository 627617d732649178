// CUDA cache insertion against the CPU backend: the same random caches and inputs, every dtype
// and layout, scattered, padding and out-of-range slots; every byte of the caches compared.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "flashmsa/ops.hpp"
#include "tests/cpp/cache_test_util.hpp"
#include "tests/cpp/gpu/gpu_test_util.cuh"

namespace flashmsa {
namespace {

using test::DeviceBuffer;
using test::RandomCaches;

std::vector<std::byte> to_host(const DeviceBuffer<std::byte>& d) {
  std::vector<std::byte> h(d.size());
  if (!h.empty())
    FLASHMSA_CHECK_CUDA(cudaMemcpy(h.data(), d.get(), h.size(), cudaMemcpyDeviceToHost));
  return h;
}

std::unique_ptr<DeviceBuffer<std::byte>> upload(const std::vector<std::byte>& h) {
  auto d = std::make_unique<DeviceBuffer<std::byte>>(std::max<size_t>(h.size(), 1));
  if (!h.empty())
    FLASHMSA_CHECK_CUDA(cudaMemcpy(d->get(), h.data(), h.size(), cudaMemcpyHostToDevice));
  return d;
}

std::vector<std::int64_t> scattered_slots(std::int64_t n, std::int64_t capacity, unsigned seed) {
  std::vector<std::int64_t> all(static_cast<size_t>(capacity));
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<std::int64_t> s(all.begin(), all.begin() + n);
  s[1] = -1;
  s[2] = capacity;
  s[3] = capacity + 77;
  return s;
}

TEST(InsertGpu, MatchesTheCpuBackendForEveryDtypeAndLayout) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const KvCacheShape shape{7, 4, 128, 128};
  for (DType dtype :
       {DType::kBf16, DType::kFp16, DType::kFp8E4m3, DType::kFp8E5m2, DType::kNvfp4}) {
    for (KvLayout layout :
         {KvLayout::kPacked, KvLayout::kSeparate, KvLayout::kStacked, KvLayout::kTokenMajor}) {
      for (DType src_dtype : {DType::kBf16, DType::kFp32}) {
        RandomCaches host(layout, shape, dtype, DType::kBf16, 128, 5);
        host.kv.k_scale = 0.5f;
        host.kv.v_scale = 3.0f;
        auto dk = upload(host.k), dv = upload(host.v), dks = upload(host.k_scales),
             dvs = upload(host.v_scales);
        auto on_device = [](const std::vector<std::byte>& h, const auto& d) {
          return CacheBuffer{h.empty() ? nullptr : d->get(), static_cast<std::int64_t>(h.size())};
        };
        KvCacheView dev = KvCacheView::make(
            layout, dtype, shape, on_device(host.k, dk), on_device(host.v, dv), Device::kCuda,
            on_device(host.k_scales, dks), on_device(host.v_scales, dvs));
        dev.k_scale = 0.5f;
        dev.v_scale = 3.0f;
        const std::int64_t T = 300, elem = dtype_bits(src_dtype) / 8;
        std::vector<std::byte> kv_in(static_cast<size_t>(T * 2 * 4 * 128 * elem));
        std::mt19937 rng(9);
        std::normal_distribution<float> normal;
        for (std::int64_t i = 0; i < T * 2 * 4 * 128; ++i) {
          const float x = normal(rng) * std::exp2(static_cast<float>(i % 9) - 4);
          if (src_dtype == DType::kBf16) {
            reinterpret_cast<std::uint16_t*>(kv_in.data())[i] = fmt::float_to_bf16(x);
          } else {
            reinterpret_cast<float*>(kv_in.data())[i] = x;
          }
        }
        const auto slots = scattered_slots(T, host.kv.capacity_tokens(), 3);
        // K and V interleaved in one [T, 2, H, D] buffer: strided views, on both sides.
        auto make_views = [&](void* base, const void* slot_data, Device device) {
          TensorView k = TensorView::contiguous(base, src_dtype, {T, 4, 128}, device);
          k.stride[0] = 2 * 4 * 128;
          TensorView v = k;
          v.data = static_cast<std::byte*>(base) + 4 * 128 * elem;
          return std::tuple{k, v, TensorView::contiguous(slot_data, DType::kInt64, {T}, device)};
        };
        auto d_in = upload(kv_in);
        DeviceBuffer<std::int64_t> d_slots(slots);
        auto [hk, hv, hs] = make_views(kv_in.data(), slots.data(), Device::kCpu);
        auto [gk, gv, gs] = make_views(d_in->get(), d_slots.get(), Device::kCuda);
        insert_kv(host.kv, hk, hv, hs);
        insert_kv(dev, gk, gv, gs);
        FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
        EXPECT_EQ(to_host(*dk), host.k) << to_string(dtype) << " layout " << int(layout);
        if (!host.v.empty()) {
          EXPECT_EQ(to_host(*dv), host.v);
        }
        if (!host.k_scales.empty()) {
          EXPECT_EQ(to_host(*dks), host.k_scales);
        }
        if (!host.v_scales.empty()) {
          EXPECT_EQ(to_host(*dvs), host.v_scales);
        }
      }
    }
  }
}

TEST(InsertGpu, IndexCacheMatchesTheCpuBackend) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  for (DType dtype : {DType::kBf16, DType::kFp8E4m3, DType::kNvfp4}) {
    RandomCaches host(KvLayout::kPacked, {6, 1, 128, 128}, DType::kBf16, dtype, 128, 8);
    auto di = upload(host.index), dis = upload(host.index_scales);
    const IndexCacheView dev = IndexCacheView::make(
        dtype, 6, 128, {di->get(), static_cast<std::int64_t>(host.index.size())}, Device::kCuda,
        {host.index_scales.empty() ? nullptr : dis->get(),
         static_cast<std::int64_t>(host.index_scales.size())});
    const std::int64_t T = 200;
    std::vector<std::uint16_t> ik(static_cast<size_t>(T * 128));
    std::mt19937 rng(4);
    std::normal_distribution<float> normal;
    for (auto& x : ik) x = fmt::float_to_bf16(normal(rng));
    const auto slots = scattered_slots(T, host.ix.capacity_tokens(), 5);
    DeviceBuffer<std::uint16_t> d_ik(ik);
    DeviceBuffer<std::int64_t> d_slots(slots);
    insert_index_k(host.ix, TensorView::contiguous(ik.data(), DType::kBf16, {T, 128}),
                   TensorView::contiguous(slots.data(), DType::kInt64, {T}));
    insert_index_k(dev, TensorView::contiguous(d_ik.get(), DType::kBf16, {T, 128}, Device::kCuda),
                   TensorView::contiguous(d_slots.get(), DType::kInt64, {T}, Device::kCuda));
    FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(to_host(*di), host.index) << to_string(dtype);
    if (!host.index_scales.empty()) {
      EXPECT_EQ(to_host(*dis), host.index_scales);
    }
  }
}

}  // namespace
}  // namespace flashmsa
