// attention_kernel: sparse (or dense) GQA attention of a tile of query rows of one request and
// one kv head, over the union of the pages the tile's rows selected (see attention_params.hpp):
// decode, and the prefill of 8- and 4-bit caches (16-bit ones: prefill_attention_kernel.cuh).
//
// Work split: warp (row, key part) owns one query row's G <= 16 query heads (the 16 rows of an
// m16n8k16 MMA) and 128 / kKeySplit keys of every page. A page is loaded once per CTA (the
// cp.async ring of page_pipeline.cuh; tokens after the tile's last position are zero-filled,
// never read) and every warp whose row selected it attends to it: S = Q K^T and O += P V with
// the mma.sync pieces of warp_mma.cuh, fp32 accumulation and an online softmax in log2 units; P is
// rounded to the MMA type (bf16 or fp16) for P V, as the spec allows. A warp whose row did not
// select a page skips it, so random selections cost loads but no wasted MMAs, and coherent
// selections (neighbouring rows picking the same pages) share them. E4M3 / E5M2 / NVFP4 pages are
// widened exactly to the 16-bit MMA type in shared memory; on 1-row tiles with bf16 queries each
// warp streams only its own keys through a ring of its own and converts their K and V codes in
// registers (register_keys.cuh); 1-row tiles
// of 16-bit caches sized for two CTAs an SM (Traits::kTwoPerSm) stream their keys the same way, a
// plane (K rows, then V rows) a stage.
//
// The epilogue merges the key parts of each row, then writes the final output (bf16 / fp16 /
// fp32 / MXFP8 and the log-sum-exp). Decode with several splits runs the splits of a row tile as
// one thread-block cluster: each leaves its normalised rows in shared memory and the cluster's
// CTAs merge them through distributed shared memory, each CTA a share of the rows.
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp8.h>
#include <cfloat>
#include <cub/block/block_scan.cuh>
#include <utility>

#include "flashmsa/error.hpp"
#include "flashmsa/formats.hpp"
#include "src/attention_workspace.hpp"
#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/launch.hpp"
#include "src/cuda/sm90/attention/attention_params.hpp"
#include "src/cuda/sm90/attention/attention_traits.hpp"
#include "src/cuda/sm90/attention/epilogue.cuh"
#include "src/cuda/sm90/attention/page_union.cuh"
#include "src/cuda/sm90/indexer/index_topk_select.cuh"
#include "src/cuda/sm90/page_codec.cuh"
#include "src/cuda/sm90/page_pipeline.cuh"
#include "src/cuda/sm90/register_keys.cuh"
#include "src/cuda/sm90/scheduler/tiles.cuh"
#include "src/cuda/sm90/warp_mma.cuh"

