// The fused Q/K/V + index projection's packing and its CPU path (include/flashmsa/projection.hpp).
#include "flashmsa/projection.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "flashmsa/error.hpp"
#include "flashmsa/formats/minifloat.hpp"
#include "src/cpu/gemm.hpp"
#include "src/cuda/cuda_ops.hpp"
#include "src/projection_workspace.hpp"

namespace flashmsa {

namespace {

constexpr float kE4m3Max = 448.0f;
constexpr const char* kSourceNames[] = {"weights.q", "weights.k", "weights.v", "weights.index_q",
                                        "weights.index_k"};

// The widths of one rank's fused row, in channels.
struct RowWidths {
  std::int64_t q, kv, index_q, index_k;
  std::int64_t total() const { return q + 2 * kv + index_q + index_k; }
};

RowWidths widths_of(const Config& rank_config) {
  const ResolvedHeads heads = rank_config.resolve_heads();
  return {std::int64_t{heads.num_attention_heads} * rank_config.head_dim,
          std::int64_t{heads.num_key_value_heads} * rank_config.head_dim,
          std::int64_t{rank_config.sparse_num_index_heads} * rank_config.sparse_index_dim,
          rank_config.sparse_index_dim};
}

ProjectionRow source_of(const TensorParallelRank& r, std::int64_t n) {
  const RowWidths w = widths_of(r.config);
  const std::int64_t d = r.config.head_dim, di = r.config.sparse_index_dim;
  if (n < w.q) return {ProjectionSource::kQ, r.first_q_head * d + n};
  n -= w.q;
  if (n < w.kv) return {ProjectionSource::kK, r.first_kv_head * d + n};
  n -= w.kv;
  if (n < w.kv) return {ProjectionSource::kV, r.first_kv_head * d + n};
  n -= w.kv;
  if (n < w.index_q) return {ProjectionSource::kIndexQ, r.first_index_head * di + n};
  return {ProjectionSource::kIndexK, n - w.index_q};
}

// Per-channel (or per-token) symmetric E4M3: scale = max |x| / 448 (1 when all zero), codes the
// saturating round-to-nearest of x / scale. A row with a NaN or infinity gets a NaN scale.
float quantize_row(const float* x, std::int64_t n, std::uint8_t* codes) {
  float amax = 0.0f;
  bool finite = true;
  for (std::int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::max(amax, std::fabs(x[i]));
  }
  if (!finite) {
    std::fill(codes, codes + n, std::uint8_t{0});
    return std::nanf("");
  }
  const float scale = amax > 0.0f ? amax / kE4m3Max : 1.0f;
  for (std::int64_t i = 0; i < n; ++i) codes[i] = fmt::float_to_e4m3(x[i] / scale);
  return scale;
}

// out = dequant(quantize_per_token(hidden)) . dequant(weight)^T in fp32, rounded to bf16: the
// CPU projection (project_qkv_index_cpu and project_qkv_index on host tensors).
void project_rows(const std::uint8_t* weight, const float* scale, std::int64_t n, std::int64_t k,
                  const TensorView& hidden, const TensorView& out) {
  const std::int64_t tokens = hidden.shape[0];
  // Dequantized operands in fp32; products by the CPU backend's GEMM (fp32 accumulation).
  std::vector<float> w(static_cast<std::size_t>(n * k));
  for (std::int64_t o = 0; o < n; ++o) {
    for (std::int64_t h = 0; h < k; ++h)
      w[o * k + h] = fmt::e4m3_to_float(weight[o * k + h]) * scale[o];
  }
  std::vector<float> x(static_cast<std::size_t>(tokens * k)), row(static_cast<std::size_t>(k));
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(k));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const auto* bits = hidden.as<const std::uint16_t>() + t * hidden.stride[0];
    for (std::int64_t h = 0; h < k; ++h) row[h] = fmt::bf16_to_float(bits[h]);
    const float s = quantize_row(row.data(), k, codes.data());
    for (std::int64_t h = 0; h < k; ++h) x[t * k + h] = fmt::e4m3_to_float(codes[h]) * s;
  }
  std::vector<float> y(static_cast<std::size_t>(tokens * n));
  cpu::gemm_nt(tokens, n, k, 1.0f, x.data(), k, w.data(), k, 0.0f, y.data(), n);
  for (std::int64_t t = 0; t < tokens; ++t) {
    auto* dst = out.as<std::uint16_t>() + t * out.stride[0];
    for (std::int64_t o = 0; o < n; ++o) dst[o] = fmt::float_to_bf16(y[t * n + o]);
  }
}

}  // namespace

std::int64_t projection_out_features(const Config& rank_config) {
  return widths_of(rank_config).total();
}

ProjectionRow projection_source(const Config& layer, int tp_size, int rank, std::int64_t n,
                                const ModelHeads& model) {
  const TensorParallelRank r = layer.for_tensor_parallel(tp_size, rank, model);
  const std::int64_t total = widths_of(r.config).total();
  FLASHMSA_CHECK_ARG(n >= 0 && n < total, "n must be in [0, ", total,
                     ") (the rank's fused row width), got ", n);
  return source_of(r, n);
}

