#include "tests/cpp/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "flashmsa/formats.hpp"
#include "tests/cpp/cache_test_util.hpp"

namespace flashmsa::ref {

Rows prefill_rows(const std::vector<std::int32_t>& cu, const std::vector<std::int32_t>& lens) {
  Rows rows;
  for (std::size_t r = 0; r < lens.size(); ++r) {
    const std::int64_t q = cu[r + 1] - cu[r];
    for (std::int64_t i = 0; i < q; ++i) {
      rows.request.push_back(static_cast<std::int64_t>(r));
      rows.position.push_back(lens[r] - q + i);
    }
  }
  return rows;
}

Rows decode_rows(const std::vector<std::int32_t>& lens, int q) {
  Rows rows;
  for (std::size_t r = 0; r < lens.size(); ++r) {
    for (int i = 0; i < q; ++i) {
      rows.request.push_back(static_cast<std::int64_t>(r));
      rows.position.push_back(lens[r] > 0 ? lens[r] - q + i : -1);
    }
  }
  return rows;
}

std::int64_t visible_blocks(std::int64_t position, std::int64_t block_size) {
  return position < 0 ? 0 : position / block_size + 1;
}

std::int64_t Table::page(std::int64_t request, std::int64_t block) const {
  if (block < 0 || block >= max_blocks) return -1;
  const std::int64_t p = (*entries)[request * max_blocks + block];
  return p >= 0 && p < num_pages ? p : -1;
}

namespace {
// The spec's ranking: NaN counts as -1e30.
double key(double s) {
  return std::isnan(s) ? -1e30 : s;
}
double rank_max(double a, double b) {
  return key(b) > key(a) ? b : a;
}
}  // namespace

IndexScores index_scores(const Config& c, const std::vector<double>& index_q, std::int64_t row,
                         std::int64_t position, std::int64_t request, const IndexCacheView& cache,
                         const Table& table) {
  const std::int64_t hkv = c.resolve_heads().num_key_value_heads;
  const std::int64_t hidx = c.sparse_num_index_heads, group = hidx / hkv;
  const std::int64_t di = c.sparse_index_dim, bs = c.sparse_block_size;
  IndexScores s;
  s.nvb = visible_blocks(position, bs);
  s.score.assign(static_cast<std::size_t>(hkv * s.nvb), std::numeric_limits<double>::quiet_NaN());
  s.magnitude.assign(s.score.size(), 0.0);
  for (std::int64_t b = 0; b < s.nvb; ++b) {
    const std::int64_t page = table.page(request, b);
    if (page < 0) continue;  // never read: NaN score
    for (std::int64_t j = b * bs; j <= std::min(position, (b + 1) * bs - 1); ++j) {
      const std::byte* k = cache.k.row(page, 0, j % bs);
      const std::byte* ks =
          cache.block_scale.data ? cache.block_scale.row(page, 0, j % bs) : nullptr;
      for (std::int64_t h = 0; h < hkv; ++h) {
        for (std::int64_t g = 0; g < group; ++g) {
          double dot = 0, mag = 0;
          for (std::int64_t d = 0; d < di; ++d) {
            const double term = index_q[(row * hidx + h * group + g) * di + d] *
                                test::decode_element(cache.dtype, k, ks, d, 1.0);
            dot += term;
            mag += std::fabs(term);
          }
          double& cell = s.score[h * s.nvb + b];
          cell = std::isnan(cell) && j == b * bs && g == 0 ? dot : rank_max(cell, dot);
          s.magnitude[h * s.nvb + b] = std::max(s.magnitude[h * s.nvb + b], mag);
        }
      }
    }
  }
  return s;
}

std::vector<std::int32_t> select_topk(const Config& c, const std::vector<double>& scores,
                                      std::int64_t nvb) {
  std::vector<double> k(static_cast<std::size_t>(nvb));
  for (std::int64_t b = 0; b < nvb; ++b) {
    k[b] = key(scores[b]);
    if (b < c.sparse_init_blocks) k[b] = 1e30;
  }
  for (std::int64_t b = std::max<std::int64_t>(0, nvb - c.sparse_local_blocks); b < nvb; ++b) {
    k[b] = 1e29;
  }
  std::vector<std::int32_t> ids(static_cast<std::size_t>(nvb));
  for (std::int64_t b = 0; b < nvb; ++b) ids[b] = static_cast<std::int32_t>(b);
  std::stable_sort(ids.begin(), ids.end(), [&](std::int32_t a, std::int32_t b) {
    return k[a] > k[b];  // stable: equal keys keep ascending ids
  });
  const std::int64_t n = std::min<std::int64_t>(c.sparse_topk_blocks, nvb);
  ids.resize(static_cast<std::size_t>(n));
  if (c.topk_order != TopkOrder::kScoreDesc) std::sort(ids.begin(), ids.end());
  ids.resize(static_cast<std::size_t>(c.sparse_topk_blocks), -1);
  return ids;
}

AttentionRow attention(const Config& c, const std::vector<double>& q_row, std::int64_t kv_head,
                       std::int64_t position, std::int64_t request,
                       const std::vector<std::int32_t>& blocks, const KvCacheView& kv,
                       const Table& table, DType probabilities) {
  const std::int64_t d = c.head_dim, bs = c.sparse_block_size;
  const double scale = c.resolved_softmax_scale();
  const std::int64_t nvb = visible_blocks(position, bs);
  std::set<std::int32_t> sel;
  for (std::int32_t b : blocks) {
    if (b >= 0 && b < nvb && table.page(request, b) >= 0) sel.insert(b);
  }
  std::vector<double> logits;
  std::vector<std::vector<double>> values;
  for (std::int32_t b : sel) {
    const std::int64_t page = table.page(request, b);
    for (std::int64_t j = b * bs; j <= std::min(position, (b + 1) * bs - 1); ++j) {
      const std::int64_t o = j % bs;
      const std::byte* ks =
          kv.k_block_scale.data ? kv.k_block_scale.row(page, kv_head, o) : nullptr;
      const std::byte* vs =
          kv.v_block_scale.data ? kv.v_block_scale.row(page, kv_head, o) : nullptr;
      double dot = 0;
      std::vector<double> v(static_cast<std::size_t>(d));
      for (std::int64_t e = 0; e < d; ++e) {
        dot += q_row[e] *
               test::decode_element(kv.dtype, kv.k.row(page, kv_head, o), ks, e, kv.k_scale);
        v[e] = test::decode_element(kv.dtype, kv.v.row(page, kv_head, o), vs, e, kv.v_scale);
      }
      logits.push_back(scale * dot);
      values.push_back(std::move(v));
    }
  }
  AttentionRow row{std::vector<double>(static_cast<std::size_t>(d), 0.0),
                   -std::numeric_limits<double>::infinity(),
                   std::vector<double>(static_cast<std::size_t>(d), 0.0)};
  if (logits.empty()) return row;
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double l : logits) sum += std::exp(l - mx);
  auto rounded = [probabilities](double p) -> double {
    const auto f = static_cast<float>(p);
    if (probabilities == DType::kBf16) return fmt::bf16_to_float(fmt::float_to_bf16(f));
    if (probabilities == DType::kFp16) return fmt::fp16_to_float(fmt::float_to_fp16(f));
    return p;
  };
  for (std::size_t j = 0; j < logits.size(); ++j) {
    const double p = std::exp(logits[j] - mx);
    const double honest = rounded(p);
    for (std::int64_t e = 0; e < d; ++e) {
      row.out[e] += p / sum * values[j][e];
      row.honest[e] += honest / sum * values[j][e];
    }
  }
  row.lse = mx + std::log(sum);
  return row;
}

}  // namespace flashmsa::ref
