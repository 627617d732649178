// The oracle: plainly written fp64 versions of the indexer, top-k and attention (spec sections 4
// and 5), for the tests. No cleverness: each function reads like the spec's formula.
#pragma once

#include <cstdint>
#include <vector>

#include "flashmsa/cache.hpp"
#include "flashmsa/config.hpp"

namespace flashmsa::ref {

// Where each query row sits: its request and absolute position (< 0: sees nothing).
struct Rows {
  std::vector<std::int64_t> request;
  std::vector<std::int64_t> position;
};
Rows prefill_rows(const std::vector<std::int32_t>& cu_seqlens,
                  const std::vector<std::int32_t>& seq_lens);
Rows decode_rows(const std::vector<std::int32_t>& seq_lens, int decode_query_len);

std::int64_t visible_blocks(std::int64_t position, std::int64_t block_size);

// A block table row lookup: the page, or -1 when missing.
struct Table {
  const std::vector<std::int32_t>* entries;
  std::int64_t max_blocks;
  std::int64_t num_pages;
  std::int64_t page(std::int64_t request, std::int64_t block) const;
};

// Index queries as doubles: q[(t * Hidx + h) * Di + d].
struct IndexScores {
  std::vector<double> score;      // [Hkv][nvb] raw block score (group max), NaN if no number
  std::vector<double> magnitude;  // [Hkv][nvb] max over the block's keys of sum |q_d k_d|
  std::int64_t nvb = 0;
};
IndexScores index_scores(const Config& c, const std::vector<double>& index_q, std::int64_t row,
                         std::int64_t position, std::int64_t request, const IndexCacheView& cache,
                         const Table& table);

// Top-k of one kv head's block scores with forcing and the spec's total order, in topk_order.
std::vector<std::int32_t> select_topk(const Config& c, const std::vector<double>& scores,
                                      std::int64_t nvb);

// Attention of row t, q head hq over the listed blocks (any ids; invalid ones ignored).
struct AttentionRow {
  std::vector<double> out;  // [D]
  double lse;               // -inf when no key
  // The honest low-precision version: each probability exp(l - max) rounded to
  // `probabilities` (bf16 / fp16, as tensor-core kernels feed P to P V) before weighting V,
  // the normaliser kept exact. Equal to `out` for fp32 probabilities.
  std::vector<double> honest;
};
AttentionRow attention(const Config& c, const std::vector<double>& q_row, std::int64_t kv_head,
                       std::int64_t position, std::int64_t request,
                       const std::vector<std::int32_t>& blocks, const KvCacheView& kv,
                       const Table& table, DType probabilities = DType::kFp32);

}  // namespace flashmsa::ref
