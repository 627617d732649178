// prefill_attention_kernel: sparse (or dense) prefill attention of 16-bit caches on Hopper's
// warpgroup tensor cores.
//
// A CTA takes a tile of 8 consecutive query rows (tokens) of one request and one kv head: 128 MMA
// rows, a token's 16 query heads each (heads past the group are zero queries, never stored). The
// union of the pages the 8 tokens selected (page_union.cuh; dense: every visible block) streams
// through shared memory, each page loaded once for the tile: its K rows through a ring of
// kKStages stages, its V rows through one of kVStages (K is read first and released first, so it
// runs further ahead). The queries stay in the consumers' registers (wgmma A fragments), so the
// shared memory goes to the rings. Warp-specialized:
//   - warpgroup 0: warp 0's lane 0 brings each page's K and V rows of the kv head by TMA (tma.hpp's
//     4-D map of the plane, 128-byte swizzle) into their stages ("full" mbarriers: transaction
//     bytes); warps 1-3 then look through the page's V rows for non-finite values (below) and
//     release the V stage to P V ("ready").
//   - warpgroups 1 and 2: the consumers, 4 tokens each (one m64 tile; warp w holds token 4c + w's
//     16 heads, so whatever depends on the token is warp-uniform). Per page: S = Q K^T (8 wgmma
//     m64n128k16, Q from registers, K read K-major from shared memory), the causal mask and the
//     online softmax in log2 units on the accumulators, P rounded to the MMA type in registers,
//     O += P V (8 wgmma with P from registers and V read N-major as stored); each plane's stage
//     goes back to the producer once read ("empty": K after S, V after P V). A consumer none of
//     whose tokens selected the page skips it; a token that did not select it gets P = 0.
// P = 0 does not make a value vanish when the value is NaN or infinite (0 x Inf is NaN), and the
// MMA multiplies every row of the warpgroup by every key: so the scanning warps zero each V row
// that holds a NaN or an infinity and mark its key, and a token whose visible keys of a selected
// page include a marked one gets a NaN row, as the spec asks of a non-finite value in Keys. Rows
// past the written length (garbage) and rows of other tokens' pages so never reach an output; K
// needs nothing of the kind: a masked score is replaced by -inf, not added to.
//
// Dense, neighbouring tiles run as a cluster of two CTAs that share every page load (TMA
// multicast, below).
//
// The epilogue normalises O (1 / l, the V scale; an empty row gives zeros and -inf, a NaN sum a
// NaN row: epilogue.cuh's output_scale), stages it in the ring's shared memory and stores each
// (token, head)'s 128 values with store_values (bf16 / fp16 / fp32 / MXFP8, the log-sum-exp).
#pragma once

#include <cooperative_groups.h>
#include <cuda.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/launch.hpp"
#include "src/cuda/sm90/attention/attention_params.hpp"
#include "src/cuda/sm90/attention/epilogue.cuh"
#include "src/cuda/sm90/attention/page_union.cuh"
#include "src/cuda/sm90/page_pipeline.cuh"
#include "src/cuda/sm90/scheduler/tiles.cuh"
#include "src/cuda/sm90/wgmma.cuh"

