// The device scratch of the CUDA attention (attention_workspace_bytes) and the decode split rule.
// Host-only arithmetic, shared by the op layer and the CUDA host code.
//
// Prefill keeps the plan of the batch's rows there. Decode needs none: the splits of a row tile
// run as one thread-block cluster and merge through distributed shared memory. The split count
// depends only on the batch shape (never on lengths), so a captured CUDA graph stays valid.
#pragma once

#include <algorithm>
#include <array>
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
// <= 128 registers a thread and half the shared memory each).
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

// Thread-block clusters of each size (1..kAttentionDecodeMaxSplits CTAs) a decode kernel runs at
// once on the device: the CUDA occupancy calculator's answer for the kernel (its CTAs an SM, and
// how the SMs group into GPCs, which a cluster may not straddle). Far fewer than SMs / size: on
// the H200 (132 SMs) a one-CTA-an-SM kernel runs 132, 66, 39, 30, 22, 17, 15, 15 clusters of
// 1..8 CTAs, a two-CTAs-an-SM kernel 264, 132, 79, 62, 47, 39, 32, 30.
using DecodeClusterWave = std::array<std::int64_t, kAttentionDecodeMaxSplits + 1>;  // [size]

// Splits of each (request, row tile, kv head)'s selected pages, which run as one cluster: the
// most (at most one per page a tile can select, at most kAttentionDecodeMaxSplits) whose clusters
// all run at once (`wave`); one split where even clusters of two would not. A second wave of
// clusters costs nearly a whole CTA's time again: a CTA pays a fixed cost (union, first page,
// epilogue, merge) besides its pages (H200: fp8 8 x 32K had 32 clusters of 8 where 30 run at once).
constexpr std::int64_t attention_decode_splits(std::int64_t num_requests,
                                               std::int64_t decode_query_len, std::int64_t kv_heads,
                                               std::int64_t topk_width, bool register_tiles,
                                               const DecodeClusterWave& wave) {
  const std::int64_t rows =
      attention_decode_tile_rows(num_requests, decode_query_len, kv_heads, register_tiles);
  const std::int64_t tiles = num_requests * ((decode_query_len + rows - 1) / rows) * kv_heads;
  const std::int64_t most =
      std::clamp<std::int64_t>(rows * topk_width, 1, kAttentionDecodeMaxSplits);
  for (std::int64_t splits = most; splits > 1; --splits) {
    if (tiles <= wave[static_cast<std::size_t>(splits)]) return splits;
  }
  return 1;
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
