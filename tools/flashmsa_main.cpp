// The `flashmsa` command: `flashmsa run` serves one MiniMax-M3 sparse layer end to end and
// reports speed and fidelity; `flashmsa info` says what this build can do.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "flashmsa/flashmsa.hpp"
#include "tools/serve_sim.hpp"

namespace {

using namespace flashmsa;
using flashmsa::tools::RunOptions;
using flashmsa::tools::Workload;

constexpr const char* kMainHelp =
    R"(flashmsa: MiniMax-M3 sparse attention (MSA), C++/CUDA library and tools

usage: flashmsa <command> [options]

commands:
  run     serve one MiniMax-M3 sparse attention layer end to end (chunked prefill, then decode)
          and report per-phase time, throughput and fidelity against dense attention
  info    print the version, build options and the backends this machine can use
  help    print this text; `flashmsa <command> --help` explains a command

`flashmsa --version` prints the version.
)";

// `flashmsa run --help`: tools/run_help.txt, compiled in (scripts/run.sh --help prints the same
// file without a build).
#include "run_help.hpp"


constexpr const char* kInfoHelp = R"(usage: flashmsa info

Prints the FlashMSA version, how it was built, and for each backend whether it can run here.
)";

// A one-line error naming the option and what it accepts; exit code 2.
[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "flashmsa: %s\n", message.c_str());
  std::exit(2);
}

std::int64_t parse_int(const std::string& option, const std::string& value, std::int64_t lo,
                       std::int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) {
    usage_error(option + " must be an integer in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "], got '" + value + "'");
  }
  return v;
}

template <class T>
T parse_choice(const std::string& option, const std::string& value,
               const std::vector<std::pair<std::string, T>>& choices) {
  std::string accepted;
  for (const auto& [name, v] : choices) {
    if (name == value) return v;
    accepted += (accepted.empty() ? "" : ", ") + name;
  }
  usage_error(option + " must be one of " + accepted + ", got '" + value + "'");
}

RunOptions parse_run(const std::vector<std::string>& args) {
  RunOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kRunHelp, stdout);
      std::exit(0);
    }
    if (a == "--quiet") {
      o.quiet = true;
      continue;
    }
    if (a.rfind("--", 0) != 0)
      usage_error("unexpected argument '" + a + "' (see flashmsa run --help)");
    if (i + 1 >= args.size()) usage_error(a + " needs a value (see flashmsa run --help)");
    const std::string v = args[++i];
    if (a == "--backend") {
      o.backend =
          parse_choice<std::string>(a, v, {{"auto", "auto"}, {"cpu", "cpu"}, {"cuda", "cuda"}});
    } else if (a == "--workload") {
      o.workload = parse_choice<Workload>(a, v,
                                          {{"needle", Workload::kNeedle},
                                           {"random", Workload::kRandom},
                                           {"clustered", Workload::kClustered}});
    } else if (a == "--requests") {
      o.requests = static_cast<int>(parse_int(a, v, 1, 4096));
    } else if (a == "--context") {
      o.context = parse_int(a, v, 256, 1 << 24);
    } else if (a == "--chunk") {
      o.chunk = parse_int(a, v, 1, 1 << 24);
    } else if (a == "--decode-steps") {
      o.decode_steps = static_cast<int>(parse_int(a, v, 0, 1 << 20));
    } else if (a == "--spec-tokens") {
      o.spec_tokens = static_cast<int>(parse_int(a, v, 0, 15));
    } else if (a == "--topk") {
      o.topk = static_cast<int>(parse_int(a, v, 1, 64));
    } else if (a == "--kv-dtype") {
      o.kv_dtype = parse_choice<DType>(a, v,
                                       {{"bf16", DType::kBf16},
                                        {"fp16", DType::kFp16},
                                        {"fp8_e4m3", DType::kFp8E4m3},
                                        {"fp8_e5m2", DType::kFp8E5m2},
                                        {"nvfp4", DType::kNvfp4}});
    } else if (a == "--index-dtype") {
      o.index_dtype = parse_choice<DType>(
          a, v, {{"bf16", DType::kBf16}, {"fp8_e4m3", DType::kFp8E4m3}, {"nvfp4", DType::kNvfp4}});
    } else if (a == "--topk-order") {
      o.topk_order = parse_choice<TopkOrder>(a, v,
                                             {{"ascending", TopkOrder::kAscending},
                                              {"score_desc", TopkOrder::kScoreDesc},
                                              {"local_last", TopkOrder::kLocalLast}});
    } else if (a == "--seed") {
      o.seed = static_cast<std::uint64_t>(parse_int(a, v, 0, INT64_MAX));
    } else if (a == "--threads") {
      o.threads = static_cast<int>(parse_int(a, v, 0, 4096));
    } else if (a == "--json") {
      o.json_path = v;
    } else {
      usage_error("unknown option '" + a + "' (see flashmsa run --help)");
    }
  }
  return o;
}

