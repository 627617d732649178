// The `flashmsa` command: `flashmsa run` serves one MiniMax-M3 sparse layer end to end and
// reports speed and fidelity; `flashmsa info` says what this build can do.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

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

// ---- `flashmsa run` options, parsed by CLI11 with the project's own messages ----

// An integer option in [lo, hi].
template <class T>
CLI::Option* int_option(CLI::App& app, const std::string& name, T& target, std::int64_t lo,
                        std::int64_t hi) {
  return app
      .add_option_function<std::string>(
          name,
          [name, &target, lo, hi](const std::string& value) {
            char* end = nullptr;
            errno = 0;
            const long long v = std::strtoll(value.c_str(), &end, 10);
            if (value.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) {
              usage_error(name + " must be an integer in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "], got '" + value + "'");
            }
            target = static_cast<T>(v);
          })
      ->type_name("N");
}

// An option taking one of `choices`.
template <class T>
CLI::Option* choice_option(CLI::App& app, const std::string& name, T& target,
                           std::vector<std::pair<std::string, T>> choices) {
  return app.add_option_function<std::string>(name, [name, &target, choices](const std::string& v) {
    std::string accepted;
    for (const auto& [choice, value] : choices) {
      if (choice == v) {
        target = value;
        return;
      }
      accepted += (accepted.empty() ? "" : ", ") + choice;
    }
    usage_error(name + " must be one of " + accepted + ", got '" + v + "'");
  });
}

// Checks an output path before the run starts: the system's reason if it cannot be written.
void check_writable(const std::string& option, const std::string& path) {
  if (path.empty() || path == "-") return;  // "-": standard output
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) {
    std::fprintf(stderr, "flashmsa: cannot write %s %s: %s\n", option.c_str(), path.c_str(),
                 std::strerror(errno));
    std::exit(2);
  }
  std::fclose(f);
}

RunOptions parse_run(const std::vector<std::string>& args) {
  RunOptions o;
  CLI::App app("flashmsa run");
  app.set_help_flag();  // --help prints tools/run_help.txt, below
  bool help = false;
  app.add_flag("-h,--help", help);
  app.add_flag("--quiet", o.quiet);
  choice_option<std::string>(app, "--backend", o.backend,
                             {{"auto", "auto"}, {"cpu", "cpu"}, {"cuda", "cuda"}});
  choice_option<Workload>(app, "--workload", o.workload,
                          {{"needle", Workload::kNeedle},
                           {"random", Workload::kRandom},
                           {"clustered", Workload::kClustered}});
  int_option(app, "--requests", o.requests, 1, 4096);
  int_option(app, "--context", o.context, 256, 1 << 24);
  int_option(app, "--chunk", o.chunk, 1, 1 << 24);
  int_option(app, "--decode-steps", o.decode_steps, 0, 1 << 20);
  int_option(app, "--spec-tokens", o.spec_tokens, 0, kMaxDecodeQueryLen - 1);
  // The widest top-k any backend takes; the chosen backend's own limit is checked by the run
  // (unsupported_reason), with its reason.
  int_option(app, "--topk", o.topk, 1,
             std::max(capabilities(Backend::kCpu).max_topk_blocks,
                      capabilities(Backend::kCudaSm90).max_topk_blocks));
  choice_option<DType>(app, "--kv-dtype", o.kv_dtype,
                       {{"bf16", DType::kBf16},
                        {"fp16", DType::kFp16},
                        {"fp8_e4m3", DType::kFp8E4m3},
                        {"fp8_e5m2", DType::kFp8E5m2},
                        {"nvfp4", DType::kNvfp4}});
  choice_option<DType>(
      app, "--index-dtype", o.index_dtype,
      {{"bf16", DType::kBf16}, {"fp8_e4m3", DType::kFp8E4m3}, {"nvfp4", DType::kNvfp4}});
  choice_option<TopkOrder>(app, "--topk-order", o.topk_order,
                           {{"ascending", TopkOrder::kAscending},
                            {"score_desc", TopkOrder::kScoreDesc},
                            {"local_last", TopkOrder::kLocalLast}});
  int_option(app, "--seed", o.seed, 0, INT64_MAX);
  int_option(app, "--threads", o.threads, 0, 4096);
  app.add_option("--json", o.json_path);
  app.add_flag("--fused-projection", o.fused_projection);
  app.allow_extras();                                             // reported below, by name
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 pops from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ArgumentMismatch& e) {  // "--context: ..." when its value is missing
    const std::string what = e.what();
    usage_error(what.substr(0, what.find(':')) + " needs a value (see flashmsa run --help)");
  } catch (const CLI::ParseError& e) {
    usage_error(std::string(e.what()) + " (see flashmsa run --help)");
  }
  if (!app.remaining().empty()) {
    const std::string a = app.remaining().front();  // remaining() returns a copy
    usage_error((a.rfind("-", 0) == 0 ? "unknown option '" : "unexpected argument '") + a +
                "' (see flashmsa run --help)");
  }
  if (help) {
    std::fputs(kRunHelp, stdout);
    std::exit(0);
  }
  if (o.fused_projection && o.workload != Workload::kRandom) {
    usage_error(
        "--fused-projection takes --workload random (the needle and clustered workloads plant "
        "their structure in q and k, which random projection weights would not keep)");
  }
  check_writable("--json", o.json_path);
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
  if (o.json_path == "-") {
    std::fputs(tools::report_json(report, o).c_str(), stdout);
  } else if (!o.json_path.empty()) {
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
