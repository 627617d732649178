// The CPU backend's indexer and attention over a RowPlan. Sparse and dense attention share one
// core and differ only in which blocks each (kv head, row) attends to.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "src/cpu/batch_rows.hpp"

namespace flashmsa::cpu {

// Appends to `blocks` the distinct block ids in [0, nvb) that (kv_head, row) attends to.
using BlockSelection = std::function<void(std::int64_t kv_head, std::int64_t row, std::int64_t nvb,
                                          std::vector<std::int32_t>& blocks)>;

void attention_rows(const Config& config, const TensorView& q, const KvCacheView& kv,
                    const RowPlan& plan, const BlockSelection& select, const AttentionOutputs& out,
                    int threads);

void index_rows(const Config& config, const TensorView& index_q, const IndexCacheView& cache,
                const RowPlan& plan, const IndexOutputs& outputs, int threads);

}  // namespace flashmsa::cpu
