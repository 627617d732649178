// Host side of the CUDA attention: checks what only the CUDA path needs (alignment, widths,
// workspace), fills AttentionParams and launches plan (prefill) and attention (decode splits in
// clusters). No host synchronisation and no allocation: decode can be captured in a graph.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "flashmsa/error.hpp"
#include "src/attention_workspace.hpp"
#include "src/cuda/cuda_ops.hpp"
#include "src/cuda/launch.hpp"
#include "src/cuda/sm90/attention/attention_launch.hpp"
#include "src/cuda/sm90/attention/epilogue.cuh"
#include "src/cuda/sm90/attention/prefill_attention_launch.hpp"
#include "src/cuda/sm90/indexer/index_topk_select.cuh"
#include "src/cuda/sm90/indexer/indexer_host.hpp"
#include "src/cuda/sm90/scheduler/row_map.hpp"

namespace flashmsa::cuda {

// Prefill rows no request covers (inconsistent cu_seqlens) get zeros and -inf, as on the CPU.
constexpr int kAttentionEmptyRowThreads = 256;

__global__ void __launch_bounds__(kAttentionEmptyRowThreads)
    attention_empty_rows_kernel(const __grid_constant__ AttentionParams p) {
  const std::int64_t t = blockIdx.x;
  if (p.rows.request_of(t) >= 0) return;
  const float zeros[32] = {};
  for (int item = threadIdx.x; item < p.num_q_heads * 4; item += kAttentionEmptyRowThreads) {
    attention_detail::store_values(p.store, t, item / 4, item % 4 * 32, zeros, -INFINITY);
  }
}

static_assert(AttentionDecode1Traits::kRows == 1 && AttentionDecodeSpecTraits::kRows == 4,
              "attention_decode_tile_rows chooses between these two");

namespace {

void check_plane(const CachePlane& c, const char* name, std::int64_t alignment) {
  FLASHMSA_CHECK_ARG(plane_aligned(c, alignment), "kv_cache.", name, " rows must be ", alignment,
                     "-byte aligned on the CUDA backend (pointer and page / head / token strides)");
}

// The common part of every attention launch.
AttentionParams common_params(const Config& config, const TensorView& q, const KvCacheView& kv,
                              const TensorView& block_table, const TensorView* topk,
                              const AttentionOutputs& out) {
  const ResolvedHeads heads = config.resolve_heads();
  const std::int64_t group = heads.num_attention_heads / heads.num_key_value_heads;
  FLASHMSA_CHECK_SUPPORTED(group >= 1 && group <= 16,
                           "the CUDA attention needs at most 16 q heads per kv head, got ", group);
  FLASHMSA_CHECK_ARG(
      q.stride[2] == 1 && aligned(q.data, 16) && q.stride[0] % 8 == 0 && q.stride[1] % 8 == 0,
      "q must have contiguous, 16-byte aligned head vectors on the CUDA backend");
  check_plane(kv.k, "k", 16);
  check_plane(kv.v, "v", 16);
  if (kv.dtype == DType::kNvfp4) {
    check_plane(kv.k_block_scale, "k_block_scale", 8);
    check_plane(kv.v_block_scale, "v_block_scale", 8);
  }

  AttentionParams p;
  p.clock = phase_clock(PhaseKernel::kAttention);
  p.q = q.data;
  p.q_row_stride = q.stride[0];
  p.q_head_stride = q.stride[1];
  p.k = device_plane(kv.k);
  p.v = device_plane(kv.v);
  p.k_scales = device_plane(kv.k_block_scale);
  p.v_scales = device_plane(kv.v_block_scale);
  p.num_pages = kv.shape.num_pages;
  p.block_table = block_table.as<const std::int32_t>();
  p.table_stride = block_table.stride[0];
  p.max_blocks = static_cast<std::int32_t>(block_table.shape[1]);
  p.group = static_cast<std::int32_t>(group);
  p.num_q_heads = static_cast<std::int32_t>(heads.num_attention_heads);
  const bool fp8 = kv.dtype == DType::kFp8E4m3 || kv.dtype == DType::kFp8E5m2;
  constexpr float kLog2e = 1.4426950408889634f;
  p.score_scale_log2 = config.resolved_softmax_scale() * (fp8 ? kv.k_scale : 1.0f) * kLog2e;
  p.v_scale = fp8 ? kv.v_scale : 1.0f;
  p.num_rows = q.shape[0];
  if (topk) {
    FLASHMSA_CHECK_SUPPORTED(topk->shape[2] <= AttentionPrefillTraits::kMaxTopk,
                             "the CUDA attention takes top-k lists of at most ",
                             AttentionPrefillTraits::kMaxTopk, " blocks, got ", topk->shape[2]);
    p.topk = topk->as<const std::int32_t>();
    for (int i = 0; i < 3; ++i) p.topk_stride[i] = topk->stride[i];
    p.topk_width = static_cast<std::int32_t>(topk->shape[2]);
  }

  AttentionStore& s = p.store;
  s.out = out.out.data;
  s.dtype = out.out.dtype;
  FLASHMSA_CHECK_ARG(aligned(out.out.data, 16), "out must be 16-byte aligned on the CUDA backend");
  if (s.dtype == DType::kFp8E4m3) {
    FLASHMSA_CHECK_ARG(out.out.stride[1] == 1 && out.out.stride[0] % 16 == 0,
                       "out (MXFP8) must have contiguous rows with a stride that is a multiple "
                       "of 16 bytes on the CUDA backend, got stride ",
                       out.out.stride[0]);
    s.row_stride = out.out.stride[0];
    s.mxfp8_scales = out.mxfp8_scales.as<std::uint8_t>();
    s.mxfp8_scale_cols = out.out.shape[1] / fmt::kMxfp8GroupSize;
    s.mxfp8_layout = out.mxfp8_scale_layout;
    s.mxfp8_rule = out.mxfp8_scale_rule;
  } else {
    const std::int64_t per16 = 16 / (dtype_bits(s.dtype) / 8);
    FLASHMSA_CHECK_ARG(
        out.out.stride[2] == 1 && out.out.stride[0] % per16 == 0 && out.out.stride[1] % per16 == 0,
        "out must have contiguous, 16-byte aligned head vectors on the CUDA "
        "backend");
    s.row_stride = out.out.stride[0];
    s.head_stride = out.out.stride[1];
  }
  if (out.lse.data) {
    s.lse = out.lse.as<float>();
    s.lse_row_stride = out.lse.stride[0];
    s.lse_head_stride = out.lse.stride[1];
  }
  return p;
}

std::byte* checked_workspace(const AttentionOutputs& out, std::int64_t bytes) {
  if (bytes == 0) return nullptr;
  return cuda::checked_workspace(out.workspace, bytes, "attention_workspace_bytes");
}

void run_prefill(AttentionParams p, const PrefillBatch& batch, const KvCacheView& kv, DType q_dtype,
                 const AttentionOutputs& out, cudaStream_t stream) {
  const std::int64_t num_requests = batch.seq_lens.shape[0];
  const auto layout = detail::attention_prefill_layout(num_requests);
  std::byte* ws = checked_workspace(out, layout.bytes);
  auto* begin = reinterpret_cast<std::int32_t*>(ws + layout.request_begin);
  auto* end = reinterpret_cast<std::int32_t*>(ws + layout.request_end);
  auto* tiles = reinterpret_cast<std::int32_t*>(ws + layout.tile_offset);
  p.rows.seq_lens = batch.seq_lens.as<const std::int32_t>();
  p.rows.seq_lens_stride = batch.seq_lens.stride[0];
  p.rows.num_requests = static_cast<std::int32_t>(num_requests);
  p.rows.request_begin = begin;
  p.rows.request_end = end;
  p.tile_offset = tiles;
  if (p.num_rows == 0) return;
  if (num_requests > 0) {
    IndexPlanParams plan;
    plan.cu_seqlens = batch.cu_seqlens_q.as<const std::int32_t>();
    plan.cu_stride = batch.cu_seqlens_q.stride[0];
    plan.num_requests = p.rows.num_requests;
    plan.num_rows = p.num_rows;
    plan.chunk = {0, p.num_rows};
    plan.tile_rows = AttentionPrefillTraits::kRows;
    plan.request_begin = begin;
    plan.request_end = end;
    plan.tile_offset = tiles;
    launch_index_plan(plan, stream);
    const dim3 grid(
        static_cast<unsigned>(ceil_div(p.num_rows, AttentionPrefillTraits::kRows) + num_requests),
        static_cast<unsigned>(p.num_q_heads / p.group), 1);
    // 16-bit caches on the wgmma kernel, the 8- and 4-bit ones on attention_kernel.
    if (kv.dtype == DType::kBf16 || kv.dtype == DType::kFp16) {
      launch_prefill_attention(p, kv, q_dtype, grid, stream);
    } else {
      launch_attention<AttentionPrefillTraits>(p, kv.dtype, q_dtype, grid, stream);
    }
  }
  launch_kernel(attention_empty_rows_kernel, dim3(static_cast<unsigned>(p.num_rows)),
                kAttentionEmptyRowThreads, 0, stream, p);
}

// The decode caches whose 1-row tiles stream each warp's keys through its own ring, two CTAs an SM
// (attention_warp_rings, for the dtypes launch_attention maps to kernels).
bool decode_register_tiles(DType cache, DType q) {
  static_assert(
      attention_warp_rings<AttentionDecode1Traits, KvFormat::kE4m3, __nv_bfloat16>() &&
      attention_warp_rings<AttentionDecode1Traits, KvFormat::kE5m2, __nv_bfloat16>() &&
      attention_warp_rings<AttentionDecode1Traits, KvFormat::kNvfp4, __nv_bfloat16>() &&
      !attention_warp_rings<AttentionDecode1Traits, KvFormat::kE4m3, __half>() &&
      !attention_warp_rings<AttentionDecode1Traits, KvFormat::kNative16, __nv_bfloat16>());
  const bool quantized =
      cache == DType::kFp8E4m3 || cache == DType::kFp8E5m2 || cache == DType::kNvfp4;
  return quantized && q != DType::kFp16;
}

// DecodeClusterWave of the traits' kernel for the cache and q dtypes on the current device (asked
// once per device: the occupancy calculator is a driver call).
template <class Traits>
const detail::DecodeClusterWave& decode_cluster_wave(DType cache, DType q) {
  static std::mutex mutex;
  static std::map<std::tuple<int, DType, DType>, detail::DecodeClusterWave> known;
  int device = 0;
  FLASHMSA_CHECK_CUDA(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto [it, inserted] = known.try_emplace({device, cache, q});
  if (inserted) {
    try {
      with_attention_kernel<Traits, void>(
          cache, q, [&]<KvFormat kFormat, class Elem, class QElem>() {
            for (std::size_t size = 1; size < it->second.size(); ++size) {
              it->second[size] = attention_kernel_clusters_at_once<Traits, kFormat, Elem, QElem>(
                  static_cast<int>(size));
            }
          });
    } catch (...) {
      known.erase(it);
      throw;
    }
  }
  return it->second;
}

// The decode kernels (attention_traits.hpp), one per traits.
enum class DecodeKernel { kFourRow, kOneRow, kOneRowSelect, kTwoPerSm, kTwoPerSmSelect };

// Returns f.template operator()<Traits>() for the kernel's traits.
template <class F>
decltype(auto) with_decode_traits(DecodeKernel kernel, F&& f) {
  switch (kernel) {
    case DecodeKernel::kFourRow: return f.template operator()<AttentionDecodeSpecTraits>();
    case DecodeKernel::kOneRow: return f.template operator()<AttentionDecode1Traits>();
    case DecodeKernel::kOneRowSelect: return f.template operator()<AttentionDecode1SelectTraits>();
    case DecodeKernel::kTwoPerSm: return f.template operator()<AttentionDecode1TwoPerSmTraits>();
    case DecodeKernel::kTwoPerSmSelect:
      return f.template operator()<AttentionDecode1TwoPerSmSelectTraits>();
  }
  throw Error(ErrorKind::kInternal, "unknown decode kernel");
}

bool selects(DecodeKernel kernel) {
  return kernel == DecodeKernel::kOneRowSelect || kernel == DecodeKernel::kTwoPerSmSelect;
}

// A decode batch's grid: row tiles (attention_decode_tile_rows), one CTA per (request's tile, kv
// head, split), run by `kernel`; the splits from that kernel's cluster wave. `select`: the 1-row
// tile that makes its own selection, where this build has it.
struct DecodeGrid {
  std::int64_t splits;
  DecodeKernel kernel;
  dim3 grid;
};
DecodeGrid decode_grid(std::int64_t num_requests, int dql, std::int64_t hkv,
                       std::int64_t topk_width, DType cache, DType q, bool select) {
  const bool register_tiles = decode_register_tiles(cache, q);
  const std::int64_t tile_rows =
      detail::attention_decode_tile_rows(num_requests, dql, hkv, register_tiles);
  const std::int64_t tiles = num_requests * ceil_div(dql, tile_rows) * hkv;
  DecodeKernel kernel = DecodeKernel::kFourRow;
  if (tile_rows == 1) {
    // 16-bit caches: one CTA an SM keeps 3 whole pages in flight (the latency of small batches),
    // but more tiles than SMs would run a second wave of them, each CTA's selection, first page
    // and epilogue exposed twice (H200, bf16 64 x 32K: 2 x ~37 us): the two-CTAs-an-SM kernel.
    const bool two_per_sm = (cache == DType::kBf16 || cache == DType::kFp16) &&
                            tiles > sm_count() &&
                            attention_compiled<AttentionDecode1TwoPerSmTraits>(cache, q);
    kernel = two_per_sm ? DecodeKernel::kTwoPerSm : DecodeKernel::kOneRow;
    if (select) {
      const DecodeKernel selecting =
          two_per_sm ? DecodeKernel::kTwoPerSmSelect : DecodeKernel::kOneRowSelect;
      if (with_decode_traits(
              selecting, [&]<class Traits>() { return attention_compiled<Traits>(cache, q); })) {
        kernel = selecting;
      }
    }
  }
  const detail::DecodeClusterWave& wave =
      with_decode_traits(kernel, [&]<class Traits>() -> const detail::DecodeClusterWave& {
        return decode_cluster_wave<Traits>(cache, q);
      });
  const std::int64_t splits =
      detail::attention_decode_splits(num_requests, dql, hkv, topk_width, register_tiles, wave);
  return {splits, kernel,
          dim3(static_cast<unsigned>(num_requests * ceil_div(dql, tile_rows)),
               static_cast<unsigned>(hkv), static_cast<unsigned>(splits))};
}

// Decode over `topk`, or (select) over the selection each 1-row tile makes itself.
void run_decode(const Config& config, const TensorView& q, const KvCacheView& kv,
                const DecodeBatch& batch, const TensorView* topk,
                const std::optional<IndexTopkParams>& select, const AttentionOutputs& out,
                void* stream) {
  AttentionParams p = common_params(config, q, kv, batch.block_table, topk, out);
  if (select) {
    p.select = *select;
    p.topk_width = select->topk;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const std::int64_t num_requests = batch.seq_lens.shape[0];
  const int dql = batch.decode_query_len;
  const std::int64_t hkv = p.num_q_heads / p.group;
  p.rows.seq_lens = batch.seq_lens.as<const std::int32_t>();
  p.rows.seq_lens_stride = batch.seq_lens.stride[0];
  p.rows.num_requests = static_cast<std::int32_t>(num_requests);
  p.rows.decode_query_len = dql;
  if (num_requests == 0) return;
  const DecodeGrid d =
      decode_grid(num_requests, dql, hkv, p.topk_width, kv.dtype, q.dtype, select.has_value());
  FLASHMSA_CHECK_KIND(ErrorKind::kInternal, selects(d.kernel) == select.has_value(),
                      "a decode selection made in the attention needs its selecting 1-row tiles");
  FLASHMSA_CHECK_KIND(ErrorKind::kInternal, topk != nullptr || select.has_value(),
                      "the decode tiles read top-k lists or select (they have no dense path)");
  p.splits = static_cast<std::int32_t>(d.splits);
  with_decode_traits(
      d.kernel, [&]<class Traits>() { launch_attention<Traits>(p, kv.dtype, q.dtype, d.grid, s); });
}

}  // namespace

void sparse_attention_prefill(const Config& config, const TensorView& q, const KvCacheView& kv,
                              const PrefillBatch& batch, const TensorView& topk,
                              const AttentionOutputs& out, void* stream) {
  const AttentionParams p = common_params(config, q, kv, batch.block_table, &topk, out);
  run_prefill(p, batch, kv, q.dtype, out, static_cast<cudaStream_t>(stream));
}

void dense_attention(const Config& config, const TensorView& q, const KvCacheView& kv,
                     const PrefillBatch& batch, const AttentionOutputs& out, void* stream) {
  const AttentionParams p = common_params(config, q, kv, batch.block_table, nullptr, out);
  run_prefill(p, batch, kv, q.dtype, out, static_cast<cudaStream_t>(stream));
}

void sparse_attention_decode(const Config& config, const TensorView& q, const KvCacheView& kv,
                             const DecodeBatch& batch, const TensorView& topk,
                             const AttentionOutputs& out, void* stream) {
  run_decode(config, q, kv, batch, &topk, std::nullopt, out, stream);
}

void sparse_decode_step(const Config& config, const TensorView& index_q,
                        const IndexCacheView& index_cache, const TensorView& q,
                        const KvCacheView& kv, const DecodeBatch& batch,
                        const IndexOutputs& index_out, const AttentionOutputs& out, void* stream) {
  // The attention selects where its tiles hold one row, the row's keys fit the stages it lends
  // (kAttentionSelectSmem) and its grid holds at most two CTAs an SM: the selection costs each
  // CTA 3-8 us before its pages, which a grid of several waves pays once a wave where the top-k
  // kernel pays it once (H200: fp8 64 x 32K dql 4, 1024 CTAs, 233 us against 231.7;
  // fp8 128 x 128K, 512 CTAs, 590-650 against 590). The indexer then launches no top-k kernel.
  // A build that left the selecting kernel out (FLASHMSA_SM90_KERNELS) runs the two ops.
  const DecodeGrid d = decode_grid(batch.seq_lens.shape[0], batch.decode_query_len,
                                   config.resolve_heads().num_key_value_heads,
                                   config.sparse_topk_blocks, kv.dtype, q.dtype, true);
  const std::int64_t ctas = std::int64_t{d.grid.x} * d.grid.y * d.grid.z;
  const bool two_ctas_an_sm = ctas <= detail::kAttentionRegisterTileCtasPerSm * sm_count();
  static_assert(
      AttentionDecode1SelectTraits::kMaxTopk == AttentionDecode1TwoPerSmSelectTraits::kMaxTopk &&
          AttentionDecode1SelectTraits::kThreads == AttentionDecode1TwoPerSmSelectTraits::kThreads,
      "both selecting tiles take the same selections");
  const bool fits = config.sparse_topk_blocks <= AttentionDecode1SelectTraits::kMaxTopk &&
                    topk_select_smem_bytes<AttentionDecode1SelectTraits::kThreads>(
                        static_cast<int>(batch.block_table.shape[1])) <= kAttentionSelectSmem;
  const std::optional<IndexTopkParams> select =
      index_decode_run(config, index_q, index_cache, batch, index_out, stream,
                       selects(d.kernel) && two_ctas_an_sm && fits ? DecodeSelection::kDeferred
                                                                   : DecodeSelection::kHere);
  run_decode(config, q, kv, batch, select ? nullptr : &index_out.topk, select, out, stream);
}

}  // namespace flashmsa::cuda
