// How many thread-block clusters of each size (1..8 CTAs) the device runs at once, for CTAs of the
// decode attention tiles' shapes (256 threads; the dynamic shared memory of a bf16 1-row / 4-row
// tile, one an SM, and of a register tile, two an SM). Session 18 on the H200:
//   one an SM: 132 66 39 30 22 17 15 15; two an SM: 264 132 79 62 47 39 32 30.
// nvcc -arch=sm_90a docs/patches/cluster_probe.cu -o cluster_probe && ./cluster_probe
#include <cuda_runtime.h>
#include <cstdio>
#define CHECK(x)                                          \
  do {                                                    \
    if (cudaError_t e = (x)) {                            \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      return 1;                                           \
    }                                                     \
  } while (0)
__global__ void probe(int* p) {
  extern __shared__ int s[];
  __shared__ int st[320];
  if (p) p[0] = s[0] + st[threadIdx.x % 320];
}
int main() {
  // The probe's 1.25 KB of static shared memory plus this stay within the 227 KB a CTA may have.
  CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("SMs %d\n", sms);
  const struct {
    const char* name;
    int smem;
  } shapes[] = {{"bf16 1-row (201472 B)", 201472},
                {"bf16 4-row (216064 B)", 216064},
                {"register tiles, 2 an SM (112384 B)", 112384}};
  for (auto& sh : shapes) {
    int blocks;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, probe, 256, sh.smem));
    std::printf("%s: %d CTAs an SM;", sh.name, blocks);
    for (int c = 1; c <= 8; ++c) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(c * 64);
      cfg.blockDim = dim3(256);
      cfg.dynamicSmemBytes = sh.smem;
      cudaLaunchAttribute a;
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = c;
      a.val.clusterDim.y = 1;
      a.val.clusterDim.z = 1;
      cfg.attrs = &a;
      cfg.numAttrs = 1;
      int n = -1;
      CHECK(cudaOccupancyMaxActiveClusters(&n, probe, &cfg));
      std::printf(" c%d: %d clusters (%d CTAs)", c, n, n * c);
    }
    std::printf("\n");
  }
}
