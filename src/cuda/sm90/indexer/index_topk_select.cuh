// select_topk_row: the exact top-k of one (row, kv head) by one CTA (spec section 4), the body of
// index_topk_kernel and of the decode attention's own selection (AttentionTraits::kSelects).
//
// Each visible block gets a 32-bit key that orders like its rank key (group max over the kv
// head's index heads, NaN as -1e30, -0 as +0, forcing 1e30 / 1e29). A most-significant-digit
// radix select (up to 4 passes of 8 bits over the keys in shared memory; it stops once every
// block of the k-th largest key's digit is taken) finds that key's decided bits T and how many
// blocks matching T to take; ties go to the smaller block id, so the selected set is exactly the
// CPU backend's. Block scans then place the ids in ascending order, and the
// score order (at most 64 ids) is a rank sort. Rows of at most 128 blocks (contexts up to 16K)
// skip the radix passes: each block's rank is counted directly, by up to 8 threads, and is its
// place in the score order too. (Counted so up to 256 blocks by the decode attention's 256
// threads, the selection took 1.2 us longer than the passes at 64 x 32K on the H200: two CTAs
// an SM, each thread comparing 256 keys.)
#pragma once

#include <cub/block/block_scan.cuh>

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/sm90/indexer/indexer_params.hpp"

