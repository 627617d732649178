#include "flashmsa/cache_manager.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "flashmsa/error.hpp"
#include "src/cuda/device_info.hpp"

namespace flashmsa {

// One owned allocation, host or device, released with the manager.
struct CacheManager::Buffer {
  Buffer(std::int64_t bytes, Device dev) : device(dev) {
    const auto size = static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1));
    if (device == Device::kCuda) {
      data = cuda::device_malloc(size);
      cuda::device_memset(data, 0, size);
    } else {
      data = std::aligned_alloc(256, (size + 255) / 256 * 256);
      FLASHMSA_CHECK_KIND(ErrorKind::kOutOfResources, data != nullptr,
                          "could not allocate host memory for the caches: one pool needs ",
                          static_cast<double>(size) / (1u << 30),
                          " GiB; use fewer pages (CacheManagerOptions::num_pages)");
      std::memset(data, 0, size);
    }
  }
  ~Buffer() {
    if (device == Device::kCuda) {
      cuda::device_free(data);
    } else {
      std::free(data);
    }
  }
  void* data = nullptr;
  Device device;
};

std::vector<std::int32_t> CacheManager::make_free_list(std::int64_t n,
                                                       const std::optional<std::uint64_t>& seed) {
  // A stack: pages are taken from the back, so reverse order hands out page 0 first.
  std::vector<std::int32_t> list(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) list[i] = static_cast<std::int32_t>(n - 1 - i);
  if (seed) {
    std::mt19937_64 rng(*seed);
    std::shuffle(list.begin(), list.end(), rng);
  }
  return list;
}

CacheManager::CacheManager(const Config& config, const CacheManagerOptions& options)
    : num_pages_(options.num_pages),
      num_index_pages_(options.num_index_pages > 0 ? options.num_index_pages : options.num_pages),
      page_size_(config.sparse_block_size),
      separate_index_(options.separate_index_pages) {
  config.check();
  FLASHMSA_CHECK_ARG(options.num_pages > 0 && options.num_pages <= INT32_MAX,
                     "num_pages must be in [1, 2^31), got ", options.num_pages);
  FLASHMSA_CHECK_ARG(options.num_index_pages >= 0 && options.num_index_pages <= INT32_MAX,
                     "num_index_pages must be in [0, 2^31), got ", options.num_index_pages);
  FLASHMSA_CHECK_ARG(separate_index_ || options.num_index_pages == 0 ||
                         options.num_index_pages == options.num_pages,
                     "num_index_pages must equal num_pages (", options.num_pages,
                     ") when the index cache shares page ids, got ", options.num_index_pages);
  const ResolvedHeads heads = config.resolve_heads();
  const KvCacheShape shape{num_pages_, heads.num_key_value_heads, config.head_dim, page_size_};
  const DType kv_dtype = config.kv_cache_dtype;
  const DType index_dtype = config.index_cache_dtype;
  const bool nvfp4 = kv_dtype == DType::kNvfp4;
  const bool two = options.layout == KvLayout::kSeparate || options.layout == KvLayout::kTokenMajor;
  const std::int64_t index_pages = num_index_pages();

  CacheManagerOptions buffers = options;
  if (!options.kv_data.data) {
    auto own = [&](std::int64_t bytes) {
      owned_.push_back(std::make_unique<Buffer>(bytes, options.device));
      return CacheBuffer{owned_.back()->data, bytes};
    };
    buffers.kv_data = own(KvCacheView::buffer_bytes(options.layout, kv_dtype, shape));
    buffers.v_data =
        two ? own(KvCacheView::buffer_bytes(options.layout, kv_dtype, shape)) : CacheBuffer{};
    if (nvfp4) {
      buffers.kv_scales = own(KvCacheView::buffer_bytes(options.layout, kv_dtype, shape, true));
      buffers.v_scales = two ? own(KvCacheView::buffer_bytes(options.layout, kv_dtype, shape, true))
                             : CacheBuffer{};
    }
    buffers.index_data = own(IndexCacheView::buffer_bytes(
        index_dtype, index_pages, config.sparse_index_dim, false, page_size_));
    if (index_dtype == DType::kNvfp4) {
      buffers.index_scales = own(IndexCacheView::buffer_bytes(
          index_dtype, index_pages, config.sparse_index_dim, true, page_size_));
    }
  }
  kv_view_ = KvCacheView::make(options.layout, kv_dtype, shape, buffers.kv_data, buffers.v_data,
                               options.device, buffers.kv_scales, buffers.v_scales);
  index_view_ =
      IndexCacheView::make(index_dtype, index_pages, config.sparse_index_dim, buffers.index_data,
                           options.device, buffers.index_scales, page_size_);
  free_ = make_free_list(num_pages_, options.shuffle_seed);
  if (separate_index_) {
    index_free_ = make_free_list(num_index_pages_, options.shuffle_seed
                                                       ? std::optional(*options.shuffle_seed + 1)
                                                       : std::nullopt);
  }
}

CacheManager::~CacheManager() = default;

CacheManager::RequestId CacheManager::add_request() {
  const RequestId id = next_id_++;
  requests_.emplace(id, Request{});
  return id;
}

const CacheManager::Request& CacheManager::request(RequestId id) const {
  auto it = requests_.find(id);
  FLASHMSA_CHECK_ARG(it != requests_.end(), "request id ", id, " is not a live request");
  return it->second;
}

std::int64_t CacheManager::free_index_pages() const {
  return separate_index_ ? static_cast<std::int64_t>(index_free_.size()) : free_pages();
}