namespace flashmsa::cuda {

struct PrefillAttentionParams {
  CUtensorMap k_map, v_map;  // the K and V planes (tma.hpp): boxes of 64 dims x 128 tokens
  AttentionParams p;
};

struct PrefillAttentionTraits {
  static constexpr int kTokens = 8;     // query rows a tile: the planner's tile rows
  static constexpr int kConsumers = 2;  // warpgroups of 4 tokens x 16 heads (an m64 tile each)
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kScanThreads = 96;        // warps 1-3: the V rows' check
  static constexpr int kPlaneBytes = 128 * 256;  // a page's K (or V) rows of one head, 16-bit
  // K and V rings of their own (K is read first and released first). Q lives in the consumers'
  // registers, so the shared memory holds 3 stages of each: a V plane lands and is checked
  // (below) while the consumers work through two pages.
  static constexpr int kKStages = 3, kVStages = 3;
  static constexpr int kRingBytes = (kKStages + kVStages) * kPlaneBytes;
  static constexpr int kMaxTopk = 64;
  static constexpr int kMaxUnion = kTokens * kMaxTopk;
  static constexpr int kWindow = 2048;            // blocks marked a pass of the union build
  static constexpr int kStagingStride = 128 + 4;  // floats an epilogue row (4 of padding: banks)
  static constexpr int kUnionBytes = kMaxUnion * 12;
  // Barriers (K: full, empty; V: full, ready, empty), the marked keys (4 words) of each V stage
  // and whether each K stage holds a page (a word).
  static constexpr int kBarrierBytes = kKStages * (2 * 8 + 4) + kVStages * (3 * 8 + 16);
  // 1024: the slack that aligns the tiles to the 1024-byte swizzle atoms.
  static constexpr int kSmemBytes = 1024 + kRingBytes + kUnionBytes + kBarrierBytes;
  static_assert(kSmemBytes <= 227 * 1024);
  static_assert(page_union_scratch_bytes<kThreads, kWindow>() <= kRingBytes);
  static_assert(kTokens * 16 * kStagingStride * 4 <= kRingBytes);
  // setmaxnreg moves registers from the producer warpgroup to the consumers' accumulators (S, O
  // and P: 160 a thread); the launch's kLaunchRegisters a thread bound the sum.
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert(128 * (kProducerRegisters + kConsumers * kConsumerRegisters) <=
                kThreads * kLaunchRegisters);
};

namespace prefill_attention {

// Whether any of the 16-bit values in `word`'s two halves is NaN or infinite, accumulated: OR the
// results over the words, then test kFlags. A half is non-finite when its exponent bits are
// all ones: |h| >= kInf, and |h| + (0x8000 - kInf) then carries into bit 15 (|h| <= 0x7fff: no
// carry into the other half).
template <class Elem>
struct NonFinite {
  static constexpr std::uint32_t kInf = std::is_same_v<Elem, __half> ? 0x7c00u : 0x7f80u;
  static constexpr std::uint32_t kBias = (0x8000u - kInf) * 0x00010001u;
  static constexpr std::uint32_t kFlags = 0x80008000u;
  __device__ __forceinline__ static std::uint32_t mark(std::uint32_t word) {
    return (word & 0x7fff7fffu) + kBias;
  }
};

// row[h] = op over the thread's 32 values of accumulator row h (acc[4 j + 2 h + x]), for both rows
// h, as trees of depth 5 side by side (a chain would be 31 dependent instructions); the quad's
// four threads still hold partial results.
template <class Op>
__device__ __forceinline__ void reduce_rows(const float (&acc)[64], Op op, float (&row)[2]) {
  float t[2][16];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < 16; ++j) t[h][j] = op(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    t[0][j] = op(t[0][j], t[0][j + 8]), t[1][j] = op(t[1][j], t[1][j + 8]);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    t[0][j] = op(t[0][j], t[0][j + 4]), t[1][j] = op(t[1][j], t[1][j + 4]);
#pragma unroll
  for (int j = 0; j < 2; ++j)
    t[0][j] = op(t[0][j], t[0][j + 2]), t[1][j] = op(t[1][j], t[1][j + 2]);
  row[0] = op(t[0][0], t[0][1]), row[1] = op(t[1][0], t[1][1]);
}

}  // namespace prefill_attention

// Elem: the cache's and the MMA's type; QElem: q's (converted to Elem on load where it differs).
template <class Elem, class QElem>
__global__ void __launch_bounds__(PrefillAttentionTraits::kThreads, 1)
    prefill_attention_kernel(const __grid_constant__ PrefillAttentionParams params) {
  using T = PrefillAttentionTraits;
  const AttentionParams& p = params.p;
  extern __shared__ std::byte smem_raw[];
  // The K ring, then the V ring.
  std::byte* stages = smem_raw + (1024u - smem_address(smem_raw) % 1024u) % 1024u;
  std::byte* v_stages = stages + T::kKStages * T::kPlaneBytes;
  auto* union_block = reinterpret_cast<std::int32_t*>(stages + T::kRingBytes);
  auto* union_page = union_block + T::kMaxUnion;
  auto* union_mask = reinterpret_cast<std::uint32_t*>(union_page + T::kMaxUnion);
  auto* k_full = reinterpret_cast<std::uint64_t*>(union_mask + T::kMaxUnion);
  std::uint64_t* k_empty = k_full + T::kKStages;
  std::uint64_t* v_full = k_empty + T::kKStages;
  std::uint64_t* v_ready = v_full + T::kVStages;
  std::uint64_t* v_empty = v_ready + T::kVStages;
  auto* marked = reinterpret_cast<std::uint32_t*>(v_empty + T::kVStages);  // [kVStages][4]
  std::uint32_t* k_loaded = marked + T::kVStages * 4;                      // [kKStages]
  // Every role steps one RingPosition along the entries: entry e's stage and phase in both rings.
  static_assert(T::kKStages == T::kVStages, "one stage counter for both rings");

  wait_for_previous_kernel();  // the planner's tiles
  const AttentionTile tile = attention_tile<T::kTokens>(p.rows, p.tile_offset);
  if (tile.request < 0) return;
  const int kv_head = blockIdx.y;
  const TileTable table = tile_table(p, tile);
  auto page_of = [&](std::int64_t b) { return table.page_of(b); };
  const std::int64_t tile_blocks = table.blocks;
  const bool listed = p.topk != nullptr;

  // Dense, the grid runs in clusters of two CTAs, neighbouring tiles: two tiles of one request
  // read the same pages (the later tile's blocks, a superset of the earlier's), so the pair
  // loads each page once: each CTA brings one 64-dim half of every K and V plane into both CTAs'
  // stages (TMA multicast), halving the pages' L2 reads. A stage is then written by both CTAs,
  // so its "empty" barriers count the peer's consumers too (a remote arrival a warp).
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const std::uint32_t rank = cluster.block_rank(), peer = rank ^ 1u;
  AttentionTile peer_tile;
  if (!listed && cluster.num_blocks() == 2)
    peer_tile = attention_tile<T::kTokens>(p.rows, p.tile_offset, blockIdx.x ^ 1u);
  const bool paired = peer_tile.request == tile.request;  // tile.request >= 0 here
  const std::int64_t pair_blocks =
      paired ? std::max(tile_blocks, tile_table(p, peer_tile).blocks) : tile_blocks;
  const int releases = 128 * T::kConsumers + (paired ? 4 * T::kConsumers : 0);

  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kKStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&k_empty[s], releases);
    }
    for (int s = 0; s < T::kVStages; ++s) {
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&v_ready[s], T::kScanThreads);
      mbarrier_init(&v_empty[s], releases);
    }
    fence_mbarrier_init();
  }

  // ---- The pages: the union of the tile's selections, or (dense) every visible block.
  int num_entries;
  if (listed) {
    auto selected_block = [&](int i, int j) -> std::int64_t {
      const std::int64_t b = p.topk[kv_head * p.topk_stride[0] + (tile.row + i) * p.topk_stride[1] +
                                    j * p.topk_stride[2]];
      const std::int64_t pos = tile.position(i);
      return pos >= 0 && b >= 0 && b <= pos / 128 && page_of(b) >= 0 ? b : -1;
    };
    num_entries = build_page_union<T::kThreads, T::kWindow>(tile.rows, p.topk_width, tile_blocks,
                                                            selected_block, page_of, stages,
                                                            union_block, union_page, union_mask);
  } else if (paired) {
    num_entries = static_cast<int>(pair_blocks);  // entry i is block i
    cluster.sync();                               // both CTAs' barriers
  } else {
    num_entries = static_cast<int>(tile_blocks);  // entry i is block i
    __syncthreads();                              // the barriers
  }
  auto entry_page = [&](int e) -> std::int64_t { return listed ? union_page[e] : page_of(e); };
  auto entry_block = [&](int e) -> std::int64_t { return listed ? union_block[e] : e; };
  // The tokens that read entry e (a bit each), its K plane in `stage`. Dense: the tile's
  // positions are consecutive, so token i sees block e iff pos + i >= 128 e, where the block has
  // a page (the producer's flag).
  auto entry_mask = [&](int e, int stage) -> std::uint32_t {
    if (listed) return union_mask[e];
    if (k_loaded[stage] == 0 || tile.padding) return 0u;
    const std::int64_t first = std::int64_t{e} * 128 - tile.pos;  // the first token that sees it
    if (first >= tile.rows) return 0u;
    const int below = first <= 0 ? 0 : static_cast<int>(first);
    return ((1u << tile.rows) - 1u) & ~((1u << below) - 1u);
  };

  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegisters>();
    if (warp == 0) {
      if (lane != 0) return;
      fence_proxy_async_shared();  // the union build's scratch in the stages, before TMA writes
      // Entry e's K and V planes into their stages, each once the consumers released the
      // stage's previous entry (K is released first, so K goes on streaming while the consumers
      // finish the V plane). An entry without a page completes its phases with no bytes (no
      // consumer reads it).
      auto load = [&](const CUtensorMap* map, std::uint64_t* full, std::byte* ring, int s,
                      std::int64_t page) {
        if (page < 0) {
          mbarrier_arrive(&full[s]);
          return;
        }
        mbarrier_arrive_expect_tx(&full[s], T::kPlaneBytes);
        if (paired) {  // this CTA's half into both CTAs
          tma_load_4d_multicast(map, &full[s], 0b11, ring + s * T::kPlaneBytes + rank * (128 * 128),
                                rank * 64, 0, kv_head, static_cast<int>(page));
          return;
        }
        for (int h = 0; h < 2; ++h) {
          tma_load_4d(map, &full[s], ring + s * T::kPlaneBytes + h * (128 * 128), h * 64, 0,
                      kv_head, static_cast<int>(page));
        }
      };
      RingPosition<T::kKStages> at;
      for (int e = 0; e < num_entries; ++e, at.next()) {
        const std::int64_t page = entry_page(e);
        // The stage's previous entry had the other phase parity.
        if (e >= T::kKStages) mbarrier_wait(&k_empty[at.stage], at.phase ^ 1u);
        k_loaded[at.stage] = page >= 0;  // published by the arrive in load
        load(&params.k_map, k_full, stages, at.stage, page);
        if (e >= T::kVStages) mbarrier_wait(&v_empty[at.stage], at.phase ^ 1u);
        load(&params.v_map, v_full, v_stages, at.stage, page);
      }
      return;
    }
    // Warps 1-3: thread t checks the V rows of keys t and (warp 1) t + 96 of every page, zeroes
    // the non-finite ones and marks their keys (word k / 32 of the stage's marks).
    using Check = prefill_attention::NonFinite<Elem>;
    const int t = threadIdx.x - 32;
    RingPosition<T::kKStages> at;
    for (int e = 0; e < num_entries; ++e, at.next()) {
      const int s = at.stage;
      mbarrier_wait(&v_full[s], at.phase);
      std::byte* v_tile = v_stages + s * T::kPlaneBytes;
      bool zeroed = false;
      for (int key = t; key < 128; key += T::kScanThreads) {
        std::uint32_t flags = 0;
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int c = 0; c < 8; ++c) {
            // Chunk (c + key) % 8: the 8 threads of a shared-memory phase read 8 bank groups.
            const uint4 x = *reinterpret_cast<const uint4*>(v_tile + h * (128 * 128) + key * 128 +
                                                            (c + key) % 8 * 16);
            flags |= Check::mark(x.x) | Check::mark(x.y) | Check::mark(x.z) | Check::mark(x.w);
          }
        }
        const bool bad = (flags & Check::kFlags) != 0;
        if (bad) {
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 8; ++c) {
              *reinterpret_cast<uint4*>(v_tile + h * (128 * 128) + key * 128 + c * 16) =
                  make_uint4(0, 0, 0, 0);
            }
          }
          zeroed = true;
        }
        const std::uint32_t word = __ballot_sync(0xffffffffu, bad);
        if (lane == 0) marked[s * 4 + key / 32] = word;
      }
      if (zeroed) fence_proxy_async_shared();  // the zeros, read by the consumers' wgmma
      mbarrier_arrive(&v_ready[s]);
    }
    return;
  }

  // ---- Consumers: warpgroup c holds tokens 4c .. 4c + 3, this warp token 4c + warp.
  cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegisters>();
  const int c = wg - 1;
  const int token = 4 * c + warp;
  const std::int64_t my_pos = token < tile.rows ? tile.position(token) : -1;
  // The token's query heads lane / 4 and 8 below as wgmma's A fragments of the 8 k-steps (zeros
  // past the group and the tile): S's MMAs read only K from shared memory.
  std::uint32_t qf[8][4];
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int head = lane / 4 + 8 * (i % 2), d = 16 * ks + 2 * (lane % 4) + 8 * (i / 2);
      std::uint32_t value = 0;
      if (token < tile.rows && head < p.group) {
        const auto* src = static_cast<const QElem*>(p.q) + (tile.row + token) * p.q_row_stride +
                          (kv_head * p.group + head) * p.q_head_stride + d;
        value = *reinterpret_cast<const std::uint32_t*>(src);
        if constexpr (!std::is_same_v<QElem, Elem>) {
          const auto* in = reinterpret_cast<const QElem*>(&value);
          value = pack2<Elem>(static_cast<float>(in[0]), static_cast<float>(in[1]));
        }
      }
      qf[ks][i] = value;
    }
  }
  const float scale = fminf(p.score_scale_log2, FLT_MAX);
  float o[64];
