// Keys widened in registers straight into the B fragments of mma.sync m16n8k16 (bf16; f16 for
// E4M3 / E5M2 keys against f16-scaled queries, see permute_query_tile), for the
// kernels whose warps each convert keys no other warp converts (the decode index scoring, the
// 1-row decode attention), and fp8 values into P V's (f16): no shared-memory widening pass, no
// widening barrier. The k order inside each MMA step is permuted so that a thread's codes come
// from one contiguous, conflict-free shared-memory read; the query side is stored (or gathered) in
// the same order: a dot product does not depend on its order.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/sm90/convert.cuh"
#include "src/cuda/sm90/kv_format.hpp"
#include "src/cuda/sm90/warp_mma.cuh"

namespace flashmsa::cuda {

// ---- NVFP4 ----
// Thread t of a quad (t = lane % 4) takes bytes [16 t, 16 t + 16) of its key's 64-byte code row,
// i.e. dims 32 t .. 32 t + 31 (scale blocks 2 t and 2 t + 1), in one conflict-free 16-byte load.
// Code word w of those four gives MMA k steps 2 w and 2 w + 1, its codes paired (j, j + 4) as
// convert::e2m1_pair_to_bf16x2 widens them: step s = 2 w + h takes pairs j = 2 h (fragment
// register b0) and 2 h + 1 (b1). So the MMA's k index kappa of step s holds dim
// nvfp4_register_dim(s, kappa), and the query tile is stored in that order.
__host__ __device__ constexpr int nvfp4_register_dim(int step, int kappa) {
  const int t = (kappa % 8) / 2, high = kappa >= 8 ? 1 : 0, odd = kappa % 2;
  return 32 * t + 8 * (step / 2) + 2 * (step % 2) + high + 4 * odd;
}

// Its inverse: the query tile column (16 step + kappa) that holds dim d.
__host__ __device__ constexpr int nvfp4_register_column(int d) {
  const int r = d % 8;
  const int step = 2 * (d % 32 / 8) + r % 4 / 2, kappa = 2 * (d / 32) + 8 * (r % 2) + r / 4;
  return 16 * step + kappa;
}

constexpr bool nvfp4_register_order_is_a_permutation() {
  for (int c = 0; c < 128; ++c) {
    if (nvfp4_register_column(nvfp4_register_dim(c / 16, c % 16)) != c) return false;
  }
  return true;
}
static_assert(nvfp4_register_order_is_a_permutation());

// With kScaledDown the fragments skip e2m1_pair_to_bf16x2's restoring multiply (one of the two a
// code pair takes): they hold code x scale x 2^-63 (convert::kE2m1ScaleUp), and the caller carries
// the 2^63 back (the index scoring in its query vectors, the attention in its score scale).
// Step s = 2 w + h of one key's fragment: pairs 2 h and 2 h + 1 of code word w, times the block
// scale pair (both halves one block's scale; x 2^63 when kScaledDown).
template <int kH, bool kScaledDown>
__device__ __forceinline__ void nvfp4_b_fragment(std::uint32_t word, std::uint32_t scale,
                                                 std::uint32_t& b0, std::uint32_t& b1) {
  b0 = convert::e2m1_pair_times_scale<2 * kH, kScaledDown>(word, scale);
  b1 = convert::e2m1_pair_times_scale<2 * kH + 1, kScaledDown>(word, scale);
}

// ---- E4M3 / E5M2 ----
// Thread t of a quad takes bytes [32 t, 32 t + 32) of its key's 128-byte code row (two 16-byte
// chunks of load_raw_plane's swizzled fp8 layout), i.e. dims 32 t .. 32 t + 31; code word s of
// those eight gives MMA k step s: codes 0, 1 as b0, codes 2, 3 as b1.
__host__ __device__ constexpr int fp8_register_dim(int step, int kappa) {
  const int t = (kappa % 8) / 2, high = kappa >= 8 ? 1 : 0, odd = kappa % 2;
  return 32 * t + 4 * step + 2 * high + odd;
}

// A code pair to f16x2, exactly (both formats' values are f16 values): one F2FP for E4M3, one byte
// move for E5M2 (its codes are the high bytes of the f16s).
template <KvFormat kFormat>
__device__ __forceinline__ std::uint32_t fp8x2_to_f16x2(std::uint32_t codes, int pair) {
  static_assert(kFormat == KvFormat::kE4m3 || kFormat == KvFormat::kE5m2);
  return kFormat == KvFormat::kE4m3 ? convert::e4m3x2_to_f16x2(codes, pair)
                                    : convert::e5m2x2_to_f16x2(codes, pair);
}

template <KvFormat kFormat>
__host__ __device__ constexpr int register_dim(int step, int kappa) {
  return kFormat == KvFormat::kNvfp4 ? nvfp4_register_dim(step, kappa)
                                     : fp8_register_dim(step, kappa);
}

template <KvFormat kFormat>
constexpr bool register_order_is_a_permutation() {
  bool seen[128] = {};
  for (int c = 0; c < 128; ++c) {
    const int d = register_dim<kFormat>(c / 16, c % 16);
    if (d < 0 || d >= 128 || seen[d]) return false;
    seen[d] = true;
  }
  return true;
}
static_assert(register_order_is_a_permutation<KvFormat::kE4m3>());

// Rewrites a swizzled bf16 tile of 16 query rows in place into register_dim's k order: column
// 16 s + kappa then holds dim register_dim(s, kappa), so that load_a_fragment reads the permuted A
// fragment of step s. By all 256 threads of the CTA, once (CTA barriers inside).
//
// With f16_restore (the f16 route of register_qk, E4M3 / E5M2 keys) each row is also scaled by a
// power of two 2^E and stored as f16; f16_restore[row] = 2^-E turns its scores back. E puts the
// row's largest finite magnitude in [2^15, 2^16), so that every element within 2^32 of it is
// exact in f16 (bf16's 8 significant bits stay on f16's grid down to 2^-17): the scores are those
// of the bf16 row, and Inf / NaN elements stay what they are. Elements more than 2^32 below the
// row's largest are rounded to f16's subnormal grid, an error under 2^-40 of that largest value
// per element, far below the fp32 accumulation's own. E is clamped to [-112, 126] (an all-zero or
// all-subnormal row gets 2^126), so 2^E and 2^-E are normal floats.
template <int kThreads, KvFormat kFormat>
__device__ void permute_query_tile(std::byte* tile, float* f16_restore = nullptr) {
  static_assert(kThreads == 16 * 16, "a thread per (row, 16-byte chunk)");
  const int row = threadIdx.x / 16, chunk = threadIdx.x % 16;
  const auto element = [&](int dim) {
    return static_cast<std::uint32_t>(*reinterpret_cast<const std::uint16_t*>(
        tile + swizzled_chunk(row, dim / 8) * 16 + (dim % 8) * 2));
  };
  std::uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int step = chunk / 2, kappa = 8 * (chunk % 2) + 2 * j;
    w[j] = element(register_dim<kFormat>(step, kappa)) |
           element(register_dim<kFormat>(step, kappa + 1)) << 16;
  }
  if (f16_restore != nullptr) {
    // The row's 16 threads are 16 consecutive lanes of one warp.
    const std::uint32_t largest =
        largest_finite_magnitude_16_lanes(make_uint4(w[0], w[1], w[2], w[3]));
    const int e = min(126, 142 - static_cast<int>(largest >> 23));  // 15 - (exponent - 127)
    const float scale = __uint_as_float(static_cast<std::uint32_t>(e + 127) << 23);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float lo = __uint_as_float(w[j] << 16), hi = __uint_as_float(w[j] & 0xFFFF0000u);
      w[j] = pack2<__half>(lo * scale, hi * scale);
    }
    if (chunk == 0) f16_restore[row] = __uint_as_float(static_cast<std::uint32_t>(127 - e) << 23);
  }
  __syncthreads();
  *reinterpret_cast<uint4*>(tile + swizzled_chunk(row, chunk) * 16) =
      make_uint4(w[0], w[1], w[2], w[3]);
  __syncthreads();
}