// --backend cuda where no sm_90 GPU can run it: say why and stop ("auto" then runs on the CPU).
void require_runnable_backend(const RunOptions& o) {
  if (o.backend == "cpu" || o.backend == "auto") return;
  if (auto why = backend_unavailable_reason(Backend::kCudaSm90)) {
    std::fprintf(stderr, "flashmsa: --backend cuda cannot run here: %s\n", why->c_str());
    std::exit(1);
  }
}

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled && isatty(2)), start_(Clock::now()) {}
  ~ProgressBar() {
    if (shown_) std::fprintf(stderr, "\r%70s\r", "");
  }
  void update(double fraction, const char* phase) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    if (!enabled_ || elapsed < 2.0) return;  // short runs stay quiet
    shown_ = true;
    const int width = 40, filled = static_cast<int>(fraction * width);
    std::fprintf(stderr, "\r[%.*s%*s] %3.0f%% %-8s %5.1f s", filled,
                 "========================================", width - filled, "", 100 * fraction,
                 phase, elapsed);
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  bool shown_ = false;
  Clock::time_point start_;
};

int run(const std::vector<std::string>& args) {
  RunOptions o = parse_run(args);
  if (o.chunk > o.context) o.chunk = o.context;
  require_runnable_backend(o);
  tools::Report report;
  {
    ProgressBar bar(!o.quiet);
    report = tools::run_simulation(o, [&](double f, const char* phase) { bar.update(f, phase); });
  }
  if (!o.quiet) tools::print_report(report, o, stdout);
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    if (!f) {
      std::fprintf(stderr, "flashmsa: cannot write --json %s\n", o.json_path.c_str());
      return 1;
    }
    f << tools::report_json(report, o);
  }
  return 0;
}

int info() {
  std::printf("%s\n", build_info().c_str());
  std::printf("cpu matrix products: %s, %d worker threads\n", cpu_matrix_library(),
              cpu_worker_threads());
  for (Backend b : {Backend::kCpu, Backend::kCudaSm90}) {
    const auto why = backend_unavailable_reason(b);
    std::printf("backend %-10s %s\n", std::string(to_string(b)).c_str(),
                why ? ("unavailable: " + *why).c_str() : "available");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const std::string command = args.empty() ? "help" : args[0];
  const std::vector<std::string> rest(args.begin() + (args.empty() ? 0 : 1), args.end());
  try {
    if (command == "run") return run(rest);
    if (command == "info") {
      if (!rest.empty() && (rest[0] == "--help" || rest[0] == "-h")) {
        std::fputs(kInfoHelp, stdout);
        return 0;
      }
      if (!rest.empty()) usage_error("info takes no options, got '" + rest[0] + "'");
      return info();
    }
    if (command == "--version" || command == "version") {
      std::printf("flashmsa %s\n", version());
      return 0;
    }
    if (command == "help" || command == "--help" || command == "-h") {
      std::fputs(kMainHelp, stdout);
      return 0;
    }
    usage_error("unknown command '" + command + "': expected one of run, info, help");
  } catch (const flashmsa::Error& e) {
    // The message names what failed and why; FlashMSA's source location is for bug reports.
    std::fprintf(stderr, "flashmsa: %s\n", e.message().c_str());
    if (e.kind() == ErrorKind::kOutOfResources && command == "run") {
      std::fprintf(stderr,
                   "flashmsa: the caches hold --requests x --context tokens (plus decode "
                   "steps): lower either\n");
    }
    return e.kind() == ErrorKind::kInvalidArgument ? 2 : 1;
  }
}
