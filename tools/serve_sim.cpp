#include "tools/serve_sim.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "src/cuda/device_info.hpp"

namespace flashmsa::tools {

const char* to_string(Workload w) {
  switch (w) {
    case Workload::kNeedle: return "needle";
    case Workload::kRandom: return "random";
    case Workload::kClustered: return "clustered";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

constexpr std::int64_t kHq = 64, kHkv = 4, kD = 128, kHidx = 4, kDi = 128, kBlock = 128;
constexpr std::int64_t kWidth = kHq * kD + 2 * kHkv * kD + kHidx * kDi + kDi;
constexpr std::int64_t kKOff = kHq * kD, kVOff = kKOff + kHkv * kD, kIqOff = kVOff + kHkv * kD;
constexpr std::int64_t kIkOff = kIqOff + kHidx * kDi;
constexpr int kNeedles = 4;
constexpr int kTopics = 8;
// Needle strength on the 64 dims RoPE leaves alone: large enough that a planted block's index
// score stands far above the best of thousands of random blocks after RMSNorm.
constexpr float kNeedleGain = 12.0f;
// Topic strength: a query's own topic blocks then hold most of the dense attention mass, as in
// real long-context attention (weaker topics leave the mass spread almost as in `random`).
constexpr float kTopicGain = 8.0f;

// Generates the raw projection rows [q | k | v | iq | ik] of each token, with the workload's
// structure planted in dims 64..127 of the heads (RoPE rotates only dims 0..63).
class Generator {
 public:
  Generator(const RunOptions& o) : options_(o), rng_(o.seed) {
    auto unit = [&] {
      std::vector<float> v(64);
      float n = 0;
      for (float& x : v) {
        x = normal_(rng_);
        n += x * x;
      }
      for (float& x : v) x /= std::sqrt(n);
      return v;
    };
    for (int r = 0; r < o.requests; ++r) {
      std::vector<std::int64_t> blocks;
      const std::int64_t nb = o.context / kBlock;
      for (int i = 0; i < kNeedles; ++i) blocks.push_back(1 + (nb - 3) * (i + 1) / (kNeedles + 1));
      needle_blocks_.push_back(blocks);
    }
    for (int i = 0; i < std::max(kNeedles, kTopics); ++i) {
      index_dir_.push_back(unit());
      for (int h = 0; h < kHkv; ++h) key_dir_.push_back(unit());
    }
    topic_of_block_.resize(static_cast<std::size_t>(o.context / kBlock + 64));
    for (auto& t : topic_of_block_) t = static_cast<int>(rng_() % kTopics);
  }

  const std::vector<std::int64_t>& needle_blocks(int r) const { return needle_blocks_[r]; }

  // Which planted direction row (request, position) asks for: a needle index or a topic, -1 none.
  int asks(int request, std::int64_t position, bool sampled) const {
    if (options_.workload == Workload::kNeedle)
      return sampled ? static_cast<int>(position % kNeedles) : -1;
    if (options_.workload == Workload::kClustered)
      return (request + static_cast<int>(position / 512)) % kTopics;
    return -1;
  }
  // The direction a key at (request, position) carries, -1 none.
  int carries(int request, std::int64_t position) const {
    const std::int64_t block = position / kBlock;
    if (options_.workload == Workload::kNeedle) {
      for (int i = 0; i < kNeedles; ++i) {
        if (needle_blocks_[request][i] == block) return i;
      }
      return -1;
    }
    if (options_.workload == Workload::kClustered) return topic_of_block_[block];
    return -1;
  }

  void row(int request, std::int64_t position, bool sampled, std::uint16_t* out) {
    float x[kWidth];
    for (float& v : x) v = normal_(rng_);
    const float gain = options_.workload == Workload::kNeedle ? kNeedleGain : kTopicGain;
    if (const int q = asks(request, position, sampled); q >= 0) {
      for (std::int64_t h = 0; h < kHidx; ++h) add(x + kIqOff + h * kDi, index_dir_[q], gain);
      for (std::int64_t h = 0; h < kHq; ++h) add(x + h * kD, key_dir_[q * kHkv + h / 16], gain);
    }
    if (const int k = carries(request, position); k >= 0) {
      add(x + kIkOff, index_dir_[k], gain);
      for (std::int64_t h = 0; h < kHkv; ++h) add(x + kKOff + h * kD, key_dir_[k * kHkv + h], gain);
    }
    for (std::int64_t i = 0; i < kWidth; ++i) out[i] = fmt::float_to_bf16(x[i]);
  }

 private:
  static void add(float* head, const std::vector<float>& dir, float gain) {
    for (int i = 0; i < 64; ++i) head[64 + i] += gain * dir[i];
  }
  const RunOptions& options_;
  std::mt19937_64 rng_;
  std::normal_distribution<float> normal_;
  std::vector<std::vector<std::int64_t>> needle_blocks_;
  std::vector<std::vector<float>> index_dir_, key_dir_;
  std::vector<int> topic_of_block_;
};

// Everything one engine step hands to the library.
struct Step {
  std::vector<std::int32_t> cu, lens, table;
  std::vector<std::int64_t> slots, positions;
  std::vector<int> request_of_row;
  std::vector<bool> sampled;
  std::int64_t rows = 0;
};

std::int64_t elem_bytes(DType d) {
  return d == DType::kNvfp4 ? 0 : dtype_bits(d) / 8;
}
double row_bytes(DType d, std::int64_t dim) {
  return d == DType::kNvfp4 ? dim / 2.0 + dim / 16.0 : static_cast<double>(dim * elem_bytes(d));
}

constexpr std::int64_t kHidden = 6144;  // MiniMax-M3's hidden size

// --fused-projection: the layer's packed FP8 projection, built from random bf16 weights of
// variance 1 / hidden (so unit-variance hidden states give fused rows of about unit variance, as
// the generated ones), on the run's device; and the hidden states of each step.
class FusedProjection {
 public:
  FusedProjection(const RunOptions& o, const Config& config, bool on_gpu)
      : rng_(o.seed ^ 0x9E3779B97F4A7C15ull) {
    if (!o.fused_projection) return;
    const float amplitude = std::sqrt(3.0f / kHidden);  // uniform with variance 1 / hidden
    auto weight = [&](std::int64_t rows) { return random_bf16(rows * kHidden, amplitude); };
    const std::vector<std::uint16_t> q = weight(kHq * kD), k = weight(kHkv * kD),
                                     v = weight(kHkv * kD), iq = weight(kHidx * kDi),
                                     ik = weight(kDi);
    auto view = [](const std::vector<std::uint16_t>& w) {
      return TensorView::contiguous(w.data(), DType::kBf16,
                                    {static_cast<std::int64_t>(w.size()) / kHidden, kHidden});
    };
    packed_ =
        pack_qkv_index_projection(config, 1, 0, {view(q), view(k), view(v), view(iq), view(ik)});
    weight_ = TensorView::contiguous(packed_.weight.data(), DType::kFp8E4m3,
                                     {packed_.out_features, kHidden});
    scale_ = TensorView::contiguous(packed_.scale.data(), DType::kFp32, {packed_.out_features});
    if (on_gpu) {
      for (TensorView* t : {&weight_, &scale_}) {
        const std::size_t bytes = static_cast<std::size_t>(t->numel() * dtype_bits(t->dtype) / 8);
        void* d = cuda::device_malloc(bytes);
        device_.push_back(d);
        cuda::copy_host_to_device(d, t->data, bytes);
        t->data = d;
        t->device = Device::kCuda;
      }
    }
  }
  ~FusedProjection() {
    for (void* p : device_) cuda::device_free(p);
  }
  FusedProjection(const FusedProjection&) = delete;
  FusedProjection& operator=(const FusedProjection&) = delete;

  ProjectionWeightView view() const { return {weight_, scale_}; }
  // Unit-variance hidden states of `tokens` tokens.
  std::vector<std::uint16_t> hidden_states(std::int64_t tokens) {
    return random_bf16(tokens * kHidden, std::sqrt(3.0f));
  }

 private:
  // Uniform values in [-amplitude, amplitude] as bf16 (a fast generator: these are many).
  std::vector<std::uint16_t> random_bf16(std::int64_t n, float amplitude) {
    std::vector<std::uint16_t> x(static_cast<std::size_t>(n));
    std::uint64_t state = rng_();
    for (auto& e : x) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      const float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      e = fmt::float_to_bf16((2.0f * u - 1.0f) * amplitude);
    }
    return x;
  }
  std::mt19937_64 rng_;
  PackedProjection packed_;
  TensorView weight_, scale_;
  std::vector<void*> device_;
};

struct Fidelity {
  std::vector<double> recall, rel_error;
  std::int64_t needle_queries = 0, needle_hits = 0, rows = 0;
};

// A step's arrays where the ops need them: the host vectors themselves on the CPU backend,
// device copies on the CUDA backend (outputs copied back by fetch()).
class Staging {
 public:
  explicit Staging(bool cuda) : cuda_(cuda) {}
  ~Staging() {
    for (void* p : buffers_) cuda::device_free(p);
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  TensorView in(const void* host, DType dtype, std::initializer_list<std::int64_t> shape) {
    TensorView t = TensorView::contiguous(const_cast<void*>(host), dtype, shape);
    if (!cuda_) return t;
    t.data = allocate(bytes(t));
    t.device = Device::kCuda;
    cuda::copy_host_to_device(t.data, host, bytes(t));
    return t;
  }
  TensorView out(void* host, DType dtype, std::initializer_list<std::int64_t> shape) {
    TensorView t = TensorView::contiguous(host, dtype, shape);
    if (!cuda_) return t;
    t.data = allocate(bytes(t));
    t.device = Device::kCuda;
    outputs_.push_back({host, t.data, bytes(t)});
    return t;
  }
  // A device tensor the run writes and reads but never copies back (CUDA only).
  TensorView scratch(DType dtype, std::initializer_list<std::int64_t> shape) {
    TensorView t = TensorView::contiguous(static_cast<void*>(nullptr), dtype, shape, Device::kCuda);
    t.data = allocate(bytes(t));
    return t;
  }
  TensorView workspace(std::int64_t size) {
    if (!cuda_) return {};
    return TensorView::contiguous(allocate(static_cast<std::size_t>(size)), DType::kUint8,
                                  {std::max<std::int64_t>(1, size)}, Device::kCuda);
  }
  // Waits for the device (so phase timings are honest) and copies the outputs back.
  void finish_phase() const {
    if (cuda_) cuda::device_synchronize();
  }
  void fetch() {
    for (const Output& o : outputs_) cuda::copy_device_to_host(o.host, o.device, o.bytes);
    outputs_.clear();
  }

 private:
  struct Output {
    void* host;
    const void* device;
    std::size_t bytes;
  };
  static std::size_t bytes(const TensorView& t) {
    return static_cast<std::size_t>(t.numel() * dtype_bits(t.dtype) / 8);
  }
  void* allocate(std::size_t n) {
    buffers_.push_back(cuda::device_malloc(std::max<std::size_t>(n, 1)));
    return buffers_.back();
  }
  bool cuda_;
  std::vector<void*> buffers_;
  std::vector<Output> outputs_;
};

}  // namespace

bool cuda_selected(const RunOptions& o) {
  return o.backend == "cuda" ||
         (o.backend == "auto" && !backend_unavailable_reason(Backend::kCudaSm90));
}

Report run_simulation(const RunOptions& o,
                      const std::function<void(double, const char*)>& progress) {
  Config config;
  config.kv_cache_dtype = o.kv_dtype;
  config.set_index_cache_dtype(o.index_dtype);
  config.topk_order = o.topk_order;
  config.sparse_topk_blocks = o.topk;
  config.fuse_qkv_index_projection = o.fused_projection;
  config.check();  // the fused path's rule: fp8 indexer, fp8 main cache
  Report rep;
  rep.config = config;
  const bool on_gpu = cuda_selected(o);
  rep.backend = on_gpu ? "cuda_sm90" : "cpu";
  rep.device = on_gpu ? cuda::device_name()
                      : detail::concat("CPU, ", cpu_worker_threads(o.threads), " threads");
  rep.gemm = on_gpu ? "tensor cores (mma.sync)" : cpu_matrix_library();
  const int dql = 1 + o.spec_tokens;
  const std::int64_t total_len = o.context + static_cast<std::int64_t>(o.decode_steps) * dql;
  const std::int64_t pages_per_request = (total_len + kBlock - 1) / kBlock;
  CacheManager cm(config, {.num_pages = o.requests * pages_per_request + 1,
                           .device = on_gpu ? Device::kCuda : Device::kCpu,
                           .shuffle_seed = o.seed});
  std::vector<CacheManager::RequestId> ids;
  for (int r = 0; r < o.requests; ++r) ids.push_back(cm.add_request());
  Generator gen(o);
  const OpOptions op{.num_threads = o.threads};
  std::vector<std::uint16_t> zeros_w(kD, fmt::float_to_bf16(0.0f));
  FusedProjection projection(o, config, on_gpu);

  const std::int64_t chunks = (o.context + o.chunk - 1) / o.chunk;
  // The progress bar advances by work, not by steps: a query costs its attention over
  // min(top-k blocks, its context) keys plus the indexer's scoring of its whole context (about an
  // eighth of a key's attention cost: 4 index heads against 64 q heads).
  auto step_work = [&](std::int64_t first_position, std::int64_t new_tokens) {
    const double mid = static_cast<double>(first_position) + 0.5 * static_cast<double>(new_tokens);
    return static_cast<double>(new_tokens) *
           (std::min(static_cast<double>(o.topk) * kBlock, mid) + mid / 8 + 1) * o.requests;
  };
  double total_work = 0, done = 0;
  for (std::int64_t c = 0; c < chunks; ++c) {
    total_work += step_work(c * o.chunk, std::min(o.chunk, o.context - c * o.chunk));
  }
  for (int s = 0; s < o.decode_steps; ++s) total_work += step_work(o.context + s * dql, dql);
  Fidelity fid;

  // Runs one step over rows_per_request[r] new tokens of every request.
  auto run_step = [&](const std::vector<std::int64_t>& new_tokens, bool decode,
                      std::int64_t sample_last) {
    Step st;
    st.cu.push_back(0);
    std::int64_t max_blocks = 0;
    for (int r = 0; r < o.requests; ++r) {
      const std::int64_t before = cm.length(ids[r]);
      cm.append(ids[r], new_tokens[r]);
      const auto s = cm.slot_mapping(ids[r], before, new_tokens[r]);
      st.slots.insert(st.slots.end(), s.begin(), s.end());
      for (std::int64_t i = 0; i < new_tokens[r]; ++i) {
        st.positions.push_back(before + i);
        st.request_of_row.push_back(r);
        st.sampled.push_back(new_tokens[r] - i <= sample_last);
      }
      st.cu.push_back(static_cast<std::int32_t>(st.cu.back() + new_tokens[r]));
      st.lens.push_back(static_cast<std::int32_t>(cm.length(ids[r])));
      max_blocks = std::max<std::int64_t>(max_blocks, cm.pages(ids[r]).size());
    }
    st.rows = st.cu.back();
    st.table = cm.block_table(ids, max_blocks);
    const std::int64_t T = st.rows;
    const std::int64_t B = o.requests;

    std::vector<std::uint16_t> input(static_cast<std::size_t>(T * kWidth));
    for (std::int64_t t = 0; t < T && !o.fused_projection; ++t) {
      gen.row(st.request_of_row[t], st.positions[t], st.sampled[t], &input[t * kWidth]);
    }
    Staging dev(on_gpu);
    std::vector<std::uint16_t> q(static_cast<std::size_t>(T * kHq * kD));
    std::vector<std::uint8_t> iq(static_cast<std::size_t>(T * kHidx * kDi * 2));
    const DType iq_dtype = config.indexer_kv_dtype == "fp8" ? DType::kFp8E4m3 : DType::kBf16;
    ProducerInputs in;
    std::vector<std::uint16_t> hidden;
    if (o.fused_projection) {
      hidden = projection.hidden_states(T);
      in.qkv_index = on_gpu ? dev.scratch(DType::kBf16, {T, kWidth})
                            : TensorView::contiguous(input.data(), DType::kBf16, {T, kWidth});
    } else {
      in.qkv_index = dev.in(input.data(), DType::kBf16, {T, kWidth});
    }
    const TensorView hidden_view =
        o.fused_projection ? dev.in(hidden.data(), DType::kBf16, {T, kHidden}) : TensorView{};
    const TensorView projection_ws =
        o.fused_projection ? dev.workspace(projection_workspace_bytes(T, kHidden)) : TensorView{};
    in.q_norm_weight = in.k_norm_weight = in.index_q_norm_weight = in.index_k_norm_weight =
        dev.in(zeros_w.data(), DType::kBf16, {kD});
    in.positions = dev.in(st.positions.data(), DType::kInt64, {T});
    in.slot_mapping = dev.in(st.slots.data(), DType::kInt64, {T});
    const auto q_view = dev.out(q.data(), DType::kBf16, {T, kHq, kD});
    const auto iq_view = dev.out(iq.data(), iq_dtype, {T, kHidx, kDi});
    std::vector<std::int32_t> topk(static_cast<std::size_t>(kHkv * T * o.topk));
    const auto topk_view = dev.out(topk.data(), DType::kInt32, {kHkv, T, o.topk});
    const PrefillBatch pb{dev.in(st.cu.data(), DType::kInt32, {B + 1}),
                          dev.in(st.lens.data(), DType::kInt32, {B}),
                          dev.in(st.table.data(), DType::kInt32, {B, max_blocks})};
    const DecodeBatch db{pb.seq_lens, pb.block_table, dql};
    std::vector<std::uint16_t> out(q.size());
    std::vector<float> lse(static_cast<std::size_t>(T * kHq));
    AttentionOutputs ao{dev.out(out.data(), DType::kBf16, {T, kHq, kD}),
                        dev.out(lse.data(), DType::kFp32, {T, kHq})};
    ao.workspace = dev.workspace(attention_workspace_bytes(config, T, B));
    IndexOutputs io{topk_view};
    io.workspace = dev.workspace(index_workspace_bytes(config, T, B, max_blocks));
    dev.finish_phase();

    PhaseTimes& times = decode ? rep.decode : rep.prefill;
    auto t0 = Clock::now();
    if (o.fused_projection) {
      project_qkv_index(projection.view(), hidden_view, in.qkv_index, projection_ws, op);
      dev.finish_phase();
      times.projection += since(t0);
      t0 = Clock::now();
    }
    produce_qkv_index(config, in, cm.kv_cache(), cm.index_cache(), {q_view, iq_view}, op);
    dev.finish_phase();
    times.producer += since(t0);

    t0 = Clock::now();
    if (decode) {
      index_decode(config, iq_view, cm.index_cache(), db, io, op);
    } else {
      index_prefill(config, iq_view, cm.index_cache(), pb, io, op);
    }
    dev.finish_phase();
    times.indexer += since(t0);

    t0 = Clock::now();
    if (decode) {
      sparse_attention_decode(config, q_view, cm.kv_cache(), db, topk_view, ao, op);
    } else {
      sparse_attention_prefill(config, q_view, cm.kv_cache(), pb, topk_view, ao, op);
    }
    dev.finish_phase();
    times.attention += since(t0);
    dev.fetch();

    // Useful FLOPs and the bytes that must be read (each request's distinct selected pages).
    double flops = 0, bytes = 0;
    for (int r = 0; r < o.requests; ++r) {
      bytes += static_cast<double>(st.lens[r]) * row_bytes(o.index_dtype, kDi);
      for (std::int64_t h = 0; h < kHkv; ++h) {
        std::set<std::int32_t> pages;
        for (std::int64_t t = st.cu[r]; t < st.cu[r + 1]; ++t) {
          flops += 2.0 * kDi * (kHidx / kHkv) * static_cast<double>(st.positions[t] + 1);
          for (int i = 0; i < o.topk; ++i) {
            const std::int32_t b = topk[(h * T + t) * o.topk + i];
            if (b < 0) continue;
            pages.insert(b);
            flops += 4.0 * kD * (kHq / kHkv) *
                     static_cast<double>(
                         std::min<std::int64_t>(kBlock, st.positions[t] - b * kBlock + 1));
          }
        }
        bytes += static_cast<double>(pages.size()) * kBlock * 2 * row_bytes(o.kv_dtype, kD);
      }
    }
    (decode ? rep.decode_flops : rep.prefill_flops) += flops;
    (decode ? rep.decode_bytes : rep.prefill_bytes) += bytes;

    // Fidelity on the sampled rows: dense attention over the same rows.
    std::vector<std::int64_t> rows;
    for (std::int64_t t = 0; t < T; ++t) {
      if (st.sampled[t]) rows.push_back(t);
    }
    if (rows.empty()) return;
    const auto n = static_cast<std::int64_t>(rows.size());
    std::vector<std::uint16_t> sq(static_cast<std::size_t>(n * kHq * kD));
    std::vector<std::int32_t> scu{0}, slens;
    for (int r = 0; r < o.requests; ++r) {
      std::int64_t count = 0;
      for (std::int64_t t : rows) count += st.request_of_row[t] == r;
      scu.push_back(static_cast<std::int32_t>(scu.back() + count));
      slens.push_back(st.lens[r]);  // sampled rows are each request's last ones
    }
    for (std::int64_t i = 0; i < n; ++i) {
      std::copy_n(&q[rows[i] * kHq * kD], kHq * kD, &sq[i * kHq * kD]);
    }
    std::vector<std::uint16_t> dout(sq.size());
    std::vector<float> dlse(static_cast<std::size_t>(n * kHq));
    AttentionOutputs dense_out{dev.out(dout.data(), DType::kBf16, {n, kHq, kD}),
                               dev.out(dlse.data(), DType::kFp32, {n, kHq})};
    dense_out.workspace = dev.workspace(attention_workspace_bytes(config, n, B));
    dense_attention(config, dev.in(sq.data(), DType::kBf16, {n, kHq, kD}), cm.kv_cache(),
                    {dev.in(scu.data(), DType::kInt32, {B + 1}),
                     dev.in(slens.data(), DType::kInt32, {B}), pb.block_table},
                    dense_out, op);
    dev.fetch();
    fid.rows += n;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t t = rows[i];
      for (std::int64_t h = 0; h < kHq; ++h) {
        // Sparse attention sums exp over a subset of the dense keys, so the mass it keeps is
        // exp(lse_sparse - lse_dense).
        fid.recall.push_back(std::exp(static_cast<double>(lse[t * kHq + h]) - dlse[i * kHq + h]));
        double diff = 0, norm = 0;
        for (std::int64_t e = 0; e < kD; ++e) {
          const double a = fmt::bf16_to_float(out[(t * kHq + h) * kD + e]);
          const double b = fmt::bf16_to_float(dout[(i * kHq + h) * kD + e]);
          diff += (a - b) * (a - b);
          norm += b * b;
        }
        fid.rel_error.push_back(norm > 0 ? std::sqrt(diff / norm) : 0.0);
      }
      const int r = st.request_of_row[t];
      if (o.workload == Workload::kNeedle) {
        const int needle = gen.asks(r, st.positions[t], true);
        const std::int64_t block = gen.needle_blocks(r)[needle];
        if (block >= st.positions[t] / kBlock) continue;  // not yet in the past
        for (std::int64_t h = 0; h < kHkv; ++h) {
          ++fid.needle_queries;
          for (int i2 = 0; i2 < o.topk; ++i2) {
            if (topk[(h * T + t) * o.topk + i2] == block) {
              ++fid.needle_hits;
              break;
            }
          }
        }
      }
    }
  };

  // Chunked prefill: step k feeds chunk k of every request, as one ragged batch.
  constexpr std::int64_t kSampledPrefillRows = 32;
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::vector<std::int64_t> n(static_cast<std::size_t>(o.requests),
                                std::min(o.chunk, o.context - c * o.chunk));
    run_step(n, false, c == chunks - 1 ? kSampledPrefillRows : 0);
    rep.prefill_tokens += n[0] * o.requests;
    done += step_work(c * o.chunk, n[0]);
    if (progress) progress(done / total_work, "prefill");
  }
  for (int s = 0; s < o.decode_steps; ++s) {
    run_step(std::vector<std::int64_t>(static_cast<std::size_t>(o.requests), dql), true, dql);
    rep.decode_tokens += static_cast<std::int64_t>(o.requests) * dql;
    done += step_work(o.context + s * dql, dql);
    if (progress) progress(std::min(1.0, done / total_work), "decode");
  }

