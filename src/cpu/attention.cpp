// Sparse (and dense) GQA attention on the CPU, block-major: for each (request, kv head, tile of
// query rows), every selected block is loaded once, and all (row, q head) pairs that selected it
// are multiplied against it in one BLAS call, with an online softmax across blocks. Work is the
// useful work whatever the overlap between rows' selections: coherent selections give large
// matrix products, unrelated ones smaller products but no wasted ones.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "src/cpu/gemm.hpp"
#include "src/cpu/row_codec.hpp"
#include "src/cpu/sparse_ops.hpp"
#include "src/cpu/thread_pool.hpp"
#include "src/cpu/vector_loops.hpp"

namespace flashmsa::cpu {
namespace {

constexpr std::int64_t kRowsPerTask = 128;
constexpr float kLog2e = 1.4426950408889634f;

// 2^x in fp32 to about 2 ulp, branch-free so loops vectorise: x = n + f with |f| <= 1/2, and
// 2^f = e^(f ln 2) by its degree-7 Taylor polynomial (truncation error < 1e-8). NaN propagates;
// x < -126 (and -inf) gives 0.
inline float exp2_polynomial(float x) {
  // Compare-and-select rather than fminf/fmaxf, which do not vectorise; NaN passes through the
  // clamp and into t, and n is made 0 for it so the integer conversion stays defined.
  const float clamped = x < -127.0f ? -127.0f : (x > 127.0f ? 127.0f : x);
  float n = std::floor(clamped + 0.5f);
  n = n == n ? n : 0.0f;
  const float t = (clamped - n) * 0.6931471805599453f;
  float p = 1.0f / 5040.0f;
  p = p * t + 1.0f / 720.0f;
  p = p * t + 1.0f / 120.0f;
  p = p * t + 1.0f / 24.0f;
  p = p * t + 1.0f / 6.0f;
  p = p * t + 0.5f;
  p = p * t + 1.0f;
  p = p * t + 1.0f;
  const float scale = fmt::bits_float(static_cast<std::uint32_t>(static_cast<int>(n) + 127) << 23);
  return x < -126.0f ? 0.0f : p * scale;
}

// Online-softmax step for one (row, q head) over a block's scores s[0, n), of which the first
// `limit` are causally visible: exponentiates in place (masked ones become 0) and updates the
// running max and sum; returns the factor the accumulator must be rescaled by.
// Non-finite scores behave as in dense FlashAttention: NaN (the max skips it) and +Inf (inf - inf)
// make the sum NaN, which the epilogue turns into a NaN row; -Inf gives its key weight 0, and
// a row whose scores are all -Inf so far exponentiates against 0 instead of -Inf (no NaN).
// Vectorised (vector_loops.hpp): the reductions run in kVectorLanes lanes.

FLASHMSA_VECTOR_CLONES
float softmax_step(float* s, std::int64_t limit, std::int64_t n, float& row_max, float& row_sum) {
  float lanes[kVectorLanes];
  for (float& l : lanes) l = row_max;
  std::int64_t c = 0;
  for (; c + kVectorLanes <= limit; c += kVectorLanes) {
    for (int j = 0; j < kVectorLanes; ++j) lanes[j] = lanes[j] < s[c + j] ? s[c + j] : lanes[j];
  }
  float mx = row_max;
  for (float l : lanes) mx = std::max(mx, l);
  for (; c < limit; ++c) mx = std::max(mx, s[c]);
  const float ref = mx == -std::numeric_limits<float>::infinity() ? 0.0f : mx;
  for (c = 0; c < limit; ++c) s[c] = exp2_polynomial(s[c] - ref);
  for (c = limit; c < n; ++c) s[c] = 0.0f;  // causal mask inside the block
  for (float& l : lanes) l = 0.0f;
  for (c = 0; c + kVectorLanes <= limit; c += kVectorLanes) {
    for (int j = 0; j < kVectorLanes; ++j) lanes[j] += s[c + j];
  }
  float sum = 0.0f;
  for (float l : lanes) sum += l;
  for (; c < limit; ++c) sum += s[c];
  const float alpha = exp2_polynomial(row_max - ref);
  row_sum = row_sum * alpha + sum;
  row_max = mx;
  return alpha;
}

FLASHMSA_VECTOR_CLONES
void rescale_add(float* acc, const float* add, float alpha, std::int64_t n) {
  for (std::int64_t e = 0; e < n; ++e) acc[e] = acc[e] * alpha + add[e];
}

FLASHMSA_VECTOR_CLONES
void bf16_row_to_float(const std::byte* row, std::int64_t n, float* out) {
  const auto* in = reinterpret_cast<const std::uint16_t*>(row);
  for (std::int64_t i = 0; i < n; ++i) out[i] = fmt::bf16_to_float(in[i]);
}

struct Task {
  std::int64_t request, kv_head, row_begin, rows;
};

void load_kv_rows(const KvCacheView& kv, std::int64_t page, std::int64_t head, std::int64_t n,
                  float* k, float* v) {
  const std::int64_t d = kv.shape.head_dim;
  if (kv.dtype == DType::kBf16) {  // the common case, vectorised
    for (std::int64_t t = 0; t < n; ++t) {
      bf16_row_to_float(kv.k.row(page, head, t), d, k + t * d);
      bf16_row_to_float(kv.v.row(page, head, t), d, v + t * d);
    }
    return;
  }
  for (std::int64_t t = 0; t < n; ++t) {
    decode_cache_row(kv.dtype, kv.k.row(page, head, t),
                     kv.k_block_scale.data ? kv.k_block_scale.row(page, head, t) : nullptr, d,
                     kv.k_scale, k + t * d);
    decode_cache_row(kv.dtype, kv.v.row(page, head, t),
                     kv.v_block_scale.data ? kv.v_block_scale.row(page, head, t) : nullptr, d,
                     kv.v_scale, v + t * d);
  }
}

// Writes one (row, q head) output vector in the requested form.
void store_output(const AttentionOutputs& out, std::int64_t t, std::int64_t hq, std::int64_t d,
                  const float* o, float lse) {
  const TensorView& y = out.out;
  if (y.dtype == DType::kFp8E4m3) {  // MXFP8: quantize the bf16 output, 32 values per scale
    std::uint16_t bf16[fmt::kMxfp8GroupSize];
    const std::int64_t scale_cols = y.shape[1] / fmt::kMxfp8GroupSize;
    for (std::int64_t g = 0; g < d / fmt::kMxfp8GroupSize; ++g) {
      for (int i = 0; i < fmt::kMxfp8GroupSize; ++i) {
        bf16[i] = fmt::float_to_bf16(o[g * fmt::kMxfp8GroupSize + i]);
      }
      const std::int64_t col = hq * d + g * fmt::kMxfp8GroupSize;
      const std::uint8_t scale = fmt::mxfp8_quantize_group(
          bf16, y.as<std::uint8_t>() + t * y.stride[0] + col, out.mxfp8_scale_rule);
      out.mxfp8_scales.as<std::uint8_t>()[fmt::mxfp8_scale_offset(
          t, col / fmt::kMxfp8GroupSize, scale_cols, out.mxfp8_scale_layout)] = scale;
    }
  } else {
    const std::int64_t base = t * y.stride[0] + hq * y.stride[1];
    for (std::int64_t e = 0; e < d; ++e) store_activation(y.dtype, y.data, base + e, o[e]);
  }
  if (out.lse.data) out.lse.as<float>()[t * out.lse.stride[0] + hq * out.lse.stride[1]] = lse;
}

void run_task(const Config& config, const TensorView& q, const KvCacheView& kv, const RowPlan& plan,
              const BlockSelection& select, const AttentionOutputs& out, const Task& task) {
  const std::int64_t hq_total = config.resolve_heads().num_attention_heads;
  const std::int64_t group = hq_total / kv.shape.num_kv_heads;
  const std::int64_t d = kv.shape.head_dim, bs = plan.block_size;
  const std::int64_t rows = task.rows, m_rows = rows * group;
  const float qk_scale = config.resolved_softmax_scale() * kLog2e;  // scores in log2 units

  // Which rows selected each block.
  std::vector<std::vector<std::int32_t>> users;
  std::vector<std::int32_t> blocks;
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t t = task.row_begin + i;
    const std::int64_t nvb = plan.visible_blocks(plan.position[t]);
    if (nvb == 0) continue;
    blocks.clear();
    select(task.kv_head, t, nvb, blocks);
    for (std::int32_t b : blocks) {
      if (plan.page(task.request, b) < 0) continue;  // no page: nothing to read
      if (users.size() <= static_cast<std::size_t>(b)) users.resize(b + 1);
      users[b].push_back(static_cast<std::int32_t>(i));
    }
  }

