// In-register widening of packed cache codes to 16-bit tensor-core operands: the candidate
// sequences for the decode and prefill rewrites (the "in-register dequant" of the Hopper issues),
// every one exact for every code, NaN and Inf included. Their throughput per SM is measured by
// bench/hopper_microbench.cu (docs/performance.md); tests/cpp/gpu/test_formats_gpu.cu checks each
// against the host decoders over all codes.
//
// Codes arrive as they sit in the cache: four fp8 codes or eight NVFP4 codes per 32-bit word,
// element 0 in the lowest byte (NVFP4: the low nibble). Outputs are packed pairs, element 2i in
// the low half.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashmsa::cuda::convert {

// prmt.b32 (default mode); on the host its emulation, so that the logic-only routes can be
// checked where no GPU is: result byte i is byte (sel >> 4 i) & 7 of {b, a} (a's bytes 0..3), or,
// where bit 3 of that selector nibble is set, that byte's sign bit replicated.
__host__ __device__ __forceinline__ std::uint32_t prmt(std::uint32_t a, std::uint32_t b,
                                                       std::uint32_t sel) {
#ifdef __CUDA_ARCH__
  std::uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
#else
  const std::uint64_t bytes = std::uint64_t{b} << 32 | a;
  std::uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t nibble = sel >> (4 * i) & 15u;
    std::uint32_t byte = static_cast<std::uint32_t>(bytes >> (8 * (nibble & 7u))) & 0xFFu;
    if (nibble & 8u) byte = byte & 0x80u ? 0xFFu : 0u;
    r |= byte << (8 * i);
  }
  return r;
#endif
}

// Each fp8 code of a pair moved to the high byte of its 16-bit half: bytes (0, 1) or (2, 3).
__device__ __forceinline__ std::uint32_t fp8_pair_high_bytes(std::uint32_t codes, int pair) {
  return prmt(codes, 0, pair == 0 ? 0x1404u : 0x3424u);
}

// Half kHalf of a packed pair in both halves. Written as 16-bit moves, not a byte permute, so that
// ptxas folds it into the consuming HMUL2's operand selector (.H0_H0 / .H1_H1): no instruction.
template <int kHalf>
__device__ __forceinline__ std::uint32_t broadcast_half(std::uint32_t pair) {
  static_assert(kHalf == 0 || kHalf == 1);
  std::uint32_t r;
  if constexpr (kHalf == 0) {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n mov.b32 %0, {lo, lo};\n}"
        : "=r"(r)
        : "r"(pair));
  } else {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n mov.b32 %0, {hi, hi};\n}"
        : "=r"(r)
        : "r"(pair));
  }
  return r;
}

__device__ __forceinline__ std::uint32_t bf16x2_mul(std::uint32_t a, std::uint32_t b) {
  std::uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// ---- E4M3 ----

// The hardware conversion (F2FP): codes pair 0 or 1 of the word to f16x2. The pair is taken as a
// half of the 32-bit register (mov.b32 {lo, hi}), so that ptxas reads it with F2FP's .H1 operand
// selector instead of shifting first.
__device__ __forceinline__ std::uint32_t e4m3x2_to_f16x2(std::uint32_t codes, int pair) {
  std::uint32_t r;
  if (pair == 0) {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}"
        : "=r"(r)
        : "r"(codes));
  } else {
    asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}"
        : "=r"(r)
        : "r"(codes));
  }
  return r;
}

// To bf16x2 through the hardware f16 conversion and fp32 (cvt): exact, every value of E4M3 is a
// bf16 value.
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16x2_cvt(std::uint32_t codes, int pair) {
  const std::uint32_t h = e4m3x2_to_f16x2(codes, pair);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const std::uint32_t*>(&b);
}

