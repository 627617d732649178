#include "flashmsa/metadata.hpp"

#include <algorithm>
#include <limits>

#include "flashmsa/error.hpp"

namespace flashmsa {

BatchMetadata build_batch_metadata(std::span<const RequestShape> decode, int decode_query_len,
                                   std::span<const RequestShape> prefill,
                                   std::int64_t decode_capacity) {
  const auto num_decode = static_cast<std::int64_t>(decode.size());
  const bool has_decode = num_decode > 0 || decode_capacity > 0;
  FLASHMSA_CHECK_ARG(
      !has_decode || (decode_query_len >= 1 && decode_query_len <= kMaxDecodeQueryLen),
      "decode_query_len must be in [1, ", kMaxDecodeQueryLen, "], got ", decode_query_len);
  FLASHMSA_CHECK_ARG(decode_capacity == 0 || decode_capacity >= num_decode,
                     "decode_capacity must be 0 or >= the ", num_decode, " decode requests, got ",
                     decode_capacity);
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  auto check_request = [&](const RequestShape& r, const char* kind, std::size_t i) {
    FLASHMSA_CHECK_ARG(r.prefix_len >= 0, kind, " request ", i, ": prefix_len must be >= 0, got ",
                       r.prefix_len);
    FLASHMSA_CHECK_ARG(r.query_len >= 1, kind, " request ", i, ": query_len must be >= 1, got ",
                       r.query_len);
    FLASHMSA_CHECK_ARG(r.prefix_len + r.query_len <= kMax, kind, " request ", i,
                       ": prefix_len + query_len must fit int32, got ", r.prefix_len + r.query_len);
  };

  // Every request is checked and the rows are counted before anything is allocated, so a batch
  // too large for int32 row indices fails at once.
  std::int64_t total = 0;
  auto count = [&](std::int64_t rows, const char* what) {
    FLASHMSA_CHECK_ARG(rows <= kMax - total, "the batch must have < 2^31 token rows (cu_seqlens_q ",
                       "is int32); it has ", total, " before ", what, " adds ", rows);
    total += rows;
  };
  for (std::size_t i = 0; i < decode.size(); ++i) {
    check_request(decode[i], "decode", i);
    FLASHMSA_CHECK_ARG(decode[i].query_len == decode_query_len, "decode request ", i,
                       ": query_len must equal decode_query_len (", decode_query_len, "), got ",
                       decode[i].query_len);
    count(decode[i].query_len, "a decode request");
  }
  if (decode_capacity > num_decode) {
    FLASHMSA_CHECK_ARG(decode_capacity - num_decode <= kMax / decode_query_len,
                       "decode_capacity must keep the batch under 2^31 token rows, got ",
                       decode_capacity);
    count((decode_capacity - num_decode) * decode_query_len, "decode padding");
  }
  for (std::size_t i = 0; i < prefill.size(); ++i) {
    check_request(prefill[i], "prefill", i);
    count(prefill[i].query_len, "a prefill request");
  }

  BatchMetadata m;
  const auto requests =
      static_cast<std::size_t>(std::max<std::int64_t>(decode_capacity, num_decode) +
                               static_cast<std::int64_t>(prefill.size()));
  m.token_request.reserve(static_cast<std::size_t>(total));
  m.token_position.reserve(static_cast<std::size_t>(total));
  m.cu_seqlens_q.reserve(requests + 1);
  m.seq_lens.reserve(requests);
  m.prefix_lens.reserve(requests);
  m.decode_query_len = has_decode ? decode_query_len : 0;
  m.num_decode_requests = static_cast<std::int32_t>(num_decode);
  m.num_padding_requests =
      static_cast<std::int32_t>(decode_capacity > 0 ? decode_capacity - num_decode : 0);
  m.num_prefill_requests = static_cast<std::int32_t>(prefill.size());
  m.cu_seqlens_q.push_back(0);
  auto add = [&](std::int64_t prefix, std::int64_t query, std::int64_t seq_len) {
    const auto index = static_cast<std::int32_t>(m.seq_lens.size());
    const std::int64_t end = m.num_tokens + query;
    FLASHMSA_CHECK_ARG(end <= kMax, "the batch must have < 2^31 token rows, got ", end);
    for (std::int64_t i = 0; i < query; ++i) {
      m.token_request.push_back(index);
      m.token_position.push_back(static_cast<std::int32_t>(seq_len - query + i));
    }
    m.num_tokens = end;
    m.cu_seqlens_q.push_back(static_cast<std::int32_t>(end));
    m.seq_lens.push_back(static_cast<std::int32_t>(seq_len));
    m.prefix_lens.push_back(static_cast<std::int32_t>(prefix));
  };
  for (std::size_t i = 0; i < decode.size(); ++i) {
    add(decode[i].prefix_len, decode[i].query_len, decode[i].prefix_len + decode[i].query_len);
  }
  for (std::int32_t i = 0; i < m.num_padding_requests; ++i) add(0, decode_query_len, 0);
  m.num_decode_tokens = m.num_tokens;
  for (std::size_t i = 0; i < prefill.size(); ++i) {
    add(prefill[i].prefix_len, prefill[i].query_len, prefill[i].prefix_len + prefill[i].query_len);
  }
  return m;
}

}  // namespace flashmsa