  std::vector<float> qs(static_cast<std::size_t>(m_rows * d));
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t g = 0; g < group; ++g) {
      const std::int64_t hq = task.kv_head * group + g;
      const std::int64_t base = (task.row_begin + i) * q.stride[0] + hq * q.stride[1];
      for (std::int64_t e = 0; e < d; ++e) {
        qs[(i * group + g) * d + e] = load_activation(q.dtype, q.data, base + e) * qk_scale;
      }
    }
  }
  std::vector<float> row_max(static_cast<std::size_t>(m_rows),
                             -std::numeric_limits<float>::infinity());
  std::vector<float> row_sum(static_cast<std::size_t>(m_rows), 0.0f);
  std::vector<float> acc(static_cast<std::size_t>(m_rows * d), 0.0f);
  std::vector<float> kb(static_cast<std::size_t>(bs * d)), vb(kb.size());
  std::vector<float> qg(qs.size()), s(static_cast<std::size_t>(m_rows * bs)), pv(qs.size());
  std::vector<float> alpha(static_cast<std::size_t>(m_rows));

  for (std::size_t b = 0; b < users.size(); ++b) {
    const std::vector<std::int32_t>& who = users[b];
    if (who.empty()) continue;
    const auto m = static_cast<std::int64_t>(who.size());
    const std::int64_t block_start = static_cast<std::int64_t>(b) * bs;
    std::int64_t p_max = 0;
    for (std::int32_t i : who) p_max = std::max(p_max, plan.position[task.row_begin + i]);
    // Only keys up to the last position any user sees: tokens past it may hold anything.
    const std::int64_t n = std::min(bs, p_max - block_start + 1);
    load_kv_rows(kv, plan.page(task.request, static_cast<std::int64_t>(b)), task.kv_head, n,
                 kb.data(), vb.data());
    const bool all_rows = m == rows;
    const float* qa = qs.data();
    if (!all_rows) {
      for (std::int64_t u = 0; u < m; ++u) {
        std::copy_n(qs.data() + who[u] * group * d, group * d, qg.data() + u * group * d);
      }
      qa = qg.data();
    }
    gemm_nt(m * group, n, d, 1.0f, qa, d, kb.data(), d, 0.0f, s.data(), n);
    for (std::int64_t u = 0; u < m; ++u) {
      const std::int64_t i = who[u];
      const std::int64_t limit = std::min(n, plan.position[task.row_begin + i] - block_start + 1);
      for (std::int64_t g = 0; g < group; ++g) {
        const std::int64_t state = i * group + g;
        alpha[u * group + g] =
            softmax_step(s.data() + (u * group + g) * n, limit, n, row_max[state], row_sum[state]);
      }
    }
    gemm_nn(m * group, d, n, 1.0f, s.data(), n, vb.data(), d, 0.0f, pv.data(), d);
    // A user that sees only the first `limit` keys of the block multiplies only those values:
    // its masked probabilities are 0, but 0 x NaN is NaN, and the keys after its position
    // (written for later rows) must not reach its output whatever they hold.
    for (std::int64_t u = 0; u < m; ++u) {
      const std::int64_t limit = plan.position[task.row_begin + who[u]] - block_start + 1;
      if (limit >= n) continue;
      gemm_nn(group, d, limit, 1.0f, s.data() + u * group * n, n, vb.data(), d, 0.0f,
              pv.data() + u * group * d, d);
    }
    for (std::int64_t u = 0; u < m; ++u) {
      for (std::int64_t g = 0; g < group; ++g) {
        rescale_add(acc.data() + (who[u] * group + g) * d, pv.data() + (u * group + g) * d,
                    alpha[u * group + g], d);
      }
    }
  }

  std::vector<float> o(static_cast<std::size_t>(d));
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t g = 0; g < group; ++g) {
      const std::int64_t state = i * group + g;
      const float l = row_sum[state];
      float lse = -std::numeric_limits<float>::infinity();
      if (l > 0.0f) {
        for (std::int64_t e = 0; e < d; ++e) o[e] = acc[state * d + e] / l;
        lse = (row_max[state] + std::log2(l)) / kLog2e;
      } else if (l == 0.0f) {
        // No key with weight: zeros and a -inf log-sum-exp (a NaN value of a zero-weight key
        // still shows, as in the GPU kernels' P V product).
        for (std::int64_t e = 0; e < d; ++e) o[e] = acc[state * d + e] * 0.0f;
      } else {  // a NaN or +Inf score: the row and its log-sum-exp are NaN (spec section 5)
        std::fill(o.begin(), o.end(), std::numeric_limits<float>::quiet_NaN());
        lse = std::numeric_limits<float>::quiet_NaN();
      }
      store_output(out, task.row_begin + i, task.kv_head * group + g, d, o.data(), lse);
    }
  }
}

}  // namespace

