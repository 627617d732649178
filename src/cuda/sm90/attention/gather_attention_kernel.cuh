// gather_attention: the key-stationary sparse prefill attention of 16-bit caches (bf16 / fp16 q
// of the cache's type, 16 q heads a kv head), for selections whose neighbouring tokens share few
// pages (i.i.d. random ones: the query-stationary tile of prefill_attention_kernel.cuh computes
// all 64 rows of a warpgroup for each page any of its 4 tokens selected, 35% of them useful at
// 32K, and reads each page once a tile of 8 tokens).
//
// For a window of rows, per kv head:
//   1. gather_count_kernel / gather_scatter_kernel: every counted top-k entry (visible, with a
//      page, not a duplicate of an earlier entry of its row: the union's rules) goes into its
//      page's list, as (row in the window, slot); gather_chunk_kernel cuts each list into work
//      items of kChunkTokens entries (hot pages, such as a sink block every token selects, are
//      several items).
//   2. gather_attention_kernel: a CTA takes work items in turn. Its producer warp loads the
//      item's page (K and V planes, TMA) once, then its entries' queries in groups of 4 tokens
//      (a token's 16 heads are rows of the m64 tile) into the ring of the consumer warpgroup that
//      takes the group (groups alternate between the two); warps 1-3 check the page's V rows for
//      non-finite values (as prefill_attention_kernel's do: zeroed, their keys marked). A consumer
//      computes S = Q K^T (8 wgmma, both operands from shared memory), the softmax of this page
//      alone (the causal mask on the token's own block; nothing to rescale), O = P V (8 wgmma, P
//      from registers) and stores the entry's partial: the unnormalised O (fp32) and each row's
//      (max, sum) in log2 units. The order in which entries join groups does not matter: an MMA
//      row depends only on its own query row, so the partials are the same bits however the
//      lists were filled.
//   3. gather_combine_kernel: each (row, q head)'s partials, merged in slot order (log-sum-exp
//      weights in fp32), stored as the final output with store_values.
#pragma once

#include <cuda.h>

#include <cfloat>
#include <cstdint>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/sm90/attention/attention_params.hpp"
#include "src/cuda/sm90/attention/epilogue.cuh"
#include "src/cuda/sm90/attention/prefill_attention_kernel.cuh"
#include "src/cuda/sm90/page_pipeline.cuh"
#include "src/cuda/sm90/wgmma.cuh"

