#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <set>
#include <vector>

#include "flashmsa/cache_manager.hpp"
#include "flashmsa/error.hpp"

namespace flashmsa {
namespace {

TEST(CacheManager, AppendTakesPagesAsBlocksFill) {
  CacheManager cm(Config{}, {.num_pages = 8});
  const auto a = cm.add_request();
  EXPECT_EQ(cm.append(a, 1), 1);
  EXPECT_EQ(cm.pages(a).size(), 1u);
  EXPECT_EQ(cm.append(a, 127), 128);
  EXPECT_EQ(cm.pages(a).size(), 1u);
  EXPECT_EQ(cm.append(a, 1), 129);
  EXPECT_EQ(cm.pages(a).size(), 2u);
  EXPECT_EQ(cm.free_pages(), 6);
  const auto slots = cm.slot_mapping(a, 126, 3);
  EXPECT_EQ(slots[0], cm.pages(a)[0] * 128 + 126);
  EXPECT_EQ(slots[2], cm.pages(a)[1] * 128 + 0);
  EXPECT_THROW(cm.slot_mapping(a, 128, 2), Error);  // position 129 not appended yet
  cm.free_request(a);
  EXPECT_EQ(cm.free_pages(), 8);
  EXPECT_FALSE(cm.contains(a));
  EXPECT_THROW(cm.length(a), Error);
  cm.check_invariants();
}

TEST(CacheManager, OutOfPagesIsAClearErrorThatChangesNothing) {
  CacheManager cm(Config{}, {.num_pages = 3});
  const auto a = cm.add_request();
  cm.append(a, 200);
  const std::vector<std::int32_t> before(cm.pages(a).begin(), cm.pages(a).end());
  try {
    cm.append(a, 300);  // needs 2 more pages, 1 free
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfResources);
    EXPECT_NE(e.message().find("out of cache pages"), std::string::npos) << e.message();
  }
  EXPECT_EQ(cm.length(a), 200);
  EXPECT_EQ(std::vector<std::int32_t>(cm.pages(a).begin(), cm.pages(a).end()), before);
  EXPECT_EQ(cm.free_pages(), 1);
  cm.check_invariants();
}

TEST(CacheManager, BlockTablesAndPaddingRows) {
  CacheManager cm(Config{}, {.num_pages = 16, .shuffle_seed = 7});
  const auto a = cm.add_request(), b = cm.add_request();
  cm.append(a, 300);
  cm.append(b, 5);
  const std::vector<CacheManager::RequestId> ids{b, CacheManager::kPaddingRequest, a};
  const auto table = cm.block_table(ids, 4);
  ASSERT_EQ(table.size(), 12u);
  EXPECT_EQ(table[0], cm.pages(b)[0]);
  EXPECT_EQ(table[1], -1);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(table[i], -1);  // padding row
  for (int i = 0; i < 3; ++i) EXPECT_EQ(table[8 + i], cm.pages(a)[i]);
  EXPECT_EQ(table[11], -1);
  EXPECT_THROW(cm.block_table(ids, 2), Error);  // a has 3 blocks
  // Shuffled pool: pages are not handed out in order.
  EXPECT_NE(std::vector<std::int32_t>(cm.pages(a).begin(), cm.pages(a).end()),
            (std::vector<std::int32_t>{0, 1, 2}));
}

TEST(CacheManager, SeparateIndexPool) {
  CacheManager cm(Config{}, {.num_pages = 4, .separate_index_pages = true, .num_index_pages = 6});
  EXPECT_EQ(cm.index_cache().num_pages, 6);
  const auto a = cm.add_request();
  cm.append(a, 129);
  EXPECT_EQ(cm.index_pages(a).size(), 2u);
  EXPECT_EQ(cm.free_index_pages(), 4);
  EXPECT_EQ(cm.free_pages(), 2);
  const auto slots = cm.slot_mapping(a, 128, 1, /*index_cache=*/true);
  EXPECT_EQ(slots[0], cm.index_pages(a)[1] * 128);
  cm.check_invariants();
  CacheManager shared(Config{}, {.num_pages = 4});
  const auto s = shared.add_request();
  shared.append(s, 10);
  EXPECT_EQ(shared.index_pages(s)[0], shared.pages(s)[0]);
}

TEST(CacheManager, CallerBuffersAndDeviceChoice) {
  Config c;
  const KvCacheShape shape{2, 4, 128, 128};
  std::vector<std::byte> kv(KvCacheView::buffer_bytes(KvLayout::kPacked, DType::kBf16, shape));
  std::vector<std::byte> idx(IndexCacheView::buffer_bytes(DType::kBf16, 2, 128));
  CacheManager cm(
      c, {.num_pages = 2,
          .kv_data = {kv.data(), static_cast<std::int64_t>(kv.size() * sizeof(kv[0]))},
          .index_data = {idx.data(), static_cast<std::int64_t>(idx.size() * sizeof(idx[0]))}});
  EXPECT_EQ(cm.kv_cache().k.data, kv.data());
  EXPECT_EQ(cm.index_cache().k.data, idx.data());
  EXPECT_THROW(CacheManager(c, {.num_pages = 0}), Error);
}

// >= 100,000 random allocate / append / free operations, invariants checked after every one.
TEST(CacheManager, RandomizedSoak) {
  const auto start = std::chrono::steady_clock::now();
  Config c;
  CacheManager cm(
      c, {.num_pages = 96, .separate_index_pages = true, .num_index_pages = 80, .shuffle_seed = 3});
  std::mt19937_64 rng(2026);
  std::vector<CacheManager::RequestId> live;
  std::int64_t ops = 0, out_of_pages = 0;
  for (; ops < 100000; ++ops) {
    const int op = static_cast<int>(rng() % 10);
    if (op == 0 || live.empty()) {
      live.push_back(cm.add_request());
    } else if (op <= 2) {
      const std::size_t i = rng() % live.size();
      cm.free_request(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      const auto id = live[rng() % live.size()];
      const std::int64_t before = cm.length(id), free_before = cm.free_pages();
      const std::int64_t n = static_cast<std::int64_t>(rng() % (op == 9 ? 2000 : 130));
      try {
        ASSERT_EQ(cm.append(id, n), before + n);
      } catch (const Error& e) {
        ASSERT_EQ(e.kind(), ErrorKind::kOutOfResources);
        ASSERT_EQ(cm.length(id), before);
        ASSERT_EQ(cm.free_pages(), free_before);
        ++out_of_pages;
      }
    }
    cm.check_invariants();
    std::int64_t held = 0;
    for (auto id : live) held += static_cast<std::int64_t>(cm.pages(id).size());
    ASSERT_EQ(held + cm.free_pages(), cm.num_pages());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(out_of_pages, 20);  // the pool really ran dry, repeatedly
  RecordProperty("operations", static_cast<int>(ops));
  std::printf("soak: %lld operations (%lld out-of-pages) in %.2f s\n", static_cast<long long>(ops),
              static_cast<long long>(out_of_pages), seconds);
}

}  // namespace
}  // namespace flashmsa
