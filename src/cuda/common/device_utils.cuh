// Small device building blocks the kernels share: warp-level tensor-core MMA (m16n8k16 with bf16
// or fp16 in, m16n8k32 with E4M3 in; fp32 accumulate), ldmatrix, cp.async, the XOR swizzle of
// 256- and 128-byte shared-memory rows, warp reductions and the orderable integer key of the
// spec's selection order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace flashmsa::cuda {

// ---- Shared-memory tiles of 128 bf16 (256 bytes) per row -----------------------------------
// Rows are 16 chunks of 16 bytes; chunk c of row r is stored at c ^ (r & 7) so that the eight
// row addresses of one ldmatrix phase fall in eight different bank groups.
constexpr int kRowChunks = 16;

__device__ __forceinline__ int swizzled_chunk(int row, int chunk) {
  return row * kRowChunks + (chunk ^ (row & 7));
}

// ---- Shared-memory tiles of 128 fp8 codes (128 bytes) per row -------------------------------
// Rows of 8 chunks with the same XOR: an fp8 page as load_raw_plane stores it and the fp8 index
// queries, read by ldmatrix conflict-free.
constexpr int kByteRowChunks = 8;

__device__ __forceinline__ int swizzled_byte_chunk(int row, int chunk) {
  return row * kByteRowChunks + (chunk ^ (row & 7));
}

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(smem)),
               "l"(global));
}
// Copies 16 bytes, or writes 16 zero bytes without reading when `fill` is false.
__device__ __forceinline__ void cp_async_16_or_zero(void* smem, const void* global, bool fill) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
               "l"(global), "r"(fill ? 16 : 0));
}
// 8-byte copies (NVFP4 scale rows) go through L1: .cg only takes 16 bytes.
__device__ __forceinline__ void cp_async_8_or_zero(void* smem, const void* global, bool fill) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_address(smem)),
               "l"(global), "r"(fill ? 8 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}

// D += A (16x16, row-major) * B (16x8, column-major), bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                               std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with fp16 operands.
__device__ __forceinline__ void mma_fp16_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                               std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D += A (16x32, row-major) * B (32x8, column-major), E4M3 operands (four codes per register,
// the lowest byte first), fp32 accumulators: every product of two E4M3 values is exact in fp32.
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const std::uint32_t (&a)[4],
                                               std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ std::uint32_t pack_fp16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// Two floats as the 16-bit MMA type Elem (__half or __nv_bfloat16), low half first.
template <class Elem>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Elem, __half>) {
    return pack_fp16(lo, hi);
  } else {
    return pack_bf16(lo, hi);
  }
}

// The largest finite magnitude of the bf16 vector that 16 consecutive lanes hold, 8 elements a
// lane packed in pairs (element 2i in the low half), as a float's bits (bf16 << 16: magnitudes
// order as integers), 0 where none is finite and non-zero; every lane of the 16 gets it. The
// power-of-two scalings of query vectors (permute_query_tile, the NVFP4 index scoring) start here.
__device__ __forceinline__ std::uint32_t largest_finite_magnitude_16_lanes(const uint4& pairs) {
  const std::uint32_t words[4] = {pairs.x, pairs.y, pairs.z, pairs.w};
  std::uint32_t largest = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const std::uint32_t magnitude = (words[e / 2] << (e % 2 == 0 ? 16 : 0)) & 0x7FFF0000u;
    if (magnitude < 0x7F800000u) largest = max(largest, magnitude);
  }
#pragma unroll
  for (int offset = 1; offset < 16; offset *= 2)
    largest = max(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
  return largest;
}

// ---- Selection order (spec section 4) -------------------------------------------------------
// The rank key of a score: NaN ranks as -1e30, -0.0 equals +0.0.
__device__ __forceinline__ float rank_key(float s) {
  return s != s ? -1e30f : (s == 0.0f ? 0.0f : s);
}
// The larger of a and b, NaN where either is NaN (fmaxf drops NaN).
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
// The largest rank key of the values added, in two min/max instructions a value instead of
// rank_key's compares: the maximum of the non-NaN values (fmaxf drops NaN) and a NaN-propagating
// maximum that only says whether a NaN was seen (it ranks as -1e30). Where NaN is rare, a max_nan
// pass alone gives the key (any itself, -0.0 as +0.0) unless it met a NaN.
struct RankMax {
  float numbers = -INFINITY, any = -INFINITY;
  __device__ __forceinline__ void add(float x) {
    numbers = fmaxf(numbers, x);
    any = max_nan(any, x);
  }
  __device__ __forceinline__ float key() const {
    const float m = any != any ? fmaxf(numbers, -1e30f) : numbers;
    return m == 0.0f ? 0.0f : m;  // -0.0 ranks as +0.0
  }
};
// An unsigned integer that orders like the (finite or infinite, non-NaN) float key.
__device__ __forceinline__ std::uint32_t orderable_bits(float key) {
  const std::uint32_t u = __float_as_uint(key);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ std::int64_t min64(std::int64_t a, std::int64_t b) {
  return a < b ? a : b;
}
__device__ __forceinline__ std::int64_t max64(std::int64_t a, std::int64_t b) {
  return a > b ? a : b;
}

// Programmatic dependent launch (sm_90, launch_dependent_kernel): wait until the stream's
// previous kernel has completed and its writes are visible (at once when this kernel was not
// launched as its dependent), and let the next kernel's CTAs launch while this one runs (called
// near the end of the main work: launched early, they would only sit waiting on the SMs).
__device__ __forceinline__ void wait_for_previous_kernel() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void allow_next_kernel() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// 2^x by the SFU (ex2.approx.ftz: about 2 ulp; -inf gives +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashmsa::cuda
