// index_prefill_kernel: the prefill indexer's block scores on Hopper's warpgroup tensor cores.
//
// The work is the chunk's (tile, block) pairs: each tile of 256 (query row, index head) vectors
// (256 / Hidx rows) against each index-K page it sees. The planner counts each tile's blocks
// (tile_pages, short and long tiles in turn: index_prefill_tile_in_order); a persistent grid of one
// CTA an SM takes an equal share of the pairs, a run of segments (a tile and a range of its
// blocks), so no SM waits on a longer split or a last wave. Warp-specialized:
//   - warpgroup 0, one thread: the producer. It brings each page (128 keys x 128 dims) by TMA into
//     a ring of kStages stages (tma.hpp's tensor map, 128-byte swizzle), each stage with a "full"
//     mbarrier (transaction bytes) and an "empty" one (the consumers' release), across segments.
//     NVFP4 keys: all of warpgroup 0 widens them, a key a thread, to bf16 (code x scale, exact)
//     into the same ring, with its own loads two pages ahead.
//   - warpgroups 1-4: the consumers, 64 vectors each (one m64 tile; loaded at a segment's start,
//     bf16 ones into a shared-memory Q tile, E4M3 ones into registers as wgmma's A operand, so
//     the fp8 MMAs read only the keys from shared memory). The query vectors are the M dimension
//     and the page's keys the N dimension (m64n128, K = 128 dims), so a row's block max over the
//     page's 128 keys stays inside each thread's accumulator fragment: 31 max instructions and two
//     shuffles a row, no shared-memory pass. While one warpgroup reduces its maxima, the other
//     three have MMAs on the tensor cores.
// bf16 and widened NVFP4 keys multiply bf16 queries (under NVFP4 keys each 8-dim chunk in the
// widening's pair order); E4M3 keys multiply E4M3 queries on the native fp8 wgmma (spec section 4,
// "Exception, the fp8 indexer": the four k32 steps accumulate in the tensor core, whose sum keeps
// about 14 significant bits, within the spec's 2^-10 sum |q_i k_i|). The causal mask and the rank
// order of the block max (NaN as -1e30, -0.0 as +0.0; a block that ranks as NaN or has no page
// reports NaN) are index_score_kernel's; only block scores reach memory (the workspace [Hidx, chunk
// rows, max_blocks]), the top-k kernel selects from them.
#pragma once

#include <cuda.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/launch.hpp"
#include "src/cuda/sm90/convert.cuh"
#include "src/cuda/sm90/indexer/indexer_params.hpp"
#include "src/cuda/sm90/kv_format.hpp"
#include "src/cuda/sm90/page_pipeline.cuh"
#include "src/cuda/sm90/scheduler/tiles.cuh"
#include "src/cuda/sm90/wgmma.cuh"
#include "src/index_workspace.hpp"