// S += Q K^T over all 128 dims for kMT row tiles x kNT x 8 keys from key0 of a raw K plane of
// kPlaneKeys tokens (load_raw_plane's layout, or load_raw_rows_warp's); q(s, a) gives the kMT A
// fragments of step s in register_dim's order (load_a_fragment of a tile stored or permuted in
// that order). All the keys' codes are read first, then each step's A fragments serve every key
// column: each key is widened once for all row tiles. MmaElem is the MMA's type: bf16, or for
// E4M3 / E5M2 keys f16 (one instruction a code pair instead of four; the queries must then be f16).
// kNvfp4ScaledDown: NVFP4 keys as code x scale x 2^-63 (nvfp4_b_fragment; the caller carries
// the 2^63 back).
template <KvFormat kFormat, int kMT, int kNT, int kPlaneKeys = 128, class MmaElem = __nv_bfloat16,
          bool kNvfp4ScaledDown = false, class QFragments>
__device__ __forceinline__ void register_qk(float (&acc)[kMT][kNT][4], QFragments&& q,
                                            const std::byte* plane, int key0, int lane) {
  if constexpr (kFormat == KvFormat::kNvfp4) {
    uint4 codes[kNT];
    std::uint32_t scales[kNT];  // the thread's two blocks' scales of each key, as a bf16 pair
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int key = key0 + nt * 8 + lane / 4;
      codes[nt] = *reinterpret_cast<const uint4*>(plane + key * 64 + (lane % 4) * 16);
      const std::uint32_t pair = *reinterpret_cast<const std::uint16_t*>(plane + kPlaneKeys * 64 +
                                                                         key * 8 + (lane % 4) * 2);
      scales[nt] = convert::e4m3x2_to_bf16x2_cvt(pair, 0);
      if constexpr (kNvfp4ScaledDown) {
        scales[nt] = convert::bf16x2_mul(scales[nt], convert::kE2m1ScaleUp);
      }
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      std::uint32_t a[kMT][4];
      q(s, a);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const std::uint32_t word = (&codes[nt].x)[s / 2];
        std::uint32_t b0, b1;
        // Steps 0..3 take the first block's scale, 4..7 the second's, in both halves.
        const std::uint32_t scale =
            s < 4 ? convert::broadcast_half<0>(scales[nt]) : convert::broadcast_half<1>(scales[nt]);
        if (s % 2 == 0) {
          nvfp4_b_fragment<0, kNvfp4ScaledDown>(word, scale, b0, b1);
        } else {
          nvfp4_b_fragment<1, kNvfp4ScaledDown>(word, scale, b0, b1);
        }
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) mma_bf16_16816(acc[mt][nt], a[mt], b0, b1);
      }
    }
  } else {
    static_assert(kFormat == KvFormat::kE4m3 || kFormat == KvFormat::kE5m2);
    uint4 codes[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int key = key0 + nt * 8 + lane / 4;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        codes[nt][c] = *reinterpret_cast<const uint4*>(
            plane + swizzled_byte_chunk(key, 2 * (lane % 4) + c) * 16);
      }
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      std::uint32_t a[kMT][4];
      q(s, a);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const std::uint32_t word = (&codes[nt][s / 4].x)[s % 4];
        std::uint32_t b0, b1;
        if constexpr (std::is_same_v<MmaElem, __half>) {
          b0 = fp8x2_to_f16x2<kFormat>(word, 0);
          b1 = fp8x2_to_f16x2<kFormat>(word, 1);
        } else if constexpr (kFormat == KvFormat::kE4m3) {
          b0 = convert::e4m3x2_to_bf16x2_cvt(word, 0);
          b1 = convert::e4m3x2_to_bf16x2_cvt(word, 1);
        } else {
          b0 = convert::e5m2x2_to_bf16x2_bits(word, 0);
          b1 = convert::e5m2x2_to_bf16x2_bits(word, 1);
        }
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) mma<MmaElem>(acc[mt][nt], a[mt], b0, b1);
      }
    }
  }
}

