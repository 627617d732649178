// The device scratch of the CUDA attention (attention_workspace_bytes) and the decode split rule.
// Host-only arithmetic, shared by the op layer and the CUDA host code.
//
// Prefill keeps the plan of the batch's rows there. Decode needs none: the splits of a row tile
// run as one thread-block cluster and merge through distributed shared memory. The split count
// depends only on the batch shape (never on lengths), so a captured CUDA graph stays valid.
#pragma once

#include <algorithm>
#include <cstdint>

#include "src/index_workspace.hpp"

namespace flashmsa::detail {

// Decode CTAs to aim for: one wave on an H100 / H200 (132 SMs) of a kernel that holds one CTA per
// SM. A CTA has a fixed cost (union build, first-page latency, epilogue: about 11 us measured
// on the H200) besides ~1.6 us per page, so fewer, longer CTAs win once the GPU is full.
inline constexpr std::int64_t kAttentionDecodeTargetCtas = 132;
// The most splits of one row tile: they run as one cluster, and 8 CTAs is the portable cluster
// size (one decode CTA per SM: a cluster of 8 fits in any of the H100 / H200's GPCs).
inline constexpr std::int64_t kAttentionDecodeMaxSplits = 8;
// CTAs an SM of the register-tile decode kernels (attention_warp_rings in attention_traits.hpp:
// <= 128 registers a thread and half the shared memory each), whose splits fill a wave of
// kAttentionRegisterTileCtasPerSm x kAttentionDecodeTargetCtas.
inline constexpr std::int64_t kAttentionRegisterTileCtasPerSm = 2;

// How a decode batch's rows are tiled: `register_tiles` is true for the caches whose 1-row tiles
// convert in registers on per-warp rings, two CTAs an SM (E4M3 / E5M2 / NVFP4 with bf16 queries:
// attention_warp_rings in attention_traits.hpp). Those take 1-row tiles at every query length:
// on the H200 a 1-row tile's page costs less than a 4-row tile's even when no page is shared.
constexpr std::int64_t attention_decode_tile_rows(std::int64_t num_requests,
                                                  std::int64_t decode_query_len,
                                                  std::int64_t kv_heads, bool register_tiles) {
  if (decode_query_len == 1 || register_tiles) return 1;
  // Otherwise speculative rows share their request's pages in tiles of 4 (each row's keys split
  // between 2 warps), but small batches take 1-row tiles, whose 4-row tiles could not fill the
  // GPU within a cluster's splits (on the H200 the fp8 1 x 8K step at dql 4 took 36.6 us with 8
  // splits of its 4-row tiles, against 33.0 us with 33 splits before splits were capped at a
  // cluster).
  const std::int64_t four_row_tiles = num_requests * ((decode_query_len + 3) / 4) * kv_heads;
  return four_row_tiles * kAttentionDecodeMaxSplits >= kAttentionDecodeTargetCtas ? 4 : 1;
}

// Splits of each (request, row tile, kv head)'s selected pages: enough CTAs to fill the GPU,
// at most one split per page a tile can select and at most a cluster's worth. Register tiles
// (two CTAs an SM) take as many splits as keep the grid within one wave of 2 x 132 CTAs.
constexpr std::int64_t attention_decode_splits(std::int64_t num_requests,
                                               std::int64_t decode_query_len, std::int64_t kv_heads,
                                               std::int64_t topk_width, bool register_tiles) {
  const std::int64_t rows =
      attention_decode_tile_rows(num_requests, decode_query_len, kv_heads, register_tiles);
  const std::int64_t tiles = (decode_query_len + rows - 1) / rows;
  const std::int64_t ctas = std::max<std::int64_t>(1, num_requests * tiles * kv_heads);
  const std::int64_t want =
      register_tiles ? kAttentionRegisterTileCtasPerSm * kAttentionDecodeTargetCtas / ctas
                     : (kAttentionDecodeTargetCtas + ctas - 1) / ctas;
  return std::clamp<std::int64_t>(
      want, 1, std::clamp<std::int64_t>(rows * topk_width, 1, kAttentionDecodeMaxSplits));
}

struct AttentionWorkspaceLayout {
  std::int64_t request_begin = 0, request_end = 0, tile_offset = 0;  // prefill plan
  std::int64_t bytes = 0;
};

constexpr AttentionWorkspaceLayout attention_prefill_layout(std::int64_t num_requests) {
  AttentionWorkspaceLayout l;
  l.request_end = align_up(4 * num_requests, 256);
  l.tile_offset = l.request_end + align_up(4 * num_requests, 256);
  l.bytes = l.tile_offset + align_up(4 * (num_requests + 1), 256);
  return l;
}

}  // namespace flashmsa::detail
