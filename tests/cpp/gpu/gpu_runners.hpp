// The GPU runners the GPU tests share: an indexer run on a mirrored Scenario with canaries
// around its outputs, and an attention call mirrored to the device (the CPU checks' runner).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "flashmsa/error.hpp"
#include "flashmsa/ops.hpp"
#include "tests/cpp/attention_checks.hpp"
#include "tests/cpp/gpu/device_scenario.hpp"
#include "tests/cpp/index_checks.hpp"

namespace flashmsa::test {

constexpr std::int64_t kIndexCanary = 64;  // poisoned elements before and after every output
constexpr std::uint32_t kIndexPoison = 0xA5A5A5A5u;

// Device outputs with canaries, downloaded and checked after the run.
struct GpuIndexOutputs {
  std::int64_t topk_count, score_count, width;
  TensorView topk_buffer, score_buffer, workspace;
  IndexOutputs views;

  GpuIndexOutputs(const Scenario& s, DeviceScenario& d) {
    const std::int64_t hkv = s.config.resolve_heads().num_key_value_heads;
    const std::int64_t k = s.config.sparse_topk_blocks;
    width = s.max_blocks + 2;
    topk_count = hkv * s.num_rows * k;
    score_count = hkv * s.num_rows * width;
    topk_buffer = d.output(DType::kInt32, {topk_count + 2 * kIndexCanary});
    score_buffer = d.output(DType::kFp32, {score_count + 2 * kIndexCanary});
    const std::int64_t requests = static_cast<std::int64_t>(s.seq_lens.size());
    workspace = d.output(DType::kUint8,
                         {index_workspace_bytes(s.config, s.num_rows, requests, s.max_blocks)});
    views.topk = TensorView::contiguous(topk_buffer.as<std::int32_t>() + kIndexCanary,
                                        DType::kInt32, {hkv, s.num_rows, k}, Device::kCuda);
    views.block_scores =
        TensorView::contiguous(score_buffer.as<float>() + kIndexCanary, DType::kFp32,
                               {hkv, s.num_rows, width}, Device::kCuda);
    views.workspace = workspace;
  }