namespace flashmsa::cuda {

struct IndexPrefillParams {
  CUtensorMap keys;        // the index-K plane (tma.hpp): boxes of 128 bytes x 128 tokens
  IndexScoreParams score;  // as for index_score_kernel (pages_per_split is not read; keys and
                           // key_scales only where warpgroup 0 widens NVFP4 pages)
  // [tiles + 1], the planner's running block counts in index_prefill_tile_in_order's order
  const std::int32_t* tile_pages = nullptr;
};

// The pairings of the configuration (spec section 4): bf16 or NVFP4 keys under bf16 queries, E4M3
// keys under E4M3 queries (the fp8 indexer).
template <KvFormat kFormat>
struct IndexPrefillTraits {
  static_assert(kFormat == KvFormat::kNative16 || kFormat == KvFormat::kNvfp4 ||
                    kFormat == KvFormat::kE4m3,
                "the wgmma indexer multiplies bf16 x bf16 (NVFP4 keys widened) or E4M3 x E4M3");
  static constexpr bool kFp8 = kFormat == KvFormat::kE4m3;  // E4M3 queries and keys
  // NVFP4 keys: warpgroup 0 widens each page to bf16 (code x scale, exact) into the stage with its
  // own loads, instead of one thread bringing the page by TMA.
  static constexpr bool kWidened = kFormat == KvFormat::kNvfp4;
  static constexpr int kConsumers = 4;              // warpgroups of one m64 tile
  static constexpr int kVectors = kConsumers * 64;  // (row, index head) pairs a tile
  static_assert(kVectors == detail::kIndexTileVectors, "the planner's tiles");
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kRowBytes = kFp8 ? 128 : 256;  // one query vector or key in shared memory
  static constexpr int kHalves = kRowBytes / 128;     // SW128 tiles an operand (64-dim halves)
  static constexpr int kKSteps = 4 * kHalves;         // 32 bytes of each row a step
  // E4M3 queries stay in the consumers' registers as wgmma's A operand (16 a thread), so the
  // tensor cores read only the keys from shared memory; bf16 ones (32 a thread would not fit
  // beside the accumulators) are a shared-memory tile.
  static constexpr bool kQueryInRegisters = kFp8;
  static constexpr int kQueryBytes = kQueryInRegisters ? 0 : kVectors * kRowBytes;
  static constexpr int kPageBytes = 128 * kRowBytes;
  static constexpr int kStages = kFp8 ? 8 : 4;
  // 1024: the slack that aligns the tiles to the 1024-byte swizzle atoms.
  static constexpr int kSmemBytes = 1024 + kQueryBytes + kStages * kPageBytes + 2 * kStages * 8;
  // setmaxnreg: the producer warpgroup gives its registers to the consumers' accumulators (the
  // widening one keeps two pages of codes in flight).
  static constexpr int kProducerRegisters = kWidened ? 64 : 24;
  static constexpr int kConsumerRegisters = kWidened ? 104 : 112;
  // Arrivals that complete a stage's "full" phase: the TMA thread's, or every widening thread's.
  static constexpr int kFullArrivals = kWidened ? 128 : 1;
  // setmaxnreg only moves registers between the CTA's warpgroups: the launch gives every thread
  // kLaunchRegisters (ptxas's cap for kThreads threads, which these kernels use in full), and the
  // new counts must fit in that, or setmaxnreg.inc waits forever.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert(128 * (kProducerRegisters + kConsumers * kConsumerRegisters) <=
                kThreads * kLaunchRegisters);
};

// A CTA's share of the chunk's (tile, block) pairs, [first, last) in their order, as segments:
// the tile at position `tile` of index_prefill_tile_in_order and its blocks [begin, end). The
// producer and the consumers walk the same ones.
struct IndexSegments {
  const std::int32_t* tile_pages;
  std::int64_t first, last;
  std::int32_t tile = 0;
  std::int64_t begin = 0, end = 0;

  __device__ IndexSegments(const std::int32_t* pages, std::int32_t tiles) : tile_pages(pages) {
    const std::int64_t total = pages[tiles];
    first = total * blockIdx.x / gridDim.x;
    last = total * (blockIdx.x + 1) / gridDim.x;
    // One before the last tile whose pairs start at or before `first` (that one holds `first`
    // when first < last): next() steps to it.
    tile = last_at_or_below(pages, tiles, first) - 1;
    end = 0;
  }
  // The next segment; false past the share.
  __device__ bool next() {
    for (++tile; first < last; ++tile) {
      const std::int64_t t0 = tile_pages[tile], t1 = tile_pages[tile + 1];
      if (t1 <= first) continue;  // a tile that sees nothing
      begin = first - t0;
      end = min64(t1, last) - t0;
      first = t0 + end;
      return true;
    }
    return false;
  }
};

namespace index_prefill {

// The consumer warpgroup c's 64 bf16 query vectors of a tile into the Q tile
// ([half][kVectors rows][128 B], SW128), zeros past the tile's rows.
template <class T>
__device__ __forceinline__ void load_queries(const IndexScoreParams& p, const IndexTile& tile,
                                             int c, int ct, int head_bits, std::byte* q_tile) {
  static_assert(!T::kQueryInRegisters);
  constexpr int kChunks = T::kRowBytes / 16;  // 16-byte chunks of a stored vector
  const auto* q = static_cast<const std::uint8_t*>(p.index_q);
  constexpr std::int64_t elem = 2;
#pragma unroll 4
  for (int i = ct; i < 64 * kChunks; i += 128) {
    const int v = c * 64 + i / kChunks, chunk = i % kChunks;
    const int row = v >> head_bits, head = v & ((1 << head_bits) - 1);
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row < tile.rows) {
      const std::uint8_t* vector =
          q + ((tile.row + row) * p.q_row_stride + head * p.q_head_stride) * elem;
      value = *reinterpret_cast<const uint4*>(vector + chunk * 16);
      // Widened NVFP4 keys hold their dims in the widening's pair order: match it.
      if constexpr (T::kWidened) value = convert::e2m1_pair_order(value);
    }
    *reinterpret_cast<uint4*>(q_tile + (chunk / 8) * (T::kVectors * 128) +
                              sw128_offset(v, chunk % 8)) = value;
  }
}

