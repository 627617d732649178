// The fused Q/K/V + index projection (include/flashmsa/projection.hpp): the packed layout of every
// tensor-parallel rank traced channel by channel, the FP8 rounding of weights and projection
// against exact products, ranks agreeing with the unsharded packing, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/formats/minifloat.hpp"
#include "flashmsa/projection.hpp"

namespace flashmsa {
namespace {

constexpr std::int64_t kHidden = 256;  // M3's is 6144; the layout does not depend on it

// One bf16 weight matrix [rows, kHidden] with values of varied magnitude (and a zero row).
std::vector<std::uint16_t> random_weight(std::int64_t rows, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> w(static_cast<std::size_t>(rows * kHidden));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(r % 13) - 8);
    for (std::int64_t h = 0; h < kHidden; ++h) {
      w[r * kHidden + h] = r == 5 ? 0 : fmt::float_to_bf16(normal(rng) * magnitude);
    }
  }
  return w;
}

struct Layer {
  Config config;
  std::vector<std::uint16_t> q, k, v, iq, ik;
  ProjectionWeights views() const {
    const std::int64_t d = config.head_dim, di = config.sparse_index_dim;
    const ResolvedHeads h = config.resolve_heads();
    return {TensorView::contiguous(q.data(), DType::kBf16, {h.num_attention_heads * d, kHidden}),
            TensorView::contiguous(k.data(), DType::kBf16, {h.num_key_value_heads * d, kHidden}),
            TensorView::contiguous(v.data(), DType::kBf16, {h.num_key_value_heads * d, kHidden}),
            TensorView::contiguous(iq.data(), DType::kBf16,
                                   {config.sparse_num_index_heads * di, kHidden}),
            TensorView::contiguous(ik.data(), DType::kBf16, {di, kHidden})};
  }
  const std::vector<std::uint16_t>& of(ProjectionSource s) const {
    return s == ProjectionSource::kQ        ? q
           : s == ProjectionSource::kK      ? k
           : s == ProjectionSource::kV      ? v
           : s == ProjectionSource::kIndexQ ? iq
                                            : ik;
  }
};

Layer m3_layer() {
  Layer l;
  const std::int64_t d = l.config.head_dim, di = l.config.sparse_index_dim;
  l.q = random_weight(64 * d, 1);
  l.k = random_weight(4 * d, 2);
  l.v = random_weight(4 * d, 3);
  l.iq = random_weight(4 * di, 4);
  l.ik = random_weight(di, 5);
  return l;
}

// The rank's channels from first principles: its q heads, its kv heads (split when there are at
// least as many as ranks, else each replicated over tp / Hkv ranks), the index heads of those kv
// heads, the index key.
std::vector<ProjectionRow> expected_channels(int hq, int hkv, int hidx, int tp, int rank) {
  const int d = 128, di = 128;
  std::vector<int> kv_heads;
  if (hkv >= tp) {
    for (int h = rank * hkv / tp; h < (rank + 1) * hkv / tp; ++h) kv_heads.push_back(h);
  } else {
    kv_heads.push_back(rank / (tp / hkv));
  }
  std::vector<ProjectionRow> rows;
  for (int h = rank * hq / tp; h < (rank + 1) * hq / tp; ++h) {
    for (int i = 0; i < d; ++i) rows.push_back({ProjectionSource::kQ, std::int64_t{h} * d + i});
  }
  for (ProjectionSource s : {ProjectionSource::kK, ProjectionSource::kV}) {
    for (int h : kv_heads) {
      for (int i = 0; i < d; ++i) rows.push_back({s, std::int64_t{h} * d + i});
    }
  }
  for (int h : kv_heads) {
    for (int ih = h * hidx / hkv; ih < (h + 1) * hidx / hkv; ++ih) {
      for (int i = 0; i < di; ++i)
        rows.push_back({ProjectionSource::kIndexQ, std::int64_t{ih} * di + i});
    }
  }
  for (int i = 0; i < di; ++i) rows.push_back({ProjectionSource::kIndexK, i});
  return rows;
}