// ---- Values (E4M3 / E5M2) straight into P V's B fragments, f16 ----
// P V's n-tile / dim order is free (O is put back in the epilogue): n-tile j, column g holds dim
// register_pv_dim(j, g). Thread (g, t) then reads one 32-bit word (dims 32 J + 4 g .. + 3) from
// each of its key rows 2 t, 2 t + 1, 2 t + 8, 2 t + 9 of the raw V plane; a byte permute pairs the
// two keys' codes per dim, and each 16-bit half converts exactly to the f16x2 B register of one
// n-tile. The stage's 128-byte XOR swizzle makes the loads conflict-free: the lanes of one load
// hit chunks (2 J + g / 4) ^ (row & 7), eight distinct chunks x four words.
__host__ __device__ constexpr int register_pv_dim(int ntile, int column) {
  return 32 * (ntile / 4) + 4 * column + ntile % 4;
}

// Whether a P V dim order (n-tile, column) -> dim puts each of the 128 dims in one place.
constexpr bool pv_order_is_a_permutation(int (*dim)(int ntile, int column)) {
  bool seen[128] = {};
  for (int c = 0; c < 128; ++c) {
    const int d = dim(c / 8, c % 8);
    if (d < 0 || d >= 128 || seen[d]) return false;
    seen[d] = true;
  }
  return true;
}
static_assert(pv_order_is_a_permutation(register_pv_dim));