// Warpgroup 0's work for NVFP4 keys: thread ct widens key ct of every page of the CTA's share
// into the stage ring, the codes and scales of the next two pages in flight in its registers.
template <class T>
struct Widener {
  struct Key {
    uint4 codes[4];  // 128 E2M1 codes
    uint2 scales;    // 8 E4M3 block scales (16 dims each)
    bool ok;         // a page in range (else the consumers report NaN and nothing is written)
  };
  const IndexScoreParams& p;
  IndexSegments walk;  // the share's pairs, one ahead of the widening
  const std::int32_t* table = nullptr;
  std::int64_t block = 0;
  int ct;

  __device__ Widener(const IndexScoreParams& params, const IndexSegments& segments, int thread)
      : p(params), walk(segments), ct(thread) {
    walk.end = walk.begin = 0;
  }

  // The next pair's key ct (ok false past the share or for a block with no page).
  __device__ Key load_next(int tile_rows) {
    Key k{};
    if (block >= walk.end) {
      if (!walk.next()) return k;
      const IndexTile tile =
          index_prefill_tile_in_order(p.rows, p.tile_offset, p.chunk, tile_rows, walk.tile);
      table = p.block_table + tile.request * p.table_stride;
      block = walk.begin;
    }
    const std::int32_t page = table[block++];
    k.ok = page >= 0 && page < p.num_pages;
    if (k.ok) {
      const auto* codes = reinterpret_cast<const uint4*>(p.keys.row(page, 0, ct));
#pragma unroll
      for (int i = 0; i < 4; ++i) k.codes[i] = __ldg(codes + i);
      k.scales = __ldg(reinterpret_cast<const uint2*>(p.key_scales.row(page, 0, ct)));
    }
    return k;
  }

  // Key ct as bf16 into the stage (SW128, dims in e2m1_pair_order within each 8-dim chunk).
  __device__ void widen(const Key& k, std::byte* stage) const {
    if (!k.ok) return;
#pragma unroll
    for (int w = 0; w < 16; ++w) {  // 8 dims a word
      const int scale_index = w / 2;
      const std::uint32_t scale_word = scale_index < 4 ? k.scales.x : k.scales.y;
      const std::uint32_t pair = convert::e4m3x2_to_bf16x2_cvt(scale_word, (scale_index % 4) / 2);
      const std::uint32_t scale = scale_index % 2 == 0 ? convert::broadcast_half<0>(pair)
                                                       : convert::broadcast_half<1>(pair);
      const std::uint32_t word = (&k.codes[w / 4].x)[w % 4];
      const uint4 out = make_uint4(convert::e2m1_pair_times_scale<0, false>(word, scale),
                                   convert::e2m1_pair_times_scale<1, false>(word, scale),
                                   convert::e2m1_pair_times_scale<2, false>(word, scale),
                                   convert::e2m1_pair_times_scale<3, false>(word, scale));
      *reinterpret_cast<uint4*>(stage + (w / 8) * (128 * 128) + sw128_offset(ct, w % 8)) = out;
    }
  }
};

// A consumer warpgroup's work on the pages of one segment: its tile's MMAs and block maxima.
// What does not change from page to page (descriptors or E4M3 query registers, each accumulator
// row's output row, its last visible block) is set up once a segment: the per-page epilogue is the
// maxima and a store.
template <class T>
struct Consumer {
  const std::int32_t* table;  // the tile's request's block table
  std::uint32_t num_pages;    // a page id below it is in the cache (as unsigned: no negatives)
  std::uint64_t q_desc;       // the warpgroup's query vectors in the Q tile (half 0; bf16 queries)
                              // and the stage ring's start
  std::uint64_t stage_desc;
  // The thread's two accumulator rows (lane / 4 + 16 warp and 8 below): block scores and
  // position (-1 for a row past the tile: its last visible block, pos >> 7, is then -1 as for a
  // row before its request's first token).
  float* row_scores[2];
  std::int32_t pos[2];
  std::int32_t full_blocks;  // blocks below it: every row of the tile sees all 128 keys
  int lane;
  // kQueryInRegisters: the thread's part of wgmma's A (the warpgroup's 64 query vectors), four
  // registers a k-step: rows lane / 4 + 16 warp and 8 below, bytes 4 (lane % 4) + {0..3} and 16
  // above, zeros for rows past the tile.
  std::uint32_t query[T::kQueryInRegisters ? 4 * T::kKSteps : 1];