TEST(Projection, EveryChannelOfEveryRankTracesToItsSourceRow) {
  const Layer layer = m3_layer();
  for (int tp : {1, 2, 4, 8}) {
    std::set<std::pair<int, std::int64_t>> covered;  // every source row is on some rank
    for (int rank = 0; rank < tp; ++rank) {
      const auto want = expected_channels(64, 4, 4, tp, rank);
      const Config rank_config = layer.config.for_tensor_parallel(tp, rank).config;
      ASSERT_EQ(projection_out_features(rank_config), std::int64_t(want.size()));
      const PackedProjection p = pack_qkv_index_projection(layer.config, tp, rank, layer.views());
      ASSERT_EQ(p.version, kProjectionLayoutVersion);
      ASSERT_EQ(p.out_features, std::int64_t(want.size()));
      ASSERT_EQ(p.hidden, kHidden);
      for (std::int64_t n = 0; n < p.out_features; ++n) {
        const ProjectionRow got = projection_source(layer.config, tp, rank, n);
        ASSERT_EQ(got.source, want[n].source) << "tp " << tp << " rank " << rank << " n " << n;
        ASSERT_EQ(got.row, want[n].row) << "tp " << tp << " rank " << rank << " n " << n;
        covered.insert({static_cast<int>(got.source), got.row});
        // The packed channel is its source row in E4M3 with its scale: per element at most half
        // an E4M3 step, 2^-4 relative for normal codes and 2^-10 * scale below them.
        const std::uint16_t* src = layer.of(got.source).data() + got.row * kHidden;
        float amax = 0.0f;
        for (std::int64_t h = 0; h < kHidden; ++h)
          amax = std::max(amax, std::fabs(fmt::bf16_to_float(src[h])));
        ASSERT_EQ(p.scale[n], amax > 0 ? amax / 448.0f : 1.0f);
        for (std::int64_t h = 0; h < kHidden; ++h) {
          const float w = fmt::bf16_to_float(src[h]);
          const float deq = fmt::e4m3_to_float(p.weight[n * kHidden + h]) * p.scale[n];
          ASSERT_LE(std::fabs(deq - w), std::ldexp(std::fabs(w), -4) + std::ldexp(p.scale[n], -10))
              << "tp " << tp << " rank " << rank << " channel " << n << " element " << h;
        }
      }
    }
    EXPECT_EQ(covered.size(), std::size_t(64 * 128 + 2 * 4 * 128 + 4 * 128 + 128)) << "tp " << tp;
  }
}

// The projection against exact products of the unquantized bf16 values. Bound: each operand is
// off by at most 2^-4 of itself plus 2^-10 of its row's scale (E4M3 rounding, above), so a
// product term by at most |x||w| (2^-3 + 2^-8) + the subnormal terms; the fp32 sum adds ~1e-6
// relative and the bf16 store 2^-9 of the result.
TEST(Projection, CpuProjectionIsWithinTheFp8RoundingBound) {
  const Layer layer = m3_layer();
  const PackedProjection p = pack_qkv_index_projection(layer.config, 8, 3, layer.views());
  const std::int64_t tokens = 5;
  std::vector<std::uint16_t> x = random_weight(tokens, 9);
  for (std::int64_t h = 0; h < kHidden; ++h) x[2 * kHidden + h] = 0;  // an all-zero token
  x[4 * kHidden + 9] = 0x7F80;  // +infinity: the token's outputs are NaN, never hidden
  std::vector<std::uint16_t> out(static_cast<std::size_t>(tokens * p.out_features), 0xFFFF);
  project_qkv_index_cpu(p, TensorView::contiguous(x.data(), DType::kBf16, {tokens, kHidden}),
                        TensorView::contiguous(out.data(), DType::kBf16, {tokens, p.out_features}));
  for (std::int64_t n = 0; n < p.out_features; ++n) {
    ASSERT_TRUE(std::isnan(fmt::bf16_to_float(out[4 * p.out_features + n]))) << "channel " << n;
  }
  for (std::int64_t t = 0; t < tokens - 1; ++t) {
    double xmax = 0;
    for (std::int64_t h = 0; h < kHidden; ++h)
      xmax = std::max(xmax, std::fabs(double(fmt::bf16_to_float(x[t * kHidden + h]))));
    const double x_scale = xmax > 0 ? xmax / 448 : 1;
    for (std::int64_t n = 0; n < p.out_features; ++n) {
      const ProjectionRow src = projection_source(layer.config, 8, 3, n);
      const std::uint16_t* w = layer.of(src.source).data() + src.row * kHidden;
      double exact = 0, magnitude = 0, subnormal = 0;
      for (std::int64_t h = 0; h < kHidden; ++h) {
        const double a = fmt::bf16_to_float(x[t * kHidden + h]), b = fmt::bf16_to_float(w[h]);
        exact += a * b;
        magnitude += std::fabs(a * b);
        subnormal += std::ldexp(x_scale, -10) * std::fabs(b) +
                     std::ldexp(p.scale[n], -10) * std::fabs(a) +
                     std::ldexp(x_scale * p.scale[n], -19);
      }
      const double got = fmt::bf16_to_float(out[t * p.out_features + n]);
      // Exactly the documented computation (per-token E4M3 of x, the packed codes and scales, in
      // fp64 here): only fp32 accumulation (~1e-6 of the magnitude) and the bf16 store (2^-9).
      double dequantized = 0, dequantized_magnitude = 0;
      for (std::int64_t h = 0; h < kHidden; ++h) {
        const double a = fmt::e4m3_to_float(fmt::float_to_e4m3(static_cast<float>(
                             fmt::bf16_to_float(x[t * kHidden + h]) / float(x_scale)))) *
                         float(x_scale);
        const double b = fmt::e4m3_to_float(p.weight[n * kHidden + h]) * double(p.scale[n]);
        dequantized += a * b;
        dequantized_magnitude += std::fabs(a * b);
      }
      ASSERT_LE(std::fabs(got - dequantized),
                std::ldexp(std::fabs(dequantized), -8) + 1e-5 * dequantized_magnitude)
          << "token " << t << " channel " << n;
      const double bound =
          magnitude * (0.125 + 0.004 + 1e-5) + 1.1 * subnormal + std::ldexp(std::fabs(exact), -8);
      ASSERT_LE(std::fabs(got - exact), bound) << "token " << t << " channel " << n;
      if (t == 2) {
        ASSERT_EQ(got, 0.0) << "an all-zero token projects to zeros";
      }
    }
  }
}

