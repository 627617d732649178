// warp_topk_row: the exact top-k of one (row, kv head) by one warp, for rows of up to
// kWarpTopkMaxBlocks visible blocks (contexts up to 128K tokens): the body of
// index_topk_warp_kernel.
//
// The row's keys (select_topk_row's: group max, NaN as -1e30, -0 as +0, forcing 1e30 / 1e29, as
// orderable bits) stay in registers, block b = 32 j + lane in the lane's key j.
// For k <= 32 the k-th largest of the 32 lane maxima bounds the k-th largest key from below (k
// lanes hold a key at least that large), so only the keys at or above it can be chosen: about 20
// on i.i.d. scores whatever the row's length (with one key a lane, the keys themselves). Up to 32
// of them go one a lane, as (key, ~id) composites, through a bitonic sort across the warp: its
// first k lanes are the top k in the score order (key desc, id asc: the CPU backend's set and
// order), and the k-th composite picks the set in ascending id order by ballots. Rows with more
// candidates (many equal keys) or k > 32 take the general path: a bitwise search for the k-th
// largest key, each step one compare a key and one warp reduction, from below the high bits it
// must share with the smallest and the largest lane maximum; it stops as soon as exactly k keys
// are at or above the bits decided. Ballots then take the keys above it and, of the keys equal to
// it, the smallest ids, and place the ids in ascending order; the score order (at most 64 ids) is
// a rank sort. No shared-memory passes and no CTA barriers, which is where the CTA version
// (index_topk_select.cuh, one CTA a row) spends most of its time on rows this short.
#pragma once

#include "src/cuda/common/device_utils.cuh"
#include "src/cuda/sm90/indexer/index_topk_select.cuh"

namespace flashmsa::cuda {

constexpr int kWarpTopkMaxBlocks = 1024;  // 32 keys a lane
constexpr int kWarpTopkWarps = 8;         // rows (warps) a CTA of index_topk_warp_kernel

// A warp's shared memory: the sorted path's candidates; the general path's selected ids and keys,
// for the score order's rank sort.
struct WarpTopkScratch {
  std::uint64_t candidates[32];
  std::int32_t ids[kMaxTopk];
  std::uint32_t keys[kMaxTopk];
};

// A key and its block id as one orderable value: the larger key first, an equal key by the
// smaller id.
__device__ __forceinline__ std::uint64_t rank_composite(std::uint32_t key, int id) {
  return std::uint64_t{key} << 32 | ~static_cast<std::uint32_t>(id);
}

// A bitonic sort of one value a lane across the warp (lane 0 first): runs of 2, 4, ... 32 lanes
// sorted in alternating directions and merged, the last run the whole warp in the asked order.
template <bool kDescending, class T>
__device__ __forceinline__ T warp_bitonic_sort(T v, int lane) {
#pragma unroll
  for (int size = 2; size <= 32; size *= 2) {
#pragma unroll
    for (int stride = size / 2; stride > 0; stride /= 2) {
      const T other = __shfl_xor_sync(0xffffffffu, v, stride);
      const bool keep_larger = (((lane & size) == 0) == kDescending) == ((lane & stride) == 0);
      v = (other > v) == keep_larger ? other : v;
    }
  }
  return v;
}

// The top k (1 <= k <= 32 < nvb) from the keys at or above the k-th largest lane maximum, sorted,
// written in p.order; false (nothing written) where more than 32 keys are.
template <int kPerLane>
__device__ __forceinline__ bool warp_topk_sorted(const IndexTopkParams& p,
                                                 const std::uint32_t (&key)[kPerLane], int k,
                                                 int lane, std::int32_t* out, WarpTopkScratch& s) {
  std::uint64_t c;
  if constexpr (kPerLane == 1) {
    // Every key is a candidate; a padding lane's key 0 ranks below the k real ones (nvb > k).
    c = rank_composite(key[0], lane);
  } else {
    // Every lane holds a real key (nvb > 32).
    std::uint32_t lane_max = key[0];
#pragma unroll
    for (int j = 1; j < kPerLane; ++j) lane_max = max(lane_max, key[j]);
    const std::uint32_t bound =
        __shfl_sync(0xffffffffu, warp_bitonic_sort<true>(lane_max, lane), k - 1);
    std::uint32_t chosen = 0;  // bit j: key j is a candidate
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) chosen |= static_cast<std::uint32_t>(key[j] >= bound) << j;
    const int candidates =
        static_cast<int>(__reduce_add_sync(0xffffffffu, static_cast<unsigned>(__popc(chosen))));
    if (candidates > 32) return false;
    // One a lane through shared memory, key j of every lane after key j - 1's.
    const std::uint32_t lanes_below = (1u << lane) - 1u;
    int placed = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const bool mine = chosen >> j & 1u;
      const std::uint32_t lanes = __ballot_sync(0xffffffffu, mine);
      if (mine)
        s.candidates[placed + __popc(lanes & lanes_below)] = rank_composite(key[j], 32 * j + lane);
      placed += __popc(lanes);
    }
    __syncwarp();
    c = lane < candidates ? s.candidates[lane] : 0;
    __syncwarp();  // read before a later row's writes
  }
  c = warp_bitonic_sort<true>(c, lane);
  allow_next_kernel();  // the attention's CTAs launch while the ids are written
  if (p.order == TopkOrder::kScoreDesc) {
    if (lane < k)
      out[lane * p.topk_stride[2]] = static_cast<std::int32_t>(~static_cast<std::uint32_t>(c));
    return true;
  }
  // The set: the composites at or above the k-th (exactly k: ids are distinct), placed in
  // ascending id order. Ascending ids end with the local blocks (the highest visible ids):
  // ascending and local_last coincide.
  const std::uint64_t kth = __shfl_sync(0xffffffffu, c, k - 1);
  const std::uint32_t lanes_below = (1u << lane) - 1u;
  int taken_before = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const bool take = rank_composite(key[j], 32 * j + lane) >= kth;
    const std::uint32_t taken_lanes = __ballot_sync(0xffffffffu, take);
    if (take)
      out[(taken_before + __popc(taken_lanes & lanes_below)) * p.topk_stride[2]] = 32 * j + lane;
    taken_before += __popc(taken_lanes);
  }
  return true;
}