namespace flashmsa::cuda {

struct GatherAttentionTraits {
  static constexpr int kGroupTokens = 4;   // tokens an m64 tile (16 heads each)
  static constexpr int kChunkTokens = 64;  // entries a work item (16 groups)
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kScanThreads = 96;
  static constexpr int kPlaneBytes = 128 * 256;        // a page's K (or V) rows of one head
  static constexpr int kPageBytes = 2 * kPlaneBytes;   // K then V
  static constexpr int kQBytes = kGroupTokens * 4096;  // a group's 64 query rows of 128 dims
  // One query stage a consumer (released once S has read it: the next group's queries land
  // during this one's softmax and P V), so that each consumer also has a 32 KB staging tile for
  // its partials (fp32 O, stored by TMA from the 128-byte swizzled tile: no bank conflicts).
  static constexpr int kPageStages = 2, kQStages = 1;
  static constexpr int kStagingBytes = 64 * 128 * 4;
  static constexpr int kMaxTopk = 64;  // slot in the low 6 bits of a list entry
  static constexpr int kBarrierBytes = kPageStages * (3 * 8 + 16) + kConsumers * kQStages * 2 * 8;
  static constexpr int kSmemBytes = 1024 + kPageStages * kPageBytes +
                                    kConsumers * (kQStages * kQBytes + kStagingBytes) +
                                    kBarrierBytes;
  static_assert(kSmemBytes <= 227 * 1024);
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
};

// One window's gather state, in device memory (the host sizes it: gather_attention.cu).
struct GatherParams {
  CUtensorMap k_map, v_map;  // the K and V planes (tma.hpp): boxes of 64 dims x 128 tokens
  CUtensorMap q_map;         // q [T, Hq, D]: boxes of 64 dims x 16 heads x 1 row
  CUtensorMap o_map;         // partial_o as [rows, 128] fp32: boxes of 32 values x 16 rows
  AttentionParams p;
  std::int64_t first_row = 0;  // the window: rows [first_row, first_row + rows)
  std::int32_t rows = 0;
  std::int32_t kv_heads = 0;
  std::int64_t buckets = 0;              // kv_heads x num_pages lists
  std::int32_t* count = nullptr;         // [buckets] entries a list (zeroed before the count)
  std::int32_t* offset = nullptr;        // [buckets + 1] exclusive scan of count
  std::int32_t* fill = nullptr;          // [buckets] entries placed (zeroed before the scatter)
  std::int32_t* chunks = nullptr;        // [buckets] work items a list
  std::int32_t* chunk_offset = nullptr;  // [buckets + 1] exclusive scan of chunks
  std::int32_t* list = nullptr;          // [entries] pack_entry(), list by list
  float* partial_o = nullptr;            // [rows, kv_heads, width, 16, 128] unnormalised O
  float2* partial_ml = nullptr;          // [rows, kv_heads, width, 16] (max, sum), log2 units
};

namespace gather_attention {

// The page of row `row`'s entry `slot` of kv head `kv` where the entry counts (the spec's Sel:
// a block in [0, nvb(pos)), with a page, the first of equal entries), else -1; its block in
// `block`.
__device__ inline std::int64_t entry_page(const AttentionParams& p, int kv, std::int64_t row,
                                          int slot, std::int32_t request, std::int64_t pos,
                                          std::int64_t& block) {
  if (request < 0 || pos < 0) return -1;
  const std::int32_t* entries = p.topk + kv * p.topk_stride[0] + row * p.topk_stride[1];
  const std::int64_t b = entries[slot * p.topk_stride[2]];
  if (b < 0 || b > pos / 128 || b >= p.max_blocks) return -1;
  for (int j = 0; j < slot; ++j) {
    if (entries[j * p.topk_stride[2]] == b) return -1;
  }
  const std::int64_t page = p.block_table[request * p.table_stride + b];
  if (page < 0 || page >= p.num_pages) return -1;
  block = b;
  return page;
}

// A list entry: the row in the window, the last key of the page the row sees (its causal limit
// on its own block, else 127) and the top-k slot.
__device__ __forceinline__ std::int32_t pack_entry(std::int64_t local, int last_key, int slot) {
  return static_cast<std::int32_t>(local << 13 | last_key << 6 | slot);
}
__device__ __forceinline__ std::int32_t entry_row(std::int32_t e) {
  return e >> 13;
}
__device__ __forceinline__ int entry_last_key(std::int32_t e) {
  return e >> 6 & 127;
}
__device__ __forceinline__ int entry_slot(std::int32_t e) {
  return e & 63;
}

// Partial (row in the window, kv head, slot, head)'s index.
__device__ __forceinline__ std::int64_t partial_index(const GatherParams& g, std::int64_t local,
                                                      int kv, int slot, int head) {
  return ((local * g.kv_heads + kv) * g.p.topk_width + slot) * 16 + head;
}

}  // namespace gather_attention

// One thread a (kv head, row of the window): its counted entries into their lists' counts
// (kScatter false) or into the lists (true).
template <bool kScatter>
__global__ void __launch_bounds__(256) gather_list_kernel(const __grid_constant__ GatherParams g) {
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= std::int64_t{g.rows} * g.kv_heads) return;
  const int kv = static_cast<int>(i / g.rows);
  const std::int64_t local = i % g.rows, row = g.first_row + local;
  const std::int32_t request = g.p.rows.request_of(row);
  const std::int64_t pos = g.p.rows.position(row);
  for (int slot = 0; slot < g.p.topk_width; ++slot) {
    std::int64_t block;
    const std::int64_t page = gather_attention::entry_page(g.p, kv, row, slot, request, pos, block);
    if (page < 0) continue;
    const std::int64_t bucket = kv * g.p.num_pages + page;
    if constexpr (kScatter) {
      const std::int32_t at = g.offset[bucket] + atomicAdd(&g.fill[bucket], 1);
      const std::int64_t rel = pos - block * 128;
      g.list[at] =
          gather_attention::pack_entry(local, rel > 127 ? 127 : static_cast<int>(rel), slot);
    } else {
      atomicAdd(&g.count[bucket], 1);
    }
  }
}