// To bf16x2 by moving bits: sign to bit 15, exponent and mantissa to bits 10..4, which reads as
// the bf16 of value * 2^-120 (subnormal codes included); one bf16 multiply by 2^120 restores the
// value exactly. The NaN codes (S.1111.111) would read as 480: one compare marks them and the
// exponent field is set to all ones (mantissa non-zero: NaN).
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16x2_bits(std::uint32_t codes, int pair) {
  const std::uint32_t u = fp8_pair_high_bytes(codes, pair);  // code << 8 in each half
  const std::uint32_t moved = (u & 0x80008000u) | ((u >> 4) & 0x07F007F0u);
  const std::uint32_t r = bf16x2_mul(moved, 0x7B807B80u);  // 2^120 in each half
  const std::uint32_t nan = __vcmpeq2(u & 0x7F007F00u, 0x7F007F00u);
  return r | (nan & 0x7F807F80u);
}

// ---- E5M2 ----

// An E5M2 code is the high byte of the f16 of its value: one byte permute per pair.
__device__ __forceinline__ std::uint32_t e5m2x2_to_f16x2(std::uint32_t codes, int pair) {
  return fp8_pair_high_bytes(codes, pair);
}

// To bf16x2 by moving bits (exponent and mantissa to bits 11..5, times 2^112); Inf and NaN codes
// (exponent 31) get the exponent field all ones, keeping their mantissa (zero: Inf).
__device__ __forceinline__ std::uint32_t e5m2x2_to_bf16x2_bits(std::uint32_t codes, int pair) {
  const std::uint32_t u = fp8_pair_high_bytes(codes, pair);
  const std::uint32_t moved = (u & 0x80008000u) | ((u >> 3) & 0x0FE00FE0u);
  const std::uint32_t r = bf16x2_mul(moved, 0x77807780u);  // 2^112 in each half
  const std::uint32_t special = __vcmpeq2(u & 0x7C007C00u, 0x7C007C00u);
  return r | (special & 0x7F807F80u);
}

// ---- NVFP4 (E2M1 codes; the E4M3 block scale is applied by the caller) ----

// Eight codes to four f16x2 by a byte-permute lookup of each magnitude's f16 high byte (0, 0.5,
// 1, 1.5, 2, 3, 4, 6; their low bytes are zero), the signs shifted in. Natural element order.
__device__ __forceinline__ void e2m1x8_to_f16x2_lut(std::uint32_t codes, std::uint32_t (&out)[4]) {
  constexpr std::uint32_t kLo = 0x3E3C3800u, kHi = 0x46444240u;  // high bytes of |value| 0..7
  const std::uint32_t mags = codes & 0x77777777u;
  const std::uint32_t high[2] = {prmt(kLo, kHi, mags), prmt(kLo, kHi, mags >> 16)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t h = prmt(high[i / 2], 0, i % 2 == 0 ? 0x1404u : 0x3424u);
    const std::uint32_t nibbles = codes >> (8 * i);  // element 2i: bits 0..3, 2i+1: bits 4..7
    out[i] = h | ((nibbles << 12) & 0x8000u) | ((nibbles << 24) & 0x80000000u);
  }
}

// Eight codes to four f16x2 holding value * 2^-14, by moving bits alone: the code's exponent and
// mantissa land in the f16's bits 11..9, which reads as value * 2^-14 (0.5 as a subnormal). The
// caller folds 2^14 into the block scale it applies after the MMA step. Element order (0, 2),
// (1, 3), (4, 6), (5, 7): the other operand's k order is permuted the same way (a dot product
// does not depend on its order), or, for P V, the output columns.
__device__ __forceinline__ void e2m1x8_to_f16x2_scaled_shift(std::uint32_t codes,
                                                             std::uint32_t (&out)[4]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const std::uint32_t spread = prmt(codes, 0, i == 0 ? 0x4140u : 0x4342u);  // bytes to halves
    out[2 * i] = ((spread << 9) & 0x0E000E00u) | ((spread << 12) & 0x80008000u);
    out[2 * i + 1] = ((spread << 5) & 0x0E000E00u) | ((spread << 8) & 0x80008000u);
  }
}

