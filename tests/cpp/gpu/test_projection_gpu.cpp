// The CUDA fused projection (project_qkv_index on device tensors) against the CPU path on the
// same random packed weights and hidden states: every output element, the E4M3 activation codes
// bit for bit, non-finite and all-zero tokens, graph replay with new inputs, bad input.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/formats/minifloat.hpp"
#include "flashmsa/projection.hpp"
#include "src/projection_workspace.hpp"
#include "tests/cpp/gpu/gpu_test_util.cuh"

namespace flashmsa {
namespace {

using test::CapturedGraph;
using test::DeviceBuffer;

// A packed weight of random E4M3 codes (every finite code occurs) and per-channel scales of
// varied magnitude: what pack_qkv_index_projection produces, without the bf16 weights.
PackedProjection random_packed(std::int64_t out_features, std::int64_t hidden, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(0, 255);
  std::uniform_real_distribution<float> unit(0.5f, 1.0f);
  PackedProjection p;
  p.hidden = hidden;
  p.out_features = out_features;
  p.weight.resize(static_cast<std::size_t>(out_features * hidden));
  for (auto& c : p.weight) {
    int v = code(rng);
    while ((v & 0x7F) == 0x7F) v = code(rng);  // no NaN codes: packing never makes them
    c = static_cast<std::uint8_t>(v);
  }
  p.scale.resize(static_cast<std::size_t>(out_features));
  for (std::int64_t n = 0; n < out_features; ++n) {
    p.scale[n] = unit(rng) * std::ldexp(1.0f, static_cast<int>(n % 9) - 12);
  }
  return p;
}

// Hidden states [tokens, hidden] bf16, normal values whose magnitude varies by token; token 1 is
// all zero when there are at least 3 tokens.
std::vector<std::uint16_t> random_hidden(std::int64_t tokens, std::int64_t hidden, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> x(static_cast<std::size_t>(tokens * hidden));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(t % 7) - 3);
    for (std::int64_t h = 0; h < hidden; ++h) {
      x[t * hidden + h] = (tokens >= 3 && t == 1) ? 0 : fmt::float_to_bf16(normal(rng) * magnitude);
    }
  }
  return x;
}

