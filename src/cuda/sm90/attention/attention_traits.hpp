// The attention kernel's shapes (rows per CTA, warps per row, pipeline depth) and the shared
// memory they take per cache format: read by the kernel and by its host launchers.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "src/attention_workspace.hpp"
#include "src/cuda/sm90/kv_format.hpp"

namespace flashmsa::cuda {

template <int kRows_, int kKeySplit_, int kBf16Stages_, bool kClusterSplits_,
          bool kSelects_ = false, bool kTwoPerSm_ = false>
struct AttentionTraits {
  static constexpr int kRows = kRows_;          // query rows per CTA: one per warp row
  static constexpr int kKeySplit = kKeySplit_;  // warps sharing a row, each with a key part
  // Whether a row tile's pages may be split over a cluster of CTAs that merge their rows (decode).
  static constexpr bool kClusterSplits = kClusterSplits_;
  // Whether the tile selects its row's blocks itself from the indexer's block scores
  // (AttentionParams::select) instead of reading a top-k list. A kernel of its own: the selection
  // code inside the list-reading kernels measurably slowed their page loop (schedules differ).
  static constexpr bool kSelects = kSelects_;
  // 1-row tiles of 16-bit caches sized for two CTAs an SM (attention_warp_rings): for grids of
  // more tiles than one wave of one-CTA-an-SM tiles holds (1-row tiles of the other caches are
  // sized so anyway).
  static constexpr bool kTwoPerSm = kTwoPerSm_;
  // Ring stages for bf16 pages; smaller pages get more (attention_stages).
  static constexpr int kBf16Stages = kBf16Stages_;
  static constexpr int kWarps = kRows * kKeySplit, kThreads = 32 * kWarps;
  static constexpr int kWarpKeys = 128 / kKeySplit;
  static constexpr int kChunkKeys = kWarpKeys < 64 ? kWarpKeys : 64;  // keys per softmax step
  static constexpr int kMaxTopk = 64;
  static constexpr int kMaxUnion = kRows * kMaxTopk;
  static constexpr int kWindow = 2048;        // blocks marked per pass of the union build
  static constexpr int kPartialStride = 132;  // floats per epilogue row (4 of padding: banks)
  static_assert(kChunkKeys % 16 == 0);
};

// Prefill and dense of 8- and 4-bit caches: 8 rows share each page (coherent selections: 8x
// fewer loads per MMA).
using AttentionPrefillTraits = AttentionTraits<8, 1, 2, false>;
// Decode, dql = 1: one row, 8 warps split each page's keys (latency hiding: one CTA per SM
// holds the ring of 3 bf16 pages).
using AttentionDecode1Traits = AttentionTraits<1, 8, 3, true>;
// Decode, dql = 1, the decode step in one call (sparse_decode_step): the 1-row tile that makes
// its row's selection before its pages.
using AttentionDecode1SelectTraits = AttentionTraits<1, 8, 3, true, true>;
// The same two for 16-bit caches in grids of more tiles than the two above run in one wave: two
// CTAs an SM, each warp streaming its keys' K rows and V rows through a ring of its own, a plane a
// stage (a 16-bit page is 64 KB: 1.5 pages in flight a CTA instead of the 3 whole pages of one CTA
// an SM, so that a second CTA's pages stream while one CTA selects, starts or ends).
using AttentionDecode1TwoPerSmTraits = AttentionTraits<1, 8, 3, true, false, true>;
using AttentionDecode1TwoPerSmSelectTraits = AttentionTraits<1, 8, 3, true, true, true>;
// Decode, dql >= 2: tiles of 4 rows (speculative tokens share their request's pages), two warps
// per row.
using AttentionDecodeSpecTraits = AttentionTraits<4, 2, 3, true>;

// The stage bytes a 1-row decode tile lends its own selection (AttentionDecode1SelectTraits)
// before the ring starts: the row's keys (4 bytes a block) and the selection's scratch.
inline constexpr int kAttentionSelectSmem = 64 * 1024;

// Shared memory before the pages: the queries and the union lists.
template <class Traits>
constexpr int attention_query_and_union_bytes() {
  return Traits::kRows * 16 * 256 + Traits::kMaxUnion * 12;
}

// 1-row tiles (decode) of an E4M3 / E5M2 / NVFP4 cache with bf16 queries convert K and V in
// registers (register_keys.cuh): each warp reads only its own keys' codes, so each warp streams
// them through a ring of its own (no CTA barrier a page). kTwoPerSm tiles of a 16-bit cache stream
// their own keys the same way (nothing to convert), a plane a stage.
template <class Traits, KvFormat kFormat, class Elem>
constexpr bool attention_warp_rings() {
  if constexpr (kFormat == KvFormat::kNative16) {
    return Traits::kRows == 1 && Traits::kTwoPerSm;
  } else {
    return Traits::kRows == 1 && std::is_same_v<Elem, __nv_bfloat16>;
  }
}
// Whether a warp ring's stage holds one plane (K rows or V rows) of the warp's keys instead of
// both: 16-bit rows, which make 8 KB a warp a page.
template <KvFormat kFormat>
constexpr bool attention_plane_stages() {
  return kFormat == KvFormat::kNative16;
}
// A warp ring's stage: the warp's keys' K rows, then their V rows (raw planes of kWarpKeys tokens);
// one of the two for attention_plane_stages.
template <class Traits, KvFormat kFormat>
constexpr int attention_warp_stage_bytes() {
  return (attention_plane_stages<kFormat>() ? 1 : 2) *
         raw_plane_bytes<kFormat, Traits::kWarpKeys>();
}
// CTAs an SM holds: warp-ring CTAs are sized for two (<= 128 registers a thread, half the shared
// memory each: 16 warps a scheduler pair hide each other's latency), the others take one.
template <class Traits, KvFormat kFormat, class Elem>
constexpr int attention_ctas_per_sm() {
  return attention_warp_rings<Traits, kFormat, Elem>()
             ? static_cast<int>(detail::kAttentionRegisterTileCtasPerSm)
             : 1;
}
// Stages of each warp's ring: what fits beside the queries and the union lists with two CTAs an SM
// (228 KB, 1 KB of it reserved a CTA, and our 1.2 KB of static shared memory). The decode traits'
// 8 warps of 16 keys: 3 fp8 stages of 4 KB, 5 NVFP4 ones of 2.25 KB, 3 16-bit plane stages of 4 KB.
template <class Traits, KvFormat kFormat>
constexpr int attention_warp_ring_stages() {
  constexpr int kPerCta =
      228 * 1024 / static_cast<int>(detail::kAttentionRegisterTileCtasPerSm) - 1024 - 1280;
  constexpr int fixed = attention_query_and_union_bytes<Traits>();
  return (kPerCta - fixed) / Traits::kWarps / attention_warp_stage_bytes<Traits, kFormat>();
}
// A warp's share of the shared memory: its ring.
template <class Traits, KvFormat kFormat>
constexpr int attention_warp_region_bytes() {
  return attention_warp_ring_stages<Traits, kFormat>() *
         attention_warp_stage_bytes<Traits, kFormat>();
}

// A page in a raw stage: its K plane, then its V plane.
template <KvFormat kFormat>
constexpr int kv_raw_page_bytes() {
  return 2 * raw_plane_bytes<kFormat>();
}

// Shared memory besides the ring: the queries, the union lists and the widened K / V tiles.
template <class Traits, KvFormat kFormat>
constexpr int attention_fixed_smem_bytes() {
  constexpr int widened = kFormat == KvFormat::kNative16 ? 0 : 2 * 128 * 256;
  return attention_query_and_union_bytes<Traits>() + widened;
}

// The ring's stages for pages of kFormat: as many bytes as the bf16 ring (a CTA of smaller pages
// keeps as many bytes in flight), within the 227 KB a CTA may have. fp8 and NVFP4 decode CTAs get
// 4 and 8 stages where bf16 has 3: +3% for fp8 at 64 x 32K on the H200, +0% for NVFP4 (both are
// bound by their shared-memory widening, not by bytes in flight).
template <class Traits, KvFormat kFormat>
constexpr int attention_stages() {
  constexpr int kMaxSmem = 226 * 1024;  // of 227 KB: 1 KB left for static shared memory
  constexpr int by_bytes =
      Traits::kBf16Stages * kv_raw_page_bytes<KvFormat::kNative16>() / kv_raw_page_bytes<kFormat>();
  constexpr int fitting =
      (kMaxSmem - attention_fixed_smem_bytes<Traits, kFormat>()) / kv_raw_page_bytes<kFormat>();
  static_assert(fitting >= Traits::kBf16Stages, "the bf16 stage count must fit");
  return by_bytes < fitting ? by_bytes : fitting;
}

template <class Traits, KvFormat kFormat, class Elem>
constexpr int attention_smem_bytes() {
  if constexpr (attention_warp_rings<Traits, kFormat, Elem>()) {
    return attention_query_and_union_bytes<Traits>() +
           Traits::kWarps * attention_warp_region_bytes<Traits, kFormat>();
  } else {
    return attention_fixed_smem_bytes<Traits, kFormat>() +
           attention_stages<Traits, kFormat>() * kv_raw_page_bytes<kFormat>();
  }
}

}  // namespace flashmsa::cuda
