// How the CPU backend's element loops are made to vectorise without -ffast-math.
#pragma once

namespace flashmsa::cpu {

// The element loops marked with it are compiled for AVX-512, AVX2 and baseline x86-64 and picked
// at run time (GCC function multiversioning), so one binary runs anywhere and fast.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FLASHMSA_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FLASHMSA_VECTOR_CLONES
#endif

// Reductions keep this many independent lanes: without -ffast-math the compiler may not reorder
// a single running max or sum, and would leave the loop scalar.
inline constexpr int kVectorLanes = 16;

}  // namespace flashmsa::cpu
