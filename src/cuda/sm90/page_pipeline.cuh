// The page pipeline every sm90 kernel streams cache pages through: a ring of kStages shared-memory
// stages, filled kStages - 1 pages ahead of the page being computed on.
//
// One protocol, two ways of filling a stage:
//   CpAsyncPageRing    every thread issues 16- or 8-byte cp.async copies (any layout: the
//                      swizzled 16-bit tiles, zero-fill past a limit, scattered token rows); a
//                      page is complete when its commit group is. What the kernels use today.
//   BulkCopyPageRing   one thread issues cp.async.bulk copies of contiguous runs that complete on
//                      the stage's mbarrier (transaction bytes announced with the fill); waiting
//                      is on the barrier's phase parity. The part the TMA rewrites build on
//                      (hopper_microbench.cu measures its bandwidth against cp.async).
//
// For pages 0, 1, ... of a sequence, with the whole CTA (or, RingScope::kWarp, one warp) as
// producer and consumer:
//   ring.fill(0 .. kStages - 2, ...)          prologue
//   for each page i:
//     ring.wait(i);                           page i is in shared memory, visible to every thread;
//                                             the CTA barrier in it also releases page i - 1
//     ring.fill(i + kStages - 1, ...);        refills the stage page i - 1 used
//     ... compute on ring.stage(i) ...
//   ring.drain();                             before the stages are reused for something else
// Every page is filled exactly once, also past the end of the sequence or for a page that is not
// loaded (then the fill copies nothing), so that the counting of groups and phases stays simple.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/cuda/common/device_utils.cuh"

namespace flashmsa::cuda {

// ---- mbarrier and bulk-copy primitives (sm_90) ------------------------------------------------

__device__ __forceinline__ void mbarrier_init(std::uint64_t* barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(barrier)),
               "r"(arrivals));
}
// Makes initialised barriers visible to the async proxy (the bulk copies) and the other threads
// of the cluster; a CTA barrier must still follow before another thread uses them.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival on the barrier that also expects `bytes` more transaction bytes in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint64_t* barrier,
                                                          std::uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(barrier)),
      "r"(bytes)
      : "memory");
}
// One arrival on the barrier (no transaction bytes).
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(barrier)) : "memory");
}
// Arrives on the barrier at `barrier`'s offset in the shared memory of cluster CTA `cta`.
__device__ __forceinline__ void mbarrier_arrive_cluster(std::uint64_t* barrier, std::uint32_t cta) {
  asm volatile(
      "{\n .reg .b32 remote;\n mapa.shared::cluster.u32 remote, %0, %1;\n"
      " mbarrier.arrive.shared::cluster.b64 _, [remote];\n}" ::"r"(smem_address(barrier)),
      "r"(cta)
      : "memory");
}
// Waits until the phase of the given parity has completed.
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* barrier, std::uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n wait:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait;\n}" ::"r"(smem_address(barrier)),
      "r"(parity)
      : "memory");
}
// Page i's place in a ring of kStages mbarrier-guarded stages: its stage, i % kStages, and the
// parity of its phase there, (i / kStages) & 1, stepped page by page instead of divided out.
template <int kStages>
struct RingPosition {
  int stage = 0;
  std::uint32_t phase = 0;
  __device__ __forceinline__ void next() {
    if (++stage == kStages) stage = 0, phase ^= 1u;
  }
};
// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory
// through the TMA unit; completion is counted on `barrier` as transaction bytes.
__device__ __forceinline__ void bulk_copy_to_shared(void* smem, const void* global,
                                                    std::uint32_t bytes, std::uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_address(smem)),
      "l"(global), "r"(bytes), "r"(smem_address(barrier))
      : "memory");
}

// ---- The rings --------------------------------------------------------------------------------

// Who fills and reads a CpAsyncPageRing's stages: the whole CTA (a CTA barrier a page), or one
// warp that owns its ring (a warp barrier: warps of a CTA move through their pages independently).
enum class RingScope { kCta, kWarp };

template <int kStages_, int kStageBytes_, RingScope kScope = RingScope::kCta>
struct CpAsyncPageRing {
  static constexpr int kStages = kStages_, kStageBytes = kStageBytes_;
  static_assert(kStages >= 2, "a ring fills one page while the CTA computes on another");
  std::byte* stages;

  __device__ std::byte* stage(int i) const { return stages + (i % kStages) * kStageBytes; }
  // Page i: copy(stage) issues its cp.async copies (every thread its share, possibly none), then
  // they close one commit group, the page's.
  template <class Copy>
  __device__ void fill(int i, Copy&& copy) const {
    copy(stage(i));
    cp_async_commit();
  }
  // The groups of pages i + 1 .. i + kStages - 2 may still be in flight; older ones (page i's, and
  // any group committed before the ring's first page) have landed.
  __device__ void wait(int) const {
    cp_async_wait<kStages - 2>();
    if constexpr (kScope == RingScope::kCta) {
      __syncthreads();
    } else {
      __syncwarp();
    }
  }
  __device__ void drain() const { cp_async_wait<0>(); }
};

template <int kStages_, int kStageBytes_>
struct BulkCopyPageRing {
  static constexpr int kStages = kStages_, kStageBytes = kStageBytes_;
  static_assert(kStages >= 2, "a ring fills one page while the CTA computes on another");
  std::byte* stages;
  std::uint64_t* full;  // kStages mbarriers in shared memory, one per stage

  // By every thread before the first fill (thread 0 initialises, the CTA barrier publishes).
  __device__ void init() const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) mbarrier_init(&full[s], 1);
      fence_mbarrier_init();
    }
    __syncthreads();
  }
  __device__ std::byte* stage(int i) const { return stages + (i % kStages) * kStageBytes; }
  // Page i: thread 0 announces `bytes` (0 for a page not loaded: the phase still completes) and
  // copy(stage, barrier) issues bulk copies of exactly that many bytes on the barrier.
  template <class Copy>
  __device__ void fill(int i, std::uint32_t bytes, Copy&& copy) const {
    if (threadIdx.x != 0) return;
    std::uint64_t* barrier = &full[i % kStages];
    mbarrier_arrive_expect_tx(barrier, bytes);
    if (bytes > 0) copy(stage(i), barrier);
  }
  // Page i's phase of its stage barrier is the (i / kStages)-th; the CTA barrier after it tells
  // thread 0 that every thread is done with page i - 1's stage.
  __device__ void wait(int i) const {
    mbarrier_wait(&full[i % kStages], static_cast<std::uint32_t>(i / kStages) & 1u);
    __syncthreads();
  }
  // Every fill of a page that was never waited for still completes its phase before the kernel
  // moves on (a bulk copy must not land in memory that is reused).
  __device__ void drain(int filled) const {
    for (int i = filled - (kStages - 1); i < filled; ++i) {
      if (i >= 0) mbarrier_wait(&full[i % kStages], static_cast<std::uint32_t>(i / kStages) & 1u);
    }
    __syncthreads();
  }
};

}  // namespace flashmsa::cuda