// Per-channel scales make a rank's channels exactly the unsharded packing's channels, so every
// rank's projection equals the matching columns of the TP 1 projection bit for bit.
TEST(Projection, RanksEqualTheUnshardedProjectionColumnForColumn) {
  const Layer layer = m3_layer();
  const PackedProjection full = pack_qkv_index_projection(layer.config, 1, 0, layer.views());
  const std::int64_t tokens = 3;
  const std::vector<std::uint16_t> x = random_weight(tokens, 11);
  const TensorView xv = TensorView::contiguous(x.data(), DType::kBf16, {tokens, kHidden});
  std::vector<std::uint16_t> y_full(static_cast<std::size_t>(tokens * full.out_features));
  project_qkv_index_cpu(
      full, xv, TensorView::contiguous(y_full.data(), DType::kBf16, {tokens, full.out_features}));
  // The TP 1 channel of each source row.
  std::map<std::pair<int, std::int64_t>, std::int64_t> full_channel;
  for (std::int64_t n = 0; n < full.out_features; ++n) {
    const ProjectionRow s = projection_source(layer.config, 1, 0, n);
    full_channel[{static_cast<int>(s.source), s.row}] = n;
  }
  for (int rank : {0, 5}) {
    const PackedProjection p = pack_qkv_index_projection(layer.config, 8, rank, layer.views());
    std::vector<std::uint16_t> y(static_cast<std::size_t>(tokens * p.out_features));
    project_qkv_index_cpu(p, xv,
                          TensorView::contiguous(y.data(), DType::kBf16, {tokens, p.out_features}));
    for (std::int64_t n = 0; n < p.out_features; n += 7) {
      const ProjectionRow src = projection_source(layer.config, 8, rank, n);
      const std::int64_t f = full_channel.at({static_cast<int>(src.source), src.row});
      for (std::int64_t t = 0; t < tokens; ++t) {
        ASSERT_EQ(y[t * p.out_features + n], y_full[t * full.out_features + f])
            << "rank " << rank << " channel " << n << " token " << t;
      }
    }
  }
}

