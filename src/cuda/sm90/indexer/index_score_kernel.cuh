// index_score_kernel: the decode indexer's block scores of one request's query rows against the
// index-K pages of one split (prefill is index_prefill_kernel's).
//
// A CTA holds its tile's index queries (kVectors (row, index head) pairs x 128 dims, bf16) in
// shared memory and streams the tile's visible pages through the cp.async ring of
// page_pipeline.cuh (on the 16-vector decode tile of E4M3 x E4M3 or NVFP4 keys, each warp streams
// its own keys through a ring of its own and the block maxima are merged once per 8 pages). Per
// page, warps compute S = Q K^T with warp_mma.cuh's pieces (warp tile kWarpRows x kWarpCols), mask
// keys after each row's position, reduce each row to its block max (rank order: NaN as -1e30) and
// write one fp32 per (index head, row, block). E4M3 keys scored by E4M3 queries (the fp8 indexer)
// go straight from the page stage into the E4M3 mma.sync (which ptxas expands into conversions and
// f16 MMAs on sm_90) on the 256-vector tile, and on the smaller tiles into f16 MMAs by hand against
// a query tile widened to f16 once (qk_step_e4m3_f16: no per-page query conversion); NVFP4 keys on
// the smaller tiles are widened in registers into the bf16 MMA's fragments (register_qk); the other
// quantized keys are widened to bf16 in shared memory (exactly: every format is a subset of bf16)
// for the bf16 path.
#pragma once

#include <cuda_fp8.h>

#include "flashmsa/error.hpp"

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/launch.hpp"
#include "src/cuda/sm90/indexer/index_score_traits.hpp"
#include "src/cuda/sm90/indexer/indexer_params.hpp"
#include "src/cuda/sm90/page_codec.cuh"
#include "src/cuda/sm90/page_pipeline.cuh"
#include "src/cuda/sm90/register_keys.cuh"
#include "src/cuda/sm90/scheduler/tiles.cuh"
#include "src/cuda/sm90/warp_mma.cuh"

