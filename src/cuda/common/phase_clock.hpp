// Per-phase device timestamps for latency studies (where a decode step's time goes).
//
// A kernel whose parameters carry a PhaseClock with stamps has thread 0 of every CTA record, at
// each of its phase boundaries, %globaltimer (ns, comparable across SMs and kernels) into
// stamps[cta][phase] and clock64 (SM cycles, fine-grained within a CTA) into
// stamps[cta][kPhaseSlots + phase]; at phase 0 it also records the SM it runs on, plus one, in
// the last clock64 slot (kSmSlot), so the spread of the CTAs' ends can be split into the SMs'
// and the work's. Without stamps (the default) a boundary costs one uniform branch. The host side
// sets a clock per kernel with phase_clock(kernel) before the launches (or a graph capture) that
// should record; the benchmark's "decode phases" case does.
#pragma once

#include <cstdint>

namespace flashmsa::cuda {

enum class PhaseKernel : int { kIndexScore, kIndexTopk, kAttention, kCount };
constexpr int kPhaseSlots = 8;  // phases per CTA at most (the last one holds no stamp)
constexpr int kSmSlot = 2 * kPhaseSlots - 1;  // %smid + 1 (0: the CTA recorded nothing)

struct PhaseClock {
  unsigned long long* stamps = nullptr;  // [capacity][2 * kPhaseSlots], device memory
  std::int64_t capacity = 0;             // CTAs with a row; later CTAs record nothing
};

// The clock the next launches of `kernel` record into (host; none unless a study sets one).
inline PhaseClock& phase_clock(PhaseKernel kernel) {
  static PhaseClock clocks[static_cast<int>(PhaseKernel::kCount)];
  return clocks[static_cast<int>(kernel)];
}

#ifdef __CUDACC__
// Not inlined: inlined, the compiler evaluated the CTA index and the capacity test ahead of the
// stamps test, in every page loop that stamps its first page (~14 instructions a page).
inline __device__ __noinline__ void phase_stamp_record(PhaseClock c, int phase) {
  const std::int64_t cta =
      blockIdx.x + std::int64_t{gridDim.x} * (blockIdx.y + std::int64_t{gridDim.y} * blockIdx.z);
  if (cta >= c.capacity) return;
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  c.stamps[cta * 2 * kPhaseSlots + phase] = ns;
  c.stamps[cta * 2 * kPhaseSlots + kPhaseSlots + phase] = clock64();
  if (phase == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    c.stamps[cta * 2 * kPhaseSlots + kSmSlot] = sm + 1;
  }
}
__device__ __forceinline__ void phase_stamp(const PhaseClock& c, int phase) {
  if (c.stamps != nullptr && threadIdx.x == 0) phase_stamp_record(c, phase);
}
#endif

}  // namespace flashmsa::cuda