  __device__ __forceinline__ Consumer(const IndexScoreParams& p, const IndexTile& tile,
                                      const std::byte* q_tile, const std::byte* stages,
                                      int head_bits, int c, int warp, int lane_)
      : table(p.block_table + tile.request * p.table_stride),
        num_pages(static_cast<std::uint32_t>(min64(p.num_pages, std::int64_t{1} << 31))),
        q_desc(sw128_descriptor(q_tile + c * 64 * 128)),
        stage_desc(sw128_descriptor(stages)),
        full_blocks(static_cast<std::int32_t>(min64((tile.pos + 1) >> 7, 0x7fffffff))),
        lane(lane_) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int v = c * 64 + warp * 16 + lane / 4 + 8 * h;
      const int row = v >> head_bits, head = v & ((1 << head_bits) - 1);
      pos[h] = row < tile.rows ? static_cast<std::int32_t>(tile.pos + row) : -1;
      row_scores[h] =
          p.scores +
          (std::int64_t{head} * p.chunk.rows() + (tile.row + row - p.chunk.begin)) * p.max_blocks;
      if constexpr (T::kQueryInRegisters) {
        // E4M3 rows are only 8-byte aligned: 4-byte loads.
        const auto* vector = static_cast<const std::uint8_t*>(p.index_q) +
                             (tile.row + row) * p.q_row_stride + head * p.q_head_stride;
#pragma unroll
        for (int ks = 0; ks < T::kKSteps; ++ks) {
#pragma unroll
          for (int upper = 0; upper < 2; ++upper) {
            const int byte = 32 * ks + 16 * upper + 4 * (lane % 4);
            query[4 * ks + 2 * upper + h] =
                row < tile.rows ? *reinterpret_cast<const std::uint32_t*>(vector + byte) : 0u;
          }
        }
      }
    }
  }

  // S = Q K^T of the page in `stage` into acc: kKSteps wgmmas of 32 bytes a row, one commit group.
  // (A descriptor's address field is the byte address / 16: offsets add to it.)
  __device__ __forceinline__ void issue(float (&acc)[64], int stage) const {
    const std::uint64_t page_desc =
        stage_desc + static_cast<std::uint64_t>(stage) * (T::kPageBytes >> 4);
    wgmma_fence_accumulators(acc);
    cute::warpgroup_arrive();
#pragma unroll
    for (int ks = 0; ks < T::kKSteps; ++ks) {
      const int half = ks / 4, offset = (ks % 4) * 32;
      const std::uint64_t da = q_desc + ((half * (T::kVectors * 128) + offset) >> 4);
      const std::uint64_t db = page_desc + ((half * (128 * 128) + offset) >> 4);
      if constexpr (T::kQueryInRegisters) {
        wgmma_64x128x32_e4m3_rs(query + 4 * ks, db, acc, ks > 0);
      } else {
        wgmma_64x128x16_bf16(da, db, acc, ks > 0);
      }
    }
    cute::warpgroup_commit_batch();
  }

  // The last key of `block` row h sees (-1: none), where the block is not whole to every row.
  __device__ __forceinline__ int last_key(int h, int block) const {
    return block < full_blocks ? 127 : max(-1, min(127, pos[h] - block * 128));
  }

  // The thread's part of row h's best number in the page (fmaxf drops NaN) as four chains of
  // eight, joined (one chain would be 32 deep; a tree needs 16 registers beside the live
  // accumulators); kMasked: the keys past `last` count as -inf.
  template <bool kMasked>
  __device__ __forceinline__ float row_max(const float (&acc)[64], int h, int last) const {
    float t[4];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = acc[4 * j + 2 * h + e];
        if constexpr (kMasked) {
          if (8 * j + 2 * (lane % 4) + e > last) x = -INFINITY;
        }
        t[j % 4] = j < 4 && e == 0 ? x : fmaxf(t[j % 4], x);
      }
    }
    return fmaxf(fmaxf(t[0], t[1]), fmaxf(t[2], t[3]));
  }

  // The block maxima of `block` (each row masked past its position) into the block scores;
  // `page` is its table entry.
  __device__ __forceinline__ void store_block_max(const float (&acc)[64], int block,
                                                  std::int32_t page) const {
    const float nan = __int_as_float(0x7fc00000);
    const bool have_page = static_cast<std::uint32_t>(page) < num_pages;
    // Each row's best number; the partial blocks (a warp-uniform branch) mask keys first.
    float m[2];
    if (block < full_blocks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) m[h] = row_max<false>(acc, h, 127);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) m[h] = row_max<true>(acc, h, last_key(h, block));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], 1));