  rep.sampled_rows = fid.rows;
  if (!fid.recall.empty()) {
    rep.recall_mean = std::accumulate(fid.recall.begin(), fid.recall.end(), 0.0) /
                      static_cast<double>(fid.recall.size());
    std::sort(fid.recall.begin(), fid.recall.end());
    rep.recall_p5 = fid.recall[fid.recall.size() / 20];
    rep.relative_error_mean = std::accumulate(fid.rel_error.begin(), fid.rel_error.end(), 0.0) /
                              static_cast<double>(fid.rel_error.size());
  }
  if (o.workload == Workload::kNeedle) {
    rep.needle_queries = fid.needle_queries;
    rep.needle_hit_rate = fid.needle_queries ? static_cast<double>(fid.needle_hits) /
                                                   static_cast<double>(fid.needle_queries)
                                             : 0.0;
  }
  return rep;
}

namespace {
double per_second(double amount, double seconds) {
  return seconds > 0 ? amount / seconds : 0;
}
}  // namespace

void print_report(const Report& r, const RunOptions& o, std::FILE* f) {
  const auto& c = r.config;
  std::fprintf(f, "FlashMSA %s: one MiniMax-M3 sparse attention layer, %s workload\n", version(),
               to_string(o.workload));
  std::fprintf(f, "backend   %s (%s; matrix products: %s)\n", r.backend.c_str(), r.device.c_str(),
               r.gemm.c_str());
  std::fprintf(f,
               "shapes    %d requests x %lld tokens, chunk %lld, %d decode steps x %d tokens; "
               "q heads 64, kv heads 4, d 128; top-%d of 128-token blocks\n",
               o.requests, static_cast<long long>(o.context), static_cast<long long>(o.chunk),
               o.decode_steps, 1 + o.spec_tokens, c.sparse_topk_blocks);
  std::fprintf(f, "dtypes    kv cache %s, index cache %s, top-k order %s\n",
               std::string(to_string(c.kv_cache_dtype)).c_str(),
               std::string(to_string(c.index_cache_dtype)).c_str(),
               std::string(to_string(c.topk_order)).c_str());
  if (o.fused_projection) {
    std::fprintf(f,
                 "input     hidden states [T, %lld] through the fused FP8 projection (random "
                 "weights): projection ms %.1f prefill, %.1f decode (in tokens/s below)\n",
                 static_cast<long long>(kHidden), 1e3 * r.prefill.projection,
                 1e3 * r.decode.projection);
  }
  std::fprintf(f, "\n%-8s %10s %12s %12s %12s %12s %11s %11s\n", "phase", "tokens", "producer ms",
               "index ms", "attention ms", "tokens/s", "GFLOP/s", "GB/s");
  for (const bool decode : {false, true}) {
    const PhaseTimes& t = decode ? r.decode : r.prefill;
    const std::int64_t tokens = decode ? r.decode_tokens : r.prefill_tokens;
    const double secs = t.total();
    // %.3g: three significant digits whatever the magnitude (prefill moves few bytes per second
    // on a CPU, decode many on a GPU).
    std::fprintf(f, "%-8s %10lld %12.1f %12.1f %12.1f %12.0f %11.3g %11.3g\n",
                 decode ? "decode" : "prefill", static_cast<long long>(tokens), 1e3 * t.producer,
                 1e3 * t.indexer, 1e3 * t.attention, per_second(static_cast<double>(tokens), secs),
                 per_second(decode ? r.decode_flops : r.prefill_flops, secs) / 1e9,
                 per_second(decode ? r.decode_bytes : r.prefill_bytes, secs) / 1e9);
  }
  std::fprintf(f,
               "(index ms includes the top-k, which is fused into the indexer. GB/s: the bytes "
               "that must be read,\n each request's index keys and each (request, kv head)'s "
               "distinct selected K/V pages, per second;\n decode is bound by them, prefill by "
               "its FLOPs)\n");
  std::fprintf(f, "\nfidelity on %lld sampled rows x 64 q heads, sparse vs dense attention:\n",
               static_cast<long long>(r.sampled_rows));
  // Each figure with what it means and what to expect for this workload.
  // Full coverage: the top-k holds every block the longest row sees (the last decode token's).
  const std::int64_t longest = o.context + std::int64_t{o.decode_steps} * (1 + o.spec_tokens);
  const bool full = selects_every_block(r.config, longest);
  if (r.needle_hit_rate >= 0) {
    std::fprintf(f, "  needle hit rate            %.3f  (%lld (row, kv head) queries)\n",
                 r.needle_hit_rate, static_cast<long long>(r.needle_queries));
    std::fprintf(f,
                 "    share of queries aimed at a planted block whose top-k kept it; expect 1.000 "
                 "(lower means the indexer misses what attention needs)\n");
  }
  std::fprintf(f, "  attention-mass recall      mean %.3f, 5th percentile %.3f\n", r.recall_mean,
               r.recall_p5);
  std::fprintf(f, "    share of the dense softmax weight inside the selected blocks; expect %s\n",
               full                                 ? "1.000 (top-k covers every block)"
               : o.workload == Workload::kRandom    ? "well under 1 (random keys: no block "
                                                      "stands out, the worst case for sparsity)"
               : o.workload == Workload::kClustered ? "0.6-0.9 (keys around a few topics)"
                                                    : "0.8-0.9 (needles planted, the rest random)");
  std::fprintf(f, "  relative error vs dense    mean %.4f\n", r.relative_error_mean);
  std::fprintf(f, "    |sparse - dense| / |dense| of the attention output; %s\n",
               full ? "expect 0 up to rounding (sparse equals dense at full coverage)"
                    : "it follows the mass the selection leaves out (about 0.1-0.3 at the recall "
                      "above; 0 only at full coverage)");
}

