// Warpgroup MMA (wgmma) and tensor-copy (TMA) pieces of the warp-specialized Hopper kernels: the
// shared-memory layout both write and read (K-major rows of 128 bytes, 128-byte swizzle), its
// matrix descriptors, the m64n128 instructions with an accumulator array, and the TMA load of one
// box of a cache plane. The instructions themselves are CuTe's (cute/arch): this header only
// binds them to FlashMSA's tiles.
#pragma once

#include <cutlass/arch/reg_reconfig.h>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "src/cuda/common/device_utils.cuh"

namespace flashmsa::cuda {

// ---- The SW128 tile: rows of 128 bytes, 16-byte chunk c of row r at r * 128 + (c ^ r % 8) * 16.
// What TMA writes with CU_TENSOR_MAP_SWIZZLE_128B for a box 128 bytes wide, and what a wgmma
// descriptor of layout B128 reads, provided the tile starts 1024-byte aligned (8-row atoms).
// Operands wider than 128 bytes a row (bf16 vectors of 128 dims) are two such tiles, one per
// 64-dim half.
__device__ __forceinline__ int sw128_offset(int row, int chunk) {
  return row * 128 + ((chunk ^ (row & 7)) << 4);
}

// The wgmma descriptor of the K-major SW128 tile whose first row starts at `smem` (1024-byte
// aligned, or that plus a k-step's byte offset inside the 128-byte row: the hardware applies the
// swizzle to the address it computes, as CUTLASS's mainloops advance along K).
__device__ __forceinline__ std::uint64_t sw128_descriptor(const void* smem) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<std::uint16_t>(smem_address(smem) >> 4);
  d.bitfield.leading_byte_offset_ = 1;         // unused by swizzled K-major layouts
  d.bitfield.stride_byte_offset_ = 1024 >> 4;  // from one 8-row atom to the next
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<std::uint8_t>(cute::SM90::GMMA::LayoutType::B128);
  return d.desc_;
}

// The wgmma descriptor of a B operand stored N-major ("MN-major"): rows of 128 bytes along K (a
// 16-bit V tile [key][64 dims] with the 128-byte swizzle, as TMA writes it), 8 rows an atom
// (1024 bytes, the stride from one 8-key group to the next), and the next 64 values of N in a
// second such tile `n_stride` bytes on (CuTe's canonical MN-major SW128 layout
// ((8,n),(8,k)):((1,LBO),(8,SBO)) in 16-byte units).
__device__ __forceinline__ std::uint64_t sw128_mn_descriptor(const void* smem, int n_stride) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<std::uint16_t>(smem_address(smem) >> 4);
  d.bitfield.leading_byte_offset_ = static_cast<std::uint16_t>(n_stride >> 4);
  d.bitfield.stride_byte_offset_ = 1024 >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = static_cast<std::uint8_t>(cute::SM90::GMMA::LayoutType::B128);
  return d.desc_;
}

