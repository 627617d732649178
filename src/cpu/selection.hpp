// Top-k block selection with the spec's total order (section 4): shared by the CPU indexer and,
// as the definition, documented here once.
//   key(S) = S, with NaN ranking as -1e30; larger key first; equal keys: smaller block id first
//   (so -0.0 == +0.0); forced blocks get 1e30 (init, at the head) and 1e29 (local, at the tail).
#pragma once

#include <cstdint>
#include <vector>

#include "flashmsa/config.hpp"

namespace flashmsa::cpu {

// (s != s: NaN, written as a compare so that loops over it vectorise.)
inline float rank_key(float s) {
  return s != s ? -1e30f : s;
}

// The larger of two scores under rank_key, keeping the winner's raw value.
inline float rank_max(float a, float b) {
  return rank_key(b) > rank_key(a) ? b : a;
}

// rank_max along row[0, n) (n >= 1), as one chain from row[0] would give it: the first value with
// the largest rank_key (vectorised, indexer.cpp: a block's score from its keys' dots).
float block_rank_max(const float* row, std::int64_t n);

struct TopkSelector {
  int topk, init, local;
  TopkOrder order;

  explicit TopkSelector(const Config& c)
      : topk(c.sparse_topk_blocks),
        init(c.sparse_init_blocks),
        local(c.sparse_local_blocks),
        order(c.topk_order) {}

  // Writes the topk ids for block scores[0, nvb) to out[0, topk) (stride `out_stride`).
  void select(const float* scores, std::int64_t nvb, std::int32_t* out,
              std::int64_t out_stride) const;

 private:
  mutable std::vector<float> keys_;
  mutable std::vector<std::int32_t> ids_;
};

}  // namespace flashmsa::cpu
