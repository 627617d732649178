#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "flashmsa/config.hpp"
#include "flashmsa/error.hpp"

namespace flashmsa {
namespace {

bool has_problem(const Config& c, const std::string& text, const ModelHeads& model = {}) {
  for (const ConfigProblem& p : c.validate(model)) {
    if (p.to_string().find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(Config, DefaultsAreMiniMaxM3) {
  const Config c;
  EXPECT_TRUE(c.validate().empty());
  EXPECT_EQ(c.algorithm, "minimax_m3");
  EXPECT_EQ(c.sparse_num_index_heads, 4);
  EXPECT_EQ(c.sparse_index_dim, 128);
  EXPECT_EQ(c.sparse_block_size, 128);
  EXPECT_EQ(c.sparse_topk_blocks, 16);
  EXPECT_EQ(c.sparse_init_blocks, 0);
  EXPECT_EQ(c.sparse_local_blocks, 1);
  EXPECT_EQ(c.sparse_score_type, "max");
  EXPECT_TRUE(c.sparse_disable_index_value);
  EXPECT_EQ(c.indexer_kv_dtype, "bf16");
  EXPECT_FALSE(c.fuse_qkv_index_projection);
  EXPECT_EQ(c.implementation, "triton");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.rope_theta, 5.0e6);
  EXPECT_EQ(c.rms_norm_eps, 1.0e-6);
  EXPECT_EQ(c.topk_order, TopkOrder::kAscending);
  const ResolvedHeads h = c.resolve_heads();
  EXPECT_EQ(h.num_attention_heads, 64);
  EXPECT_EQ(h.num_key_value_heads, 4);
  EXPECT_FLOAT_EQ(c.resolved_softmax_scale(), 1.0f / std::sqrt(128.0f));
  EXPECT_NO_THROW(c.check());
}

TEST(Config, HeadCountsResolveConfigThenModelThenDefault) {
  Config c;
  c.num_attention_heads.reset();
  c.num_key_value_heads.reset();
  EXPECT_EQ(c.resolve_heads().num_attention_heads, 64);
  EXPECT_EQ(c.resolve_heads().num_key_value_heads, 64);  // kv falls back to q heads
  const ModelHeads model{32, 8};
  EXPECT_EQ(c.resolve_heads(model).num_attention_heads, 32);
  EXPECT_EQ(c.resolve_heads(model).num_key_value_heads, 8);
  EXPECT_EQ(c.resolve_heads(ModelHeads{32, std::nullopt}).num_key_value_heads, 32);
  c.num_attention_heads = 16;
  EXPECT_EQ(c.resolve_heads(model).num_attention_heads, 16);  // config wins
  EXPECT_EQ(c.resolve_heads(model).num_key_value_heads, 8);
}

TEST(Config, EveryProblemIsReportedAtOnceWithFieldValueAndRule) {
  Config c;
  c.sparse_num_index_heads = 0;
  c.sparse_index_dim = 0;
  c.sparse_block_size = 96;
  c.sparse_score_type = "mean";
  c.sparse_disable_index_value = false;
  c.sparse_init_blocks = 10;
  c.sparse_local_blocks = 7;
  c.rms_norm_eps = -1;
  const auto problems = c.validate();
  EXPECT_GE(problems.size(), 7u);
  EXPECT_TRUE(has_problem(c, "sparse_num_index_heads must be > 0, got 0"));
  EXPECT_TRUE(has_problem(c, "sparse_index_dim must be > 0, got 0"));
  EXPECT_TRUE(has_problem(c, "sparse_block_size must be a power of two"));
  EXPECT_TRUE(has_problem(c, "sparse_score_type must be \"max\""));
  EXPECT_TRUE(has_problem(c, "sparse_disable_index_value must be true"));
  EXPECT_TRUE(has_problem(c,
                          "sparse_init_blocks + sparse_local_blocks must be <= "
                          "sparse_topk_blocks (16), got 17"));
  EXPECT_TRUE(has_problem(c, "rms_norm_eps must be finite and > 0, got -1"));
  try {
    c.check();
    FAIL() << "check() accepted an invalid config";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    for (const auto& p : problems) {
      EXPECT_NE(e.message().find(p.to_string()), std::string::npos) << p.to_string();
    }
  }
}

TEST(Config, HeadRules) {
  Config c;
  c.num_attention_heads = 62;
  EXPECT_TRUE(has_problem(c, "num_attention_heads must be a multiple of num_key_value_heads (4)"));
  c = Config{};
  c.sparse_num_index_heads = 6;
  EXPECT_TRUE(has_problem(c,
                          "sparse_num_index_heads must be equal to or a multiple of "
                          "num_key_value_heads (4), got 6"));
  c.sparse_num_index_heads = 8;  // g = 2 index heads per kv head: allowed (max-reduced)
  EXPECT_TRUE(c.validate().empty());
  c = Config{};
  c.num_key_value_heads = 0;
  EXPECT_TRUE(has_problem(c, "num_key_value_heads must be > 0, got 0"));
}

TEST(Config, Fp8IndexerAndFusedProjectionDependencies) {
  Config c;
  c.indexer_kv_dtype = "fp8";
  EXPECT_TRUE(has_problem(c, "implementation must be \"msa\" when indexer_kv_dtype is \"fp8\""));
  EXPECT_TRUE(has_problem(c, "index_cache_dtype must be fp8_e4m3 when indexer_kv_dtype is"));
  c.implementation = "msa";
  c.index_cache_dtype = DType::kFp8E4m3;
  EXPECT_TRUE(c.validate().empty());
  c.fuse_qkv_index_projection = true;
  EXPECT_TRUE(has_problem(c, "kv_cache_dtype must be fp8_e4m3 when fuse_qkv_index_projection"));
  c.kv_cache_dtype = DType::kFp8E4m3;
  EXPECT_TRUE(c.validate().empty());
  c.indexer_kv_dtype = "bf16";
  c.index_cache_dtype = DType::kBf16;
  EXPECT_TRUE(has_problem(c, "indexer_kv_dtype must be \"fp8\" when fuse_qkv_index_projection"));
  c = Config{};
  c.implementation = "msa";
  c.sparse_block_size = 64;
  EXPECT_TRUE(has_problem(c, "sparse_block_size must be 128 when implementation is \"msa\""));
  c = Config{};
  c.implementation = "cuda";
  EXPECT_TRUE(has_problem(c, "implementation must be \"triton\" or \"msa\", got \"cuda\""));
  c = Config{};
  c.index_cache_dtype = DType::kFp8E4m3;  // an fp8 index cache needs the fp8 indexer
  EXPECT_TRUE(has_problem(c, "index_cache_dtype must be bf16 or nvfp4"));
}

TEST(Config, SetIndexCacheDtypeKeepsTheIndexerConsistent) {
  Config c;
  c.set_index_cache_dtype(DType::kFp8E4m3);
  EXPECT_EQ(c.indexer_kv_dtype, "fp8");
  EXPECT_EQ(c.implementation, "msa");
  EXPECT_TRUE(c.validate().empty());
  c.set_index_cache_dtype(DType::kNvfp4);
  EXPECT_EQ(c.indexer_kv_dtype, "bf16");
  EXPECT_TRUE(c.validate().empty());
}

TEST(Config, DtypeRules) {
  Config c;
  c.kv_cache_dtype = DType::kFp32;
  EXPECT_TRUE(has_problem(c,
                          "kv_cache_dtype must be one of bf16, fp16, fp8_e4m3, fp8_e5m2, "
                          "nvfp4, got fp32"));
  c = Config{};
  c.index_cache_dtype = DType::kFp16;
  EXPECT_TRUE(has_problem(c, "index_cache_dtype must be one of bf16, fp8_e4m3, nvfp4, got fp16"));
  for (DType d : {DType::kBf16, DType::kFp16, DType::kFp8E4m3, DType::kFp8E5m2, DType::kNvfp4}) {
    c = Config{};
    c.kv_cache_dtype = d;
    EXPECT_TRUE(c.validate().empty()) << to_string(d);
  }
  c = Config{};
  c.index_cache_dtype = DType::kNvfp4;
  EXPECT_TRUE(c.validate().empty());
  c.head_dim = 72;
  c.rope_dim = 64;
  c.kv_cache_dtype = DType::kNvfp4;
  EXPECT_TRUE(has_problem(c, "head_dim must be a multiple of 16 for an nvfp4 kv cache, got 72"));
  c = Config{};
  c.softmax_scale = NAN;
  EXPECT_TRUE(has_problem(c, "softmax_scale must be finite and > 0"));
  c.softmax_scale = 0.5f;
  EXPECT_TRUE(c.validate().empty());
  EXPECT_EQ(c.resolved_softmax_scale(), 0.5f);
  c.rope_dim = 130;
  EXPECT_TRUE(has_problem(c, "rope_dim must be even, >= 0 and <= head_dim (128)"));
}

TEST(Config, NamesParse) {
  EXPECT_EQ(parse_topk_order("score_desc"), TopkOrder::kScoreDesc);
  EXPECT_EQ(parse_topk_order("local_last"), TopkOrder::kLocalLast);
  EXPECT_FALSE(parse_topk_order("descending").has_value());
  for (DType d : {DType::kBf16, DType::kFp16, DType::kFp32, DType::kFp8E4m3, DType::kFp8E5m2,
                  DType::kNvfp4, DType::kInt32, DType::kInt64, DType::kUint8}) {
    EXPECT_EQ(parse_dtype(to_string(d)), d);
  }
  EXPECT_FALSE(parse_dtype("float8").has_value());
  EXPECT_EQ(dtype_bits(DType::kNvfp4), 4);
}

TEST(Config, TensorParallelSplitsQAndKvHeads) {
  const Config c;  // 64 q heads, 4 kv heads, 4 index heads
  for (int tp : {1, 2, 4}) {
    for (int r = 0; r < tp; ++r) {
      const TensorParallelRank rank = c.for_tensor_parallel(tp, r);
      EXPECT_EQ(rank.config.num_attention_heads, 64 / tp);
      EXPECT_EQ(rank.config.num_key_value_heads, 4 / tp);
      EXPECT_EQ(rank.config.sparse_num_index_heads, 4 / tp);
      EXPECT_EQ(rank.first_q_head, r * 64 / tp);
      EXPECT_EQ(rank.first_kv_head, r * 4 / tp);
      EXPECT_EQ(rank.first_index_head, r * 4 / tp);
      EXPECT_EQ(rank.config.sparse_index_dim, 128);  // the index-K head is replicated
      EXPECT_TRUE(rank.config.validate().empty());
    }
  }
  // tp 8 > 4 kv heads: each kv head (and its index head) is replicated on 2 ranks.
  for (int r = 0; r < 8; ++r) {
    const TensorParallelRank rank = c.for_tensor_parallel(8, r);
    EXPECT_EQ(rank.config.num_attention_heads, 8);
    EXPECT_EQ(rank.config.num_key_value_heads, 1);
    EXPECT_EQ(rank.config.sparse_num_index_heads, 1);
    EXPECT_EQ(rank.first_q_head, 8 * r);
    EXPECT_EQ(rank.first_kv_head, r / 2);
    // q head h uses kv head h / 16 globally: this rank's q heads all map to first_kv_head.
    EXPECT_EQ(rank.first_q_head / 16, rank.first_kv_head);
    EXPECT_TRUE(rank.config.validate().empty());
  }
}

TEST(Config, TensorParallelRejectsImpossibleSplits) {
  const Config c;
  EXPECT_THROW(c.for_tensor_parallel(0, 0), Error);
  EXPECT_THROW(c.for_tensor_parallel(2, 2), Error);
  EXPECT_THROW(c.for_tensor_parallel(3, 0), Error);  // 64 q heads do not split 3 ways
  Config six_kv;
  six_kv.num_attention_heads = 48;
  six_kv.num_key_value_heads = 6;
  six_kv.sparse_num_index_heads = 6;
  ASSERT_TRUE(six_kv.validate().empty());
  try {
    six_kv.for_tensor_parallel(4, 0);  // 6 kv heads over 4 ranks
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("num_key_value_heads (6)"), std::string::npos) << e.message();
  }
  Config bad;
  bad.sparse_score_type = "sum";
  EXPECT_THROW(bad.for_tensor_parallel(1, 0), Error);
}

}  // namespace
}  // namespace flashmsa