// Work items a list: ceil(count / kChunkTokens).
__global__ void __launch_bounds__(256) gather_chunk_kernel(const __grid_constant__ GatherParams g) {
  const std::int64_t b = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (b < g.buckets) {
    g.chunks[b] = (g.count[b] + GatherAttentionTraits::kChunkTokens - 1) /
                  GatherAttentionTraits::kChunkTokens;
  }
}

// The last bucket whose first work item is at or below `item` (a bucket with items: the next
// one's offset is past it).
__device__ inline std::int64_t gather_bucket_of(const std::int32_t* chunk_offset,
                                                std::int64_t buckets, std::int32_t item) {
  std::int64_t lo = 0, hi = buckets;
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    if (chunk_offset[mid] <= item) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <class Elem>
__global__ void __launch_bounds__(GatherAttentionTraits::kThreads, 1)
    gather_attention_kernel(const __grid_constant__ GatherParams g) {
  using T = GatherAttentionTraits;
  const AttentionParams& p = g.p;
  extern __shared__ std::byte smem_raw[];
  std::byte* pages = smem_raw + (1024u - smem_address(smem_raw) % 1024u) % 1024u;
  std::byte* q_stages = pages + T::kPageStages * T::kPageBytes;              // [consumer][stage]
  std::byte* staging = q_stages + T::kConsumers * T::kQStages * T::kQBytes;  // [consumer]
  auto* page_full = reinterpret_cast<std::uint64_t*>(staging + T::kConsumers * T::kStagingBytes);
  std::uint64_t* page_ready = page_full + T::kPageStages;
  std::uint64_t* page_empty = page_ready + T::kPageStages;
  std::uint64_t* q_full = page_empty + T::kPageStages;            // [consumer][stage]
  std::uint64_t* q_empty = q_full + T::kConsumers * T::kQStages;  // [consumer][stage]
  auto* marked = reinterpret_cast<std::uint32_t*>(q_empty + T::kConsumers * T::kQStages);
  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kPageStages; ++s) {
      mbarrier_init(&page_full[s], 1);
      mbarrier_init(&page_ready[s], T::kScanThreads);
      mbarrier_init(&page_empty[s], 4 * T::kConsumers);  // a warp of each consumer's
    }
    for (int s = 0; s < T::kConsumers * T::kQStages; ++s) {
      mbarrier_init(&q_full[s], 1);
      mbarrier_init(&q_empty[s], 4);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  wait_for_previous_kernel();  // the lists

  const std::int32_t items = g.chunk_offset[g.buckets];
  // Item i's list: its page, kv head, and entries [first, last) of the list array.
  struct Item {
    int kv;
    std::int64_t page;
    std::int32_t first, last;
  };
  auto item_of = [&](std::int32_t i) {
    const std::int64_t b = gather_bucket_of(g.chunk_offset, g.buckets, i);
    const std::int32_t first = g.offset[b] + (i - g.chunk_offset[b]) * T::kChunkTokens;
    return Item{static_cast<int>(b / p.num_pages), b % p.num_pages, first,
                min(first + T::kChunkTokens, g.offset[b] + g.count[b])};
  };

  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegisters>();
    if (warp == 0) {
      if (lane != 0) return;
      int q_count[T::kConsumers] = {};
      RingPosition<T::kPageStages> at;
      for (std::int32_t i = blockIdx.x; i < items; i += gridDim.x, at.next()) {
        const Item item = item_of(i);
        const int s = at.stage;
        if (i >= static_cast<std::int32_t>(blockIdx.x + T::kPageStages * gridDim.x)) {
          mbarrier_wait(&page_empty[s], at.phase ^ 1u);
        }
        std::byte* stage = pages + s * T::kPageBytes;
        mbarrier_arrive_expect_tx(&page_full[s], T::kPageBytes);
        for (int h = 0; h < 2; ++h) {
          tma_load_4d(&g.k_map, &page_full[s], stage + h * (128 * 128), h * 64, 0, item.kv,
                      static_cast<int>(item.page));
          tma_load_4d(&g.v_map, &page_full[s], stage + T::kPlaneBytes + h * (128 * 128), h * 64, 0,
                      item.kv, static_cast<int>(item.page));
        }
        // The groups' queries, group n of the item to consumer n % 2.
        for (std::int32_t e = item.first, n = 0; e < item.last; e += T::kGroupTokens, ++n) {
          const int c = n % T::kConsumers, k = q_count[c]++;
          const int qs = c * T::kQStages + k % T::kQStages;
          if (k >= T::kQStages) mbarrier_wait(&q_empty[qs], ((k / T::kQStages) & 1) ^ 1);
          const int tokens = min(T::kGroupTokens, item.last - e);
          mbarrier_arrive_expect_tx(&q_full[qs], tokens * 4096);
          std::byte* q_stage = q_stages + qs * T::kQBytes;
          std::int32_t entries[T::kGroupTokens];
          for (int t = 0; t < tokens; ++t) entries[t] = g.list[e + t];  // loads side by side
          for (int t = 0; t < tokens; ++t) {
            const std::int64_t row = g.first_row + gather_attention::entry_row(entries[t]);
            for (int h = 0; h < 2; ++h) {
              // Half h of the group's rows: token t's 16 heads at rows 16 t .. 16 t + 15.
              tma_load_3d(&g.q_map, &q_full[qs], q_stage + h * (64 * 128) + t * (16 * 128), h * 64,
                          item.kv * 16, static_cast<int>(row));
            }
          }
        }
      }
      return;
    }
    // Warps 1-3: the V rows' check (prefill_attention_kernel's).
    using Check = prefill_attention::NonFinite<Elem>;
    const int t = threadIdx.x - 32;
    RingPosition<T::kPageStages> at;
    for (std::int32_t i = blockIdx.x; i < items; i += gridDim.x, at.next()) {
      const int s = at.stage;
      mbarrier_wait(&page_full[s], at.phase);
      std::byte* v_tile = pages + s * T::kPageBytes + T::kPlaneBytes;
      bool zeroed = false;
      for (int key = t; key < 128; key += T::kScanThreads) {
        std::uint32_t flags = 0;
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int c = 0; c < 8; ++c) {
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
      if (zeroed) fence_proxy_async_shared();
      mbarrier_arrive(&page_ready[s]);
    }
    return;
  }

  // ---- Consumers: warpgroup c takes groups c, c + 2, ... of each item; warp w token w of a group.
  cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegisters>();
  const int c = wg - 1;
  const float scale = fminf(p.score_scale_log2, FLT_MAX);
  auto advance = [](std::uint64_t desc, std::uint32_t bytes) {
    return (desc & 0xffffffff00000000ull) | (static_cast<std::uint32_t>(desc) + (bytes >> 4));
  };
  const std::uint64_t k_desc0 = sw128_descriptor(pages);
  const std::uint64_t v_desc0 = sw128_mn_descriptor(pages + T::kPlaneBytes, 128 * 128);
  const std::uint64_t q_desc0 = sw128_descriptor(q_stages + c * T::kQStages * T::kQBytes);
  int k = 0;  // this consumer's groups so far
  RingPosition<T::kPageStages> at;
  for (std::int32_t i = blockIdx.x; i < items; i += gridDim.x, at.next()) {
    const Item item = item_of(i);
    const int s = at.stage;
    mbarrier_wait(&page_full[s], at.phase);
    mbarrier_wait(&page_ready[s], at.phase);
    const std::uint64_t k_desc = advance(k_desc0, s * T::kPageBytes);
    const std::uint64_t v_desc = advance(v_desc0, s * T::kPageBytes);
    for (std::int32_t e = item.first + c * T::kGroupTokens; e < item.last;
         e += T::kConsumers * T::kGroupTokens, ++k) {
      const int qs = k % T::kQStages;
      // This warp's entry (a load in flight under S), or a padding row of the group's last.
      const bool valid = e + warp < item.last;  // warp-uniform
      const std::int32_t entry = valid ? g.list[e + warp] : gather_attention::pack_entry(0, 127, 0);
      mbarrier_wait(&q_full[c * T::kQStages + qs], (k / T::kQStages) & 1);
      // ---- S = Q K^T
      float acc[64];
      const std::uint64_t q_desc = advance(q_desc0, qs * T::kQBytes);
      wgmma_fence_accumulators(acc);
      cute::warpgroup_arrive();
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const int half = ks / 4, offset = (ks % 4) * 32;
        wgmma_64x128x16_ss<Elem>(advance(q_desc, half * (64 * 128) + offset),
                                 advance(k_desc, half * (128 * 128) + offset), acc, ks > 0);
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      wgmma_fence_accumulators(acc);
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&q_empty[c * T::kQStages + qs]);

      const int last_key = gather_attention::entry_last_key(entry);
      if (last_key < 127) {
        const int limit = last_key - 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            if (8 * j + x % 2 > limit) acc[4 * j + x] = -INFINITY;
          }
        }
      }
      // ---- The page's softmax (log2 units, the scale folded into the exponent's FFMA).
      float t[2][16], ref[2], row_sum[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 16; ++j) t[h][j] = fmaxf(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
      prefill_attention::reduce_rows(t, [](float a, float b) { return fmaxf(a, b); });
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = t[h][0];
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m = mx * scale;
        ref[h] = m == -INFINITY ? 0.0f : m;
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int x = 0; x < 4; ++x)
          acc[4 * j + x] = fast_exp2(fmaf(acc[4 * j + x], scale, -ref[x / 2]));
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 16; ++j) t[h][j] = acc[4 * j + 2 * h] + acc[4 * j + 2 * h + 1];
      }
      prefill_attention::reduce_rows(t, [](float a, float b) { return a + b; });
      // The marked (non-finite) values among the keys the token sees make its row NaN.
      bool poisoned = false;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int seen = last_key - 32 * w + 1;
        const std::uint32_t visible = seen >= 32 ? 0xffffffffu : seen <= 0 ? 0u : (1u << seen) - 1u;
        poisoned |= (marked[s * 4 + w] & visible) != 0;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = t[h][0];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        // An overflowing scaled score (+inf max) or a marked value: a NaN row.
        row_sum[h] = ref[h] == INFINITY || poisoned ? __int_as_float(0x7fc00000) : l;
      }
      std::uint32_t pf[8][4];
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
        for (int x = 0; x < 4; ++x)
          pf[kk][x] = pack2<Elem>(acc[8 * kk + 2 * x], acc[8 * kk + 2 * x + 1]);
      }
      // ---- O = P V
      float o[64];