namespace flashmsa::cuda {

constexpr int kMaxDecodeSplits = static_cast<int>(detail::kAttentionDecodeMaxSplits);

template <class Traits, KvFormat kFormat, class Elem, class QElem>
__global__ void __launch_bounds__(Traits::kThreads, attention_ctas_per_sm<Traits, kFormat, Elem>())
    attention_kernel(const __grid_constant__ AttentionParams p) {
  using namespace attention_detail;  // the epilogue's pieces
  constexpr bool kWiden = kFormat != KvFormat::kNative16;
  // 1-row tiles of a quantized cache with bf16 queries: each warp streams its own keys' rows
  // through a ring of its own (no other warp needs them: no CTA barrier a page) and converts their
  // K codes in registers (register_keys.cuh), and their V codes straight into P V's B fragments:
  // E4M3 / E5M2 ones into f16 ones (register_pv; P is rounded to f16 for P V, O kept in
  // register_pv_dim's order), and so are their K codes, against f16 queries; NVFP4 ones into bf16
  // ones (register_pv_nvfp4, O kept in nvfp4_pv_dim's order).
  constexpr bool kWarpRings = attention_warp_rings<Traits, kFormat, Elem>();
  constexpr bool kRegisterV =
      kWarpRings && (kFormat == KvFormat::kE4m3 || kFormat == KvFormat::kE5m2);
  constexpr bool kRegisterNvfp4V = kWarpRings && kFormat == KvFormat::kNvfp4;
  // Warp rings of 16-bit rows (AttentionDecode1TwoPerSmTraits) hold a plane a stage: a page is two
  // ring entries, its K rows and then its V rows, so that V streams in while QK^T runs.
  constexpr bool kPlaneStages = kWarpRings && attention_plane_stages<kFormat>();
  constexpr int kEntriesPerPage = kPlaneStages ? 2 : 1;
  static_assert(!kWarpRings || Traits::kWarpKeys == Traits::kChunkKeys);
  static_assert(!Traits::kSelects ||
                    (Traits::kRows == 1 && attention_smem_bytes<Traits, kFormat, Elem>() -
                                                   attention_query_and_union_bytes<Traits>() >=
                                               kAttentionSelectSmem),
                "a selecting tile holds one row, and its stages its selection");
  // NVFP4 K and V into bf16 tiles or fragments as code x scale x 2^-63 (one multiply a code pair
  // fewer; convert::kE2m1ScaleUp); the score scale and the output scale carry the 2^63 back. Only
  // products whose unscaled value is below 2^-63 lose bits (fp32 subnormals): far under the fp32
  // sums' own rounding, within the spec's error rule.
  constexpr bool kNvfp4ScaledDown =
      kFormat == KvFormat::kNvfp4 && std::is_same_v<Elem, __nv_bfloat16>;
  constexpr float kRestore = kNvfp4ScaledDown ? convert::kE2m1ScaledDownRestore : 1.0f;
  using PvElem = std::conditional_t<kRegisterV, __half, Elem>;  // P's type in P V
  using QkElem = std::conditional_t<kRegisterV, __half, Elem>;  // Q's (and K's) in Q K^T
  constexpr int kStageBytes =
      kWarpRings ? attention_warp_stage_bytes<Traits, kFormat>() : kv_raw_page_bytes<kFormat>();
  constexpr int kStages = kWarpRings ? attention_warp_ring_stages<Traits, kFormat>()
                                     : attention_stages<Traits, kFormat>();
  extern __shared__ __align__(128) std::byte smem[];
  std::byte* q_tile = smem;
  auto* union_block = reinterpret_cast<std::int32_t*>(q_tile + Traits::kRows * 16 * 256);
  auto* union_page = union_block + Traits::kMaxUnion;
  auto* union_mask = reinterpret_cast<std::uint32_t*>(union_page + Traits::kMaxUnion);
  std::byte* stages = reinterpret_cast<std::byte*>(union_mask + Traits::kMaxUnion);
  std::byte* widened = stages + kStages * kStageBytes;  // the widened 16-bit tiles (not kWarpRings)

  wait_for_previous_kernel();  // launched as a dependent of the step's previous kernel
  phase_stamp(p.clock, 0);
  const AttentionTile tile = attention_tile<Traits::kRows>(p.rows, p.tile_offset);
  if (tile.request < 0) return;
  const int kv_head = blockIdx.y, split = blockIdx.z;
  const TileTable table = tile_table(p, tile);
  auto page_of = [&](std::int64_t b) { return table.page_of(b); };
  const std::int64_t tile_blocks = table.blocks;
  const std::int64_t last_pos = tile.position(tile.rows - 1);

  // ---- Queries: each warp row's G heads as the 16 rows of an MMA tile (rows >= G are zero).
  // Copied asynchronously first (one cp.async group), so their latency hides behind the union
  // build; a q dtype other than the MMA type is converted through registers instead.
  for (int i = threadIdx.x; i < Traits::kRows * 16 * kRowChunks; i += Traits::kThreads) {
    const int r = i / kRowChunks, chunk = i % kRowChunks;
    const int row = r / 16, head = r % 16;
    const bool live = row < tile.rows && head < p.group;
    const auto* src = static_cast<const QElem*>(p.q) +
                      (tile.row + (live ? row : 0)) * p.q_row_stride +
                      (kv_head * p.group + (live ? head : 0)) * p.q_head_stride + chunk * 8;
    std::byte* dst = q_tile + swizzled_chunk(r, chunk) * 16;
    if constexpr (std::is_same_v<QElem, Elem>) {
      cp_async_16_or_zero(dst, src, live);
    } else {
      uint4 value = make_uint4(0, 0, 0, 0);
      if (live) {
        const uint4 raw = *reinterpret_cast<const uint4*>(src);
        const auto* in = reinterpret_cast<const QElem*>(&raw);
        std::uint32_t w[4];
        for (int j = 0; j < 4; ++j) {
          w[j] = pack2<Elem>(static_cast<float>(in[2 * j]), static_cast<float>(in[2 * j + 1]));
        }
        value = make_uint4(w[0], w[1], w[2], w[3]);
      }
      *reinterpret_cast<uint4*>(dst) = value;
    }
  }
  cp_async_commit();

  // ---- The union of the tile's selected pages, ascending, with the rows that chose each ----
  int num_entries;
  // A selection entry that counts: visible to its row and with a page in the table.
  auto selected_block = [&](int i, int j) -> std::int64_t {
    const std::int64_t b = p.topk[kv_head * p.topk_stride[0] + (tile.row + i) * p.topk_stride[1] +
                                  j * p.topk_stride[2]];
    const std::int64_t pos = tile.position(i);
    return pos >= 0 && b >= 0 && b <= pos / 128 && page_of(b) >= 0 ? b : -1;
  };
  if constexpr (Traits::kSelects) {
    // The row's selection (ascending, distinct, visible), made here from the block scores; the
    // union is its blocks with a page in the table. Keys and scratch use the stages (free until
    // the ring; the host checked that they fit in kAttentionSelectSmem).
    using Scan = cub::BlockScan<int, Traits::kThreads>;
    auto* keys = reinterpret_cast<std::uint32_t*>(stages);
    auto& scratch = *reinterpret_cast<TopkScratch<Traits::kThreads>*>(
        stages + topk_keys_bytes(p.select.max_blocks));
    int k;
    if constexpr (kFormat == KvFormat::kNvfp4) {
      k = select_and_write_topk_row<Traits::kThreads>(p.select, tile.row, kv_head, keys, scratch,
                                                      split == 0);
    } else {
      k = select_and_write_topk_row_inline<Traits::kThreads>(p.select, tile.row, kv_head, keys,
                                                             scratch, split == 0);
    }
    const std::int64_t b = threadIdx.x < k ? scratch.selected[threadIdx.x] : -1;
    const std::int64_t page = b >= 0 ? page_of(b) : -1;
    int offset;
    Scan(scratch.scan).ExclusiveSum(page >= 0 ? 1 : 0, offset, num_entries);
    if (page >= 0) {
      union_block[offset] = static_cast<std::int32_t>(b);
      union_page[offset] = static_cast<std::int32_t>(page);
      union_mask[offset] = 1u;
    }
    __syncthreads();
  } else if (!Traits::kClusterSplits && p.topk == nullptr) {
    num_entries = static_cast<int>(tile_blocks);  // dense: entry i is block i
  } else {                                        // the stages are free until the ring
    num_entries = build_page_union<Traits::kThreads, Traits::kWindow>(
        tile.rows, p.topk_width, tile_blocks, selected_block, page_of, stages, union_block,
        union_page, union_mask);
  }
  phase_stamp(p.clock, 1);  // the union is built
  // Dense entries: the rows whose position reaches the block, if the table has its page.
  // Listed (a selection, made or read) or dense; tested where used, as the schedules prefer.
  // Decode tiles are always listed (the decode op reads top-k lists or selects): no dense code.
  auto listed = [&] { return Traits::kSelects || Traits::kClusterSplits || p.topk != nullptr; };
  auto entry_page = [&](int e) -> std::int64_t { return listed() ? union_page[e] : page_of(e); };
  auto entry_block = [&](int e) -> std::int64_t { return listed() ? union_block[e] : e; };
  auto entry_mask = [&](int e) -> std::uint32_t {
    if (listed()) return union_mask[e];
    if (page_of(e) < 0) return 0;
    std::uint32_t m = 0;
    for (int i = 0; i < tile.rows; ++i)
      m |= (tile.position(i) >= std::int64_t{e} * 128) ? 1u << i : 0u;
    return m;
  };
  const int per_split = (num_entries + p.splits - 1) / p.splits;
  const int begin = min(num_entries, split * per_split);
  const int end = min(num_entries, begin + per_split);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row = warp / Traits::kKeySplit, key_part = warp % Traits::kKeySplit;
  // Entry e's page (K plane, then V plane) goes through the ring as its page e - begin; tokens
  // after the tile's last position are zero-filled, never read. kWarpRings: each warp's ring
  // holds its own keys' K rows, then their V rows; kPlaneStages: as ring pages 2 (e - begin)
  // and 2 (e - begin) + 1.
  using Ring =
      CpAsyncPageRing<kStages, kStageBytes, kWarpRings ? RingScope::kWarp : RingScope::kCta>;
  // kWarpRings: each warp's share of the stages (attention_warp_region_bytes): its ring.
  std::byte* const ring_base =
      kWarpRings ? stages + warp * attention_warp_region_bytes<Traits, kFormat>() : stages;
  const Ring ring{ring_base};
  auto fill = [&](int slot) {  // the ring's page `slot`
    ring.fill(slot, [&](std::byte* stage) {
      const int e = begin + slot / kEntriesPerPage;
      if (e >= end) return;
      const std::int64_t page = entry_page(e);
      if (page < 0) return;
      const int limit = static_cast<int>(min64(128, last_pos - entry_block(e) * 128 + 1));
      if constexpr (kWarpRings) {
        const int token0 = key_part * Traits::kWarpKeys;
        if (token0 >= limit) return;   // none of this warp's keys is visible: nothing is read
        if constexpr (kPlaneStages) {  // the page's K plane, or (odd slots) its V plane
          load_raw_rows_warp<Traits::kWarpKeys, kFormat>(slot % 2 == 0 ? p.k : p.v, p.k_scales,
                                                         page, kv_head, token0, limit - token0,
                                                         stage, lane);
        } else {
          load_raw_rows_warp<Traits::kWarpKeys, kFormat>(p.k, p.k_scales, page, kv_head, token0,
                                                         limit - token0, stage, lane);
          load_raw_rows_warp<Traits::kWarpKeys, kFormat>(
              p.v, p.v_scales, page, kv_head, token0, limit - token0,
              stage + raw_plane_bytes<kFormat, Traits::kWarpKeys>(), lane);
        }
      } else {
        load_raw_plane<Traits::kThreads, kFormat>(p.k, p.k_scales, page, kv_head, limit, stage);
        load_raw_plane<Traits::kThreads, kFormat>(p.v, p.v_scales, page, kv_head, limit,
                                                  stage + raw_plane_bytes<kFormat>());
      }
    });
  };
  for (int s = 0; s < kStages - 1; ++s) fill(s);

  cp_async_wait<kStages - 1>();  // the queries' group (pages may still be in flight)
  __syncthreads();

  const std::int64_t my_pos = warp_row < tile.rows ? tile.position(warp_row) : -1;
  // kWarpRings: the queries' dims in the k order of the keys' register fragments; kRegisterV: as
  // f16 scaled by a power of two a head, for QK^T on f16 MMAs (one conversion a K code pair
  // instead of four), each head's scores multiplied back by its 2^-E with the softmax scale.
  __shared__ float q_restore[16];
  if constexpr (kWarpRings && kWiden)
    permute_query_tile<Traits::kThreads, kFormat>(q_tile, kRegisterV ? q_restore : nullptr);
  float score_scale[2];  // the rows lane / 4 and lane / 4 + 8 (finite: 0 x scale stays 0)
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    score_scale[half] = kRegisterV
                            ? fminf(p.score_scale_log2 * q_restore[lane / 4 + 8 * half], FLT_MAX)
                            : fminf(p.score_scale_log2 * kRestore, FLT_MAX);
  }
  // The row's queries as A fragments, one per 16 dims; kWarpRings reads them from shared memory
  // at each use instead (32 registers fewer: two CTAs fit on an SM).
  std::uint32_t qf[8][1][4];
  if constexpr (!kWarpRings) {
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) load_a_fragment(qf[ks][0], q_tile, warp_row * 16, ks, lane);
  }
  float o[16][4];