std::string report_json(const Report& r, const RunOptions& o) {
  using Json = nlohmann::ordered_json;
  // JSON has no NaN or Inf: a figure that is not a number is null.
  auto number = [](double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); };
  auto phase = [&](const PhaseTimes& t, std::int64_t tokens, double flops, double bytes) {
    return Json{{"tokens", tokens},
                {"projection_s", number(t.projection)},
                {"producer_s", number(t.producer)},
                {"indexer_s", number(t.indexer)},
                {"topk_s", 0},
                {"topk_fused_into_indexer", true},
                {"attention_s", number(t.attention)},
                {"total_s", number(t.total())},
                {"tokens_per_s", number(per_second(static_cast<double>(tokens), t.total()))},
                {"flops", number(flops)},
                {"flop_per_s", number(per_second(flops, t.total()))},
                {"bytes", number(bytes)},
                {"bytes_per_s", number(per_second(bytes, t.total()))}};
  };
  const Json j{
      {"flashmsa_version", version()},
      {"backend", r.backend},
      {"device", r.device},
      {"workload", std::string(to_string(o.workload))},
      {"requests", o.requests},
      {"context", o.context},
      {"chunk", o.chunk},
      {"decode_steps", o.decode_steps},
      {"decode_query_len", 1 + o.spec_tokens},
      {"fused_projection", o.fused_projection},
      {"num_attention_heads", 64},
      {"num_key_value_heads", 4},
      {"head_dim", 128},
      {"topk", r.config.sparse_topk_blocks},
      {"kv_dtype", std::string(to_string(r.config.kv_cache_dtype))},
      {"index_dtype", std::string(to_string(r.config.index_cache_dtype))},
      {"topk_order", std::string(to_string(r.config.topk_order))},
      {"seed", o.seed},
      {"prefill", phase(r.prefill, r.prefill_tokens, r.prefill_flops, r.prefill_bytes)},
      {"decode", phase(r.decode, r.decode_tokens, r.decode_flops, r.decode_bytes)},
      {"fidelity",
       {{"sampled_rows", r.sampled_rows},
        {"needle_queries", r.needle_queries},
        {"needle_hit_rate", r.needle_hit_rate >= 0 ? number(r.needle_hit_rate) : Json(nullptr)},
        {"recall_mean", number(r.recall_mean)},
        {"recall_p5", number(r.recall_p5)},
        {"relative_error_mean", number(r.relative_error_mean)}}}};
  return j.dump(2) + "\n";
}

}  // namespace flashmsa::tools