void attention_rows(const Config& config, const TensorView& q, const KvCacheView& kv,
                    const RowPlan& plan, const BlockSelection& select, const AttentionOutputs& out,
                    int threads) {
  std::vector<Task> tasks;
  // Rows outside every request still get their (empty) output.
  std::vector<char> covered(static_cast<std::size_t>(plan.num_rows()), 0);
  for (std::int64_t r = 0; r < plan.num_requests(); ++r) {
    for (std::int64_t t0 = plan.row_begin[r]; t0 < plan.row_end[r]; t0 += kRowsPerTask) {
      const std::int64_t rows = std::min(kRowsPerTask, plan.row_end[r] - t0);
      for (std::int64_t h = 0; h < kv.shape.num_kv_heads; ++h) tasks.push_back({r, h, t0, rows});
      std::fill_n(covered.begin() + t0, rows, 1);
    }
  }
  for (std::int64_t t = 0; t < plan.num_rows(); ++t) {
    if (covered[t]) continue;
    for (std::int64_t h = 0; h < kv.shape.num_kv_heads; ++h) tasks.push_back({-1, h, t, 1});
  }
  parallel_for(
      static_cast<std::int64_t>(tasks.size()),
      [&](std::int64_t i) { run_task(config, q, kv, plan, select, out, tasks[i]); }, threads);
}

}  // namespace flashmsa::cpu
