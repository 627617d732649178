// The index scoring kernel's shapes and the shared memory they take per index-cache format: read
// by the kernel and by its host launchers.
#pragma once

#include "src/cuda/sm90/kv_format.hpp"

namespace flashmsa::cuda {

template <int kVectors_, int kWarpsM_, int kWarpsN_, int kStages_>
struct IndexScoreTraits {
  static constexpr int kVectors = kVectors_;  // (row, index head) pairs per tile
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_, kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kPageTokens = 128, kDim = 128;
  static constexpr int kWarpRows = kVectors / kWarpsM, kMTiles = kWarpRows / 16;
  static constexpr int kWarpCols = kPageTokens / kWarpsN, kNTiles = kWarpCols / 8;
  static_assert(kMTiles >= 1 && kWarpRows % 16 == 0 && kNTiles % 2 == 0);
};

// Decode (prefill is index_prefill_kernel's): one request's rows, dql x Hidx <= 16 or <= 64 with
// 4 warps splitting each page's keys, up to 256 (16 index heads) with 8 warps of 64 x 64.
using IndexScoreDecodeTraits16 = IndexScoreTraits<16, 1, 4, 3>;
using IndexScoreDecodeTraits64 = IndexScoreTraits<64, 1, 4, 3>;
using IndexScoreDecodeTraits256 = IndexScoreTraits<256, 4, 2, 2>;

// E4M3 keys against E4M3 queries (the fp8 indexer) are multiplied as they are by the E4M3
// mma.sync (on sm_90 ptxas expands it into f16 conversions and f16 MMAs); every other pairing of a
// quantized cache is widened to bf16 first (below: where).
template <KvFormat kFormat, bool kQueryFp8>
constexpr bool index_score_uses_fp8_mma() {
  return kFormat == KvFormat::kE4m3 && kQueryFp8;
}

// NVFP4 keys against bf16 queries on the decode tiles (one row of warps, each warp its own keys):
// every warp widens its keys' codes in registers straight into MMA fragments, the block scale
// multiplied in (register_qk's kNvfp4ScaledDown: code x scale x 2^-63, exact; each query
// vector is stored x 2^(E + 63) with E a power that puts its largest finite magnitude in [1, 2),
// and its block maxima are multiplied back by 2^-E). The 256-vector tile's four warp rows would
// each widen the same keys: it keeps the shared-memory pass.
template <class Traits, KvFormat kFormat, bool kQueryFp8>
constexpr bool index_score_widens_in_registers() {
  return kFormat == KvFormat::kNvfp4 && !kQueryFp8 && Traits::kWarpsM == 1;
}

// Every other pairing of a quantized cache without the fp8 MMA is widened to bf16 tiles in shared
// memory first.
template <class Traits, KvFormat kFormat, bool kQueryFp8>
constexpr bool index_score_widens_in_shared() {
  return kFormat != KvFormat::kNative16 && !index_score_uses_fp8_mma<kFormat, kQueryFp8>() &&
         !index_score_widens_in_registers<Traits, kFormat, kQueryFp8>();
}

// The decode tiles whose keys need no shared-memory pass (E4M3 x E4M3 on the E4M3 mma.sync, NVFP4
// widened in registers): each warp streams its own keys through a ring of its own (kStages stages
// of its kWarpCols keys, the CTA ring's bytes in all) and leaves its block maxima for
// kIndexScoreMaxGroup pages in shared memory, which the CTA merges and stores after each group:
// two CTA barriers a group instead of two a page. (Not on the 64-vector decode tile: its E4M3
// instance spilled.)
template <class Traits, KvFormat kFormat, bool kQueryFp8>
constexpr bool index_score_warp_rings() {
  return Traits::kWarpsM == 1 && Traits::kMTiles == 1 &&
         (index_score_uses_fp8_mma<kFormat, kQueryFp8>() ||
          index_score_widens_in_registers<Traits, kFormat, kQueryFp8>());
}
inline constexpr int kIndexScoreMaxGroup = 8;
// The most pages one CTA scores: one block-table entry a lane of each warp (the kernel's fills
// read a page's entry by a shuffle, not by a global load in the page loop).
inline constexpr int kIndexScoreMaxSplitPages = 32;

// E4M3 x E4M3 on those warp-ring tiles: the query tile widened once to f16 and each k step run as
// qk_step_e4m3_f16 (what ptxas makes of the fp8 mma.sync on sm_90, less the query's conversion
// at every page and the FADDs).
template <class Traits, KvFormat kFormat, bool kQueryFp8>
constexpr bool index_score_fp8_as_f16() {
  return index_score_warp_rings<Traits, kFormat, kQueryFp8>() &&
         index_score_uses_fp8_mma<kFormat, kQueryFp8>();
}

// The shared memory, in the kernel's order: the query tile (E4M3 as it is for the fp8 MMA, f16 for
// the decode tiles' f16 route, else bf16), the ring(s), the widened tile, the block maxima slots,
// the register-widened tiles' 2^-E per query vector.
template <class Traits, KvFormat kFormat, bool kQueryFp8>
constexpr int index_score_query_bytes() {
  return Traits::kVectors * (index_score_uses_fp8_mma<kFormat, kQueryFp8>() &&
                                     !index_score_fp8_as_f16<Traits, kFormat, kQueryFp8>()
                                 ? 128
                                 : 256);
}
// (One ring depth for every format: fp8 pages with the bf16 ring's bytes, 6 stages and two CTAs
// per SM instead of 3 and four, scored at 1.9 TB/s instead of 2.6 on the H200.)
template <class Traits, KvFormat kFormat, bool kQueryFp8>
constexpr int index_score_ring_bytes() {
  return index_score_warp_rings<Traits, kFormat, kQueryFp8>()
             ? Traits::kWarpsN * Traits::kStages * raw_plane_bytes<kFormat, Traits::kWarpCols>()
             : Traits::kStages * raw_plane_bytes<kFormat>();
}
template <class Traits, KvFormat kFormat, bool kQueryFp8>
constexpr int index_score_widened_bytes() {
  return index_score_widens_in_shared<Traits, kFormat, kQueryFp8>() ? 128 * 256 : 0;
}
template <class Traits, KvFormat kFormat, bool kQueryFp8>
constexpr int index_score_smem_bytes() {
  constexpr bool kWarpRings = index_score_warp_rings<Traits, kFormat, kQueryFp8>();
  return index_score_query_bytes<Traits, kFormat, kQueryFp8>() +
         index_score_ring_bytes<Traits, kFormat, kQueryFp8>() +
         index_score_widened_bytes<Traits, kFormat, kQueryFp8>() +
         (kWarpRings ? kIndexScoreMaxGroup : 1) * Traits::kWarpsN * Traits::kVectors * 4 +
         (index_score_widens_in_registers<Traits, kFormat, kQueryFp8>() ? Traits::kVectors * 4 : 0);
}

}  // namespace flashmsa::cuda
