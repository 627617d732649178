// Quantizing 8 consecutive elements of a cache row on the device, with the format code the CPU
// backend uses (so the bytes are identical). A row of 128 elements is written by 16 lanes of one
// warp; NVFP4 groups of 16 span two lanes, which share their amax through one shuffle. Every
// lane of the warp must call encode_cache_chunk (the shuffle is unconditional); lanes with
// write == false contribute nothing and store nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashmsa/dtype.hpp"
#include "flashmsa/formats.hpp"

namespace flashmsa::cuda {

constexpr int kChunkElems = 8;

// x[0..8) are elements [8 * part, 8 * part + 8) of the row at `row` (NVFP4 scales at
// `scale_row`); fp8 stores x / scale.
__device__ __forceinline__ void encode_cache_chunk(DType dtype, const float (&x)[kChunkElems],
                                                   bool write, std::byte* row, std::byte* scale_row,
                                                   int part, float scale) {
  float amax = 0.0f;
  if (write) amax = fmt::nan_ignoring_amax(x, kChunkElems);
  const float other = __shfl_xor_sync(0xffffffffu, amax, 1);
  if (!write) return;
  if (dtype == DType::kNvfp4) {
    amax = other > amax ? other : amax;
    const std::uint8_t scale_code = fmt::float_to_e4m3(amax / 6.0f);
    const float s = fmt::e4m3_to_float(scale_code);
    std::uint32_t packed = 0;
    for (int i = 0; i < kChunkElems / 2; ++i) {
      const std::uint32_t lo = s == 0.0f ? 0u : fmt::float_to_e2m1(x[2 * i] / s);
      const std::uint32_t hi = s == 0.0f ? 0u : fmt::float_to_e2m1(x[2 * i + 1] / s);
      packed |= (lo | (hi << 4)) << (8 * i);
    }
    *reinterpret_cast<std::uint32_t*>(row + part * 4) = packed;
    if ((part & 1) == 0) scale_row[part / 2] = static_cast<std::byte>(scale_code);
  } else if (dtype == DType::kBf16 || dtype == DType::kFp16) {
    uint4 out;
    auto* o = reinterpret_cast<std::uint16_t*>(&out);
    for (int i = 0; i < kChunkElems; ++i) {
      o[i] = dtype == DType::kBf16 ? fmt::float_to_bf16(x[i]) : fmt::float_to_fp16(x[i]);
    }
    *reinterpret_cast<uint4*>(row + part * 16) = out;
  } else {
    uint2 out;
    auto* o = reinterpret_cast<std::uint8_t*>(&out);
    for (int i = 0; i < kChunkElems; ++i) {
      // x / scale, as the CPU backend computes it (a division, not a multiply by 1/scale).
      const float q = x[i] / scale;
      o[i] = dtype == DType::kFp8E4m3 ? fmt::float_to_e4m3(q) : fmt::float_to_e5m2(q);
    }
    *reinterpret_cast<uint2*>(row + part * 8) = out;
  }
}

// Loads 8 consecutive activations (bf16, fp16 or fp32) as floats with 16-byte loads.
__device__ __forceinline__ void load_chunk(DType dtype, const void* base, std::int64_t offset,
                                           float (&x)[kChunkElems]) {
  if (dtype == DType::kFp32) {
    const float4* s = reinterpret_cast<const float4*>(static_cast<const float*>(base) + offset);
    const float4 a = s[0], b = s[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    return;
  }
  const uint4 raw =
      *reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(base) + offset);
  const auto* h = reinterpret_cast<const std::uint16_t*>(&raw);
  for (int i = 0; i < kChunkElems; ++i) {
    x[i] = dtype == DType::kBf16 ? fmt::bf16_to_float(h[i]) : fmt::fp16_to_float(h[i]);
  }
}

}  // namespace flashmsa::cuda