#pragma unroll
      for (float& x : o) x = 0.0f;
      wgmma_fence_accumulators(o);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        wgmma_64x128x16_rs_accumulate<Elem>(pf[kk], advance(v_desc, kk * 16 * 128), o);
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      wgmma_fence_accumulators(o);
      // ---- The partial of the token's heads lane / 4 and 8 below: O into the warp's 8 KB of the
      // staging tile (4 boxes of 16 rows x 32 values, 128-byte swizzled as the TMA store reads
      // them), once the warp's previous store has read it; (max, sum) stored directly.
      std::byte* mine = staging + c * T::kStagingBytes + warp * 8192;
      if (lane == 0) cute::tma_store_wait<0>();
      __syncwarp();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = lane / 4 + 8 * h;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int chunk = 2 * (j % 4) + (lane % 4) / 2;
          *reinterpret_cast<float2*>(mine + (j / 4) * 2048 + r * 128 + ((chunk ^ (r & 7)) << 4) +
                                     (lane % 2) * 8) =
              make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]);
        }
      }
      fence_proxy_async_shared();
      __syncwarp();
      if (valid) {
        const std::int64_t first = gather_attention::partial_index(
            g, gather_attention::entry_row(entry), item.kv, gather_attention::entry_slot(entry), 0);
        if (lane == 0) {
          for (int b = 0; b < 4; ++b) {
            cute::SM90_TMA_STORE_2D::copy(&g.o_map, mine + b * 2048, b * 32,
                                          static_cast<int>(first));
          }
          cute::tma_store_arrive();
        }
        if (lane % 4 == 0) {
          g.partial_ml[first + lane / 4] = make_float2(ref[0], row_sum[0]);
          g.partial_ml[first + lane / 4 + 8] = make_float2(ref[1], row_sum[1]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&page_empty[s]);
  }
  if (lane == 0) cute::tma_store_wait<0>();  // the staging tile read before the CTA leaves
  allow_next_kernel();
}