// One m64n128 step with A and B from shared memory into acc (64 fp32 a thread: for each n8 block
// j, acc[4j], acc[4j + 1] are row lane / 4 + 16 warp, columns 8j + 2 (lane % 4) + {0, 1}, and
// acc[4j + 2], acc[4j + 3] the row 8 below). accumulate false overwrites acc.
template <class Mma, std::size_t... I>
__device__ __forceinline__ void wgmma_64x128_impl(std::uint64_t a, std::uint64_t b,
                                                  float (&acc)[64], bool accumulate,
                                                  std::index_sequence<I...>) {
  Mma::fma(a, b, acc[I]...,
           accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}
// bf16 x bf16, k 16 (32 bytes of each row).
__device__ __forceinline__ void wgmma_64x128x16_bf16(std::uint64_t a, std::uint64_t b,
                                                     float (&acc)[64], bool accumulate) {
  using Mma = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                             cute::SM90::GMMA::Major::K>;
  wgmma_64x128_impl<Mma>(a, b, acc, accumulate, std::make_index_sequence<64>{});
}
// The 16-bit m64n128k16 instructions of an MMA type (bf16 or fp16), A from registers: B K-major
// (Q K^T: K as stored) or B N-major (P V: P in the S accumulator's own layout, V as stored).
template <class Elem>
struct Wgmma16 {
  static_assert(std::is_same_v<Elem, __nv_bfloat16> || std::is_same_v<Elem, __half>);
  static constexpr bool kBf16 = std::is_same_v<Elem, __nv_bfloat16>;
  template <cute::SM90::GMMA::Major kB>
  using RS = std::conditional_t<
      kBf16, cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, kB>,
      cute::SM90::GMMA::MMA_64x128x16_F32F16F16_RS<cute::SM90::GMMA::Major::K, kB>>;
};
// a[4]: rows lane / 4 + 16 warp and 8 below, k 2 (lane % 4) + {0, 1} and 8 above, in the order
// (row, k), (row + 8, k), (row, k + 8), (row + 8, k + 8): the accumulator's n8 blocks 2i and
// 2i + 1 of k-step i, two values a register. accumulate false overwrites acc.
template <class Mma, std::size_t... I>
__device__ __forceinline__ void wgmma_64x128_rs_impl(const std::uint32_t* a, std::uint64_t b,
                                                     float (&acc)[64], bool accumulate,
                                                     std::index_sequence<I...>) {
  Mma::fma(a[0], a[1], a[2], a[3], b, acc[I]...,
           accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}
// O += P V: B N-major.
template <class Elem>
__device__ __forceinline__ void wgmma_64x128x16_rs_accumulate(const std::uint32_t* a,
                                                              std::uint64_t b, float (&acc)[64]) {
  using Mma = typename Wgmma16<Elem>::template RS<cute::SM90::GMMA::Major::MN>;
  wgmma_64x128_rs_impl<Mma>(a, b, acc, true, std::make_index_sequence<64>{});
}
// S = Q K^T: B K-major.
template <class Elem>
__device__ __forceinline__ void wgmma_64x128x16_rs_kmajor(const std::uint32_t* a, std::uint64_t b,
                                                          float (&acc)[64], bool accumulate) {
  using Mma = typename Wgmma16<Elem>::template RS<cute::SM90::GMMA::Major::K>;
  wgmma_64x128_rs_impl<Mma>(a, b, acc, accumulate, std::make_index_sequence<64>{});
}

// E4M3 x E4M3, k 32 (32 bytes of each row), A from registers: the native fp8 tensor-core path,
// whose sum inside one instruction keeps about 14 significant bits (spec section 4's fp8
// exception). a[4] is wgmma's A fragment of the k-step: rows lane / 4 + 16 warp and 8 below,
// bytes 4 (lane % 4) + {0..3} and 16 above, in that register order.
template <std::size_t... I>
__device__ __forceinline__ void wgmma_64x128x32_e4m3_rs_impl(const std::uint32_t* a,
                                                             std::uint64_t b, float (&acc)[64],
                                                             bool accumulate,
                                                             std::index_sequence<I...>) {
  cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_RS_TN<>::fma(
      a[0], a[1], a[2], a[3], b, acc[I]...,
      accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}
__device__ __forceinline__ void wgmma_64x128x32_e4m3_rs(const std::uint32_t* a, std::uint64_t b,
                                                        float (&acc)[64], bool accumulate) {
  wgmma_64x128x32_e4m3_rs_impl(a, b, acc, accumulate, std::make_index_sequence<64>{});
}

// The accumulators are written asynchronously between a wgmma and the wait for its group: these
// fences keep the compiler from moving their reads and writes across that window.
__device__ __forceinline__ void wgmma_fence_accumulators(float (&acc)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(acc[i]));
}

// A barrier of `threads` threads (a multiple of 32) on named barrier `id` (1..15; 0 is
// __syncthreads's).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Generic-proxy shared-memory stores (a tile written by threads) made visible to the async proxy
// (wgmma and TMA reads of it).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// TMA: the box at coordinates (c0, c1, c2) of a 3-D tensor map into shared memory, completing on
// `barrier` as transaction bytes.
__device__ __forceinline__ void tma_load_3d(const void* map, std::uint64_t* barrier, void* smem,
                                            int c0, int c1, int c2) {
  cute::SM90_TMA_LOAD_3D::copy(map, barrier,
                               static_cast<std::uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL),
                               smem, c0, c1, c2);
}

// The same for a 4-D tensor map (a page plane of several heads: tma.hpp).
__device__ __forceinline__ void tma_load_4d(const void* map, std::uint64_t* barrier, void* smem,
                                            int c0, int c1, int c2, int c3) {
  cute::SM90_TMA_LOAD_4D::copy(map, barrier,
                               static_cast<std::uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL),
                               smem, c0, c1, c2, c3);
}

// The same box into the same shared-memory offset of every CTA of the cluster in `ctas` (a bit
// each), completing on the barrier at `barrier`'s offset in each of them.
__device__ __forceinline__ void tma_load_4d_multicast(const void* map, std::uint64_t* barrier,
                                                      std::uint16_t ctas, void* smem, int c0,
                                                      int c1, int c2, int c3) {
  cute::SM90_TMA_LOAD_MULTICAST_4D::copy(
      map, barrier, ctas, static_cast<std::uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL), smem,
      c0, c1, c2, c3);
}

}  // namespace flashmsa::cuda
