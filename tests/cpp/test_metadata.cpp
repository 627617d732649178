#include <gtest/gtest.h>

#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/metadata.hpp"
#include "tests/cpp/error_message.hpp"

namespace flashmsa {
namespace {

TEST(Metadata, DecodeRowsFirstThenPaddingThenPrefill) {
  const std::vector<RequestShape> decode{{100, 2}, {7, 2}};
  const std::vector<RequestShape> prefill{{256, 3}, {0, 1}};
  const BatchMetadata m = build_batch_metadata(decode, 2, prefill, /*decode_capacity=*/3);
  EXPECT_EQ(m.num_decode_requests, 2);
  EXPECT_EQ(m.num_padding_requests, 1);
  EXPECT_EQ(m.num_prefill_requests, 2);
  EXPECT_EQ(m.decode_query_len, 2);
  EXPECT_EQ(m.num_decode_tokens, 6);
  EXPECT_EQ(m.num_tokens, 10);
  EXPECT_EQ(m.cu_seqlens_q, (std::vector<std::int32_t>{0, 2, 4, 6, 9, 10}));
  EXPECT_EQ(m.seq_lens, (std::vector<std::int32_t>{102, 9, 0, 259, 1}));
  EXPECT_EQ(m.prefix_lens, (std::vector<std::int32_t>{100, 7, 0, 256, 0}));
  EXPECT_EQ(m.token_request, (std::vector<std::int32_t>{0, 0, 1, 1, 2, 2, 3, 3, 3, 4}));
  EXPECT_EQ(m.token_position,
            (std::vector<std::int32_t>{100, 101, 7, 8, -2, -1, 256, 257, 258, 0}));
  EXPECT_TRUE(m.is_padding(2));
  EXPECT_FALSE(m.is_padding(1));
  EXPECT_FALSE(m.is_padding(3));
}

TEST(Metadata, PrefillOnlyAndEmpty) {
  const std::vector<RequestShape> prefill{{0, 5}};
  const BatchMetadata m = build_batch_metadata({}, 0, prefill);
  EXPECT_EQ(m.decode_query_len, 0);
  EXPECT_EQ(m.num_decode_tokens, 0);
  EXPECT_EQ(m.token_position, (std::vector<std::int32_t>{0, 1, 2, 3, 4}));
  const BatchMetadata empty = build_batch_metadata({}, 0, {});
  EXPECT_EQ(empty.cu_seqlens_q, std::vector<std::int32_t>{0});
  EXPECT_EQ(empty.num_tokens, 0);
}

TEST(Metadata, RejectsInconsistentInput) {
  const std::vector<RequestShape> d{{10, 1}, {10, 2}};
  EXPECT_EQ(test::error_message([&] { build_batch_metadata(d, 1, {}); }),
            "decode request 1: query_len must equal decode_query_len (1), got 2");
  EXPECT_EQ(test::error_message([&] { build_batch_metadata(d, 17, {}); }),
            "decode_query_len must be in [1, 16], got 17");
  EXPECT_EQ(test::error_message([&] {
              build_batch_metadata(std::vector<RequestShape>{{1, 1}}, 1, {}, 0);
            }),
            "no error");
  EXPECT_EQ(test::error_message([&] { build_batch_metadata(d, 2, {}, 1); }),
            "decode_capacity must be 0 or >= the 2 decode requests, got 1");
  const std::vector<RequestShape> p{{-1, 4}};
  EXPECT_EQ(test::error_message([&] { build_batch_metadata({}, 0, p); }),
            "prefill request 0: prefix_len must be >= 0, got -1");
  const std::vector<RequestShape> z{{3, 0}};
  EXPECT_EQ(test::error_message([&] { build_batch_metadata({}, 0, z); }),
            "prefill request 0: query_len must be >= 1, got 0");
  const std::vector<RequestShape> big{{2147483647, 1}};
  EXPECT_NE(test::error_message([&] { build_batch_metadata({}, 0, big); }).find("must fit int32"),
            std::string::npos);
}

}  // namespace
}  // namespace flashmsa
