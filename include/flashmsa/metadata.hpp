// Batch metadata (spec sections 2 and 8): from the requests of one engine step to the arrays
// every operation reads. Decode rows come first, all with one query length (1 + speculative
// tokens); then prefill rows (ragged, possibly chunked with a cached prefix). A fixed-capacity
// (CUDA-graph) batch pads the decode part with rows of length 0 that select and write nothing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace flashmsa {

// One request of a step: `prefix_len` tokens already cached, `query_len` new tokens.
struct RequestShape {
  std::int64_t prefix_len = 0;
  std::int64_t query_len = 0;
};

inline constexpr int kMaxDecodeQueryLen = 16;

struct BatchMetadata {
  std::int32_t num_decode_requests = 0;   // real decode requests
  std::int32_t num_padding_requests = 0;  // padding rows after them (length 0)
  std::int32_t num_prefill_requests = 0;
  std::int32_t decode_query_len = 0;   // 0 when the batch has no decode part
  std::int64_t num_decode_tokens = 0;  // (decode + padding requests) * decode_query_len
  std::int64_t num_tokens = 0;         // T

  // Per request, in order: decode, padding, prefill. B = size of seq_lens.
  std::vector<std::int32_t> cu_seqlens_q;  // [B + 1], starts at 0
  std::vector<std::int32_t> seq_lens;      // [B] L = prefix + query (0 for padding)
  std::vector<std::int32_t> prefix_lens;   // [B]
  // Per token row.
  std::vector<std::int32_t> token_request;   // [T] request index in this batch
  std::vector<std::int32_t> token_position;  // [T] absolute position (negative for padding)

  std::int64_t num_requests() const { return static_cast<std::int64_t>(seq_lens.size()); }
  bool is_padding(std::int64_t request) const {
    return request >= num_decode_requests && request < num_decode_requests + num_padding_requests;
  }
};

// Builds the metadata. Every decode request must have query_len == decode_query_len (1..16);
// `decode_capacity` (0: none) pads the decode part to that many requests. Throws Error naming
// the offending request and value on inconsistent input.
BatchMetadata build_batch_metadata(std::span<const RequestShape> decode, int decode_query_len,
                                   std::span<const RequestShape> prefill,
                                   std::int64_t decode_capacity = 0);

}  // namespace flashmsa
