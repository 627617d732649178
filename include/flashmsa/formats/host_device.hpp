// Helpers that let the numeric-format code compile unchanged for the host and for CUDA devices.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FLASHMSA_HD __host__ __device__ __forceinline__
#else
#define FLASHMSA_HD inline
#endif

namespace flashmsa::fmt {

FLASHMSA_HD std::uint32_t float_bits(float x) {
  std::uint32_t u;
  memcpy(&u, &x, sizeof(u));
  return u;
}

FLASHMSA_HD float bits_float(std::uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof(x));
  return x;
}

// 2^k as a float for k in [-149, 127], exactly (subnormal results included).
FLASHMSA_HD float exact_pow2(int k) {
  return k >= -126 ? bits_float(static_cast<std::uint32_t>(k + 127) << 23)
                   : bits_float(std::uint32_t{1} << (k + 149));
}

}  // namespace flashmsa::fmt
