// `flashmsa run`: one MiniMax-M3 sparse attention layer served end to end, the way an engine
// calls the library: caches from the cache manager, chunked prefill of a batch of requests
// (producer -> indexer + top-k -> sparse attention), then decode steps (with speculative tokens
// when asked), plus a fidelity check of the sparse output against dense attention.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "flashmsa/flashmsa.hpp"

namespace flashmsa::tools {

enum class Workload { kNeedle, kRandom, kClustered };
const char* to_string(Workload w);

struct RunOptions {
  std::string backend = "auto";  // auto | cpu | cuda
  Workload workload = Workload::kNeedle;
  int requests = 2;
  std::int64_t context = 8192;  // tokens per request
  std::int64_t chunk = 4096;    // prefill chunk
  int decode_steps = 8;
  int spec_tokens = 0;  // decode query length = 1 + spec_tokens
  int topk = 16;
  DType kv_dtype = DType::kBf16;
  DType index_dtype = DType::kBf16;
  TopkOrder topk_order = TopkOrder::kAscending;
  std::uint64_t seed = 1;
  int threads = 0;
  std::string json_path;
  bool quiet = false;
  // Start every step from hidden states through the fused FP8 projection (random layer weights,
  // M3's hidden 6144) instead of the workload's generated q / k / v rows.
  bool fused_projection = false;
};

struct PhaseTimes {
  // Seconds; top-k is fused into the indexer; projection only with --fused-projection.
  double projection = 0, producer = 0, indexer = 0, attention = 0;
  double total() const { return projection + producer + indexer + attention; }
};

struct Report {
  std::string backend, device, gemm;
  Config config;
  std::int64_t prefill_tokens = 0, decode_tokens = 0;
  PhaseTimes prefill, decode;
  double prefill_flops = 0, decode_flops = 0;  // useful FLOPs (indexer + attention)
  double prefill_bytes = 0, decode_bytes = 0;  // bytes that must be read
  // Fidelity on a sample of rows (the last rows of each prefill and every decode row).
  std::int64_t sampled_rows = 0;
  std::int64_t needle_queries = 0;        // (row, kv head) pairs that asked for a planted block
  double needle_hit_rate = -1;            // -1: not a needle workload
  double recall_mean = 0, recall_p5 = 0;  // share of dense softmax mass in the selected blocks
  double relative_error_mean = 0;         // ||sparse - dense|| / ||dense||, per (row, q head)
};

// Whether the options select the CUDA backend: "cuda", or "auto" where an sm_90 GPU is present.
bool cuda_selected(const RunOptions& options);

// Runs the simulation; `progress(fraction, phase)` is called as work completes.
Report run_simulation(const RunOptions& options,
                      const std::function<void(double, const char*)>& progress = {});

void print_report(const Report& report, const RunOptions& options, std::FILE* out);
std::string report_json(const Report& report, const RunOptions& options);

}  // namespace flashmsa::tools