namespace flashmsa::cuda {

template <class Traits, KvFormat kFormat, bool kQueryFp8>
__global__ void __launch_bounds__(Traits::kThreads)
    index_score_kernel(const __grid_constant__ IndexScoreParams p) {
  constexpr bool kFp8Mma = index_score_uses_fp8_mma<kFormat, kQueryFp8>();
  constexpr bool kConvert = index_score_widens_in_shared<Traits, kFormat, kQueryFp8>();
  constexpr bool kRegisterCodes = index_score_widens_in_registers<Traits, kFormat, kQueryFp8>();
  constexpr bool kWarpRings = index_score_warp_rings<Traits, kFormat, kQueryFp8>();
  constexpr bool kF16Route = index_score_fp8_as_f16<Traits, kFormat, kQueryFp8>();
  static_assert(!kF16Route || kFp8Mma, "the f16 route reads the E4M3 queries as the fp8 MMA does");
  // A stage: the page's keys, or (kWarpRings) the warp's kWarpCols keys of it.
  constexpr int kStageKeys = kWarpRings ? Traits::kWarpCols : 128;
  constexpr int kStageBytes = raw_plane_bytes<kFormat, kStageKeys>();
  constexpr int kGroup = kWarpRings ? kIndexScoreMaxGroup : 1;  // pages a CTA merge covers
  wait_for_previous_kernel();  // launched as a dependent of the step's previous kernel
  phase_stamp(p.clock, 0);
  extern __shared__ __align__(128) std::byte smem[];
  std::byte* q_tile = smem;
  std::byte* stages = q_tile + index_score_query_bytes<Traits, kFormat, kQueryFp8>();
  std::byte* widened = stages + index_score_ring_bytes<Traits, kFormat, kQueryFp8>();
  // [kGroup pages][kWarpsN][kVectors]: each warp's block maxima.
  float* partial_max =
      reinterpret_cast<float*>(widened + index_score_widened_bytes<Traits, kFormat, kQueryFp8>());
  // kRegisterCodes: each query vector's 2^-E (index_score_widens_in_registers says why).
  float* vector_restore = partial_max + kGroup * Traits::kWarpsN * Traits::kVectors;

  const int hidx = p.num_index_heads;
  const IndexTile tile = index_decode_tile(p.rows, p.chunk);
  const std::int64_t tile_blocks = index_tile_blocks(tile, p.max_blocks);
  const std::int64_t block_begin = std::int64_t{blockIdx.y} * p.pages_per_split;
  const std::int64_t block_end = min64(block_begin + p.pages_per_split, tile_blocks);
  if (block_begin >= block_end) return;
  const int num_blocks = static_cast<int>(block_end - block_begin);
  const std::int32_t* table = p.block_table + tile.request * p.table_stride;
  auto page_of = [&](int i) -> std::int64_t {
    const std::int64_t page = table[block_begin + i];
    return page >= 0 && page < p.num_pages ? page : -1;
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / Traits::kWarpsN, warp_n = warp % Traits::kWarpsN;
  // Decode tiles: the split's pages, one a lane (num_blocks <= kIndexScoreMaxSplitPages), so the
  // page loop's fills take their page by a shuffle instead of waiting on a global load of the
  // table each. (The 256-vector tile keeps the loads: the lane's register made its E4M3 instance
  // spill.)
  constexpr bool kPagesInLanes = Traits::kWarpsM == 1;
  const int lane_page = kPagesInLanes && lane < num_blocks ? static_cast<int>(page_of(lane)) : -1;
  auto split_page = [&](int i) -> std::int64_t {  // page of split entry i (-1: none); every lane
    if constexpr (kPagesInLanes) {
      const int page = __shfl_sync(0xffffffffu, lane_page, i % kIndexScoreMaxSplitPages);
      return i < num_blocks ? page : -1;
    } else {
      return i < num_blocks ? page_of(i) : -1;
    }
  };

  // Pages first (they take longest), then the queries.
  using Ring = CpAsyncPageRing<Traits::kStages, kStageBytes,
                               kWarpRings ? RingScope::kWarp : RingScope::kCta>;
  const Ring ring{kWarpRings ? stages + warp * Traits::kStages * kStageBytes : stages};
  auto fill = [&](int i) {
    ring.fill(i, [&](std::byte* stage) {
      // The index cache has one head; every token is loaded (keys past a row's position are
      // masked after the MMA).
      const std::int64_t page = split_page(i);
      if (page < 0) return;
      if constexpr (kWarpRings) {
        load_raw_rows_warp<kStageKeys, kFormat>(p.keys, p.key_scales, page, 0, warp_n * kStageKeys,
                                                kStageKeys, stage, lane);
      } else {
        load_raw_plane<Traits::kThreads, kFormat>(p.keys, p.key_scales, page, 0, 128, stage);
      }
    });
  };
  for (int s = 0; s < Traits::kStages - 1; ++s) fill(s);
  // The tile's queries: E4M3 as they are for the fp8 MMA (in 8-byte pieces: rows are only
  // 8-byte aligned), as f16 in e4m3_f16_column's order for kF16Route, otherwise as bf16 (an E4M3
  // query widened exactly).
  if constexpr (kFp8Mma) {
    for (int i = threadIdx.x; i < Traits::kVectors * 16; i += Traits::kThreads) {
      const int v = i / 16, piece = i % 16;
      const int row = v / hidx, head = v % hidx;
      uint2 value = make_uint2(0, 0);
      if (row < tile.rows) {
        value = *reinterpret_cast<const uint2*>(static_cast<const std::uint8_t*>(p.index_q) +
                                                (tile.row + row) * p.q_row_stride +
                                                head * p.q_head_stride + piece * 8);
      }
      if constexpr (kF16Route) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {  // dims 8 piece + 2 w, + 1
          const std::uint32_t pair = convert::e4m3x2_to_f16x2(w < 2 ? value.x : value.y, w % 2);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int dim = piece * 8 + 2 * w + e, k = dim % 16;
            const int column = dim - k + e4m3_f16_column(k);
            reinterpret_cast<std::uint16_t*>(q_tile +
                                             swizzled_chunk(v, column / 8) * 16)[column % 8] =
                static_cast<std::uint16_t>(pair >> (16 * e));
          }
        }
      } else {
        reinterpret_cast<uint2*>(q_tile + swizzled_byte_chunk(v, piece / 2) * 16)[piece % 2] =
            value;
      }
    }
  } else {
    for (int i = threadIdx.x; i < Traits::kVectors * kRowChunks; i += Traits::kThreads) {
      const int v = i / kRowChunks, chunk = i % kRowChunks;
      const int row = v / hidx, head = v % hidx;
      uint4 value = make_uint4(0, 0, 0, 0);
      if (row < tile.rows) {
        const std::int64_t offset =
            (tile.row + row) * p.q_row_stride + head * p.q_head_stride + chunk * 8;
        if constexpr (kQueryFp8) {
          const uint2 raw =
              *reinterpret_cast<const uint2*>(static_cast<const std::uint8_t*>(p.index_q) + offset);
          const auto* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
          auto* o = reinterpret_cast<std::uint32_t*>(&value);
          for (int j = 0; j < 4; ++j) {
            const float2 f =
                __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3)));
            o[j] = pack_bf16(f.x, f.y);
          }
        } else {
          value = *reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(p.index_q) +
                                                  offset);
        }
      }
      if constexpr (kRegisterCodes) {
        // The vector x 2^(E + 63) (index_score_widens_in_registers), each dim at the k position
        // the register-widened keys hold it at. A vector's chunks are 16 consecutive lanes.
        static_assert(kRowChunks == 16 && Traits::kVectors * kRowChunks % Traits::kThreads == 0);
        const auto* dims = reinterpret_cast<const std::uint16_t*>(&value);
        const std::uint32_t largest = largest_finite_magnitude_16_lanes(value);
        // E in [-126, 126]: 2^E and 2^-E are normal floats. x 2^E x 2^63 is exact but for
        // elements more than 2^141 below the largest (x 2^E rounds on fp32's subnormal grid).
        const int power = max(-126, min(126, 127 - static_cast<int>(largest >> 23)));
        const float up = __uint_as_float(static_cast<std::uint32_t>(power + 127) << 23);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float x = __uint_as_float(std::uint32_t{dims[e]} << 16) * up * 0x1p63f;
          const int column = nvfp4_register_column(chunk * 8 + e);
          reinterpret_cast<std::uint16_t*>(q_tile +
                                           swizzled_chunk(v, column / 8) * 16)[column % 8] =
              __bfloat16_as_ushort(__float2bfloat16_rn(x));
        }
        if (chunk == 0) {
          vector_restore[v] = __uint_as_float(static_cast<std::uint32_t>(127 - power) << 23);
        }
      } else {
        reinterpret_cast<uint4*>(q_tile)[swizzled_chunk(v, chunk)] = value;
      }
    }
  }

  const float nan = __int_as_float(0x7fc00000);
  // The queries (plain stores by every thread) reach every warp by this barrier: with warp rings
  // the page waits are warp barriers only.
  if constexpr (kWarpRings) __syncthreads();
  // The warp's query fragments of all 8 k steps (16 dims each) stay in registers for every page
  // where the tile has registers to spare (32 with kMTiles 1): kF16Route's f16 ones (4 CTAs an
  // SM), and the NVFP4 register codes' bf16 ones on warp rings. No fragment loads a page.
  constexpr bool kQueryInRegisters = kF16Route || (kRegisterCodes && kWarpRings);
  using QueryFragment = std::conditional_t<kF16Route, __half, __nv_bfloat16>;
  std::uint32_t q_steps[kQueryInRegisters ? 8 : 1][Traits::kMTiles][4];
  if constexpr (kQueryInRegisters) {
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
      for (int mt = 0; mt < Traits::kMTiles; ++mt) {
        load_a_fragment<QueryFragment>(q_steps[ks][mt], q_tile,
                                       warp_m * Traits::kWarpRows + mt * 16, ks, lane);
      }
    }
  }
  // Vector v's row, v / hidx: the page loop divided every page (and every group's store). On the
  // decode tiles it is (v x row_magic) >> 24, exact for v, hidx <= 256: row_magic is
  // (2^24 + e) / hidx with e < hidx, so the product exceeds v x 2^24 / hidx by v x e / hidx with
  // v x e < 2^16, less than the 2^24 / hidx that would change the quotient. The 256-vector tile
  // keeps the division (the magic's register made its E4M3 instance spill).
  static_assert(Traits::kVectors <= 256);
  const std::uint32_t row_magic = ((1u << 24) + hidx - 1) / hidx;
  auto row_of_vector = [&](int v) -> int {
    if constexpr (Traits::kWarpsM == 1) {
      return static_cast<int>(static_cast<std::uint32_t>(v) * row_magic >> 24);
    } else {
      return v / hidx;
    }
  };
  // kWarpRings: the CTA's block maxima of pages [i0, i0 + count) to the scores, merged over the
  // warps.
  auto store_maxima = [&](int i0, int count) {
    for (int item = threadIdx.x; item < count * Traits::kVectors; item += Traits::kThreads) {
      const int j = item / Traits::kVectors, v = item % Traits::kVectors;
      const int row = row_of_vector(v), head = v - row * hidx;
      const std::int64_t pos = tile.pos + row;
      const std::int64_t block = block_begin + i0 + j;
      if (row < tile.rows && pos >= 0 && block <= pos / 128) {
        const float* slot = partial_max + (i0 + j) % kGroup * Traits::kWarpsN * Traits::kVectors;
        float m = slot[v];
#pragma unroll
        for (int w = 1; w < Traits::kWarpsN; ++w) m = fmaxf(m, slot[w * Traits::kVectors + v]);
        // A block whose best key ranks as NaN (all dots NaN, or no page) reports NaN, as on the
        // CPU.
        if (page_of(i0 + j) < 0 || m == -1e30f) {
          m = nan;
        } else if constexpr (kRegisterCodes) {
          m *= vector_restore[v];
        }
        p.scores[(std::int64_t{head} * p.chunk.rows() + (tile.row + row - p.chunk.begin)) *
                     p.max_blocks +
                 block] = m;
      }
    }
  };

  // The first page has landed: stamped before the page loop (as in the attention).
  ring.wait(0);
  phase_stamp(p.clock, 1);
  for (int i = 0; i < num_blocks; ++i) {
    ring.wait(i);
    fill(i + Traits::kStages - 1);
    const std::int64_t block = block_begin + i;
    const bool page_ok = split_page(i) >= 0;
    const std::byte* k_tile = ring.stage(i);
    const int key0 = kWarpRings ? 0 : warp_n * Traits::kWarpCols;  // the warp's first key there
    if constexpr (kConvert) {
      if (page_ok)
        widen_planes<Traits::kThreads, kFormat, __nv_bfloat16, 1>(k_tile, widened, threadIdx.x);
      __syncthreads();
      k_tile = widened;
    }

    float acc[Traits::kMTiles][Traits::kNTiles][4];
    for (auto& m : acc) {
      for (auto& n : m) {
        for (float& x : n) x = 0.0f;
      }
    }
    if (page_ok) {
      if constexpr (kRegisterCodes) {
        const auto q = [&](int step, std::uint32_t(&a)[Traits::kMTiles][4]) {
#pragma unroll
          for (int mt = 0; mt < Traits::kMTiles; ++mt) {
            if constexpr (kQueryInRegisters) {
#pragma unroll
              for (int r = 0; r < 4; ++r) a[mt][r] = q_steps[step][mt][r];
            } else {
              load_a_fragment(a[mt], q_tile, warp_m * Traits::kWarpRows + mt * 16, step, lane);
            }
          }
        };
        register_qk<kFormat, Traits::kMTiles, Traits::kNTiles, kStageKeys, __nv_bfloat16, true>(
            acc, q, k_tile, key0, lane);
      } else if constexpr (kF16Route) {
        float halves[2][Traits::kMTiles][Traits::kNTiles][4] = {};
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {  // 32 dims a step: 16-dim steps 2 ks and 2 ks + 1
          std::uint32_t a16[Traits::kMTiles][2][4];
#pragma unroll
          for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              a16[mt][0][r] = q_steps[2 * ks][mt][r];
              a16[mt][1][r] = q_steps[2 * ks + 1][mt][r];
            }
          }
          qk_step_e4m3_f16<Traits::kMTiles, Traits::kNTiles>(halves, a16, k_tile, key0, ks, lane);
        }
#pragma unroll
        for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
          for (int nt = 0; nt < Traits::kNTiles; ++nt) {
#pragma unroll
            for (int c = 0; c < 4; ++c)
              acc[mt][nt][c] = halves[0][mt][nt][c] + halves[1][mt][nt][c];
          }
        }
      } else {
        using MmaElem = std::conditional_t<kFp8Mma, __nv_fp8_e4m3, __nv_bfloat16>;
        // The fp8 steps are not unrolled: one is already kMTiles x kNTiles MMAs, and unrolling
        // made the 256-vector tile spill.
#pragma unroll(kFp8Mma ? 1 : 8)
        for (int ks = 0; ks < 128 / kStepDims<MmaElem>; ++ks) {
          std::uint32_t a[Traits::kMTiles][4];
#pragma unroll
          for (int mt = 0; mt < Traits::kMTiles; ++mt) {
            load_a_fragment<MmaElem>(a[mt], q_tile, warp_m * Traits::kWarpRows + mt * 16, ks, lane);
          }
          qk_step<MmaElem, Traits::kMTiles, Traits::kNTiles>(acc, a, k_tile, key0, ks, lane);
        }
      }
    }

    // Block max per (row, index head) over this warp's keys, causal mask applied.
    const std::int64_t first_key = block * 128;
    const bool all_visible = first_key + 127 <= tile.pos;
