// The page-format codec every sm90 kernel reads cache pages through: the formats and plane sizes
// of kv_format.hpp, the copy of one plane of a page into a raw stage (load_raw_plane), and the
// exact widening of a raw 8- or 4-bit stage into the swizzled 16-bit tiles the tensor cores read.
// Register-level widening routes for the rewrites are in convert.cuh.
#pragma once

#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "src/cuda/common/device_plane.hpp"
#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/sm90/convert.cuh"
#include "src/cuda/sm90/kv_format.hpp"

namespace flashmsa::cuda {

// Issues the cp.async copies (kThreads threads, each its share) of one plane of (page, head) into
// a raw stage of raw_plane_bytes<kFormat>(): the 128 token rows (16-bit rows straight into the
// swizzled MMA layout, 8-bit rows swizzled in 128-byte rows, 4-bit rows as they are), then for
// NVFP4 the rows' scales from `scales`. Tokens at or after `limit` are zero-filled without being
// read.
template <int kThreads, KvFormat kFormat>
__device__ __forceinline__ void load_raw_plane(const DevicePlane& src, const DevicePlane& scales,
                                               std::int64_t page, int head, int limit,
                                               std::byte* dst) {
  const std::byte* base = src.row(page, head, 0);
  if constexpr (kFormat == KvFormat::kNative16) {
    // Each thread keeps one 16-byte column and walks the tokens (few address computations).
    static_assert(kThreads % kRowChunks == 0);
    constexpr int kStep = kThreads / kRowChunks;
    const int chunk = threadIdx.x % kRowChunks;
    const std::byte* from = base + (threadIdx.x / kRowChunks) * src.token_stride + chunk * 16;
#pragma unroll 4
    for (int token = threadIdx.x / kRowChunks; token < 128; token += kStep) {
      cp_async_16_or_zero(dst + swizzled_chunk(token, chunk) * 16, from, token < limit);
      from += kStep * src.token_stride;
    }
  } else {
    // fp8 rows are stored swizzled (swizzled_byte_chunk: the fp8 tensor-core path reads them by
    // ldmatrix); NVFP4 rows as they are.
    // (Fixed trip counts, straight-line copies: the per-page loop of the decode scoring is
    // instruction-bound on small NVFP4 / fp8 pages.)
    constexpr int kChunks = kFormat == KvFormat::kNvfp4 ? 4 : kByteRowChunks;  // 16-byte pieces
    static_assert(128 * kChunks % kThreads == 0);
#pragma unroll
    for (int r = 0; r < 128 * kChunks / kThreads; ++r) {
      const int i = threadIdx.x + r * kThreads;
      const int token = i / kChunks, chunk = i % kChunks;
      const int at = kFormat == KvFormat::kNvfp4 ? i : swizzled_byte_chunk(token, chunk);
      cp_async_16_or_zero(dst + at * 16, base + token * src.token_stride + chunk * 16,
                          token < limit);
    }
    if constexpr (kFormat == KvFormat::kNvfp4) {
      const std::byte* scale_rows = scales.row(page, head, 0);
      static_assert(128 % kThreads == 0 || kThreads % 128 == 0);
#pragma unroll
      for (int r = 0; r < (128 + kThreads - 1) / kThreads; ++r) {
        const int token = threadIdx.x + r * kThreads;
        if (token < 128) {
          cp_async_8_or_zero(dst + 128 * 64 + token * 8, scale_rows + token * scales.token_stride,
                             token < limit);
        }
      }
    }
  }
}

// One warp's share of a plane: the kRows token rows from token0 of (page, head), as a raw plane
// of kRows tokens (raw_plane_bytes<kFormat, kRows>) in load_raw_plane's layout with row token0 as
// row 0 (the swizzles depend on the row mod 8 and token0 is a multiple of 8). Rows at or after
// `limit` (counted from token0) are zero-filled without being read.
template <int kRows, KvFormat kFormat>
__device__ __forceinline__ void load_raw_rows_warp(const DevicePlane& src,
                                                   const DevicePlane& scales, std::int64_t page,
                                                   int head, int token0, int limit, std::byte* dst,
                                                   int lane) {
  static_assert(kRows % 8 == 0);
  if constexpr (kFormat == KvFormat::kNative16) {
    // Two rows a pass; each lane keeps one 16-byte column (the swizzled MMA tile's chunk).
    const int lane_token = lane / kRowChunks, chunk = lane % kRowChunks;
    const std::byte* from = src.row(page, head, token0 + lane_token) + chunk * 16;
    const std::int64_t pass_stride = 2 * src.token_stride;
#pragma unroll
    for (int r = 0; r < kRows / 2; ++r) {
      const int token = lane_token + 2 * r;
      cp_async_16_or_zero(dst + swizzled_chunk(token, chunk) * 16, from, token < limit);
      from += pass_stride;
    }
  } else {
    constexpr int kChunks = kFormat == KvFormat::kNvfp4 ? 4 : kByteRowChunks;  // 16-byte pieces
    constexpr int kPassTokens = 32 / kChunks;  // the rows one pass of the warp copies
    static_assert(kRows % kPassTokens == 0 && 8 % kPassTokens == 0);
    // Lane-fixed token and chunk, one 64-bit source pointer advanced a pass at a time: the loop of
    // a decode kernel re-derives these every page (its registers are spent on the MMAs), so the
    // per-pass part is kept to a pointer add, a compare and the copy.
    const int lane_token = lane / kChunks, chunk = lane % kChunks;
    const std::byte* from = src.row(page, head, token0 + lane_token) + chunk * 16;
    const std::int64_t pass_stride = kPassTokens * src.token_stride;
#pragma unroll
    for (int r = 0; r < kRows / kPassTokens; ++r) {
      const int token = lane_token + r * kPassTokens;
      // The fp8 swizzle depends on token % 8 = lane_token + (r kPassTokens) % 8 (lane_token <
      // kPassTokens, which divides 8): two lane values, the rest is a constant offset.
      const int in_eight = (r * kPassTokens) % 8;
      const int at = kFormat == KvFormat::kNvfp4
                         ? lane + 32 * r
                         : swizzled_byte_chunk(lane_token + in_eight, chunk) +
                               (r * kPassTokens - in_eight) * kByteRowChunks;
      cp_async_16_or_zero(dst + at * 16, from, token < limit);
      from += pass_stride;
    }
    if constexpr (kFormat == KvFormat::kNvfp4) {
      static_assert(kRows <= 32);
      if (lane < kRows) {
        cp_async_8_or_zero(dst + kRows * 64 + lane * 8,
                           scales.row(page, head, token0) + lane * scales.token_stride,
                           lane < limit);
      }
    }
  }
}

// Widens kPlanes consecutive raw planes of kTokens tokens of a stage into as many swizzled 16-bit
// tiles (kTokens x 256 bytes each), exactly: every E4M3, E5M2 and NVFP4 (code x E4M3 scale) value
// is representable in bf16 and in fp16. Work unit: 16 elements of one token; `thread` is the
// caller's index among the kThreads that share the work. kNvfp4ScaledDown (NVFP4 into bf16): the
// tiles hold code x scale x 2^-63, one multiply a code pair fewer (convert::kE2m1ScaleUp).
template <int kThreads, KvFormat kFormat, class Elem, int kPlanes, int kTokens = 128,
          bool kNvfp4ScaledDown = false>
__device__ void widen_planes(const std::byte* stage, std::byte* tiles, int thread) {
  static_assert(kFormat != KvFormat::kNative16, "16-bit pages are copied, not widened");
  for (int i = thread; i < kPlanes * kTokens * 8; i += kThreads) {
    // With one plane i < kTokens * 8 already: no division for the plane index.
    const int plane = kPlanes == 1 ? 0 : i / (kTokens * 8);
    const int token = kPlanes == 1 ? i / 8 : (i / 8) % kTokens, group = i % 8;
    const std::byte* raw = stage + plane * raw_plane_bytes<kFormat, kTokens>();
    auto* dst = reinterpret_cast<uint4*>(tiles + plane * kTokens * 256);
    if constexpr (kFormat == KvFormat::kNvfp4 && std::is_same_v<Elem, __nv_bfloat16>) {
      // bf16 tiles: each pair of codes (j, j + 4) of a word straight to bf16x2
      // (convert::e2m1_pair_to_bf16x2), times the scale in bf16 (exact: <= 6 significant bits),
      // then byte permutes back to the natural order.
      const uint2 codes = *reinterpret_cast<const uint2*>(raw + token * 64 + group * 8);
      const auto scale_code = static_cast<std::uint8_t>(raw[kTokens * 64 + token * 8 + group]);
      std::uint32_t scale = convert::prmt(convert::e4m3x2_to_bf16x2_cvt(scale_code, 0), 0,
                                          0x1010u);  // (scale, scale)
      if constexpr (kNvfp4ScaledDown) scale = convert::bf16x2_mul(scale, convert::kE2m1ScaleUp);
      uint4 out[2];
      auto* o = reinterpret_cast<std::uint32_t*>(out);
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        const std::uint32_t word = w == 0 ? codes.x : codes.y;
        const std::uint32_t p0 = convert::e2m1_pair_times_scale<0, kNvfp4ScaledDown>(word, scale);
        const std::uint32_t p1 = convert::e2m1_pair_times_scale<1, kNvfp4ScaledDown>(word, scale);
        const std::uint32_t p2 = convert::e2m1_pair_times_scale<2, kNvfp4ScaledDown>(word, scale);
        const std::uint32_t p3 = convert::e2m1_pair_times_scale<3, kNvfp4ScaledDown>(word, scale);
        o[4 * w + 0] = convert::prmt(p0, p1, 0x5410u);  // elements 0, 1
        o[4 * w + 1] = convert::prmt(p2, p3, 0x5410u);  // 2, 3
        o[4 * w + 2] = convert::prmt(p0, p1, 0x7632u);  // 4, 5
        o[4 * w + 3] = convert::prmt(p2, p3, 0x7632u);  // 6, 7
      }
      dst[swizzled_chunk(token, 2 * group)] = out[0];
      dst[swizzled_chunk(token, 2 * group + 1)] = out[1];
      continue;
    }
    float x[16];
    if constexpr (kFormat == KvFormat::kNvfp4) {
      const uint2 codes = *reinterpret_cast<const uint2*>(raw + token * 64 + group * 8);
      const auto scale_code = static_cast<std::uint8_t>(raw[kTokens * 64 + token * 8 + group]);
      const float scale = __half2float(__half(__nv_cvt_fp8_to_halfraw(scale_code, __NV_E4M3)));
      // The codes' values through a byte-permute lookup (registers only), times the scale.
      std::uint32_t halves[8];
      convert::e2m1x8_to_f16x2_lut(codes.x, reinterpret_cast<std::uint32_t(&)[4]>(halves[0]));
      convert::e2m1x8_to_f16x2_lut(codes.y, reinterpret_cast<std::uint32_t(&)[4]>(halves[4]));
      for (int j = 0; j < 8; ++j) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&halves[j]));
        x[2 * j] = f.x * scale;
        x[2 * j + 1] = f.y * scale;
      }
    } else {
      const std::byte* at = raw + swizzled_byte_chunk(token, group) * 16;
      const uint4 bytes = *reinterpret_cast<const uint4*>(at);
      const auto* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&bytes);
      constexpr __nv_fp8_interpretation_t kKind =
          kFormat == KvFormat::kE4m3 ? __NV_E4M3 : __NV_E5M2;
      for (int j = 0; j < 8; ++j) {
        const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], kKind)));
        x[2 * j] = f.x;
        x[2 * j + 1] = f.y;
      }
    }
    uint4 out[2];
    auto* o = reinterpret_cast<std::uint32_t*>(out);
    for (int j = 0; j < 8; ++j) o[j] = pack2<Elem>(x[2 * j], x[2 * j + 1]);
    dst[swizzled_chunk(token, 2 * group)] = out[0];
    dst[swizzled_chunk(token, 2 * group + 1)] = out[1];
  }
}

}  // namespace flashmsa::cuda