// The same four f16x2, element order and 2^-14 as e2m1x8_to_f16x2_scaled_shift, by building each
// code's f16 high byte inside its own byte (sign to bit 7, exponent and mantissa to bits 3..1:
// three logic ops for the high nibbles, four for the low ones) and moving bytes into the halves'
// high bytes: 11 instructions for 8 codes against the shifts' 18. An f16 high byte holds a whole
// code; a bf16 one does not (its exponent's low bit is in the low byte).
__host__ __device__ __forceinline__ void e2m1x8_to_f16x2_scaled_bytes(std::uint32_t codes,
                                                                      std::uint32_t (&out)[4]) {
  const std::uint32_t odd = (codes & 0x80808080u) | ((codes >> 3) & 0x0E0E0E0Eu);
  const std::uint32_t even = ((codes << 4) & 0x80808080u) | ((codes << 1) & 0x0E0E0E0Eu);
  out[0] = prmt(even, 0, 0x1404u);  // elements 0, 2
  out[1] = prmt(odd, 0, 0x1404u);   // 1, 3
  out[2] = prmt(even, 0, 0x3424u);  // 4, 6
  out[3] = prmt(odd, 0, 0x3424u);   // 5, 7
}

// Codes j and j + 4 of a word (j = 0..3: one from each 16-bit half, at the same offset) to the
// bf16x2 of their values, by moving bits: each code's exponent and mantissa land in bits 8..6 and
// its sign in bit 15 of its half, which reads as value * 2^-126 (0.5 as a subnormal:
// e2m1_pair_to_bf16x2_bits); one bf16 multiply by 2^126 restores the value exactly. Pairing j with
// j + 4 gives both codes of a pair the same shifts: two shifts, two logic ops and the multiply per
// pair. The other operand's k order is permuted to match (the index scoring's decode path).
template <int kJ>
__device__ __forceinline__ std::uint32_t e2m1_pair_to_bf16x2_bits(std::uint32_t codes) {
  static_assert(kJ >= 0 && kJ < 4);
  constexpr int kMagnitudeShift = 6 - 4 * kJ, kSignShift = 12 - 4 * kJ;
  const std::uint32_t magnitude =
      (kMagnitudeShift >= 0 ? codes << kMagnitudeShift : codes >> -kMagnitudeShift) & 0x01C001C0u;
  const std::uint32_t sign = (codes << kSignShift) & 0x80008000u;
  return magnitude | sign;  // value * 2^-126
}
// Where a scale follows anyway, the restoring multiply can go: bits x (scale x 2^63) is
// code x scale x 2^-63, a normal bf16 with at most 6 significant bits (|code x scale| is 0 or in
// [2^-10, 2688]), so exact; the consumer carries the 2^63 back (register_qk, widen_planes).
inline constexpr std::uint32_t kE2m1ScaleUp = 0x5F005F00u;  // 2^63 in each bf16 half
inline constexpr float kE2m1ScaledDownRestore = 0x1p63f;
template <int kJ>
__device__ __forceinline__ std::uint32_t e2m1_pair_to_bf16x2(std::uint32_t codes) {
  return bf16x2_mul(e2m1_pair_to_bf16x2_bits<kJ>(codes), 0x7E807E80u);  // 2^126 in each half
}
// Eight bf16 values (dims 0..7 of a 16-byte chunk) in the order of e2m1_pair_to_bf16x2's pairs,
// (0, 4), (1, 5), (2, 6), (3, 7): the other operand of keys widened pair by pair into a chunk.
__device__ __forceinline__ uint4 e2m1_pair_order(uint4 v) {
  return make_uint4(prmt(v.x, v.z, 0x5410u), prmt(v.x, v.z, 0x7632u), prmt(v.y, v.w, 0x5410u),
                    prmt(v.y, v.w, 0x7632u));
}
// Codes j and j + 4 times their block scale pair (exact); kScaledDown: x 2^-63 too, the scale
// pair carrying kE2m1ScaleUp.
template <int kJ, bool kScaledDown>
__device__ __forceinline__ std::uint32_t e2m1_pair_times_scale(std::uint32_t codes,
                                                               std::uint32_t scale) {
  if constexpr (kScaledDown) {
    return bf16x2_mul(e2m1_pair_to_bf16x2_bits<kJ>(codes), scale);
  } else {
    return bf16x2_mul(e2m1_pair_to_bf16x2<kJ>(codes), scale);
  }
}

}  // namespace flashmsa::cuda::convert