#pragma unroll
  for (auto& n : o) {
    for (float& x : n) x = 0.0f;
  }
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  // The queries and the first page have landed: stamped before the page loop, whose every page
  // paid the stamp's test inside it (the compiler evaluates it ahead of the branch).
  if (begin < end) {
    ring.wait(0);
    phase_stamp(p.clock, 2);
  }
  for (int e = begin; e < end; ++e) {
    const int slot = kEntriesPerPage * (e - begin);  // the ring page of e's K plane
    ring.wait(slot);
    fill(slot + kStages - 1);
    // kPlaneStages: the V plane's ring page, waited for (and its stage's refill issued) once
    // QK^T is done with the K stage, which that refill takes; on every path through the page.
    bool v_plane_waited = false;
    auto wait_v_plane = [&] {
      if constexpr (kPlaneStages) {
        if (!v_plane_waited) {
          ring.wait(slot + 1);
          fill(slot + kStages);
          v_plane_waited = true;
        }
      }
    };
    const std::byte* tiles = ring.stage(slot);
    const std::int64_t first_key = entry_block(e) * 128;
    // kWarpRings: the stage holds this warp's keys only (from raw_key0), K rows then V rows (or
    // kPlaneStages: one of them).
    const int raw_key0 = kWarpRings ? key_part * Traits::kWarpKeys : 0;
    const std::byte* k_raw = tiles;
    const std::byte* v_raw =
        kPlaneStages ? ring.stage(slot + 1) : tiles + raw_plane_bytes<kFormat, Traits::kWarpKeys>();
    const std::byte* k_tile = tiles;  // the 16-bit tiles (not kWarpRings, or kPlaneStages)
    const std::byte* v_tile = kPlaneStages ? v_raw : tiles + 128 * 256;
    if constexpr (kWarpRings) {
      // Nothing to widen: the warp converts its keys' K and V codes in registers, or its 16-bit
      // rows are the MMA tiles.
    } else if constexpr (kWiden) {
      if (entry_page(e) >= 0)
        widen_planes<Traits::kThreads, kFormat, Elem, 2, 128, kNvfp4ScaledDown>(tiles, widened,
                                                                                threadIdx.x);
      __syncthreads();
      k_tile = widened;
      v_tile = widened + 128 * 256;
    }
    if (!((entry_mask(e) >> warp_row) & 1u)) {
      wait_v_plane();
      continue;
    }
#pragma unroll 1
    for (int kc = 0; kc < Traits::kWarpKeys / Traits::kChunkKeys; ++kc) {
      const int key0 = key_part * Traits::kWarpKeys + kc * Traits::kChunkKeys;
      if (first_key + key0 > my_pos) break;
      constexpr int kNT = Traits::kChunkKeys / 8;
      float scores[1][kNT][4];
#pragma unroll
      for (auto& n : scores[0]) {
        for (float& x : n) x = 0.0f;
      }
      if constexpr (kPlaneStages) {
        // The row's queries read at each step (as kWarpRings do: registers for two CTAs an SM).
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
          std::uint32_t a[1][4];
          load_a_fragment(a[0], q_tile, 0, ks, lane);
          qk_step<Elem, 1, kNT>(scores, a, k_tile, key0 - raw_key0, ks, lane);
        }
      } else if constexpr (kWarpRings) {
        const auto q = [&](int step, std::uint32_t(&a)[1][4]) {
          load_a_fragment(a[0], q_tile, 0, step, lane);
        };
        register_qk<kFormat, 1, kNT, Traits::kWarpKeys, QkElem, kNvfp4ScaledDown>(
            scores, q, k_raw, key0 - raw_key0, lane);
      } else {
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
          qk_step<Elem, 1, kNT>(scores, qf[ks], k_tile, key0, ks, lane);
        }
      }
      auto& s = scores[0];
      const bool all_visible = first_key + key0 + Traits::kChunkKeys - 1 <= my_pos;
      float alpha[2];  // the rescale of O's two rows
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = s[nt][2 * half + c];
            const int key = key0 + nt * 8 + 2 * (lane % 4) + c;
            x = (all_visible || first_key + key <= my_pos) ? x * score_scale[half] : -INFINITY;
            mx = fmaxf(mx, x);
          }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float new_max = fmaxf(row_max[half], mx);
        const float ref = new_max == -INFINITY ? 0.0f : new_max;  // no key yet: no NaN
        alpha[half] = fast_exp2(row_max[half] - ref);
        row_max[half] = new_max;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = s[nt][2 * half + c];
            x = fast_exp2(x - ref);
            sum += x;
          }
        }
        row_sum[half] = row_sum[half] * alpha[half] + sum;
      }
      // O is rescaled only when a row's max moved: x 1.0 is exact, so skipping changes no bit.
      // After the first pages the max rarely moves: 64 multiplies a chunk saved (no measurable
      // gain yet on the H200, whose decode loop is latency-bound rather than issue-bound).
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
          o[nt][0] *= alpha[0], o[nt][1] *= alpha[0];
          o[nt][2] *= alpha[1], o[nt][3] *= alpha[1];
        }
      }
      wait_v_plane();
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        const std::uint32_t a[4] = {pack2<PvElem>(s[2 * kk][0], s[2 * kk][1]),
                                    pack2<PvElem>(s[2 * kk][2], s[2 * kk][3]),
                                    pack2<PvElem>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack2<PvElem>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        // Keys after this row's position have P = 0, but 0 x NaN is NaN: their values (written
        // for later rows, possibly non-finite) are zeroed in the fragment (see pv_step). Not on
        // warp-ring tiles: one row, whose stage rows past its position were zero-filled, never
        // read (the fill's limit is that row's position), so the masks are constant.
        std::uint32_t keep_lo = 0xFFFFFFFFu, keep_hi = 0xFFFFFFFFu;
        if (!kWarpRings && !all_visible) {
          const std::int64_t k = first_key + key0 + 16 * kk + 2 * (lane % 4);
          keep_lo = (k <= my_pos ? 0x0000FFFFu : 0u) | (k + 1 <= my_pos ? 0xFFFF0000u : 0u);
          keep_hi = (k + 8 <= my_pos ? 0x0000FFFFu : 0u) | (k + 9 <= my_pos ? 0xFFFF0000u : 0u);
        }
        if constexpr (kRegisterV) {
          register_pv<kFormat>(o, a, v_raw, key0 - raw_key0 + 16 * kk, keep_lo, keep_hi, lane);
        } else if constexpr (kRegisterNvfp4V) {
          register_pv_nvfp4<Traits::kWarpKeys, kNvfp4ScaledDown>(
              o, a, v_raw, key0 - raw_key0 + 16 * kk, keep_lo, keep_hi, lane);
        } else {
          pv_step<Elem>(o, a, v_tile, key0 - raw_key0 + 16 * kk, keep_lo, keep_hi, lane);
        }
      }
    }
    wait_v_plane();  // (a warp none of whose keys the row sees)
  }
  allow_next_kernel();  // the step's next kernel launches during the epilogue
  ring.drain();
  __syncthreads();  // the ring is free: the epilogue reuses it
  phase_stamp(p.clock, 3);

  // ---- Epilogue: each warp's (max, sum, unnormalised O) to shared memory ----
  // The key parts' partials, then (cluster splits) the CTA's merged rows for the other splits.
  constexpr int kSplitRowFloats = Traits::kClusterSplits ? Traits::kRows * 16 * 129 : 0;
  static_assert((Traits::kWarps * 16 * (Traits::kPartialStride + 2) + kSplitRowFloats) * 4 <=
                (kWarpRings ? Traits::kWarps * attention_warp_region_bytes<Traits, kFormat>()
                            : kStages * kStageBytes + (kWiden ? 2 * 128 * 256 : 0)));
  float* part_o = reinterpret_cast<float*>(stages);
  float* part_max = part_o + Traits::kWarps * 16 * Traits::kPartialStride;
  float* part_sum = part_max + Traits::kWarps * 16;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = row_sum[half];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = lane / 4 + 8 * half;
    float* dst = part_o + (warp * 16 + r) * Traits::kPartialStride;
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      if constexpr (kRegisterV || kRegisterNvfp4V) {
        // Back to the natural dim order: column c of n-tiles 4 J .. 4 J + 3 holds 4 consecutive
        // dims (register_pv_dim, nvfp4_pv_dim), one 16-byte store.
        if (nt % 4 == 0) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int col = 2 * (lane % 4) + c;
            const int dim = kRegisterV ? register_pv_dim(nt, col) : nvfp4_pv_dim(nt, col);
            *reinterpret_cast<float4*>(dst + dim) =
                make_float4(o[nt][2 * half + c], o[nt + 1][2 * half + c], o[nt + 2][2 * half + c],
                            o[nt + 3][2 * half + c]);
          }
        }
      } else {
        *reinterpret_cast<float2*>(dst + nt * 8 + 2 * (lane % 4)) =
            make_float2(o[nt][2 * half], o[nt][2 * half + 1]);
      }
    }
    if (lane % 4 == 0) {
      part_max[warp * 16 + r] = row_max[half];
      part_sum[warp * 16 + r] = sum;
    }
  }
  __syncthreads();

  // ---- Merge the key parts of each (row, head) ----
  // Values [col, col + W) of (row, head): merged over the key parts, normalised into v; returns
  // the natural log-sum-exp. Every part is merged, empty ones with weight 0: a NaN sum (NaN or
  // +Inf score) or a NaN value behind a zero weight must reach the row, as in the CPU backend.
  auto merge = [&]<int W>(int row, int head, int col, float(&v)[W]) {
    float m = -INFINITY;
    for (int w = 0; w < Traits::kKeySplit; ++w) {
      m = fmaxf(m, part_max[(row * Traits::kKeySplit + w) * 16 + head]);
    }
    const float ref = m == -INFINITY ? 0.0f : m;  // no key anywhere: scales exp2(-inf) = 0
    float l = 0.0f;
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = 0.0f;
#pragma unroll
    for (int w = 0; w < Traits::kKeySplit; ++w) {
      const int slot = (row * Traits::kKeySplit + w) * 16 + head;
      const float scale = fast_exp2(part_max[slot] - ref);
      l += scale * part_sum[slot];
      add_scaled(v, part_o + slot * Traits::kPartialStride + col, scale);
    }
    const OutputScale out_scale = output_scale(l, m, p.v_scale * kRestore);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] *= out_scale.inv;
    constexpr float kLn2 = 0.6931471805599453f;
    return out_scale.lse_log2 * kLn2;
  };
  // One-row decode tiles have 64 groups of 32 values for 256 threads: there the key parts are
  // merged by pieces of 8 (4x the threads share the merge, which is on the latency path of every
  // step; 1 us of fp8's 3 at 64 x 32K) into shared memory and stored from there. Not for NVFP4,
  // whose page loop measured 1.3 us slower with it (64 x 32K, its registers 124 -> 128).
  constexpr bool kPieceMerge =
      Traits::kClusterSplits && Traits::kRows == 1 && kFormat != KvFormat::kNvfp4;
  float* split_o = part_sum + Traits::kWarps * 16;  // [kRows * 16 (row, head)][128]
  float* split_lse = split_o + Traits::kRows * 16 * 128;
  // (row, head)'s values, normalised, and its log-sum-exp into shared memory by pieces of 8.
  auto merge_to_shared = [&] {
    for (int item = threadIdx.x; item < tile.rows * p.group * 16; item += Traits::kThreads) {
      const int row = item / (p.group * 16), head = (item / 16) % p.group, piece = item % 16;
      float v[8];
      const float lse = merge(row, head, piece * 8, v);
      auto* dst = reinterpret_cast<float4*>(split_o + (row * 16 + head) * 128 + piece * 8);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
      if (piece == 0) split_lse[row * 16 + head] = lse;
    }
  };
  if (!Traits::kClusterSplits || p.splits == 1) {
    // Final outputs by groups of 32 values (MXFP8 quantizes 32 at a time).
    if constexpr (kPieceMerge) {
      merge_to_shared();
      __syncthreads();
    }
    for (int item = threadIdx.x; item < tile.rows * p.group * 4; item += Traits::kThreads) {
      const int row = item / (p.group * 4), head = (item / 4) % p.group, grp = item % 4;
      float v[32];
      float lse;
      if constexpr (kPieceMerge) {
        const auto* src = reinterpret_cast<const float4*>(split_o + (row * 16 + head) * 128);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 x = src[grp * 8 + j];
          v[4 * j] = x.x, v[4 * j + 1] = x.y, v[4 * j + 2] = x.z, v[4 * j + 3] = x.w;
        }
        lse = split_lse[row * 16 + head];
      } else {
        lse = merge(row, head, grp * 32, v);
      }
      store_values(p.store, tile.row + row, kv_head * p.group + head, grp * 32, v, lse);
    }
    phase_stamp(p.clock, 4);
  } else if constexpr (Traits::kClusterSplits) {
    // The splits of this row tile are one cluster (grid.z). Each CTA leaves its rows, normalised,
    // and their log-sum-exps in its shared memory (4x the threads share the key parts' merge,
    // which is on the latency path of the small batches that split) ...
    merge_to_shared();
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every split's rows are in its shared memory
    phase_stamp(p.clock, 4);
    // ... then CTA r merges the (row, head) vectors r, r + splits, ... of every split through
    // distributed shared memory: a warp per vector, a lane per 4 values, every split's loads in
    // flight, merged in split order (the key parts' partials are read: their space takes the
    // merged vectors) ...
    const int rank = static_cast<int>(cluster.block_rank());
    const int vectors = tile.rows * p.group;
    const int mine = (vectors - rank + p.splits - 1) / p.splits;
    float* merged = part_o;  // [mine][128]
    float* merged_lse = part_o + mine * 128;
    for (int local = warp; local < mine; local += Traits::kWarps) {
      const int vec = local * p.splits + rank;
      const int slot = (vec / p.group) * 16 + vec % p.group;
      float lse[kMaxDecodeSplits];
      float4 x[kMaxDecodeSplits];
      float m = -INFINITY;
#pragma unroll
      for (int s = 0; s < kMaxDecodeSplits; ++s) {
        if (s < p.splits) {
          lse[s] = cluster.map_shared_rank(split_lse, s)[slot];
          x[s] = reinterpret_cast<const float4*>(cluster.map_shared_rank(split_o, s) +
                                                 slot * 128)[lane];
          m = fmaxf(m, lse[s]);
        }
      }
      const float ref = m == -INFINITY ? 0.0f : m;  // every split empty: weights exp(-inf) = 0
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float l = 0.0f;
      // Every split is merged, empty ones with weight 0, so a NaN partial (log-sum-exp or value)
      // reaches the row (spec section 5).
#pragma unroll
      for (int s = 0; s < kMaxDecodeSplits; ++s) {
        if (s < p.splits) {
          const float w = __expf(lse[s] - ref);
          l += w;
          v.x += w * x[s].x, v.y += w * x[s].y, v.z += w * x[s].z, v.w += w * x[s].w;
        }
      }
      // l > 0: normalise; l == 0 (no key): zeros and -inf; NaN l: NaN row and log-sum-exp.
      auto normalise = [&](float y) { return l > 0.0f ? y / l : y * l; };
      reinterpret_cast<float4*>(merged + local * 128)[lane] =
          make_float4(normalise(v.x), normalise(v.y), normalise(v.z), normalise(v.w));
      if (lane == 0) merged_lse[local] = l > 0.0f ? m + __logf(l) : l == 0.0f ? -INFINITY : l;
    }
    // This CTA has read the others' rows: it says so now and waits for them to have read its own
    // only before it exits, so the barrier's latency hides behind the stores.
    auto done_reading = cluster.barrier_arrive();
    __syncthreads();
    // ... and stores them by groups of 32 values (MXFP8 quantizes 32 at a time).
    for (int item = threadIdx.x; item < mine * 4; item += Traits::kThreads) {
      const int local = item / 4, grp = item % 4, vec = local * p.splits + rank;
      float v[32];
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = merged[local * 128 + grp * 32 + j];
      store_values(p.store, tile.row + vec / p.group, kv_head * p.group + vec % p.group, grp * 32,
                   v, merged_lse[local]);
    }
    phase_stamp(p.clock, 5);
    cluster.barrier_wait(std::move(done_reading));  // no CTA leaves while its rows may be read
  }
}

// Host launcher of one instantiation (explicitly instantiated by the generated sources listed in
// cmake/sm90_kernels.cmake; attention_launch.hpp chooses among them at run time).
template <class Traits, KvFormat kFormat, class Elem, class QElem>
void launch_attention_kernel(const AttentionParams& p, dim3 grid, cudaStream_t stream) {
  // The splits of a row tile (grid.z) form one cluster.
  launch_dependent_cluster_kernel(attention_kernel<Traits, kFormat, Elem, QElem>, grid,
                                  dim3(1, 1, static_cast<unsigned>(p.splits)), Traits::kThreads,
                                  attention_smem_bytes<Traits, kFormat, Elem>(), stream, p);
}

// Clusters of `size` CTAs of this instantiation the device runs at once (the decode split rule's
// DecodeClusterWave).
template <class Traits, KvFormat kFormat, class Elem, class QElem>
int attention_kernel_clusters_at_once(int size) {
  return clusters_at_once(attention_kernel<Traits, kFormat, Elem, QElem>, Traits::kThreads,
                          attention_smem_bytes<Traits, kFormat, Elem>(), size);
}

}  // namespace flashmsa::cuda