  IndexRun download() const {
    const auto topk = test::download<std::int32_t>(topk_buffer.data, topk_count + 2 * kIndexCanary);
    const auto scores = test::download<float>(score_buffer.data, score_count + 2 * kIndexCanary);
    for (std::int64_t i = 0; i < kIndexCanary; ++i) {
      EXPECT_EQ(static_cast<std::uint32_t>(topk[i]), kIndexPoison) << "topk canary before, " << i;
      EXPECT_EQ(static_cast<std::uint32_t>(topk[kIndexCanary + topk_count + i]), kIndexPoison)
          << "topk canary after, " << i;
      std::uint32_t before, after;
      std::memcpy(&before, &scores[i], 4);
      std::memcpy(&after, &scores[kIndexCanary + score_count + i], 4);
      EXPECT_EQ(before, kIndexPoison) << "block_scores canary before, " << i;
      EXPECT_EQ(after, kIndexPoison) << "block_scores canary after, " << i;
    }
    IndexRun run;
    run.width = width;
    run.topk.assign(topk.begin() + kIndexCanary, topk.begin() + kIndexCanary + topk_count);
    run.scores.assign(scores.begin() + kIndexCanary, scores.begin() + kIndexCanary + score_count);
    return run;
  }
};

inline void launch_indexer(const Scenario& s, const DeviceScenario& d, const IndexOutputs& out,
                           const OpOptions& options = {}) {
  if (s.decode_query_len) {
    index_decode(s.config, d.index_q, d.index_cache, d.decode, out, options);
  } else {
    index_prefill(s.config, d.index_q, d.index_cache, d.prefill, out, options);
  }
}

inline IndexRun run_gpu_indexer(const Scenario& s) {
  DeviceScenario d(s);
  GpuIndexOutputs out(s, d);
  launch_indexer(s, d, out.views);
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
  const auto index_before = download<std::byte>(
      d.index_cache.k.data, static_cast<std::size_t>(IndexCacheView::buffer_bytes(
                                d.index_cache.dtype, d.index_cache.num_pages, 128)));
  IndexRun run = out.download();
  // The caches are inputs: byte-identical to the host copy they came from.
  EXPECT_EQ(std::memcmp(index_before.data(), s.cm->index_cache().k.data, index_before.size()), 0)
      << "the index cache changed";
  return run;
}

// Mirrors every view of the call to the device (with a poisoned workspace), runs it there and
// copies everything back.
inline void run_on_gpu(const AttentionCall& call) {
  DeviceMirror m;
  for (const TensorView* t :
       {&call.q, &call.prefill.cu_seqlens_q, &call.prefill.seq_lens, &call.prefill.block_table,
        &call.decode.seq_lens, &call.decode.block_table, &call.topk}) {
    m.add(*t);
  }
  m.add(call.kv);
  for (const auto& [p, n] : call.guarded) m.add(p, n);
  m.add(call.out.out);
  m.add(call.out.lse);
  m.add(call.out.mxfp8_scales);
  m.upload();
  AttentionCall d = call;
  auto on_device = [&](TensorView& t) {
    if (t.data) t = m.device(t);
  };
  for (TensorView* t : {&d.q, &d.prefill.cu_seqlens_q, &d.prefill.seq_lens, &d.prefill.block_table,
                        &d.decode.seq_lens, &d.decode.block_table, &d.topk, &d.out.out, &d.out.lse,
                        &d.out.mxfp8_scales}) {
    on_device(*t);
  }
  d.kv = m.device(call.kv);
  const std::int64_t requests = call.prefill.seq_lens.shape[0];
  DeviceBuffer<std::uint8_t> workspace(static_cast<std::size_t>(std::max<std::int64_t>(
      1, attention_workspace_bytes(call.config, call.q.shape[0], requests))));
  d.out.workspace = workspace_view(workspace);
  run_attention_call(d);
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
  m.download();
}

// A producer call's host views (inputs, caches, outputs) added to `m`, before its upload.
inline void mirror_producer(DeviceMirror& m, const ProducerInputs& in, const KvCacheView& kv,
                            const IndexCacheView& ix, const ProducerOutputs& out) {
  for (const TensorView* t : {&in.qkv_index, &in.q_norm_weight, &in.k_norm_weight,
                              &in.index_q_norm_weight, &in.index_k_norm_weight, &in.positions,
                              &in.slot_mapping, &in.index_slot_mapping, &out.q, &out.index_q}) {
    m.add(*t);
  }
  m.add(kv);
  m.add(ix);
}

// produce_qkv_index on the device copies of an uploaded mirror_producer mirror; waits for it.
inline void run_producer_on_device(const DeviceMirror& m, const Config& c, const ProducerInputs& in,
                                   const KvCacheView& kv, const IndexCacheView& ix,
                                   const ProducerOutputs& out) {
  ProducerInputs d = in;
  for (TensorView* t : {&d.qkv_index, &d.q_norm_weight, &d.k_norm_weight, &d.index_q_norm_weight,
                        &d.index_k_norm_weight, &d.positions, &d.slot_mapping}) {
    *t = m.device(*t);
  }
  if (in.index_slot_mapping.data) d.index_slot_mapping = m.device(in.index_slot_mapping);
  produce_qkv_index(c, d, m.device(kv), m.device(ix), {m.device(out.q), m.device(out.index_q)});
  FLASHMSA_CHECK_CUDA(cudaDeviceSynchronize());
}

inline const AttentionBackend kGpuBf16P{run_on_gpu, DType::kBf16};
inline const AttentionBackend kGpuFp16P{run_on_gpu, DType::kFp16};

}  // namespace flashmsa::test
