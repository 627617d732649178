// The attention kernel's shapes (rows per CTA, warps per row, pipeline depth) and the shared
// memory they take per cache format: read by the kernel and by its host launchers.
#pragma once

#include "src/cuda/sm90/kv_format.hpp"

namespace flashmsa::cuda {

template <int kRows_, int kKeySplit_, int kStages_>
struct AttentionTraits {
  static constexpr int kRows = kRows_;          // query rows per CTA: one per warp row
  static constexpr int kKeySplit = kKeySplit_;  // warps sharing a row, each with a key part
  static constexpr int kStages = kStages_;
  static constexpr int kWarps = kRows * kKeySplit, kThreads = 32 * kWarps;
  static constexpr int kWarpKeys = 128 / kKeySplit;
  static constexpr int kChunkKeys = kWarpKeys < 64 ? kWarpKeys : 64;  // keys per softmax step
  static constexpr int kMaxTopk = 64;
  static constexpr int kMaxUnion = kRows * kMaxTopk;
  static constexpr int kWindow = 2048;        // blocks marked per pass of the union build
  static constexpr int kPartialStride = 132;  // floats per epilogue row (4 of padding: banks)
  static_assert(kChunkKeys % 16 == 0);
};

// Prefill and dense: 8 rows share each page (coherent selections: 8x fewer loads per MMA).
using AttentionPrefillTraits = AttentionTraits<8, 1, 2>;
// Decode, dql = 1: one row, 8 warps split each page's keys (latency hiding: one CTA per SM
// holds the 3-page ring), 3 pages in flight.
using AttentionDecode1Traits = AttentionTraits<1, 8, 3>;
// Decode, dql >= 2: tiles of 4 rows (speculative tokens share their request's pages), two warps
// per row.
using AttentionDecodeSpecTraits = AttentionTraits<4, 2, 3>;

// A page in a raw stage: its K plane, then its V plane.
template <KvFormat kFormat>
constexpr int kv_raw_page_bytes() {
  return 2 * raw_plane_bytes<kFormat>();
}

template <class Traits, KvFormat kFormat>
constexpr int attention_smem_bytes() {
  constexpr int q = Traits::kRows * 16 * 256;
  constexpr int union_lists = Traits::kMaxUnion * 12;
  constexpr int stages = Traits::kStages * kv_raw_page_bytes<kFormat>();
  constexpr int widened = kFormat == KvFormat::kNative16 ? 0 : 2 * 128 * 256;
  return q + union_lists + stages + widened;
}

}  // namespace flashmsa::cuda