PackedProjection pack_qkv_index_projection(const Config& layer, int tp_size, int rank,
                                           const ProjectionWeights& weights,
                                           const ModelHeads& model) {
  const TensorParallelRank r = layer.for_tensor_parallel(tp_size, rank, model);
  const ResolvedHeads heads = layer.resolve_heads(model);
  const std::int64_t hidden = weights.q.rank == 2 ? weights.q.shape[1] : -1;
  FLASHMSA_CHECK_ARG(hidden > 0,
                     "weights.q must be [num_attention_heads * head_dim, hidden] with "
                     "hidden > 0, got rank ",
                     weights.q.rank);
  const std::int64_t d = layer.head_dim, di = layer.sparse_index_dim;
  check_tensor(weights.q, "weights.q", DType::kBf16, Device::kCpu,
               {heads.num_attention_heads * d, hidden});
  check_tensor(weights.k, "weights.k", DType::kBf16, Device::kCpu,
               {heads.num_key_value_heads * d, hidden});
  check_tensor(weights.v, "weights.v", DType::kBf16, Device::kCpu,
               {heads.num_key_value_heads * d, hidden});
  check_tensor(weights.index_q, "weights.index_q", DType::kBf16, Device::kCpu,
               {layer.sparse_num_index_heads * di, hidden});
  check_tensor(weights.index_k, "weights.index_k", DType::kBf16, Device::kCpu, {di, hidden});

  PackedProjection p;
  p.hidden = hidden;
  p.out_features = widths_of(r.config).total();
  p.weight.resize(static_cast<std::size_t>(p.out_features * hidden));
  p.scale.resize(static_cast<std::size_t>(p.out_features));
  std::vector<float> row(static_cast<std::size_t>(hidden));
  for (std::int64_t n = 0; n < p.out_features; ++n) {
    const ProjectionRow src = source_of(r, n);
    const TensorView& w = src.source == ProjectionSource::kQ        ? weights.q
                          : src.source == ProjectionSource::kK      ? weights.k
                          : src.source == ProjectionSource::kV      ? weights.v
                          : src.source == ProjectionSource::kIndexQ ? weights.index_q
                                                                    : weights.index_k;
    const auto* bits = w.as<const std::uint16_t>() + src.row * w.stride[0];
    for (std::int64_t h = 0; h < hidden; ++h) row[h] = fmt::bf16_to_float(bits[h]);
    p.scale[n] = quantize_row(row.data(), hidden, p.weight.data() + n * hidden);
    FLASHMSA_CHECK_ARG(!std::isnan(p.scale[n]), "weights must be finite, got a NaN or infinity in ",
                       kSourceNames[static_cast<int>(src.source)], " row ", src.row);
  }
  return p;
}

void project_qkv_index_cpu(const PackedProjection& packed, const TensorView& hidden,
                           const TensorView& out) {
  FLASHMSA_CHECK_ARG(packed.version == kProjectionLayoutVersion, "packed must have layout version ",
                     kProjectionLayoutVersion, ", got ", packed.version);
  FLASHMSA_CHECK_ARG(
      packed.hidden > 0 && packed.out_features > 0 &&
          std::int64_t(packed.weight.size()) == packed.out_features * packed.hidden &&
          std::int64_t(packed.scale.size()) == packed.out_features,
      "packed must hold out_features x hidden codes and out_features scales, got ",
      packed.weight.size(), " codes and ", packed.scale.size(), " scales for ", packed.out_features,
      " x ", packed.hidden);
  check_tensor(hidden, "hidden", DType::kBf16, Device::kCpu, {-1, packed.hidden});
  const std::int64_t tokens = hidden.shape[0];
  check_output_tensor(out, "out", DType::kBf16, Device::kCpu, {tokens, packed.out_features});
  if (tokens == 0) return;

  project_rows(packed.weight.data(), packed.scale.data(), packed.out_features, packed.hidden,
               hidden, out);
}

std::int64_t projection_workspace_bytes(std::int64_t max_tokens, std::int64_t hidden) {
  FLASHMSA_CHECK_ARG(max_tokens >= 0, "max_tokens must be >= 0, got ", max_tokens);
  FLASHMSA_CHECK_ARG(hidden > 0, "hidden must be > 0, got ", hidden);
  return detail::projection_workspace_layout(max_tokens, hidden).total;
}

void project_qkv_index(const ProjectionWeightView& weights, const TensorView& hidden,
                       const TensorView& out, const TensorView& workspace,
                       const OpOptions& options) {
  const Device device = weights.weight.device;
  check_tensor(weights.weight, "weights.weight", DType::kFp8E4m3, device, {-1, -1});
  const std::int64_t n = weights.weight.shape[0], k = weights.weight.shape[1];
  FLASHMSA_CHECK_ARG(n > 0 && k > 0,
                     "weights.weight must be [out_features, hidden], both > 0, got [", n, ", ", k,
                     "]");
  FLASHMSA_CHECK_ARG(weights.weight.stride[0] == k,
                     "weights.weight must be contiguous (row stride hidden = ", k, "), got ",
                     weights.weight.stride[0]);
  check_tensor(weights.scale, "weights.scale", DType::kFp32, device, {n});
  check_tensor(hidden, "hidden", DType::kBf16, device, {-1, k});
  const std::int64_t tokens = hidden.shape[0];
  check_output_tensor(out, "out", DType::kBf16, device, {tokens, n});
  if (device == Device::kCuda) {
    FLASHMSA_CHECK_ARG(k % 16 == 0,
                       "hidden must be a multiple of 16 on the CUDA backend (FP8 GEMM ",
                       "operands), got ", k);
    FLASHMSA_CHECK_ARG(n % 8 == 0, "out_features must be a multiple of 8 on the CUDA backend, got ",
                       n);
    FLASHMSA_CHECK_ARG(hidden.stride[0] == k && out.stride[0] == n,
                       "hidden and out must have contiguous rows on the CUDA backend, got row "
                       "strides ",
                       hidden.stride[0], " and ", out.stride[0]);
    check_tensor(workspace, "workspace", DType::kUint8, device, {-1});
    cuda::project_qkv_index(weights, hidden, out, workspace, options.stream);
    return;
  }
  if (tokens == 0) return;
  project_rows(weights.weight.as<const std::uint8_t>(), weights.scale.as<const float>(), n, k,
               hidden, out);
}

}  // namespace flashmsa
