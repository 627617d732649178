// Host side of the key-stationary prefill attention (gather_attention_kernel.cuh): whether it
// takes a call, its scratch, and the launches of each window of rows.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cub/device/device_scan.cuh>

#include "flashmsa/error.hpp"
#include "src/cuda/launch.hpp"
#include "src/cuda/sm90/attention/gather_attention_kernel.cuh"
#include "src/cuda/sm90/attention/gather_attention_launch.hpp"
#include "src/cuda/sm90/tma.hpp"

namespace flashmsa::cuda {

namespace {

// Rows a window: the partials of a row take kv heads x width x 16 x 520 bytes (2 MB at 4 kv
// heads and width 16 for 4096 rows... per row 532 KB), and a window's pages see window x width
// selections a kv head, enough that most lists fill whole groups of 4 at 128K.
constexpr std::int64_t kWindowRows = 4096;

}  // namespace

bool gather_attention_applies(const AttentionParams& p, DType cache, DType q_dtype) {
  const char* env = std::getenv("FLASHMSA_PREFILL_GATHER");
  if (!env || env[0] != '1') return false;
  return p.topk != nullptr && (cache == DType::kBf16 || cache == DType::kFp16) &&
         q_dtype == cache && p.group == 16 && p.topk_width <= GatherAttentionTraits::kMaxTopk &&
         p.q_head_stride % 8 == 0;
}

void launch_gather_attention(const AttentionParams& p, const KvCacheView& kv, cudaStream_t stream) {
  using T = GatherAttentionTraits;
  const int heads = static_cast<int>(kv.shape.num_kv_heads);
  GatherParams g{};
  const auto k_map = page_plane_tensor_map(kv.k, kv.shape.num_pages, heads, 128, 2, 64);
  const auto v_map = page_plane_tensor_map(kv.v, kv.shape.num_pages, heads, 128, 2, 64);
  const auto q_map =
      query_tensor_map(p.q, p.num_rows, p.num_q_heads, p.q_row_stride, p.q_head_stride, 16);
  FLASHMSA_CHECK_SUPPORTED(k_map && v_map && q_map,
                           "the CUDA driver cannot describe this KV cache or q to the TMA unit");
  g.k_map = *k_map;
  g.v_map = *v_map;
  g.q_map = *q_map;
  g.p = p;
  g.kv_heads = heads;
  g.buckets = std::int64_t{heads} * kv.shape.num_pages;
  const std::int64_t window = std::min(kWindowRows, p.num_rows);
  const std::int64_t slots = window * heads * p.topk_width;

  // Scratch (stream-ordered: a prototype's; the product would take it from the workspace).
  std::size_t scan_bytes = 0;
  FLASHMSA_CHECK_CUDA(
      cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, g.count, g.offset, g.buckets + 1, stream));
  const std::size_t ints = 4 * static_cast<std::size_t>(g.buckets + 1);
  const std::size_t bytes = 4 * ints + 4 * static_cast<std::size_t>(slots) + scan_bytes +
                            static_cast<std::size_t>(slots) * 16 * (8 + 512) + 1024;
  void* scratch = nullptr;
  FLASHMSA_CHECK_CUDA(cudaMallocAsync(&scratch, bytes, stream));
  auto* base = static_cast<std::byte*>(scratch);
  auto take = [&](std::size_t n) {
    std::byte* at = base;
    base += (n + 255) / 256 * 256;
    return at;
  };
  g.count = reinterpret_cast<std::int32_t*>(take(4 * (g.buckets + 1)));
  g.offset = reinterpret_cast<std::int32_t*>(take(4 * (g.buckets + 1)));
  g.fill = reinterpret_cast<std::int32_t*>(take(4 * (g.buckets + 1)));
  g.chunks = reinterpret_cast<std::int32_t*>(take(4 * (g.buckets + 1)));
  g.chunk_offset = reinterpret_cast<std::int32_t*>(take(4 * (g.buckets + 1)));
  g.list = reinterpret_cast<std::int32_t*>(take(4 * slots));
  void* scan_temp = take(scan_bytes);
  g.partial_ml = reinterpret_cast<float2*>(take(8 * 16 * slots));
  g.partial_o = reinterpret_cast<float*>(take(512 * 16 * slots));
  const auto o_map = partial_tensor_map(g.partial_o, 16 * slots);
  FLASHMSA_CHECK_SUPPORTED(o_map.has_value(), "the CUDA driver cannot describe the partials");
  g.o_map = *o_map;

  const int sms = sm_count();
  for (std::int64_t first = 0; first < p.num_rows; first += window) {
    g.first_row = first;
    g.rows = static_cast<std::int32_t>(std::min(window, p.num_rows - first));
    const std::int64_t threads = std::int64_t{g.rows} * heads;
    const dim3 list_grid(static_cast<unsigned>(ceil_div(threads, 256)));
    const dim3 bucket_grid(static_cast<unsigned>(ceil_div(g.buckets, 256)));
    FLASHMSA_CHECK_CUDA(cudaMemsetAsync(g.count, 0, 4 * (g.buckets + 1), stream));
    FLASHMSA_CHECK_CUDA(cudaMemsetAsync(g.fill, 0, 4 * (g.buckets + 1), stream));
    FLASHMSA_CHECK_CUDA(cudaMemsetAsync(g.chunks, 0, 4 * (g.buckets + 1), stream));
    launch_kernel(gather_list_kernel<false>, list_grid, 256, 0, stream, g);
    FLASHMSA_CHECK_CUDA(cub::DeviceScan::ExclusiveSum(scan_temp, scan_bytes, g.count, g.offset,
                                                      g.buckets + 1, stream));
    launch_kernel(gather_list_kernel<true>, list_grid, 256, 0, stream, g);
    launch_kernel(gather_chunk_kernel, bucket_grid, 256, 0, stream, g);
    FLASHMSA_CHECK_CUDA(cub::DeviceScan::ExclusiveSum(scan_temp, scan_bytes, g.chunks,
                                                      g.chunk_offset, g.buckets + 1, stream));
    auto kernel = kv.dtype == DType::kBf16 ? gather_attention_kernel<__nv_bfloat16>
                                           : gather_attention_kernel<__half>;
    launch_dependent_cluster_kernel(kernel, dim3(static_cast<unsigned>(sms)), dim3(1, 1, 1),
                                    T::kThreads, T::kSmemBytes, stream, g);
    launch_dependent_cluster_kernel(
        gather_combine_kernel,
        dim3(static_cast<unsigned>(ceil_div(std::int64_t{g.rows} * heads * 64, 256))),
        dim3(1, 1, 1), 256, 0, stream, g);
  }
  FLASHMSA_CHECK_CUDA(cudaFreeAsync(scratch, stream));
}

}  // namespace flashmsa::cuda