namespace flashmsa::cuda {

constexpr int kIndexTopkThreads = 128;
constexpr int kMaxTopk = 64;

// The group's rule over a kv head's index heads: of two raw scores the one whose rank key is
// larger, the earlier head's on equal keys (the raw value is kept: block_scores reports it).
__device__ __forceinline__ float group_max(float best, float other) {
  return rank_key(other) > rank_key(best) ? other : best;
}

// Raw group score of block b (group_max over the group's index heads).
__device__ __forceinline__ float group_score(const IndexTopkParams& p, const float* row_scores,
                                             std::int64_t head_stride, int b) {
  float best = row_scores[b];
  for (int g = 1; g < p.group; ++g) best = group_max(best, row_scores[g * head_stride + b]);
  return best;
}

// Block b's selection key from its raw group score: the rank key, or a forcing value (1e30 for the
// init blocks, 1e29 from first_local on: local wins over init), as orderable bits.
__device__ __forceinline__ std::uint32_t selection_key(const IndexTopkParams& p, int b,
                                                       int first_local, float score) {
  float key = rank_key(score);
  if (b < p.init) key = 1e30f;
  if (b >= first_local) key = 1e29f;
  return orderable_bits(key);
}

// The selection's shared memory besides the keys (a CTA of kThreads threads).
template <int kThreads>
struct TopkScratch {
  typename cub::BlockScan<int, kThreads>::TempStorage scan;
  std::uint32_t histogram[256];
  std::uint32_t prefix;
  int need;
  bool whole;
  bool ranked;  // `ordered` holds the score order already (the direct ranking's ranks)
  std::int32_t selected[kMaxTopk], ordered[kMaxTopk];
};

// Block b's key sits at slot b + b / 32: a word of padding every 32 keys, so that the radix
// select's threads, each over a contiguous run of ids, read different banks (unpadded, runs of 32
// ids put a warp's 32 reads in one bank).
__device__ __forceinline__ int key_slot(int b) {
  return b + (b >> 5);
}
// A selection's shared memory: the row's key slots (16-byte aligned), then the scratch.
constexpr int topk_keys_bytes(int max_blocks) {
  return (4 * (max_blocks + max_blocks / 32) + 15) / 16 * 16;
}
template <int kThreads>
constexpr int topk_select_smem_bytes(int max_blocks) {
  return topk_keys_bytes(max_blocks) + static_cast<int>(sizeof(TopkScratch<kThreads>));
}

// Selects the top-k blocks of row t for `kv_head` with all kThreads threads of the CTA: returns k
// (min(topk, visible blocks)), the ids ascending in s.selected[0, k), every block b's key in
// keys[key_slot(b)] (shared memory, topk_keys_bytes); with write_scores the row's block_scores too
// (when asked for). Ends with a CTA barrier.
template <int kThreads>
__device__ int select_topk_row(const IndexTopkParams& p, std::int64_t t, int kv_head,
                               std::uint32_t* keys, TopkScratch<kThreads>& s, bool write_scores) {
  static_assert(kThreads >= kIndexTopkThreads, "a thread per block of the direct ranking");
  using Scan = cub::BlockScan<int, kThreads>;
  const std::int64_t pos = p.rows.position(t);
  const int nvb = pos < 0 ? 0 : static_cast<int>(min64(pos / 128 + 1, p.max_blocks));
  const int k = min(p.topk, nvb);
  const std::int64_t head_stride = p.chunk.rows() * p.max_blocks;
  const float* row_scores =
      p.scores + std::int64_t{kv_head} * p.group * head_stride + (t - p.chunk.begin) * p.max_blocks;

  const int first_local = max(0, nvb - p.local);
  // Each thread reads kLoadBatch blocks' scores at a time, group_score's compares after its loads:
  // independent loads in flight instead of one round trip a block (the top-k kernel's 128
  // threads took ~0.6 us a block a thread on the H200, 23 us for a 512K row).
  constexpr int kLoadBatch = 8;
  for (int b0 = 0; b0 < nvb; b0 += kLoadBatch * kThreads) {
    // The batch's rounds of kThreads blocks that hold any (CTA-uniform; one in short rows).
    const int rounds = min(kLoadBatch, (nvb - b0 + kThreads - 1) / kThreads);
    float best[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int b = b0 + j * kThreads + static_cast<int>(threadIdx.x);
      if (j < rounds) best[j] = b < nvb ? row_scores[b] : 0.0f;
    }
    for (int g = 1; g < p.group; ++g) {
      float other[kLoadBatch];
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        const int b = b0 + j * kThreads + static_cast<int>(threadIdx.x);
        if (j < rounds) other[j] = b < nvb ? row_scores[g * head_stride + b] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kLoadBatch; ++j) {
        if (j < rounds) best[j] = group_max(best[j], other[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int b = b0 + j * kThreads + static_cast<int>(threadIdx.x);
      if (j >= rounds || b >= nvb) continue;
      keys[key_slot(b)] = selection_key(p, b, first_local, best[j]);
    }
  }
  if (p.block_scores && write_scores) {
    float* out = p.block_scores + kv_head * p.block_scores_stride[0] + t * p.block_scores_stride[1];
    for (int b = threadIdx.x; b < p.block_scores_width; b += kThreads) {
      out[b * p.block_scores_stride[2]] =
          b < nvb ? group_score(p, row_scores, head_stride, b) : -INFINITY;
    }
  }
  __syncthreads();

  if (nvb <= kIndexTopkThreads) {
    // Few blocks (contexts up to 16K; measured faster than the passes only that far): `parts`
    // consecutive threads a block (as many as the CTA has to spare, up to 8) count the blocks
    // that rank before it (key desc, id asc), each over a share of them, and keep it if fewer
    // than k do; the rank is its place in the score order, and one scan places the kept ids in
    // ascending order. The same set as the radix select below, without its passes.
    const int parts = nvb == 0 ? 1 : min(8, 1 << (31 - __clz(kThreads / nvb)));
    const int b = static_cast<int>(threadIdx.x) / parts,
              part = static_cast<int>(threadIdx.x) % parts;
    const bool live = b < nvb;
    int rank = 0;
    if (live) {
      const std::uint32_t key = keys[key_slot(b)];
      const int share = (nvb + parts - 1) / parts;
      const int end = min(nvb, (part + 1) * share);
      for (int o = part * share; o < end; ++o) {
        const std::uint32_t other = keys[key_slot(o)];
        rank += other > key || (other == key && o < b);
      }
    }
    for (int lane = 1; lane < parts; lane <<= 1) rank += __shfl_xor_sync(0xffffffffu, rank, lane);
    const bool take = live && part == 0 && rank < k;
    int position;
    Scan(s.scan).ExclusiveSum(static_cast<int>(take), position);
    if (take) {
      s.selected[position] = b;
      s.ordered[rank] = b;
    }
    if (threadIdx.x == 0) s.ranked = true;
  } else {
    if (threadIdx.x == 0) s.ranked = false;
    // Threshold key (its bits under `decided`) and how many blocks equal to it there are taken
    // (all blocks when nvb <= topk).
    std::uint32_t threshold = 0, decided = 0xffffffffu;
    int need_equal = nvb;
    if (nvb > p.topk) {
      std::uint32_t prefix = 0, mask = 0;
      int need = k;
      for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += kThreads) s.histogram[i] = 0;
        __syncthreads();
        for (int b = threadIdx.x; b < nvb; b += kThreads) {
          const std::uint32_t key = keys[key_slot(b)];
          if ((key & mask) == prefix) atomicAdd(&s.histogram[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
          const int lane = threadIdx.x;
          int sum = 0;
          for (int j = 0; j < 8; ++j) sum += static_cast<int>(s.histogram[8 * lane + j]);
          int suffix = sum;  // blocks in the digits of lanes >= this one
          for (int o = 1; o < 32; o <<= 1) {
            const int other = __shfl_down_sync(0xffffffffu, suffix, o);
            if (lane + o < 32) suffix += other;
          }
          const int above = suffix - sum;
          if (above < need && need <= suffix) {
            int acc = above;
            for (int digit = 8 * lane + 7; digit >= 8 * lane; --digit) {
              const int c = static_cast<int>(s.histogram[digit]);
              if (acc + c >= need) {
                s.prefix = prefix | (static_cast<std::uint32_t>(digit) << shift);
                s.need = need - acc;
                s.whole = need - acc == c;  // the digit's blocks are all taken: decided
                break;
              }
              acc += c;
            }
          }
        }
        __syncthreads();
        prefix = s.prefix;
        need = s.need;
        mask |= 255u << shift;
        // Every block of the threshold's digit is taken: the lower bits cannot change the set
        // (random scores mostly decide within two passes of the four).
        if (s.whole) break;
      }
      threshold = prefix;
      decided = mask;
      need_equal = need;
    }

    // Each thread owns a contiguous run of ids; two scans give the equal-key ranks and the output
    // positions in ascending id order.
    const int per_thread = (nvb + kThreads - 1) / kThreads;
    const int lo = min(nvb, static_cast<int>(threadIdx.x) * per_thread);
    const int hi = min(nvb, lo + per_thread);
    int equal_here = 0;
    for (int b = lo; b < hi; ++b) equal_here += (keys[key_slot(b)] & decided) == threshold;
    int equal_before;
    Scan(s.scan).ExclusiveSum(equal_here, equal_before);
    __syncthreads();
    auto taken = [&](int b, int& equal_seen) {
      const std::uint32_t key = keys[key_slot(b)] & decided;
      if (key > threshold) return true;
      if (key != threshold) return false;
      return equal_before + equal_seen++ < need_equal;
    };
    int count_here = 0;
    {
      int equal_seen = 0;
      for (int b = lo; b < hi; ++b) count_here += taken(b, equal_seen);
    }
    int position;
    Scan(s.scan).ExclusiveSum(count_here, position);
    {
      int equal_seen = 0;
      for (int b = lo; b < hi; ++b) {
        if (taken(b, equal_seen)) s.selected[position++] = b;
      }
    }
  }
  __syncthreads();
  return k;
}

// Writes row t's top-k list (p.order; -1 past k) from select_topk_row's result.
template <int kThreads>
__device__ void write_topk_row(const IndexTopkParams& p, std::int64_t t, int kv_head, int k,
                               const std::uint32_t* keys, TopkScratch<kThreads>& s) {
  // Ascending ids already end with the local blocks (the highest visible ids), so ascending and
  // local_last coincide; score order ranks by (key desc, id asc).
  const std::int32_t* result = s.selected;
  if (p.order == TopkOrder::kScoreDesc && s.ranked) {
    result = s.ordered;
  } else if (p.order == TopkOrder::kScoreDesc) {
    if (threadIdx.x < k) {
      const std::int32_t id = s.selected[threadIdx.x];
      const std::uint32_t key = keys[key_slot(id)];
      int rank = 0;
      for (int j = 0; j < k; ++j) {
        const std::uint32_t other = keys[key_slot(s.selected[j])];
        rank += other > key || (other == key && s.selected[j] < id);
      }
      s.ordered[rank] = id;
    }
    __syncthreads();
    result = s.ordered;
  }
  std::int32_t* out = p.topk_out + kv_head * p.topk_stride[0] + t * p.topk_stride[1];
  for (int i = threadIdx.x; i < p.topk; i += kThreads) {
    out[i * p.topk_stride[2]] = i < k ? result[i] : -1;
  }
}

// select_topk_row and, with `write`, write_topk_row: the decode attention's selection
// (AttentionTraits::kSelects), inlined into its kernel.
template <int kThreads>
__device__ __forceinline__ int select_and_write_topk_row_inline(const IndexTopkParams& p,
                                                                std::int64_t t, int kv_head,
                                                                std::uint32_t* keys,
                                                                TopkScratch<kThreads>& s,
                                                                bool write) {
  const int k = select_topk_row<kThreads>(p, t, kv_head, keys, s, write);
  if (write) write_topk_row<kThreads>(p, t, kv_head, k, keys, s);
  return k;
}

// The same as a call of its own, kept out of the register allocation of the kernel's page loop
// (the NVFP4 kernel spills with it inlined); it reads its parameters through a generic pointer
// to the kernel's parameter space.
template <int kThreads>
__device__ __noinline__ int select_and_write_topk_row(const IndexTopkParams& p, std::int64_t t,
                                                      int kv_head, std::uint32_t* keys,
                                                      TopkScratch<kThreads>& s, bool write) {
  return select_and_write_topk_row_inline<kThreads>(p, t, kv_head, keys, s, write);
}

}  // namespace flashmsa::cuda