std::int64_t CacheManager::append(RequestId id, std::int64_t num_tokens) {
  FLASHMSA_CHECK_ARG(num_tokens >= 0, "num_tokens must be >= 0, got ", num_tokens);
  auto it = requests_.find(id);
  FLASHMSA_CHECK_ARG(it != requests_.end(), "request id ", id, " is not a live request");
  Request& r = it->second;
  FLASHMSA_CHECK_ARG(r.length + num_tokens <= INT32_MAX, "request ", id,
                     " would exceed 2^31 - 1 tokens");
  const std::int64_t new_length = r.length + num_tokens;
  const std::int64_t need =
      (new_length + page_size_ - 1) / page_size_ - static_cast<std::int64_t>(r.pages.size());
  FLASHMSA_CHECK_KIND(ErrorKind::kOutOfResources, need <= free_pages(),
                      "out of cache pages: ", "request ", id, " needs ", need, " more, ",
                      free_pages(), " of ", num_pages_, " are free");
  FLASHMSA_CHECK_KIND(ErrorKind::kOutOfResources, !separate_index_ || need <= free_index_pages(),
                      "out of index-cache pages: request ", id, " needs ", need, " more, ",
                      free_index_pages(), " are free");
  for (std::int64_t i = 0; i < need; ++i) {
    r.pages.push_back(free_.back());
    free_.pop_back();
    if (separate_index_) {
      r.index_pages.push_back(index_free_.back());
      index_free_.pop_back();
    }
  }
  r.length = new_length;
  return new_length;
}

void CacheManager::free_request(RequestId id) {
  const Request& r = request(id);
  // Freed pages go back on top of the stack in reverse, so the next request reuses them in the
  // same order.
  free_.insert(free_.end(), r.pages.rbegin(), r.pages.rend());
  index_free_.insert(index_free_.end(), r.index_pages.rbegin(), r.index_pages.rend());
  requests_.erase(id);
}

std::int64_t CacheManager::length(RequestId id) const {
  return request(id).length;
}

std::span<const std::int32_t> CacheManager::pages(RequestId id) const {
  return request(id).pages;
}

std::span<const std::int32_t> CacheManager::index_pages(RequestId id) const {
  const Request& r = request(id);
  return separate_index_ ? r.index_pages : r.pages;
}

std::vector<CacheManager::RequestId> CacheManager::live_requests() const {
  std::vector<RequestId> ids;
  for (const auto& [id, r] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<std::int32_t> CacheManager::block_table(std::span<const RequestId> ids,
                                                    std::int64_t max_blocks,
                                                    bool index_cache) const {
  FLASHMSA_CHECK_ARG(max_blocks >= 0, "max_blocks must be >= 0, got ", max_blocks);
  std::vector<std::int32_t> table(ids.size() * static_cast<std::size_t>(max_blocks), -1);
  for (std::size_t row = 0; row < ids.size(); ++row) {
    if (ids[row] == kPaddingRequest) continue;
    const auto p = index_cache ? index_pages(ids[row]) : pages(ids[row]);
    FLASHMSA_CHECK_ARG(static_cast<std::int64_t>(p.size()) <= max_blocks, "request ", ids[row],
                       " has ", p.size(), " blocks, more than max_blocks ", max_blocks);
    std::copy(p.begin(), p.end(), table.begin() + static_cast<std::ptrdiff_t>(row * max_blocks));
  }
  return table;
}

std::vector<std::int64_t> CacheManager::slot_mapping(RequestId id, std::int64_t first,
                                                     std::int64_t count, bool index_cache) const {
  const Request& r = request(id);
  FLASHMSA_CHECK_ARG(first >= 0 && count >= 0 && first + count <= r.length, "positions [", first,
                     ", ", first + count, ") must lie within request ", id, "'s ", r.length,
                     " tokens");
  const auto p = index_cache ? index_pages(id) : pages(id);
  std::vector<std::int64_t> slots(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t pos = first + i;
    slots[i] = static_cast<std::int64_t>(p[pos / page_size_]) * page_size_ + pos % page_size_;
  }
  return slots;
}

void CacheManager::check_invariants() const {
  auto fail = [](const std::string& what) { throw Error(ErrorKind::kInternal, what); };
  auto check_pool = [&](std::int64_t n, const std::vector<std::int32_t>& free_list, bool index) {
    std::vector<std::int64_t> owner(static_cast<std::size_t>(n), -2);  // -2: unseen
    for (std::int32_t p : free_list) {
      if (p < 0 || p >= n) fail(detail::concat("free list holds page ", p, " outside the pool"));
      if (owner[p] != -2) fail(detail::concat("page ", p, " is on the free list twice"));
      owner[p] = -1;
    }
    for (const auto& [id, r] : requests_) {
      const auto& list = index ? r.index_pages : r.pages;
      const std::int64_t want = (r.length + page_size_ - 1) / page_size_;
      if (static_cast<std::int64_t>(list.size()) != want) {
        fail(detail::concat("request ", id, " of length ", r.length, " holds ", list.size(),
                            " pages, expected ", want));
      }
      for (std::int32_t p : list) {
        if (p < 0 || p >= n) fail(detail::concat("request ", id, " holds page ", p));
        if (owner[p] != -2) {
          fail(detail::concat(
              "page ", p, " is owned by request ", id, " and also ",
              owner[p] == -1 ? std::string("free") : detail::concat("request ", owner[p])));
        }
        owner[p] = id;
      }
    }
    for (std::int64_t p = 0; p < n; ++p) {
      if (owner[p] == -2) fail(detail::concat("page ", p, " leaked: neither free nor owned"));
    }
  };
  check_pool(num_pages_, free_, false);
  if (separate_index_) check_pool(num_index_pages_, index_free_, true);
}

}  // namespace flashmsa