#pragma unroll
    for (int h = 0; h < 2; ++h) m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], 2));
    // A NaN ranks as -1e30 (RankMax): it decides the key only where the best number is below
    // that or there is none (m NaN or -inf), so only there (rare; a warp-uniform branch) are NaNs
    // looked for.
    const bool low[2] = {!(m[0] >= -1e30f), !(m[1] >= -1e30f)};
    if (__any_sync(0xffffffffu, low[0] || low[1])) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int last = last_key(h, block);
        int any_nan = 0;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = acc[4 * j + 2 * h + e];
            any_nan |=
                static_cast<int>(x != x) & static_cast<int>(8 * j + 2 * (lane % 4) + e <= last);
          }
        }
        any_nan |= __shfl_xor_sync(0xffffffffu, any_nan, 1);
        any_nan |= __shfl_xor_sync(0xffffffffu, any_nan, 2);
        if (low[h] && any_nan) m[h] = -1e30f;  // (m NaN only where every key is: any_nan)
      }
    }
    if (lane % 4 != 0) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (block > pos[h] >> 7) continue;  // past the row's last visible block
      if (m[h] == 0.0f) m[h] = 0.0f;      // -0.0 ranks as +0.0
      // A block whose best key ranks as NaN (all dots NaN, or no page) reports NaN, as on the CPU.
      row_scores[h][block] = !have_page || m[h] == -1e30f ? nan : m[h];
    }
  }
};

}  // namespace index_prefill

