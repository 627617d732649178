// The cache manager's device pools: allocated in device memory, zeroed, released.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "flashmsa/cache_manager.hpp"
#include "tests/cpp/gpu/gpu_test_util.cuh"

namespace flashmsa {
namespace {

bool is_device_pointer(const void* p) {
  cudaPointerAttributes attr{};
  return cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.type == cudaMemoryTypeDevice;
}

TEST(CacheManagerGpu, PoolsLiveInDeviceMemory) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  Config c;
  c.kv_cache_dtype = DType::kNvfp4;
  c.index_cache_dtype = DType::kNvfp4;
  for (KvLayout layout : {KvLayout::kPacked, KvLayout::kSeparate}) {
    CacheManager cm(c, {.num_pages = 64, .layout = layout, .device = Device::kCuda});
    const KvCacheView& kv = cm.kv_cache();
    EXPECT_EQ(kv.device, Device::kCuda);
    for (const void* p : {kv.k.data, kv.v.data, kv.k_block_scale.data, kv.v_block_scale.data,
                          cm.index_cache().k.data, cm.index_cache().block_scale.data}) {
      EXPECT_TRUE(is_device_pointer(p));
    }
    std::vector<unsigned char> host(4096, 0xFF);
    FLASHMSA_CHECK_CUDA(cudaMemcpy(host.data(), kv.k.data, host.size(), cudaMemcpyDeviceToHost));
    for (unsigned char b : host) ASSERT_EQ(b, 0);  // pools start zeroed
    const auto id = cm.add_request();
    cm.append(id, 1000);
    EXPECT_EQ(cm.pages(id).size(), 8u);
  }
}

}  // namespace
}  // namespace flashmsa
