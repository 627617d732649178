// The CPU backend's indexer and attention over a RowPlan. Sparse and dense attention share one
// core and differ only in which blocks each (kv head, row) attends to.
#pragma once

#include <cstdint>
#include <functional>
#include <new>
#include <vector>

#include "flashmsa/error.hpp"
#include "src/cpu/batch_rows.hpp"

namespace flashmsa::cpu {

// A zero-filled scratch vector of n elements; running out of host memory is reported as
// Error(kOutOfResources) saying what was asked for, never a bare std::bad_alloc.
template <class T>
std::vector<T> allocate_scratch(std::int64_t n, const char* what) {
  try {
    return std::vector<T>(static_cast<std::size_t>(n));
  } catch (const std::bad_alloc&) {
    throw Error(ErrorKind::kOutOfResources,
                detail::concat("out of host memory: ", what, " needs ",
                               static_cast<double>(n) * sizeof(T) / (1u << 30),
                               " GiB; use a smaller batch or block table (work follows the "
                               "block table's width and seq_lens)"));
  }
}

// Appends to `blocks` the distinct block ids in [0, nvb) that (kv_head, row) attends to.
using BlockSelection = std::function<void(std::int64_t kv_head, std::int64_t row, std::int64_t nvb,
                                          std::vector<std::int32_t>& blocks)>;

void attention_rows(const Config& config, const TensorView& q, const KvCacheView& kv,
                    const RowPlan& plan, const BlockSelection& select, const AttentionOutputs& out,
                    int threads);

void index_rows(const Config& config, const TensorView& index_q, const IndexCacheView& cache,
                const RowPlan& plan, const IndexOutputs& outputs, int threads);

}  // namespace flashmsa::cpu
