// The warp-level pieces of the two products the sm90 kernels compute with mma.sync (fp32
// accumulators), on 128-dim tiles in the swizzled shared-memory layouts of device_utils.cuh:
//   S = Q K^T   load_a_fragment (16 query rows x one k step) and qk_step (one k step against
//               8-key columns of a K tile; the index scoring and the attention both use it)
//   O += P V    pv_step (16 rows x 16 keys of P, from S's accumulators, against a V tile read
//               transposed, over all 128 dims)
// The operand type Elem sets the tile and the step: __half / __nv_bfloat16 tiles of 256-byte rows,
// m16n8k16, 16 dims per step; __nv_fp8_e4m3 tiles of 128-byte rows (load_raw_plane's fp8 layout),
// m16n8k32, 32 dims per step (ldmatrix's 8 x 16-byte matrices are exactly its fragment quarters).
// Accumulator layout (PTX m16n8 C fragment): lane holds rows lane / 4 and lane / 4 + 8, columns
// 2 (lane % 4) + {0, 1}; d[0], d[1] the first row, d[2], d[3] the second.
#pragma once

#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/sm90/convert.cuh"

namespace flashmsa::cuda {

template <class Elem>
inline constexpr bool kIsE4m3 = std::is_same_v<Elem, __nv_fp8_e4m3>;

// Dims of one k step of S = Q K^T for the operand type Elem.
template <class Elem>
inline constexpr int kStepDims = kIsE4m3<Elem> ? 32 : 16;

// Chunk `chunk` (16 bytes) of row `row` of an Elem tile.
template <class Elem>
__device__ __forceinline__ int tile_chunk(int row, int chunk) {
  return kIsE4m3<Elem> ? swizzled_byte_chunk(row, chunk) : swizzled_chunk(row, chunk);
}

// D += A B with operands of type Elem.
template <class Elem>
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                    std::uint32_t b1) {
  if constexpr (kIsE4m3<Elem>) {
    mma_e4m3_16832(d, a, b0, b1);
  } else if constexpr (std::is_same_v<Elem, __half>) {
    mma_fp16_16816(d, a, b0, b1);
  } else {
    mma_bf16_16816(d, a, b0, b1);
  }
}

// The A fragment of rows [row0, row0 + 16), k step ks of a swizzled Elem tile.
template <class Elem = __nv_bfloat16>
__device__ __forceinline__ void load_a_fragment(std::uint32_t (&a)[4], const std::byte* tile,
                                                int row0, int ks, int lane) {
  ldmatrix_x4(a, tile + tile_chunk<Elem>(row0 + lane % 16, 2 * ks + lane / 16) * 16);
}

// One k step (dims [kStepDims ks, kStepDims (ks + 1))) of S = Q K^T for kMT row tiles and kNT
// columns of 8 keys from key0: acc[m][n] += a[m] . K[key0 + 8 n .. + 8]^T. Each K fragment is
// loaded once and used by every row tile.
template <class Elem, int kMT, int kNT>
__device__ __forceinline__ void qk_step(float (&acc)[kMT][kNT][4], const std::uint32_t (&a)[kMT][4],
                                        const std::byte* k_tile, int key0, int ks, int lane) {
  static_assert(kNT % 2 == 0, "keys are loaded 16 at a time");
#pragma unroll
  for (int np = 0; np < kNT / 2; ++np) {
    std::uint32_t b[4];
    const int key = key0 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
    ldmatrix_x4(b, k_tile + tile_chunk<Elem>(key, 2 * ks + ((lane >> 3) & 1)) * 16);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      mma<Elem>(acc[mt][2 * np], a[mt], b[0], b[1]);
      mma<Elem>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
    }
  }
}

// On sm_90 `mma.sync ... e4m3` is not a tensor-core instruction: ptxas expands each m16n8k32 into
// F2FP conversions of both operands, two f16 HMMAs into zeroed registers and four FADDs. An E4M3
// k step of S = Q K^T done that way by hand, with the query side converted once: a16[m][h] is the
// f16 A fragment of dims [32 ks + 16 h, + 16) of row tile m, stored in e4m3_f16_column's order
// (that of the converted K codes). Half h of each step accumulates into acc[h] (E4M3 values are
// exact in f16, their products in fp32): two chains of dependent HMMAs a tile instead of one, as
// one chain of 8 a page left the H200's scoring latency-bound (78 us instead of 72 at 64 x 32K);
// the caller adds acc[1] into acc[0].
__host__ __device__ constexpr int e4m3_f16_column(int k) {  // k in [0, 16): column of dim k
  return (k / 2) % 2 == 0 ? 2 * (k / 4) + k % 2 : 8 + 2 * (k / 4) + k % 2;
}
template <int kMT, int kNT>
__device__ __forceinline__ void qk_step_e4m3_f16(float (&acc)[2][kMT][kNT][4],
                                                 const std::uint32_t (&a16)[kMT][2][4],
                                                 const std::byte* k_tile, int key0, int ks,
                                                 int lane) {
  static_assert(kNT % 2 == 0, "keys are loaded 16 at a time");
#pragma unroll
  for (int np = 0; np < kNT / 2; ++np) {
    std::uint32_t b[4];
    const int key = key0 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
    ldmatrix_x4(b, k_tile + swizzled_byte_chunk(key, 2 * ks + ((lane >> 3) & 1)) * 16);
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // b[r]: n tile 2 np + r / 2, dims 16 (r % 2) + 4 t .. + 3
      const std::uint32_t lo = convert::e4m3x2_to_f16x2(b[r], 0);
      const std::uint32_t hi = convert::e4m3x2_to_f16x2(b[r], 1);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        mma_fp16_16816(acc[r % 2][mt][2 * np + r / 2], a16[mt][r % 2], lo, hi);
    }
  }
}

// O += P V for the 16 keys from key0: p is the A fragment of P (16 rows x 16 keys, packed to
// Elem), o[n] the accumulators of dims [8 n, 8 n + 8). keep_lo / keep_hi are ANDed into the value
// fragments of keys 2 (lane % 4) + {0, 1} and those + 8 (low half of each word first): a caller
// zeroes there the values of keys a row must not see, because P = 0 times a non-finite value is
// still NaN.
template <class Elem>
__device__ __forceinline__ void pv_step(float (&o)[16][4], const std::uint32_t (&p)[4],
                                        const std::byte* v_tile, int key0, std::uint32_t keep_lo,
                                        std::uint32_t keep_hi, int lane) {
#pragma unroll
  for (int np = 0; np < 8; ++np) {
    std::uint32_t b[4];
    const int key = key0 + (lane & 7) + (((lane >> 3) & 1) << 3);
    ldmatrix_x4_trans(b, v_tile + swizzled_chunk(key, 2 * np + (lane >> 4)) * 16);
    b[0] &= keep_lo, b[2] &= keep_lo, b[1] &= keep_hi, b[3] &= keep_hi;
    mma<Elem>(o[2 * np], p, b[0], b[1]);
    mma<Elem>(o[2 * np + 1], p, b[2], b[3]);
  }
}

}  // namespace flashmsa::cuda
