// Whether the SMs of one H100 / H200 stream from HBM at different rates (docs/performance.md,
// sessions 21-22: with every SM holding four equal CTAs, the decode scoring's SMs still ended
// 12-13 us apart). Two access patterns, all SMs at once, each CTA timing itself (%globaltimer):
//  1. One CTA an SM reading a contiguous region of its own with plain 16-byte loads (8 in flight
//     a thread, 1024 threads), 32 MiB and 2 MiB an SM.
//  2. The decode scoring's pattern: warps streaming 4 KB slices of 16 KB pages through rings of 3
//     stages by cp.async (4 warps a slice set of a page, 32 pages), as 528 CTAs of 4 warps, 264 of
//     8 or 132 of 16: each SM's mean CTA end (after the earliest) and the launch's rate.
//   nvcc -arch=sm_90a -std=c++17 -O2 docs/patches/sm_rates_probe.cu -o sm_rates_probe &&
//   ./sm_rates_probe
// Session 22, H200 (two machines): pattern 1 streams alike on every SM (32 MiB each: 995 us,
// 4.45 TB/s, SM medians' 90th - 10th percentile 8.7 us; 2 MiB each: 62.3 us, 1.7 us, a fast SM in
// one repetition is not in the next). Pattern 2 does not: ~24 SMs (whole TPC pairs, the same ones
// every launch and in the decode scoring's phase stamps of the same machine; another machine had
// a partly different set) end ~14 us before the median SM of a 62.5 us launch, whatever the CTA
// shape (4, 8 or 16 warps) and also by cp.async.bulk. Yet the launch still reads 4.43 TB/s: the
// other SMs speed up once those finish, so the spread costs this pattern ~2 us (62.5 against 60.7
// at the ceiling), and balancing the decode scoring's SMs could gain about that much, not more.
// (The two parts ran as two programs; this file joins them, compiled but not run as one.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CHECK(x)                                          \
  do {                                                    \
    if (cudaError_t e = (x)) {                            \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      return 1;                                           \
    }                                                     \
  } while (0)

__device__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
__device__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ unsigned saddr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// CTA c reads its own `bytes` from src (8 loads in flight a thread), then records its SM and time.
__global__ void stream(const uint4* src, long long bytes, unsigned long long* out, uint4* sink) {
  const unsigned long long t0 = globaltimer();
  const uint4* p = src + blockIdx.x * (bytes / 16);
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (long long i = threadIdx.x; i < bytes / 16; i += 8 * blockDim.x) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const long long k = i + j * blockDim.x;
      v[j] = k < bytes / 16 ? __ldcs(p + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) acc.x ^= v[j].x, acc.y ^= v[j].y, acc.z ^= v[j].z, acc.w ^= v[j].w;
  }
  __syncthreads();
  if (acc.x == 0x12345678u && acc.y == 0x9abcdef0u) *sink = acc;  // keeps the loads
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = smid();
    out[2 * blockIdx.x + 1] = globaltimer() - t0;
  }
}

