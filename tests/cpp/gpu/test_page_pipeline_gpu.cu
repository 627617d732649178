// The page ring of page_pipeline.cuh with both ways of filling it (cp.async groups, bulk copies on
// mbarriers): pages gathered from a pool through a page list, with unloaded pages (-1) in it and
// enough pages for every stage to wrap several times (each mbarrier phase parity flips), must
// arrive byte for byte at the position of the list that asked for them.
#include <cstddef>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "src/cuda/sm90/page_pipeline.cuh"
#include "tests/cpp/gpu/gpu_test_util.cuh"

namespace flashmsa {
namespace {

using cuda::BulkCopyPageRing;
using cuda::CpAsyncPageRing;
using test::DeviceBuffer;

constexpr int kPageBytes = 4096, kThreads = 128;

// out[i] = pool[pages[i]] through the ring; pages[i] < 0 leaves out[i] as it was.
template <bool kBulk, int kStages>
__global__ void __launch_bounds__(kThreads)
    stream_pages_kernel(const std::byte* pool, const int* pages, int n, std::byte* out) {
  extern __shared__ __align__(128) std::byte smem[];
  __shared__ __align__(8) std::uint64_t barriers[kStages];
  using Ring = std::conditional_t<kBulk, BulkCopyPageRing<kStages, kPageBytes>,
                                  CpAsyncPageRing<kStages, kPageBytes>>;
  Ring ring;
  ring.stages = smem;
  if constexpr (kBulk) {
    ring.full = barriers;
    ring.init();
  }
  auto fill = [&](int i) {
    const int page = i < n ? pages[i] : -1;
    const std::byte* src = pool + static_cast<std::int64_t>(page) * kPageBytes;
    if constexpr (kBulk) {
      // Two transactions on one barrier: the phase completes when both have landed.
      ring.fill(i, page >= 0 ? kPageBytes : 0, [&](std::byte* dst, std::uint64_t* barrier) {
        cuda::bulk_copy_to_shared(dst, src, kPageBytes / 2, barrier);
        cuda::bulk_copy_to_shared(dst + kPageBytes / 2, src + kPageBytes / 2, kPageBytes / 2,
                                  barrier);
      });
    } else {
      ring.fill(i, [&](std::byte* dst) {
        if (page < 0) return;
        for (int c = threadIdx.x; c < kPageBytes / 16; c += kThreads) {
          cuda::cp_async_16(dst + 16 * c, src + 16 * c);
        }
      });
    }
  };
  for (int s = 0; s < kStages - 1; ++s) fill(s);
  for (int i = 0; i < n; ++i) {
    ring.wait(i);
    fill(i + kStages - 1);
    if (pages[i] < 0) continue;
    const auto* stage = reinterpret_cast<const uint4*>(ring.stage(i));
    auto* dst = reinterpret_cast<uint4*>(out + static_cast<std::int64_t>(i) * kPageBytes);
    for (int c = threadIdx.x; c < kPageBytes / 16; c += kThreads) dst[c] = stage[c];
  }
  if constexpr (kBulk) {
    ring.drain(n + kStages - 1);
  } else {
    ring.drain();
  }
}

template <bool kBulk, int kStages>
void check_ring(std::uint32_t seed) {
  constexpr int kPool = 64, kPages = 41;
  std::mt19937 rng(seed);
  std::vector<std::byte> pool(std::size_t{kPool} * kPageBytes);
  for (auto& b : pool) b = static_cast<std::byte>(rng());
  std::vector<int> pages(kPages);
  for (int& p : pages) p = rng() % 5 == 0 ? -1 : static_cast<int>(rng() % kPool);
  pages[0] = 7, pages[kPages - 1] = -1;  // a loaded first page, an unloaded last one

  DeviceBuffer<std::byte> d_pool(pool);
  DeviceBuffer<int> d_pages(pages);
  DeviceBuffer<std::byte> d_out(std::size_t{kPages} * kPageBytes, 0xA5);
  const int smem = kStages * kPageBytes;
  stream_pages_kernel<kBulk, kStages>
      <<<1, kThreads, smem>>>(d_pool.get(), d_pages.get(), kPages, d_out.get());
  FLASHMSA_CHECK_CUDA(cudaGetLastError());
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<std::byte> out = d_out.to_host();
  int wrong = 0;
  for (int i = 0; i < kPages; ++i) {
    for (int b = 0; b < kPageBytes; ++b) {
      const std::byte want =
          pages[i] < 0 ? std::byte{0xA5} : pool[std::size_t(pages[i]) * kPageBytes + b];
      if (out[std::size_t(i) * kPageBytes + b] != want && ++wrong <= 5) {
        ADD_FAILURE() << "page " << i << " (pool page " << pages[i] << ") byte " << b;
      }
    }
  }
  EXPECT_EQ(wrong, 0) << (kBulk ? "bulk-copy" : "cp.async") << " ring, " << kStages << " stages";
}

TEST(PagePipelineGpu, CpAsyncRingDeliversEveryPageInOrder) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  check_ring<false, 2>(1);
  check_ring<false, 3>(2);
  check_ring<false, 4>(3);
}

TEST(PagePipelineGpu, BulkCopyRingDeliversEveryPageInOrder) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  check_ring<true, 2>(4);
  check_ring<true, 3>(5);
  check_ring<true, 4>(6);
}

}  // namespace
}  // namespace flashmsa