#pragma unroll
  for (float& x : o) x = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  bool poisoned = false;  // a marked (non-finite) value among the token's keys
  // The stage descriptors of the rings' first stages; a stage, k-step or key block is an offset
  // added to the low word (the start address field: no carry, shared memory is < 2^18 bytes).
  const std::uint64_t k_desc0 = sw128_descriptor(stages);
  const std::uint64_t v_desc0 = sw128_mn_descriptor(v_stages, 128 * 128);
  auto advance = [](std::uint64_t desc, std::uint32_t bytes) {
    return (desc & 0xffffffff00000000ull) | (static_cast<std::uint32_t>(desc) + (bytes >> 4));
  };
  const std::uint32_t group_bits = 0xFu << (4 * c), token_bit = 1u << token;
  RingPosition<T::kKStages> at;
  for (int e = 0; e < num_entries; ++e, at.next()) {
    const int stage = at.stage;
    const std::uint32_t phase = at.phase;
    // Every phase is waited for, also where skipped: no warpgroup's release may run a phase
    // ahead of the other's on an "empty" barrier, nor ahead of the scanners on a V stage (the
    // next V plane comes only after both consumers released the stage, so after its scan).
    mbarrier_wait(&k_full[stage], phase);
    const std::uint32_t mask = entry_mask(e, stage);
    const bool mine = (mask & group_bits) != 0;  // any of the warpgroup's tokens
    float acc[64];
    if (mine) {
      // ---- S = Q K^T
      const std::uint64_t k_desc = advance(k_desc0, stage * T::kPlaneBytes);
      wgmma_fence_accumulators(acc);
      cute::warpgroup_arrive();
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const int half = ks / 4, offset = (ks % 4) * 32;
        wgmma_64x128x16_rs_kmajor<Elem>(qf[ks], advance(k_desc, half * (128 * 128) + offset), acc,
                                        ks > 0);
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      wgmma_fence_accumulators(acc);
    }
    mbarrier_arrive(&k_empty[stage]);  // the K plane is read
    if (paired && lane == 0) mbarrier_arrive_cluster(&k_empty[stage], peer);
    if (mine) {
      // ---- The online softmax of the token's rows (lane / 4 and 8 below), or P = 0.
      const bool selected = (mask & token_bit) != 0;  // warp-uniform
      // Keys 0 .. last_key of the page are the token's (a selected block is visible).
      const std::int64_t rel = my_pos - entry_block(e) * 128;
      const int last_key = rel > 127 ? 127 : static_cast<int>(rel);
      std::uint32_t pf[8][4];
      if (selected) {
        // The causal mask touches only the token's own block, so the test is warp-uniform and
        // per key an int32 compare with a constant: key 8 j + 2 (lane % 4) + x is hidden past
        // last_key.
        if (last_key < 127) {
          const int limit = last_key - 2 * (lane % 4);
#pragma unroll
          for (int j = 0; j < 16; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              if (8 * j + i % 2 > limit) acc[4 * j + i] = -INFINITY;
            }
          }
        }
        // Maxima and sums as trees (reduce_rows), both rows side by side: the softmax is
        // latency-bound, not issue-bound.
        float t[2];
        prefill_attention::reduce_rows(
            acc, [](float a, float b) { return fmaxf(a, b); }, t);
        // Max over the raw scores, the scale folded into the exponent's FFMA (scale > 0).
        float alpha[2], ref[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = t[h];
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float new_max = fmaxf(row_max[h], mx * scale);
          ref[h] = new_max == -INFINITY ? 0.0f : new_max;  // no key yet: no NaN
          alpha[h] = fast_exp2(row_max[h] - ref[h]);
          row_max[h] = new_max;
        }
#pragma unroll
        for (int j = 0; j < 16; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            acc[4 * j + i] = fast_exp2(fmaf(acc[4 * j + i], scale, -ref[i / 2]));
        }
        prefill_attention::reduce_rows(
            acc, [](float a, float b) { return a + b; }, t);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // A score whose scaled value overflows gives +inf as the max, and exp2(s scale - inf)
          // would be 0 for it: the row is NaN, as inf - inf made it before the fold.
          const float sum = ref[h] == INFINITY ? __int_as_float(0x7fc00000) : t[h];
          row_sum[h] = row_sum[h] * alpha[h] + sum;
        }
        // O rescaled on every page: no vote waits for alpha, so the multiplies fill the
        // exponentials' latency (x 1.0 is exact: the bits are those of skipping it).
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          o[4 * j] *= alpha[0], o[4 * j + 1] *= alpha[0];
          o[4 * j + 2] *= alpha[1], o[4 * j + 3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            pf[kk][i] = pack2<Elem>(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1]);
        }
      } else {
#pragma unroll
        for (auto& f : pf) {
          for (std::uint32_t& x : f) x = 0u;
        }
      }

      // ---- O += P V, once the V rows are checked.
      mbarrier_wait(&v_full[stage], phase);
      mbarrier_wait(&v_ready[stage], phase);
      if (selected) {
        // The marked keys the token sees (keys 0 .. last_key) make its row NaN.
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const int seen = last_key - 32 * w + 1;  // keys of word w the token sees
          const std::uint32_t visible = seen >= 32  ? 0xffffffffu
                                        : seen <= 0 ? 0u
                                                    : (1u << seen) - 1u;
          poisoned |= (marked[stage * 4 + w] & visible) != 0;
        }
      }
      const std::uint64_t v_desc = advance(v_desc0, stage * T::kPlaneBytes);
      wgmma_fence_accumulators(o);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        wgmma_64x128x16_rs_accumulate<Elem>(pf[kk], advance(v_desc, kk * 16 * 128), o);
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      wgmma_fence_accumulators(o);
    } else {
      // Nothing to read: the scan's end implies the plane's landing.
      mbarrier_wait(&v_ready[stage], phase);
    }
    mbarrier_arrive(&v_empty[stage]);
    if (paired && lane == 0) mbarrier_arrive_cluster(&v_empty[stage], peer);
  }
  allow_next_kernel();

  // ---- Epilogue: normalised rows into shared memory (the ring, free once both consumers are
  // past their last page), then stored by (token, head, 32 values).
  named_barrier_sync(1, 128 * T::kConsumers);
  float* staging = reinterpret_cast<float*>(stages);
  __shared__ float staged_lse[T::kTokens * 16];
  constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (poisoned) l = __int_as_float(0x7fc00000);
    const attention_detail::OutputScale out =
        attention_detail::output_scale(l, row_max[h], p.v_scale);
    const int row = token * 16 + lane / 4 + 8 * h;
    float* dst = staging + row * T::kStagingStride + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      *reinterpret_cast<float2*>(dst + 8 * j) =
          make_float2(o[4 * j + 2 * h] * out.inv, o[4 * j + 2 * h + 1] * out.inv);
    }
    if (lane % 4 == 0) staged_lse[row] = out.lse_log2 * kLn2;
  }
  named_barrier_sync(1, 128 * T::kConsumers);
  const int ct = threadIdx.x - 128;
  for (int item = ct; item < tile.rows * p.group * 4; item += 128 * T::kConsumers) {
    const int row = item / (p.group * 4), head = (item / 4) % p.group, grp = item % 4;
    const float* src = staging + (row * 16 + head) * T::kStagingStride + grp * 32;
    float v[32];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 x = reinterpret_cast<const float4*>(src)[j];
      v[4 * j] = x.x, v[4 * j + 1] = x.y, v[4 * j + 2] = x.z, v[4 * j + 3] = x.w;
    }
    attention_detail::store_values(p.store, tile.row + row, kv_head * p.group + head, grp * 32, v,
                                   staged_lse[row * 16 + head]);
  }
  // The peer's last releases arrive on this CTA's barriers: no CTA of a pair leaves before both
  // are done (the producer warpgroup's threads have left; the cluster barrier waits only for the
  // threads still running).
  if (paired) cluster.sync();
}

template <class Elem, class QElem>
void launch_prefill_attention_kernel(const PrefillAttentionParams& p, dim3 grid,
                                     cudaStream_t stream) {
  // Dense: clusters of two neighbouring tiles (an even grid: a CTA past the last tile leaves at
  // once). Sparse pairs share fewer pages, and clusters cost their scheduling (2-3% measured).
  const bool dense = p.p.topk == nullptr;
  launch_dependent_cluster_kernel(prefill_attention_kernel<Elem, QElem>,
                                  dim3(grid.x + (dense ? grid.x % 2 : 0), grid.y, grid.z),
                                  dim3(dense ? 2 : 1, 1, 1), PrefillAttentionTraits::kThreads,
                                  PrefillAttentionTraits::kSmemBytes, stream, p);
}

}  // namespace flashmsa::cuda