void expect_error(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// The device-generic entry point on host tensors (the CPU backend) is the CPU projection, bit for
// bit, reading the packed weight through views; its own argument checks name the argument.
TEST(Projection, ViewEntryPointOnTheCpuEqualsTheCpuProjection) {
  const Layer layer = m3_layer();
  const PackedProjection p = pack_qkv_index_projection(layer.config, 2, 1, layer.views());
  const std::int64_t tokens = 3;
  const std::vector<std::uint16_t> x = random_weight(tokens, 17);
  std::vector<std::uint16_t> want(static_cast<std::size_t>(tokens * p.out_features), 0xFFFF);
  std::vector<std::uint16_t> got(want.size(), 0xA5A5);
  const auto xv = TensorView::contiguous(x.data(), DType::kBf16, {tokens, kHidden});
  project_qkv_index_cpu(
      p, xv, TensorView::contiguous(want.data(), DType::kBf16, {tokens, p.out_features}));
  const ProjectionWeightView view{
      TensorView::contiguous(p.weight.data(), DType::kFp8E4m3, {p.out_features, kHidden}),
      TensorView::contiguous(p.scale.data(), DType::kFp32, {p.out_features})};
  project_qkv_index(view, xv,
                    TensorView::contiguous(got.data(), DType::kBf16, {tokens, p.out_features}), {});
  EXPECT_EQ(got, want);

  ProjectionWeightView bad = view;
  bad.weight = TensorView::contiguous(p.weight.data(), DType::kUint8, {p.out_features, kHidden});
  expect_error([&] { project_qkv_index(bad, xv, TensorView(), {}); }, "weights.weight");
  bad = view;
  bad.scale = TensorView::contiguous(p.scale.data(), DType::kFp32, {p.out_features + 1});
  expect_error([&] { project_qkv_index(bad, xv, TensorView(), {}); }, "weights.scale");
  expect_error(
      [&] {
        project_qkv_index(view, xv,
                          TensorView::contiguous(got.data(), DType::kBf16, {tokens, kHidden}), {});
      },
      "out");
  expect_error([&] { projection_workspace_bytes(-1, kHidden); }, "max_tokens");
}

TEST(Projection, BadInputNamesTheArgument) {
  Layer layer = m3_layer();
  const ProjectionWeights w = layer.views();
  expect_error([&] { pack_qkv_index_projection(layer.config, 3, 0, w); }, "tp_size");
  expect_error([&] { pack_qkv_index_projection(layer.config, 8, 8, w); }, "rank");
  expect_error([&] { projection_source(layer.config, 8, 0, -1); }, "n must be in [0, ");
  expect_error([&] { projection_source(layer.config, 8, 0, 1536); }, "n must be in [0, 1536)");
  ProjectionWeights bad = w;
  bad.k = TensorView::contiguous(layer.k.data(), DType::kBf16, {3 * 128, kHidden});
  expect_error([&] { pack_qkv_index_projection(layer.config, 1, 0, bad); }, "weights.k");
  bad = w;
  bad.index_k = TensorView::contiguous(layer.ik.data(), DType::kFp16, {128, kHidden});
  expect_error([&] { pack_qkv_index_projection(layer.config, 1, 0, bad); }, "weights.index_k");
  bad = w;
  bad.v = TensorView::contiguous(layer.v.data(), DType::kBf16, {4 * 128, kHidden - 1});
  expect_error([&] { pack_qkv_index_projection(layer.config, 1, 0, bad); }, "weights.v");

  Layer nan_layer = layer;
  nan_layer.v[130 * kHidden + 7] = 0x7FC0;  // a NaN in W_v row 130 (kv head 1)
  expect_error([&] { pack_qkv_index_projection(nan_layer.config, 4, 1, nan_layer.views()); },
               "weights must be finite, got a NaN or infinity in weights.v row 130");
  EXPECT_NO_THROW(pack_qkv_index_projection(nan_layer.config, 4, 0, nan_layer.views()))
      << "rank 0 of 4 does not carry kv head 1";

  const PackedProjection p = pack_qkv_index_projection(layer.config, 8, 0, w);
  std::vector<std::uint16_t> x(2 * kHidden), out(2 * p.out_features);
  // Projects with hidden [hidden_rows, hidden_cols] and out [out_rows, out_features].
  auto project = [&](const PackedProjection& packed, std::int64_t hidden_rows,
                     std::int64_t hidden_cols, std::int64_t out_rows) {
    return [&, hidden_rows, hidden_cols, out_rows] {
      project_qkv_index_cpu(
          packed, TensorView::contiguous(x.data(), DType::kBf16, {hidden_rows, hidden_cols}),
          TensorView::contiguous(out.data(), DType::kBf16, {out_rows, packed.out_features}));
    };
  };
  expect_error(project(p, 1, 2 * kHidden, 1), "hidden");
  expect_error(project(p, 2, kHidden, 1), "out");
  PackedProjection old = p;
  old.version = 0;
  expect_error(project(old, 2, kHidden, 2), "layout version");
}

}  // namespace
}  // namespace flashmsa