// ---- Pattern 2 ----
constexpr int kStages = 3, kStage = 4096, kPages = 32, kPage = 16384;
template <int W>
constexpr int kSmemOf = W* kStages* kStage + W* kStages * 8;
template <bool kBulk, int W>
__global__ void __launch_bounds__(32 * W)
    ring(const uint8_t* src, unsigned long long t0base, unsigned long long* out, int* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  auto stages = reinterpret_cast<uint8_t(*)[kStages][kStage]>(smem);
  auto bar = reinterpret_cast<uint64_t(*)[kStages]>(smem + W * kStages * kStage);
  const unsigned long long t0 = globaltimer();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gw = blockIdx.x * W + warp;
  const uint8_t* base = src + (size_t)(gw / 4) * kPages * kPage + (gw % 4) * kStage;
  if (kBulk && lane == 0)
    for (int s = 0; s < kStages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&bar[warp][s])));
  if (kBulk) asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  auto fill = [&](int p) {
    if (p >= kPages) {
      if (!kBulk) asm volatile("cp.async.commit_group;");
      return;
    }
    uint8_t* st = stages[warp][p % kStages];
    const uint8_t* g = base + (size_t)p * kPage;
    if (kBulk) {
      if (lane == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                         saddr(&bar[warp][p % kStages])),
                     "r"(kStage)
                     : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(saddr(st)),
            "l"(g), "r"(kStage), "r"(saddr(&bar[warp][p % kStages]))
            : "memory");
      }
    } else {
      for (int j = 0; j < kStage / 16 / 32; ++j) {
        const int o = (j * 32 + lane) * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr(st + o)), "l"(g + o)
                     : "memory");
      }
      asm volatile("cp.async.commit_group;");
    }
  };
  for (int s = 0; s < kStages - 1; ++s) fill(s);
  int acc = 0;
  for (int p = 0; p < kPages; ++p) {
    if (kBulk) {
      const unsigned parity = (p / kStages) & 1;
      asm volatile(
          "{\n .reg .pred d;\n w:\n mbarrier.try_wait.parity.shared::cta.b64 d, [%0], %1;\n @!d "
          "bra w;\n}" ::"r"(saddr(&bar[warp][p % kStages])),
          "r"(parity)
          : "memory");
    } else {
      asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");
    }
    __syncwarp();
    fill(p + kStages - 1);
    acc += stages[warp][p % kStages][lane * 4];
  }
  if (acc == 0x7fffffff) *sink = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = smid();
    out[2 * blockIdx.x + 1] = globaltimer() - t0base;
  }
}
template <bool kBulk, int W>
int run(const uint8_t* src, int ctas, unsigned long long* d_out, int* sink, int sms) {
  std::vector<double> sum(sms, 0);
  std::vector<int> n(sms, 0);
  for (int rep = 0; rep < 11; ++rep) {
    // Two buffers of 528 4-warp CTAs' pages (2 x 270 MB on 132 SMs), alternately: no L2 hits.
    ring<kBulk, W><<<ctas, 32 * W, (kSmemOf<W>)>>>(
        src + (size_t)(rep % 2) * 4 * sms * kPages * kPage, 0, d_out, sink);
    CHECK(cudaGetLastError());
    std::vector<unsigned long long> h(2 * ctas);
    CHECK(cudaMemcpy(h.data(), d_out, h.size() * 8, cudaMemcpyDeviceToHost));
    if (rep == 0) continue;
    unsigned long long mn = ~0ull;
    for (int c = 0; c < ctas; ++c) mn = std::min(mn, h[2 * c + 1]);
    // Each CTA's end after the launch's earliest end.
    for (int c = 0; c < ctas; ++c) {
      int s = (int)h[2 * c];
      double e = (h[2 * c + 1] - mn) * 1e-3;
      sum[s] += e;
      n[s]++;
    }
  }
  std::vector<std::pair<double, int>> m;
  for (int s = 0; s < sms; ++s)
    if (n[s]) m.push_back({sum[s] / n[s], s});
  std::sort(m.begin(), m.end());
  std::printf(
      "W %2d x %3d CTAs %s: SM mean end after the first (us): p10 %.1f p50 %.1f p90 %.1f max %.1f; "
      "earliest SMs:",
      W, ctas, kBulk ? "bulk" : "cp.async", m[m.size() / 10].first, m[m.size() / 2].first,
      m[m.size() * 9 / 10].first, m.back().first);
  for (int i = 0; i < 24; ++i) std::printf(" %d", m[i].second);
  std::printf("\n");
  return 0;
}
int main() {
  constexpr int kSmem = 200 * 1024;  // pattern 1: one CTA an SM
  CHECK(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // 1. Each SM's time for the same bytes, all SMs at once: a long read (~1 ms) and one the size
  // of a decode scoring's (fp8 64 x 32K: ~2 MiB an SM, ~60 us), repeated.
  const long long most_bytes = 32ll << 20;
  uint4* src;
  uint4* sink;
  unsigned long long* d_out;
  CHECK(cudaMalloc(&src, most_bytes * sms));
  CHECK(cudaMemset(src, 1, most_bytes * sms));
  CHECK(cudaMalloc(&sink, sizeof(uint4)));
  CHECK(cudaMalloc(&d_out, 2 * sms * sizeof(unsigned long long)));
  for (const long long bytes : {most_bytes, 2ll << 20}) {
    const int reps = bytes == most_bytes ? 6 : 21;
    std::vector<std::vector<double>> us_by_sm(sms);
    for (int rep = 0; rep < reps; ++rep) {
      stream<<<sms, 1024, kSmem>>>(src, bytes, d_out, sink);
      CHECK(cudaGetLastError());
      std::vector<unsigned long long> h(2 * sms);
      CHECK(cudaMemcpy(h.data(), d_out, h.size() * 8, cudaMemcpyDeviceToHost));
      if (rep == 0) continue;  // warm-up
      for (int c = 0; c < sms; ++c) us_by_sm[h[2 * c]].push_back(h[2 * c + 1] * 1e-3);
    }
    std::printf("1. contiguous, %lld KiB an SM: SM time (us, median of %d)\n", bytes >> 10,
                reps - 1);
    std::vector<double> med(sms, 0);
    for (int sm = 0; sm < sms; ++sm) {
      auto v = us_by_sm[sm];
      std::sort(v.begin(), v.end());
      med[sm] = v.empty() ? 0 : v[v.size() / 2];
    }
    std::vector<double> sorted(med);
    std::sort(sorted.begin(), sorted.end());
    std::printf("   SM medians: min %.1f, 10th %.1f, 50th %.1f, 90th %.1f, max %.1f us\n",
                sorted[0], sorted[sms / 10], sorted[sms / 2], sorted[sms * 9 / 10],
                sorted[sms - 1]);
  }

  // 2. The decode scoring's pattern, by CTA shape.
  const size_t bytes = size_t{4} * sms * kPages * kPage;
  std::uint8_t* pages;
  CHECK(cudaMalloc(&pages, 2 * bytes));
  CHECK(cudaMemset(pages, 1, 2 * bytes));
  unsigned long long* ends;
  CHECK(cudaMalloc(&ends, 2 * 4 * sms * sizeof(unsigned long long)));
  int* flag;
  CHECK(cudaMalloc(&flag, 4));
  CHECK(cudaFuncSetAttribute(ring<false, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemOf<4>));
  CHECK(cudaFuncSetAttribute(ring<false, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemOf<8>));
  CHECK(cudaFuncSetAttribute(ring<false, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemOf<16>));
  CHECK(
      cudaFuncSetAttribute(ring<true, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemOf<4>));
  if (run<false, 4>(pages, 4 * sms, ends, flag, sms) ||
      run<false, 8>(pages, 2 * sms, ends, flag, sms) ||
      run<false, 16>(pages, sms, ends, flag, sms) || run<true, 4>(pages, 4 * sms, ends, flag, sms))
    return 1;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a));
  for (int r = 0; r < 20; ++r)
    ring<false, 4><<<4 * sms, 128, (kSmemOf<4>)>>>(pages + (r % 2) * bytes, 0, ends, flag);
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  std::printf("2. 4-warp CTAs: %.1f us a launch, %.2f TB/s\n", ms * 1e3 / 20,
              bytes / (ms * 1e-3 / 20) / 1e12);
  return 0;
}
