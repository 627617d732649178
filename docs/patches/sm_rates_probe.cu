// Whether the SMs of one H100 / H200 stream from HBM at different rates with the same work, and
// whether the slow ones share a GPC (docs/performance.md, session 21: with every SM holding four
// equal CTAs, the decode scoring's SMs still ended 13 us apart). Two parts:
//  1. SM groups: clusters of 8 CTAs, one CTA an SM, run within one GPC; over launches of
//     different sizes, SMs seen in one cluster are joined (union-find).
//  2. Each SM's rate: one CTA an SM, all at once, each reads the same bytes of its own (16-byte
//     loads, 8 in flight a thread, 1024 threads) and times itself (%globaltimer); printed by
//     group, then the spread of the SMs' times. Repeated, so that a slow SM shows as slow every
//     time or not.
//   nvcc -arch=sm_90a -std=c++17 -O2 docs/patches/sm_rates_probe.cu -o sm_rates_probe &&
//   ./sm_rates_probe
// Session 22, H200: the SMs stream alike. 32 MiB each: 995 us (4.45 TB/s in all), SM medians
// 90th - 10th percentile 8.7 us (0.9%); 2 MiB each (a decode scoring's share): 62.3 us, 1.7 us
// (2.7%), and an SM fast in one repetition is not in the next. So the scoring's 12-13 us is not
// the SMs' rates. (Part 1 does not find the GPCs: clusters of two only ever paired the two SMs of
// a TPC, 66 pairs, and clusters of 8 land on fixed groups of 8 SMs: 23 groups.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
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

// A CTA records its SM; the cluster's CTAs sit at out[8 * cluster + rank].
__global__ void where(unsigned* out) {
  unsigned cluster, rank;  // (the launch's dynamic shared memory keeps it to one CTA an SM)
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cluster));
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) out[8 * cluster + rank] = smid();
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

int find(std::vector<int>& parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

int main() {
  constexpr int kSmem = 200 * 1024;  // one CTA an SM
  CHECK(cudaFuncSetAttribute(where, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CHECK(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  // 1. GPCs.
  std::vector<int> parent(sms);
  std::iota(parent.begin(), parent.end(), 0);
  unsigned* d_where;
  CHECK(cudaMalloc(&d_where, 16 * sms * sizeof(unsigned)));
  constexpr int kCluster = 8;  // (clusters of two only ever pair the two SMs of a TPC)
  for (int round = 0; round < 200; ++round) {
    const int clusters = sms / kCluster - round % 4;  // different sizes place them differently
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(kCluster * clusters);
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = kSmem;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kCluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&cfg, where, d_where));
    std::vector<unsigned> h(kCluster * clusters);
    CHECK(cudaMemcpy(h.data(), d_where, h.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (int c = 0; c < clusters; ++c) {
      for (int r = 1; r < kCluster; ++r)
        parent[find(parent, h[kCluster * c + r])] = find(parent, h[kCluster * c]);
    }
  }
  std::vector<int> gpc(sms, -1), gpc_size;
  for (int s = 0; s < sms; ++s) {
    const int root = find(parent, s);
    if (gpc[root] < 0) gpc[root] = static_cast<int>(gpc_size.size()), gpc_size.push_back(0);
    gpc[s] = gpc[root];
    ++gpc_size[gpc[s]];
  }
  std::printf("SMs %d, GPCs %zu of", sms, gpc_size.size());
  for (int n : gpc_size) std::printf(" %d", n);
  std::printf(" SMs\n");

  // 2. Each SM's time for the same bytes, all SMs at once: a long read (~1 ms) and one the size
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
    std::printf("GPC: SM time (us, median (min-max) of %d; all SMs at once, %lld KiB each)\n",
                reps - 1, bytes >> 10);
    std::vector<double> med(sms, 0);
    for (int g = 0; g < static_cast<int>(gpc_size.size()); ++g) {
      std::printf("GPC %d (%d SMs):", g, gpc_size[g]);
      for (int s = 0; s < sms; ++s) {
        if (gpc[s] != g || us_by_sm[s].empty()) continue;
        auto v = us_by_sm[s];
        std::sort(v.begin(), v.end());
        med[s] = v[v.size() / 2];
        std::printf(" %d:%.1f(%.1f-%.1f)", s, med[s], v.front(), v.back());
      }
      std::vector<double> in_gpc;
      for (int s = 0; s < sms; ++s) {
        if (gpc[s] == g) in_gpc.push_back(med[s]);
      }
      std::sort(in_gpc.begin(), in_gpc.end());
      std::printf("\n  GPC %d median %.1f us\n", g, in_gpc[in_gpc.size() / 2]);
    }
    std::vector<double> sorted(med);
    std::sort(sorted.begin(), sorted.end());
    std::printf("SM medians: min %.1f, 10th %.1f, 50th %.1f, 90th %.1f, max %.1f us\n", sorted[0],
                sorted[sms / 10], sorted[sms / 2], sorted[sms * 9 / 10], sorted[sms - 1]);
  }
  return 0;
}