template <KvFormat kFormat>
__global__ void __launch_bounds__(IndexPrefillTraits<kFormat>::kThreads, 1)
    index_prefill_kernel(const __grid_constant__ IndexPrefillParams params) {
  using T = IndexPrefillTraits<kFormat>;
  const IndexScoreParams& p = params.score;
  extern __shared__ std::byte smem_raw[];
  std::byte* q_tile = smem_raw + (1024u - smem_address(smem_raw) % 1024u) % 1024u;
  std::byte* stages = q_tile + T::kQueryBytes;
  auto* full = reinterpret_cast<std::uint64_t*>(stages + T::kStages * T::kPageBytes);
  std::uint64_t* empty = full + T::kStages;

  wait_for_previous_kernel();                          // the planner's tiles
  const int head_bits = __ffs(p.num_index_heads) - 1;  // a power of two (common_setup)
  const int tile_rows = T::kVectors >> head_bits;
  const std::int32_t tiles = p.tile_offset[p.rows.num_requests];
  IndexSegments segments(params.tile_pages, tiles);
  if (segments.first >= segments.last) return;
  auto tile_of = [&](std::int32_t i) {
    return index_prefill_tile_in_order(p.rows, p.tile_offset, p.chunk, tile_rows, i);
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kStages; ++s) {
      mbarrier_init(&full[s], T::kFullArrivals);
      mbarrier_init(&empty[s], 128 * T::kConsumers);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  // The share's g-th page goes to stage g % kStages once the consumers released the stage's
  // previous page (the (g / kStages - 1)-th phase of its "empty" barrier).
  auto free_stage = [&](std::int64_t g) {
    const int s = static_cast<int>(g % T::kStages);
    if (g >= T::kStages) {
      mbarrier_wait(&empty[s], static_cast<std::uint32_t>(g / T::kStages - 1) & 1u);
    }
    return s;
  };
  const int wg = threadIdx.x / 128;
  if constexpr (T::kWidened) {
    if (wg == 0) {
      cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegisters>();
      // The share's pages widened into their stages, two pages' keys in flight (the loop takes
      // them in turn).
      index_prefill::Widener<T> widener(p, segments, static_cast<int>(threadIdx.x));
      const std::int64_t pages = segments.last - segments.first;
      auto widen = [&](const typename index_prefill::Widener<T>::Key& key, std::int64_t g) {
        const int s = free_stage(g);
        widener.widen(key, stages + s * T::kPageBytes);
        fence_proxy_async_shared();  // the stores, seen by the consumers' wgmma
        mbarrier_arrive(&full[s]);
      };
      auto a = widener.load_next(tile_rows), b = widener.load_next(tile_rows);
      for (std::int64_t g = 0; g < pages; g += 2) {
        widen(a, g);
        a = widener.load_next(tile_rows);
        if (g + 1 < pages) {
          widen(b, g + 1);
          b = widener.load_next(tile_rows);
        }
      }
      return;
    }
  } else if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    // The share's pages into their stages by TMA; a block without a page completes its phase with
    // no bytes (the consumers report NaN).
    std::int64_t g = 0;
    while (segments.next()) {
      const IndexTile tile = tile_of(segments.tile);
      const std::int32_t* table = p.block_table + tile.request * p.table_stride;
      for (std::int64_t b = segments.begin; b < segments.end; ++b, ++g) {
        const int s = free_stage(g);
        const std::int32_t page = table[b];
        if (page >= 0 && page < p.num_pages) {
          mbarrier_arrive_expect_tx(&full[s], T::kPageBytes);
#pragma unroll
          for (int h = 0; h < T::kHalves; ++h) {
            tma_load_3d(&params.keys, &full[s], stages + s * T::kPageBytes + h * 128 * 128, h * 64,
                        0, page);
          }
        } else {
          mbarrier_arrive(&full[s]);
        }
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegisters>();
  // c and warp broadcast from lane 0: the compiler then knows them warp-uniform and keeps the
  // descriptors in uniform registers.
  const int c = __shfl_sync(0xffffffffu, wg - 1, 0), ct = threadIdx.x % 128,
            warp = __shfl_sync(0xffffffffu, ct / 32, 0), lane = ct % 32;
  // The share's g-th page waits in stage g % kStages for phase (g / kStages) & 1, carried across
  // segments.
  RingPosition<T::kStages> at;
  while (segments.next()) {
    const IndexTile tile = tile_of(segments.tile);
    if constexpr (!T::kQueryInRegisters) {
      // The warpgroup's query vectors of the tile: its earlier MMAs are done (wait_group 0), and
      // the barrier keeps its warps from overwriting what another warp's last MMA may still read.
      named_barrier_sync(1 + c, 128);
      index_prefill::load_queries<T>(p, tile, c, ct, head_bits, q_tile);
      fence_proxy_async_shared();
      named_barrier_sync(1 + c, 128);
    }
    const index_prefill::Consumer<T> consumer(p, tile, q_tile, stages, head_bits, c, warp, lane);
    // Per page: the MMAs, then the maxima while the other warpgroups' MMAs run. Blocks are below
    // max_blocks (int32); each block's table entry is read a page ahead, its latency hidden
    // behind the wait and the MMAs.
    const int begin = static_cast<int>(segments.begin), end = static_cast<int>(segments.end);
    std::int32_t page = consumer.table[begin];
    float acc[64];
    for (int b = begin; b < end; ++b) {
      const std::int32_t next_page = b + 1 < end ? consumer.table[b + 1] : -1;
      mbarrier_wait(&full[at.stage], at.phase);
      consumer.issue(acc, at.stage);
      cute::warpgroup_wait<0>();
      wgmma_fence_accumulators(acc);
      mbarrier_arrive(&empty[at.stage]);  // the page is read: the producer may refill its stage
      consumer.store_block_max(acc, b, page);
      page = next_page;
      at.next();
    }
  }
  allow_next_kernel();
}

// Host launcher of one instantiation (index_prefill.cu instantiates them).
template <KvFormat kFormat>
void launch_index_prefill_kernel(const IndexPrefillParams& p, dim3 grid, cudaStream_t stream) {
  using T = IndexPrefillTraits<kFormat>;
  static const int registers = [] {
    cudaFuncAttributes a{};
    FLASHMSA_CHECK_CUDA(cudaFuncGetAttributes(&a, index_prefill_kernel<kFormat>));
    return a.numRegs;
  }();
  FLASHMSA_CHECK_KIND(ErrorKind::kInternal, registers == T::kLaunchRegisters,
                      "index_prefill_kernel has ", registers,
                      " registers a thread; its setmaxnreg split needs ", T::kLaunchRegisters);
  launch_dependent_kernel(index_prefill_kernel<kFormat>, grid, T::kThreads, T::kSmemBytes, stream,
                          p);
}

}  // namespace flashmsa::cuda