// Row t's top-k for `kv_head` by the calling warp, written in p.order (-1 past k), with the row's
// block_scores when asked for. kPerLane * 32 >= nvb, the row's visible blocks.
template <int kPerLane>
__device__ __forceinline__ void warp_topk_row(const IndexTopkParams& p, std::int64_t t, int kv_head,
                                              int nvb, int lane, WarpTopkScratch& s) {
  const int k = min(p.topk, nvb);
  const std::int64_t head_stride = p.chunk.rows() * p.max_blocks;
  const float* row_scores =
      p.scores + std::int64_t{kv_head} * p.group * head_stride + (t - p.chunk.begin) * p.max_blocks;

  // Every load of the row in flight before the first compare (the other heads of a group, one
  // head at a time, fold into the first's values as they come: no second array of registers).
  float best[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int b = 32 * j + lane;
    best[j] = b < nvb ? row_scores[b] : 0.0f;
  }
  for (int g = 1; g < p.group; ++g) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int b = 32 * j + lane;
      if (b < nvb) best[j] = group_max(best[j], row_scores[g * head_stride + b]);
    }
  }

  float* block_scores = p.block_scores ? p.block_scores + kv_head * p.block_scores_stride[0] +
                                             t * p.block_scores_stride[1]
                                       : nullptr;
  const int first_local = max(0, nvb - p.local);
  // Past the visible blocks the key is 0, below every real key (orderable_bits of any float is
  // at least 0x007fffff, that of -inf), so no candidate of the search counts it.
  std::uint32_t key[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int b = 32 * j + lane;
    const std::uint32_t bits = selection_key(p, b, first_local, best[j]);
    key[j] = b < nvb ? bits : 0u;
    if (block_scores && b < p.block_scores_width) {
      block_scores[b * p.block_scores_stride[2]] = b < nvb ? best[j] : -INFINITY;
    }
  }
  if (block_scores) {
    for (int b = 32 * kPerLane + lane; b < p.block_scores_width; b += 32) {
      block_scores[b * p.block_scores_stride[2]] = -INFINITY;
    }
  }

  std::int32_t* out = p.topk_out + kv_head * p.topk_stride[0] + t * p.topk_stride[1];
  if (nvb > k && k >= 1 && k <= 32 && warp_topk_sorted(p, key, k, lane, out, s)) {
    for (int i = k + lane; i < p.topk; i += 32) out[i * p.topk_stride[2]] = -1;
    return;
  }

  // Keys above `threshold` are taken, then the first need_equal keys equal to it by id. With at
  // most k blocks, all of them (every real key is above 0).
  std::uint32_t threshold = 0;
  int need_equal = 0;
  if (nvb > k) {
    // The largest value with at least k keys at or above it is the k-th largest key T. For
    // k <= 32: every lane's largest key is at least the smallest of them, low, so 32 keys are and
    // low <= T <= high (the largest key); T then has the bits above the highest one where low
    // and high differ, and the search starts below them (a row's scores share their sign and
    // most of their exponent: several steps fewer).
    std::uint32_t lane_max = key[0];
#pragma unroll
    for (int j = 1; j < kPerLane; ++j) lane_max = max(lane_max, key[j]);
    const std::uint32_t low = __reduce_min_sync(0xffffffffu, lane_max);
    const std::uint32_t high = __reduce_max_sync(0xffffffffu, lane_max);
    const std::uint32_t differ = k <= 32 ? low ^ high : ~0u;
    const int first_bit = differ == 0 ? -1 : 31 - __clz(static_cast<int>(differ));
    std::uint32_t prefix = first_bit < 0 ? high : high & ~(~0u >> (31 - first_bit));
    bool exact = false;
    for (int bit = first_bit; bit >= 0 && !exact; --bit) {
      const std::uint32_t candidate = prefix | (1u << bit);
      // The lane's count as a sum of independent terms (a running sum made a chain of two
      // dependent instructions a key).
      int at_or_above[kPerLane];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) at_or_above[j] = key[j] >= candidate;
#pragma unroll
      for (int width = 1; width < kPerLane; width *= 2) {
#pragma unroll
        for (int j = 0; j + width < kPerLane; j += 2 * width)
          at_or_above[j] += at_or_above[j + width];
      }
      const int count =
          static_cast<int>(__reduce_add_sync(0xffffffffu, static_cast<unsigned>(at_or_above[0])));
      if (count >= k) {
        prefix = candidate;
        exact = count == k;  // exactly the k keys at or above prefix: no tie can cross it
      }
    }
    if (exact) {
      threshold = prefix - 1;
    } else {
      int above = 0;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) above += key[j] > prefix;
      threshold = prefix;
      need_equal =
          k - static_cast<int>(__reduce_add_sync(0xffffffffu, static_cast<unsigned>(above)));
    }
  }
  allow_next_kernel();  // the attention's CTAs launch while the ids are written

  const bool by_score = p.order == TopkOrder::kScoreDesc;
  const std::uint32_t lanes_below = (1u << lane) - 1u;
  int taken_before = 0, equal_before = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int b = 32 * j + lane;
    const bool equal = key[j] == threshold;  // a padding key 0 only where need_equal is 0
    const std::uint32_t equal_lanes = __ballot_sync(0xffffffffu, equal);
    const bool take = key[j] > threshold ||
                      (equal && equal_before + __popc(equal_lanes & lanes_below) < need_equal);
    equal_before += __popc(equal_lanes);
    const std::uint32_t taken_lanes = __ballot_sync(0xffffffffu, take);
    if (take) {
      const int at = taken_before + __popc(taken_lanes & lanes_below);
      if (by_score) {
        s.ids[at] = b;
        s.keys[at] = key[j];
      } else {
        // Ascending ids end with the local blocks (the highest visible ids): ascending and
        // local_last coincide.
        out[at * p.topk_stride[2]] = b;
      }
    }
    taken_before += __popc(taken_lanes);
  }
  if (by_score) {
    __syncwarp();
    // Rank by (key desc, id asc); the ids are in ascending order, so an equal key ranks first
    // where its index is smaller.
    for (int i = lane; i < k; i += 32) {
      const std::uint32_t mine = s.keys[i];
      int rank = 0;
      for (int j = 0; j < k; ++j) {
        const std::uint32_t other = s.keys[j];
        rank += other > mine || (other == mine && j < i);
      }
      out[rank * p.topk_stride[2]] = s.ids[i];
    }
  }
  for (int i = k + lane; i < p.topk; i += 32) out[i * p.topk_stride[2]] = -1;
}

}  // namespace flashmsa::cuda