#pragma unroll
    for (int mt = 0; mt < Traits::kMTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // MMA rows past the tile's vectors hold zero queries and nothing reads their maxima (dql 1
        // and 2 with 4 index heads fill rows 0..7 only): skipped (warp-uniform) where the page
        // loop is instruction-bound, the NVFP4 register codes' (on the E4M3 decode tile the test
        // took 21 more registers).
        if (kRegisterCodes && mt * 16 + 8 * half >= tile.rows * hidx) continue;
        const int v = warp_m * Traits::kWarpRows + mt * 16 + lane / 4 + 8 * half;
        const std::int64_t pos = tile.pos + row_of_vector(v);
        // Decode tiles: the row's last visible key of the page as a 32-bit bound, one compare a
        // key (on the 256-vector tile the bound made the E4M3 instance spill).
        const int last_key =
            all_visible ? 127 : static_cast<int>(max64(-1, min64(127, pos - first_key)));
        auto block_max = [&](auto visible) {
          RankMax best;
#pragma unroll
          for (int nt = 0; nt < Traits::kNTiles; ++nt) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int key = warp_n * Traits::kWarpCols + nt * 8 + 2 * (lane % 4) + c;
              if (visible(key)) best.add(acc[mt][nt][2 * half + c]);
            }
          }
          return best.key();
        };
        float m;
        if (Traits::kWarpsM == 1 && all_visible) {
          // Decode tiles, every key visible (warp-uniform): one NaN-propagating max, and
          // RankMax's two only where it met a NaN.
          float any = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < Traits::kNTiles; ++nt) {
#pragma unroll
            for (int c = 0; c < 2; ++c) any = max_nan(any, acc[mt][nt][2 * half + c]);
          }
          m = any != any ? block_max([](int) { return true; }) : (any == 0.0f ? 0.0f : any);
        } else {
          m = block_max([&](int key) {
            return Traits::kWarpsM == 1 ? key <= last_key : all_visible || first_key + key <= pos;
          });
        }
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        if (lane % 4 == 0) {
          partial_max[((i % kGroup) * Traits::kWarpsN + warp_n) * Traits::kVectors + v] = m;
        }
      }
    }
    if constexpr (kWarpRings) {
      // After each group of pages the CTA merges and stores them; the second barrier frees the
      // slots for the next group.
      if (i % kGroup == kGroup - 1 || i == num_blocks - 1) {
        __syncthreads();
        store_maxima(i - i % kGroup, i % kGroup + 1);
        __syncthreads();
      }
      continue;
    }
    // Every page on its own (store_maxima(i, 1) computes the same, but made the 256-vector E4M3
    // instance spill). One (row, index head) per thread: kVectors <= kThreads in every tile shape.
    __syncthreads();
    static_assert(Traits::kVectors <= Traits::kThreads);
    if (const int v = threadIdx.x; v < Traits::kVectors) {
      const int row = row_of_vector(v), head = v - row * hidx;
      const std::int64_t pos = tile.pos + row;
      if (row < tile.rows && pos >= 0 && block <= pos / 128) {
        float m = partial_max[v];
#pragma unroll
        for (int w = 1; w < Traits::kWarpsN; ++w) {
          m = fmaxf(m, partial_max[w * Traits::kVectors + v]);
        }
        // A block whose best key ranks as NaN (all dots NaN, or no page) reports NaN, as on the
        // CPU.
        if (!page_ok || m == -1e30f) {
          m = nan;
        } else if constexpr (kRegisterCodes) {
          m *= vector_restore[v];
        }
        p.scores[(std::int64_t{head} * p.chunk.rows() + (tile.row + row - p.chunk.begin)) *
                     p.max_blocks +
                 block] = m;
      }
    }
  }
  allow_next_kernel();  // near the end: the top-k's CTAs launch while the last pages finish
  ring.drain();
  phase_stamp(p.clock, 2);
}

}  // namespace flashmsa::cuda

namespace flashmsa::cuda {

// Host launcher of one instantiation (explicitly instantiated by the generated sources listed in
// cmake/sm90_kernels.cmake; index_score_launch.hpp chooses among them at run time).
template <class Traits, KvFormat kFormat, bool kQueryFp8>
void launch_index_score_kernel(const IndexScoreParams& p, dim3 grid, cudaStream_t stream) {
  launch_dependent_kernel(index_score_kernel<Traits, kFormat, kQueryFp8>, grid, Traits::kThreads,
                          index_score_smem_bytes<Traits, kFormat, kQueryFp8>(), stream, p);
}

// The instantiation's CTAs an SM holds (asked once: every device this library runs on is an sm_90
// part with the same registers and shared memory an SM).
template <class Traits, KvFormat kFormat, bool kQueryFp8>
int index_score_kernel_ctas_per_sm() {
  static const int ctas =
      ctas_per_sm(index_score_kernel<Traits, kFormat, kQueryFp8>, Traits::kThreads,
                  index_score_smem_bytes<Traits, kFormat, kQueryFp8>());
  return ctas;
}

}  // namespace flashmsa::cuda
