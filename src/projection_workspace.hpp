// The layout of the device scratch of the CUDA projection (projection_workspace_bytes): the
// E4M3 activations, their per-token scales and cuBLASLt's workspace, each 256-byte aligned.
#pragma once

#include <cstdint>

#include "src/index_workspace.hpp"  // align_up

namespace flashmsa::detail {

// cuBLASLt's scratch: what NVIDIA recommends for Hopper GEMMs (larger lets it pick split-K
// kernels for small token counts).
inline constexpr std::int64_t kProjectionGemmWorkspaceBytes = std::int64_t{32} << 20;

struct ProjectionWorkspaceLayout {
  std::int64_t codes = 0, scales = 0, gemm = 0;  // byte offsets
  std::int64_t total = 0;
};

constexpr ProjectionWorkspaceLayout projection_workspace_layout(std::int64_t tokens,
                                                                std::int64_t hidden) {
  ProjectionWorkspaceLayout l;
  l.codes = 0;
  l.scales = align_up(tokens * hidden, 256);
  l.gemm = l.scales + align_up(tokens * 4, 256);
  l.total = l.gemm + kProjectionGemmWorkspaceBytes;
  return l;
}

}  // namespace flashmsa::detail