// O += P V for the 16 keys from key0 of a raw E4M3 / E5M2 V plane, P the f16 A fragment, O in
// register_pv_dim's order; keep_lo / keep_hi as in pv_step (ANDed into the values of keys
// 2 (lane % 4) + {0, 1} and those + 8).
template <KvFormat kFormat>
__device__ __forceinline__ void register_pv(float (&o)[16][4], const std::uint32_t (&p)[4],
                                            const std::byte* plane, int key0, std::uint32_t keep_lo,
                                            std::uint32_t keep_hi, int lane) {
  const int g = lane / 4, t = lane % 4;
  const auto word = [&](int key, int j4) {  // dims 32 j4 + 4 g .. + 3 of one key
    return *reinterpret_cast<const std::uint32_t*>(
        plane + swizzled_byte_chunk(key, 2 * j4 + g / 4) * 16 + (g % 4) * 4);
  };
#pragma unroll
  for (int j4 = 0; j4 < 4; ++j4) {
    const std::uint32_t a = word(key0 + 2 * t, j4), b = word(key0 + 2 * t + 1, j4);
    const std::uint32_t c = word(key0 + 2 * t + 8, j4), d = word(key0 + 2 * t + 9, j4);
    // (key 2 t, key 2 t + 1) code pairs of dims 0, 1 and of dims 2, 3; the same for + 8.
    const std::uint32_t lo01 = convert::prmt(a, b, 0x5140u), lo23 = convert::prmt(a, b, 0x7362u);
    const std::uint32_t hi01 = convert::prmt(c, d, 0x5140u), hi23 = convert::prmt(c, d, 0x7362u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::uint32_t lo = i < 2 ? lo01 : lo23, hi = i < 2 ? hi01 : hi23;
      const std::uint32_t b0 = fp8x2_to_f16x2<kFormat>(lo, i % 2) & keep_lo;
      const std::uint32_t b1 = fp8x2_to_f16x2<kFormat>(hi, i % 2) & keep_hi;
      mma_fp16_16816(o[4 * j4 + i], p, b0, b1);
    }
  }
}

