// Owns the page pools of the main K/V cache and the index-K side cache, hands pages to requests
// as their tokens arrive, and produces the block tables and slot mappings the operations read
// (spec sections 2, 6, 8). Host bookkeeping; the pools live in host memory for the CPU backend
// and in device memory for CUDA, or in buffers the caller provides.
//
//   flashmsa::CacheManager cm(config, {.num_pages = 1024});
//   auto id = cm.add_request();
//   cm.append(id, prompt_len);             // takes ceil(len / 128) pages
//   auto slots = cm.slot_mapping(id, 0, prompt_len);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "flashmsa/cache.hpp"
#include "flashmsa/config.hpp"

namespace flashmsa {

struct CacheManagerOptions {
  std::int64_t num_pages = 0;  // main-cache pages (each `sparse_block_size` tokens)
  KvLayout layout = KvLayout::kPacked;
  Device device = Device::kCpu;
  // The index cache shares the main cache's page ids by default; with this it has its own pool
  // (of num_index_pages, 0 meaning num_pages) and its own block table.
  bool separate_index_pages = false;
  std::int64_t num_index_pages = 0;
  // Hand pages out in a shuffled order (tests exercise scattered page tables with it).
  std::optional<std::uint64_t> shuffle_seed;
  // Caller-owned buffers with their sizes; when kv_data is set the manager allocates nothing.
  // Each must hold at least KvCacheView::buffer_bytes / IndexCacheView::buffer_bytes.
  CacheBuffer kv_data;    // K (or the packed/stacked buffer)
  CacheBuffer v_data;     // V, for two-buffer layouts
  CacheBuffer kv_scales;  // NVFP4 K scales (or packed/stacked scales)
  CacheBuffer v_scales;   // NVFP4 V scales, two-buffer layouts
  CacheBuffer index_data;
  CacheBuffer index_scales;  // NVFP4 index cache
};

class CacheManager {
 public:
  using RequestId = std::int64_t;
  static constexpr RequestId kPaddingRequest = -1;  // a CUDA-graph padding row in tables

  CacheManager(const Config& config, const CacheManagerOptions& options);
  ~CacheManager();
  CacheManager(const CacheManager&) = delete;
  CacheManager& operator=(const CacheManager&) = delete;

  RequestId add_request();
  // Grows the request by `num_tokens`, taking pages as blocks fill; returns the new length.
  // All or nothing: without enough free pages it throws Error(kOutOfResources), changing nothing.
  std::int64_t append(RequestId id, std::int64_t num_tokens);
  // Returns the request's pages to the pools.
  void free_request(RequestId id);

  bool contains(RequestId id) const { return requests_.count(id) != 0; }
  std::int64_t length(RequestId id) const;
  std::span<const std::int32_t> pages(RequestId id) const;
  std::span<const std::int32_t> index_pages(RequestId id) const;  // == pages() when shared
  std::vector<RequestId> live_requests() const;

  std::int64_t num_pages() const { return num_pages_; }
  std::int64_t num_index_pages() const { return separate_index_ ? num_index_pages_ : num_pages_; }
  std::int64_t free_pages() const { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t free_index_pages() const;
  std::int64_t page_size() const { return page_size_; }

  // int32 block table [ids.size(), max_blocks]: logical block b of row r -> physical page, -1
  // past the request's pages and for kPaddingRequest rows. Throws if a request has more blocks
  // than max_blocks.
  std::vector<std::int32_t> block_table(std::span<const RequestId> ids, std::int64_t max_blocks,
                                        bool index_cache = false) const;
  // int64 slots (page * page_size + offset) of positions [first, first + count) of a request;
  // the positions must already be appended.
  std::vector<std::int64_t> slot_mapping(RequestId id, std::int64_t first, std::int64_t count,
                                         bool index_cache = false) const;

  const KvCacheView& kv_cache() const { return kv_view_; }
  const IndexCacheView& index_cache() const { return index_view_; }

  // Checks the bookkeeping (every page free or owned by exactly one live request that lists it
  // once, page counts match lengths); throws Error(kInternal) describing the first violation.
  void check_invariants() const;

 private:
  struct Request {
    std::int64_t length = 0;
    std::vector<std::int32_t> pages;
    std::vector<std::int32_t> index_pages;  // only with separate_index_pages
  };
  struct Buffer;

  const Request& request(RequestId id) const;
  static std::vector<std::int32_t> make_free_list(std::int64_t n,
                                                  const std::optional<std::uint64_t>& seed);

  std::int64_t num_pages_;
  std::int64_t num_index_pages_;
  std::int64_t page_size_;
  bool separate_index_;
  std::vector<std::int32_t> free_;
  std::vector<std::int32_t> index_free_;
  std::unordered_map<RequestId, Request> requests_;
  RequestId next_id_ = 0;
  std::vector<std::unique_ptr<Buffer>> owned_;
  KvCacheView kv_view_;
  IndexCacheView index_view_;
};

}  // namespace flashmsa
