// A batch ready for the indexer and attention tests: caches filled through the cache manager
// (scattered pages, garbage in every unwritten byte), random queries, and the batch arrays.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "flashmsa/cache_manager.hpp"
#include "flashmsa/formats.hpp"
#include "flashmsa/metadata.hpp"
#include "flashmsa/ops.hpp"
#include "tests/cpp/reference.hpp"

namespace flashmsa::test {

struct Scenario {
  Config config;
  std::unique_ptr<CacheManager> cm;
  std::vector<CacheManager::RequestId> ids;  // kPaddingRequest for padding rows
  std::vector<std::int32_t> cu_seqlens, seq_lens, block_table;
  std::int64_t max_blocks = 0;
  int decode_query_len = 0;  // 0: a prefill batch
  std::int64_t num_rows = 0;
  ref::Rows rows;
  std::vector<std::uint16_t> q;       // [T, Hq, D] bf16
  std::vector<std::uint8_t> index_q;  // [T, Hidx, Di] bf16 (2 bytes each) or e4m3
  std::vector<double> q_values, index_q_values;
  // Per-tensor fp8 dequantization scales the ops and the oracle read the main cache with.
  float k_scale = 1.0f, v_scale = 1.0f;

  DType index_q_dtype() const {
    return config.indexer_kv_dtype == "fp8" ? DType::kFp8E4m3 : DType::kBf16;
  }
  ref::Table table() const { return {&block_table, max_blocks, cm->num_pages()}; }
  KvCacheView kv() const {
    KvCacheView v = cm->kv_cache();
    v.k_scale = k_scale;
    v.v_scale = v_scale;
    return v;
  }
  TensorView q_view() const;
  TensorView index_q_view() const;
  PrefillBatch prefill_batch() const;
  DecodeBatch decode_batch() const;
  std::vector<double> q_row(std::int64_t t, std::int64_t hq) const;
};

// Prefill batch: requests (prefix_len, query_len). All L = prefix + query tokens are in the cache.
Scenario make_prefill(const Config& config, const std::vector<RequestShape>& requests,
                      std::uint64_t seed, KvLayout layout = KvLayout::kPacked);
// Changes a decode batch of 4 requests in place, the shapes kept, as a graph-replay test needs:
// lengths set to `seq_lens` (no longer than the written tokens), request 0's first two pages
// swapped, request 3 put on request 1's pages; the row positions follow.
void change_decode_batch(Scenario& s, const std::vector<std::int32_t>& seq_lens);

// Decode batch: seq_lens per request (0: padding), decode_query_len rows each.
Scenario make_decode(const Config& config, const std::vector<std::int64_t>& seq_lens,
                     int decode_query_len, std::uint64_t seed, KvLayout layout = KvLayout::kPacked);

}  // namespace flashmsa::test