// ---- NVFP4 values straight into P V's B fragments (bf16) ----
// N-tile j, column g holds dim nvfp4_pv_dim(j, g) = 16 g + j (O is put back in the epilogue).
// Thread (g, t) then reads the 8 bytes of dims 16 g .. 16 g + 15 (one scale block) of each of its
// key rows 2 t, 2 t + 1, 2 t + 8, 2 t + 9 of the raw V plane (load_raw_rows_warp's NVFP4 layout:
// kPlaneKeys 64-byte code rows, then their 8-byte scale rows). A byte permute puts two keys' codes
// of four dims in one word, its codes j and j + 4 being one dim of the two keys, which
// e2m1_pair_times_scale widens at once into the B register of one n-tile: no shared-memory
// widening pass, no ldmatrix. The values are those widen_planes gives (code x scale, x 2^-63 when
// kScaledDown), so O is the same, bit for bit.
__host__ __device__ constexpr int nvfp4_pv_dim(int ntile, int column) {
  return 16 * column + ntile;
}

static_assert(pv_order_is_a_permutation(nvfp4_pv_dim));

// O += P V for the 16 keys from key0 of a raw NVFP4 V plane, P the bf16 A fragment, O in
// nvfp4_pv_dim's order; keep_lo / keep_hi as in pv_step.
template <int kPlaneKeys, bool kScaledDown>
__device__ __forceinline__ void register_pv_nvfp4(float (&o)[16][4], const std::uint32_t (&p)[4],
                                                  const std::byte* plane, int key0,
                                                  std::uint32_t keep_lo, std::uint32_t keep_hi,
                                                  int lane) {
  const int g = lane / 4, t = lane % 4;
  const auto codes = [&](int key) {  // dims 16 g .. 16 g + 15 of one key
    return *reinterpret_cast<const uint2*>(plane + key * 64 + g * 8);
  };
  const auto scale_pair = [&](int key) {  // block g's scales of keys `key`, `key` + 1, as bf16
    const auto* s = reinterpret_cast<const std::uint8_t*>(plane + kPlaneKeys * 64 + key * 8 + g);
    const std::uint32_t both =
        convert::e4m3x2_to_bf16x2_cvt(static_cast<std::uint32_t>(s[0] | s[8] << 8), 0);
    return kScaledDown ? convert::bf16x2_mul(both, convert::kE2m1ScaleUp) : both;
  };
  const int lo_key = key0 + 2 * t, hi_key = lo_key + 8;
  const uint2 a = codes(lo_key), b = codes(lo_key + 1), c = codes(hi_key), d = codes(hi_key + 1);
  const std::uint32_t lo_scale = scale_pair(lo_key), hi_scale = scale_pair(hi_key);
  // Dims 4 q .. 4 q + 3 of the block (n-tiles 4 q .. 4 q + 3): bytes 0, 1 (q even) or 2, 3 of
  // code word q / 2 of the two keys, the first key's in the low half.
  const auto quad = [&]<int kQ>() {
    constexpr std::uint32_t sel = kQ % 2 == 0 ? 0x5410u : 0x7632u;
    const std::uint32_t lo = convert::prmt(kQ < 2 ? a.x : a.y, kQ < 2 ? b.x : b.y, sel);
    const std::uint32_t hi = convert::prmt(kQ < 2 ? c.x : c.y, kQ < 2 ? d.x : d.y, sel);
    const auto step = [&]<int kJ>() {
      const std::uint32_t b0 = convert::e2m1_pair_times_scale<kJ, kScaledDown>(lo, lo_scale);
      const std::uint32_t b1 = convert::e2m1_pair_times_scale<kJ, kScaledDown>(hi, hi_scale);
      mma_bf16_16816(o[4 * kQ + kJ], p, b0 & keep_lo, b1 & keep_hi);
    };
    step.template operator()<0>();
    step.template operator()<1>();
    step.template operator()<2>();
    step.template operator()<3>();
  };
  quad.template operator()<0>();
  quad.template operator()<1>();
  quad.template operator()<2>();
  quad.template operator()<3>();
}

}  // namespace flashmsa::cuda