// One thread a (row of the window, q head, 32 dims): the row's partials merged in slot order.
__global__ void __launch_bounds__(256)
    gather_combine_kernel(const __grid_constant__ GatherParams g) {
  wait_for_previous_kernel();
  const AttentionParams& p = g.p;
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const std::int64_t per_row = std::int64_t{g.kv_heads} * 16 * 4;
  if (i >= std::int64_t{g.rows} * per_row) return;
  const std::int64_t local = i / per_row, row = g.first_row + local;
  const int hq = static_cast<int>(i % per_row / 4), grp = static_cast<int>(i % 4);
  const int kv = hq / 16, head = hq % 16;
  const std::int32_t request = p.rows.request_of(row);
  if (request < 0) return;  // attention_empty_rows_kernel's
  const std::int64_t pos = p.rows.position(row);
  // The counted slots, then the largest max, then the weighted sums (loads independent of each
  // other: several slots in flight).
  std::uint64_t counted = 0;
  float m = -INFINITY;
  for (int slot = 0; slot < p.topk_width; ++slot) {
    std::int64_t block;
    if (gather_attention::entry_page(p, kv, row, slot, request, pos, block) < 0) continue;
    counted |= std::uint64_t{1} << slot;
    m = fmaxf(m, g.partial_ml[gather_attention::partial_index(g, local, kv, slot, head)].x);
  }
  if (m == -INFINITY) m = 0.0f;  // no key (or none but -inf scores): no NaN from -inf - -inf
  float v[32] = {}, l = 0.0f;
#pragma unroll 2
  for (int slot = 0; slot < p.topk_width; ++slot) {
    if (!(counted >> slot & 1)) continue;
    const std::int64_t at = gather_attention::partial_index(g, local, kv, slot, head);
    const float2 ml = g.partial_ml[at];
    const float w = fast_exp2(ml.x - m);
    l += ml.y * w;
    const float4* src = reinterpret_cast<const float4*>(g.partial_o + at * 128 + grp * 32);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float4 x = src[j];
      v[4 * j] += x.x * w;
      v[4 * j + 1] += x.y * w;
      v[4 * j + 2] += x.z * w;
      v[4 * j + 3] += x.w * w;
    }
  }
  const attention_detail::OutputScale out = attention_detail::output_scale(l, m, p.v_scale);
#pragma unroll
  for (float& x : v) x *= out.inv;
  constexpr float kLn2 = 0.6931471805599453f;
  attention_detail::store_values(p.store, row, hq, grp * 32, v, out.lse_log2 * kLn2);
}

}  // namespace flashmsa::cuda