// The CPU's per-token quantization (project_qkv_index_cpu's, spelled out): the codes the device
// kernel must produce bit for bit, and the dequantized values for the error bound.
struct Quantized {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
};
Quantized quantize_tokens(const std::vector<std::uint16_t>& x, std::int64_t tokens,
                          std::int64_t hidden) {
  Quantized q{std::vector<std::uint8_t>(x.size()),
              std::vector<float>(static_cast<std::size_t>(tokens))};
  for (std::int64_t t = 0; t < tokens; ++t) {
    float amax = 0.0f;
    bool finite = true;
    for (std::int64_t h = 0; h < hidden; ++h) {
      const float v = fmt::bf16_to_float(x[t * hidden + h]);
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    const float scale = !finite ? NAN : amax > 0.0f ? amax / 448.0f : 1.0f;
    q.scales[t] = scale;
    for (std::int64_t h = 0; h < hidden; ++h) {
      q.codes[t * hidden + h] =
          finite ? fmt::float_to_e4m3(fmt::bf16_to_float(x[t * hidden + h]) / scale) : 0;
    }
  }
  return q;
}

struct DeviceProjection {
  DeviceBuffer<std::uint8_t> weight;
  DeviceBuffer<float> scale;
  explicit DeviceProjection(const PackedProjection& p) : weight(p.weight), scale(p.scale) {}
  ProjectionWeightView view(const PackedProjection& p) const {
    return {TensorView::contiguous(weight.get(), DType::kFp8E4m3, {p.out_features, p.hidden},
                                   Device::kCuda),
            TensorView::contiguous(scale.get(), DType::kFp32, {p.out_features}, Device::kCuda)};
  }
};

// Every element of the device output against the CPU path's. Both sum the same exact E4M3
// products and round once to bf16: the CPU with the scales multiplied in first, in fp32; the GPU
// on Hopper's FP8 tensor cores, whose accumulation keeps about 14 bits inside a k block before
// it is added in fp32. FlashAttention rule, twice the honest low-precision error of the two:
// 2 x (two bf16 roundings, 2^-8 relative each, + two fp32 sums, k 2^-24 sum |x_h w_h| each,
// + the tensor cores' 2^-13 sum |x_h w_h|).
void expect_matches_cpu(const PackedProjection& p, const std::vector<std::uint16_t>& x,
                        std::int64_t tokens, const std::vector<std::uint16_t>& got) {
  std::vector<std::uint16_t> want(static_cast<std::size_t>(tokens * p.out_features));
  project_qkv_index_cpu(
      p,
      TensorView::contiguous(const_cast<std::uint16_t*>(x.data()), DType::kBf16,
                             {tokens, p.hidden}),
      TensorView::contiguous(want.data(), DType::kBf16, {tokens, p.out_features}));
  const Quantized q = quantize_tokens(x, tokens, p.hidden);
  int bad = 0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t n = 0; n < p.out_features; ++n) {
      const float w = fmt::bf16_to_float(want[t * p.out_features + n]);
      const float g = fmt::bf16_to_float(got[t * p.out_features + n]);
      if (std::isnan(w)) {
        if (!std::isnan(g) && bad++ < 5)
          ADD_FAILURE() << "token " << t << " channel " << n << ": " << g << ", want NaN";
        continue;
      }
      double abs_sum = 0.0;
      for (std::int64_t h = 0; h < p.hidden; ++h) {
        abs_sum += std::fabs(double(fmt::e4m3_to_float(q.codes[t * p.hidden + h])) * q.scales[t] *
                             fmt::e4m3_to_float(p.weight[n * p.hidden + h]) * p.scale[n]);
      }
      const double bound =
          2.0 * (2.0 * std::ldexp(std::fabs(w), -8) +
                 (std::ldexp(1.0, -13) + 2.0 * p.hidden * std::ldexp(1.0, -24)) * abs_sum);
      if (!(std::fabs(double(g) - w) <= bound) && bad++ < 5) {
        ADD_FAILURE() << "token " << t << " channel " << n << ": " << g << ", want " << w
                      << " (bound " << bound << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(ProjectionGpu, MatchesTheCpuPathAndItsCodesBitForBit) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  // (out_features, hidden, token counts): M3's TP-2 rank over a short hidden, and a TP-8 rank at
  // M3's 6144; then channels that do not fill the streaming kernel's last 16-channel CTA, at the
  // streaming kernel's largest token count and the GEMM's smallest, and a hidden size the
  // streaming kernel does not take (not a multiple of 256), so that the GEMM serves one token.
  struct Case {
    std::int64_t n, k;
    std::vector<std::int64_t> token_counts;
  };
  for (const Case& c : {Case{4992, 1024, {1, 5, 64, 333}}, Case{1536, 6144, {1, 5, 64, 333}},
                        Case{1000, 1024, {8, 9}}, Case{1000, 1088, {1, 9}}}) {
    const std::int64_t n = c.n, k = c.k;
    const PackedProjection p = random_packed(n, k, static_cast<unsigned>(n + k));
    const DeviceProjection dp(p);
    for (std::int64_t tokens : c.token_counts) {
      SCOPED_TRACE(testing::Message() << n << " x " << k << ", " << tokens << " tokens");
      std::vector<std::uint16_t> x = random_hidden(tokens, k, static_cast<unsigned>(tokens));
      if (tokens >= 5) {
        x[2 * k + 7] = 0x7FC0;  // token 2: a NaN
        x[3 * k + 1] = 0xFF80;  // token 3: -infinity
      }
      const DeviceBuffer<std::uint16_t> dx(x);
      DeviceBuffer<std::uint16_t> out(static_cast<std::size_t>(tokens * n));  // poisoned
      DeviceBuffer<std::byte> ws(static_cast<std::size_t>(projection_workspace_bytes(tokens, k)));
      project_qkv_index(
          dp.view(p), TensorView::contiguous(dx.get(), DType::kBf16, {tokens, k}, Device::kCuda),
          TensorView::contiguous(out.get(), DType::kBf16, {tokens, n}, Device::kCuda),
          TensorView::contiguous(ws.get(), DType::kUint8, {static_cast<std::int64_t>(ws.size())},
                                 Device::kCuda));
      FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
      expect_matches_cpu(p, x, tokens, out.to_host());

      const auto layout = detail::projection_workspace_layout(tokens, k);
      const std::vector<std::byte> scratch = ws.to_host();
      const Quantized q = quantize_tokens(x, tokens, k);
      for (std::int64_t i = 0; i < tokens * k; ++i) {
        ASSERT_EQ(static_cast<std::uint8_t>(scratch[layout.codes + i]), q.codes[i])
            << "activation code " << i;
      }
      for (std::int64_t t = 0; t < tokens; ++t) {
        float s;
        std::memcpy(&s, scratch.data() + layout.scales + 4 * t, 4);
        if (std::isnan(q.scales[t])) {
          EXPECT_TRUE(std::isnan(s)) << "token " << t;
        } else {
          EXPECT_EQ(s, q.scales[t]) << "token " << t;
        }
      }
    }
  }
}

TEST(ProjectionGpu, GraphReplayReadsTheNewHiddenStates) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const std::int64_t n = 1536, k = 1024, tokens = 8;
  const PackedProjection p = random_packed(n, k, 7);
  const DeviceProjection dp(p);
  DeviceBuffer<std::uint16_t> dx(static_cast<std::size_t>(tokens * k));
  DeviceBuffer<std::uint16_t> out(static_cast<std::size_t>(tokens * n));
  DeviceBuffer<std::byte> ws(static_cast<std::size_t>(projection_workspace_bytes(64, k)));
  const CapturedGraph graph([&](cudaStream_t stream) {
    project_qkv_index(dp.view(p),
                      TensorView::contiguous(dx.get(), DType::kBf16, {tokens, k}, Device::kCuda),
                      TensorView::contiguous(out.get(), DType::kBf16, {tokens, n}, Device::kCuda),
                      TensorView::contiguous(ws.get(), DType::kUint8,
                                             {static_cast<std::int64_t>(ws.size())}, Device::kCuda),
                      {.stream = stream});
  });
  for (unsigned step = 0; step < 3; ++step) {
    const std::vector<std::uint16_t> x = random_hidden(tokens, k, 100 + step);
    FLASHMSA_CHECK_CUDA(cudaMemcpy(dx.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    FLASHMSA_CHECK_CUDA(cudaMemset(out.get(), 0xA5, out.bytes()));
    graph.replay();
    SCOPED_TRACE(testing::Message() << "replay " << step);
    expect_matches_cpu(p, x, tokens, out.to_host());
  }
}

TEST(ProjectionGpu, BadInputNamesTheArgument) {
  FLASHMSA_REQUIRE_SM90_OR_SKIP();
  const std::int64_t n = 1536, k = 1024, tokens = 4;
  const PackedProjection p = random_packed(n, k, 9);
  const DeviceProjection dp(p);
  DeviceBuffer<std::uint16_t> dx(static_cast<std::size_t>(tokens * k));
  DeviceBuffer<std::uint16_t> out(static_cast<std::size_t>(tokens * n));
  const std::int64_t need = projection_workspace_bytes(tokens, k);
  DeviceBuffer<std::byte> ws(static_cast<std::size_t>(need));
  auto hidden = TensorView::contiguous(dx.get(), DType::kBf16, {tokens, k}, Device::kCuda);
  auto output = TensorView::contiguous(out.get(), DType::kBf16, {tokens, n}, Device::kCuda);
  auto workspace = TensorView::contiguous(ws.get(), DType::kUint8, {need}, Device::kCuda);
  auto expect_error = [&](const std::function<void()>& call, const std::string& name) {
    try {
      call();
      ADD_FAILURE() << "no error for bad " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  expect_error(
      [&] {
        project_qkv_index(
            dp.view(p), hidden, output,
            TensorView::contiguous(ws.get(), DType::kUint8, {need - 1}, Device::kCuda));
      },
      "workspace");
  expect_error(
      [&] {
        project_qkv_index(dp.view(p),
                          TensorView::contiguous(dx.get(), DType::kBf16, {2, 2 * k}, Device::kCuda),
                          output, workspace);
      },
      "hidden");
  expect_error(
      [&] {
        project_qkv_index(
            dp.view(p), hidden,
            TensorView::contiguous(out.get(), DType::kFp16, {tokens, n}, Device::kCuda), workspace);
      },
      "out");
  ProjectionWeightView wrong = dp.view(p);
  wrong.scale = TensorView::contiguous(dp.scale.get(), DType::kFp32, {n - 1}, Device::kCuda);
  expect_error([&] { project_qkv_index(wrong, hidden, output, workspace); }, "weights.scale");
}

}  // namespace
}  // namespace flashmsa
