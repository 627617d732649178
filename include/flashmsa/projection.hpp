// The fused quantized Q/K/V + index projection (spec sections 3 and 9): one FP8 E4M3
// weight per tensor-parallel rank whose output channels are exactly the producer's input row of
// that rank, [q (Hq*D) | k (Hkv*D) | v (Hkv*D) | index q (Hidx*Di) | index k (Di)], so that
// hidden states -> projection -> produce_qkv_index needs no reshuffling in between.
//
//   auto packed = flashmsa::pack_qkv_index_projection(config, 8, rank, weights);  // once
//   // upload packed.weight / packed.scale to the GPU once; then per step, on a stream:
//   flashmsa::project_qkv_index({weight, scale}, hidden_states, fused, workspace, {.stream = s});
//   flashmsa::produce_qkv_index(config, {.qkv_index = fused, ...}, ...);
//
// Packed layout, version 1 (kProjectionLayoutVersion):
//   weight [out_features, hidden] E4M3 codes, row-major: each output channel's hidden values
//          contiguous (the N x K, K-major operand of an FP8 GEMM)
//   scale  [out_features] fp32 per output channel: W[n, h] ~= e4m3(weight[n, h]) * scale[n],
//          scale = max |W[n, :]| / 448 (the E4M3 maximum), 1 for an all-zero channel; codes are
//          the saturating round-to-nearest of W / scale
// Output channel n of a rank comes from (projection_source):
//   [0, Hq*D)                 W_q rows of the rank's q heads
//   next Hkv*D, then Hkv*D    W_k, then W_v rows of the rank's kv heads (replicated kv heads:
//                             every rank that serves one carries it)
//   next Hidx*Di              W_index_q rows of the index heads sharded with those kv heads
//   last Di                   W_index_k, replicated on every rank
// Head counts and dims are the rank's (Config::for_tensor_parallel); the weights are the whole
// layer's.
#pragma once

#include <cstdint>
#include <vector>

#include "flashmsa/config.hpp"
#include "flashmsa/ops.hpp"
#include "flashmsa/tensor.hpp"

namespace flashmsa {

inline constexpr int kProjectionLayoutVersion = 1;

// The layer's bf16 projection weights, [out, hidden] each on the host (last dim contiguous):
// q [Hq*D], k and v [Hkv*D], index_q [Hidx*Di], index_k [Di] rows, all heads of the model.
struct ProjectionWeights {
  TensorView q, k, v, index_q, index_k;
};

enum class ProjectionSource { kQ, kK, kV, kIndexQ, kIndexK };

// One output channel's origin: which weight and which of its rows.
struct ProjectionRow {
  ProjectionSource source;
  std::int64_t row;
};

struct PackedProjection {
  int version = kProjectionLayoutVersion;
  std::int64_t hidden = 0, out_features = 0;
  std::vector<std::uint8_t> weight;  // [out_features, hidden] E4M3 codes
  std::vector<float> scale;          // [out_features]
};

// The fused row width of one rank: Hq*D + 2*Hkv*D + Hidx*Di + Di of its per-rank config.
std::int64_t projection_out_features(const Config& rank_config);

// Where output channel `n` of rank `rank` of `tp_size` comes from (layout above). Throws naming
// the argument for a bad tp_size / rank (as Config::for_tensor_parallel) or n out of range.
ProjectionRow projection_source(const Config& layer, int tp_size, int rank, std::int64_t n,
                                const ModelHeads& model = {});

// Packs rank `rank` of `tp_size`'s channels of the layer's weights (layout version 1). Checks
// every weight's dtype (bf16), device (host) and shape against the layer, naming the argument,
// and that the rank's weight rows are finite.
PackedProjection pack_qkv_index_projection(const Config& layer, int tp_size, int rank,
                                           const ProjectionWeights& weights,
                                           const ModelHeads& model = {});

// The projection on the CPU, the oracle of a GPU path: hidden [T, hidden] bf16 -> per token E4M3
// (scale max |x| / 448, 1 for an all-zero token; saturating round-to-nearest) -> fp32 dot products
// of the dequantized values -> out [T, out_features] bf16 (round to nearest even). Host tensors.
// A token with a NaN or infinity gets NaN outputs (never hidden).
void project_qkv_index_cpu(const PackedProjection& packed, const TensorView& hidden,
                           const TensorView& out);

// A packed weight where the projection reads it (both tensors on one device, contiguous):
// weight fp8_e4m3 [out_features, hidden] codes and scale fp32 [out_features], as packed.
struct ProjectionWeightView {
  TensorView weight, scale;
};

// Bytes of device workspace project_qkv_index needs for up to `max_tokens` tokens of width
// `hidden` on the CUDA backend (the E4M3 activations, their scales and the GEMM's scratch). A
// buffer sized for the largest batch serves every smaller one and every captured graph.
std::int64_t projection_workspace_bytes(std::int64_t max_tokens, std::int64_t hidden);

// The projection on the tensors' device: hidden [T, hidden] bf16 -> out [T, out_features] bf16 (the
// producer's qkv_index input), with the numerics of project_qkv_index_cpu. CUDA: each token is
// quantized to E4M3 (its scale max |x| / 448), then the FP8 product with the per-token and
// per-channel scales applied after the sums writes bf16: for up to 8 tokens a weight-streaming
// kernel, above a cuBLASLt FP8 GEMM (outer-vector scaling, no fast accumulation); on
// options.stream, no host sync, CUDA-graph capturable. The first GEMM call per (T, out_features,
// hidden) shape times up to 8 of cuBLASLt's algorithms on the call's data and keeps the fastest (a
// host synchronisation, once per shape): make it before capturing (inside a capture it takes
// cuBLASLt's first choice, also for every later call of that shape). `workspace` (uint8, 256-byte
// aligned, projection_workspace_bytes) is CUDA only; the CPU backend ignores it. hidden % 16 == 0
// and out_features % 8 == 0 on CUDA (FP8 GEMM operand alignment), which every Config satisfies.
void project_qkv_index(const ProjectionWeightView& weights, const TensorView& hidden,
                       const TensorView& out, const TensorView& workspace,
                       const OpOptions& options = {});

}  // namespace flashmsa
