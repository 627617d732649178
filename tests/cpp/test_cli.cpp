// The `flashmsa run` main job: small runs of each workload through the simulation, checked on the
// report and its JSON, and the command line's argument errors and exit codes.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "flashmsa/version.hpp"

#include "tools/serve_sim.hpp"

namespace flashmsa {
namespace {

using tools::RunOptions;
using tools::Workload;

RunOptions small(Workload w) {
  RunOptions o;
  o.workload = w;
  o.requests = 2;
  o.context = 1536;
  o.chunk = 512;
  o.decode_steps = 3;
  o.spec_tokens = 1;
  o.quiet = true;
  return o;
}

void expect_sane_timings(const tools::Report& r) {
  for (const auto* t : {&r.prefill, &r.decode}) {
    EXPECT_GT(t->producer, 0);
    EXPECT_GT(t->indexer, 0);
    EXPECT_GT(t->attention, 0);
    EXPECT_LT(t->total(), 60);
  }
  EXPECT_EQ(r.prefill_tokens, 2 * 1536);
  EXPECT_EQ(r.decode_tokens, 2 * 3 * 2);
  EXPECT_GT(r.prefill_flops, 0);
  EXPECT_GT(r.decode_bytes, 0);
}

TEST(Cli, EasyNeedleIsAlwaysFound) {
  const RunOptions o = small(Workload::kNeedle);
  const tools::Report r = tools::run_simulation(o);
  expect_sane_timings(r);
  EXPECT_GT(r.needle_queries, 0);
  EXPECT_EQ(r.needle_hit_rate, 1.0);
  EXPECT_GT(r.recall_mean, 0.5);
  const auto json = nlohmann::json::parse(tools::report_json(r, o));  // it must parse
  EXPECT_EQ(json["fidelity"]["needle_hit_rate"], 1.0);
  EXPECT_EQ(json["workload"], "needle");
  EXPECT_EQ(json["prefill"]["tokens"], 3072);
  EXPECT_EQ(json["decode_query_len"], 2);
  for (const char* field : {"producer_s", "bytes_per_s", "flop_per_s", "total_s"}) {
    EXPECT_TRUE(json["prefill"][field].is_number()) << field;
  }
  EXPECT_TRUE(json["fidelity"]["recall_p5"].is_number());
}

TEST(Cli, FullCoverageRecallsAllMass) {
  for (Workload w : {Workload::kRandom, Workload::kClustered}) {
    RunOptions o = small(w);
    o.topk = 64;  // more than the 13 blocks any row sees: sparse = dense
    const tools::Report r = tools::run_simulation(o);
    expect_sane_timings(r);
    EXPECT_NEAR(r.recall_mean, 1.0, 1e-5);
    EXPECT_NEAR(r.recall_p5, 1.0, 1e-5);
    // The CPU runs sparse and dense through one code path: bit-equal. The CUDA decode kernel
    // merges key parts and splits in another order than the dense (prefill) kernel, so there
    // they agree up to the bf16 rounding of the output (2^-9 relative per element).
    if (r.backend == "cpu") {
      EXPECT_EQ(r.relative_error_mean, 0.0);
    } else {
      EXPECT_LE(r.relative_error_mean, 1.0 / 512);
    }
    EXPECT_EQ(r.needle_hit_rate, -1);
    EXPECT_TRUE(
        nlohmann::json::parse(tools::report_json(r, o))["fidelity"]["needle_hit_rate"].is_null());
  }
}

TEST(Cli, SparseRandomKeepsLessMassThanClustered) {
  RunOptions random = small(Workload::kRandom), clustered = small(Workload::kClustered);
  random.topk = clustered.topk = 4;
  const double r = tools::run_simulation(random).recall_mean;
  const double c = tools::run_simulation(clustered).recall_mean;
  EXPECT_LT(r, c);
  EXPECT_GT(r, 0.0);
}

struct Result {
  int code;
  std::string output;
};

Result run_cli(const std::string& args) {
  const std::string cmd = std::string(FLASHMSA_CLI_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 512> buf{};
  while (p && fgets(buf.data(), buf.size(), p)) out += buf.data();
  const int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(Cli, ArgumentErrorsNameTheOptionAndExitTwo) {
  const std::pair<const char*, const char*> cases[] = {
      {"run --workload haystack",
       "flashmsa: --workload must be one of needle, random, clustered, got 'haystack'\n"},
      {"run --kv-dtype fp4",
       "flashmsa: --kv-dtype must be one of bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4, got 'fp4'\n"},
      {"run --requests 0", "flashmsa: --requests must be an integer in [1, 4096], got '0'\n"},
      {"run --spec-tokens 16", "flashmsa: --spec-tokens must be an integer in [0, 15], got '16'\n"},
      {"run --context", "flashmsa: --context needs a value (see flashmsa run --help)\n"},
      {"run --bogus 1", "flashmsa: unknown option '--bogus' (see flashmsa run --help)\n"},
      {"run --bogus", "flashmsa: unknown option '--bogus' (see flashmsa run --help)\n"},
      {"run --requests 2 stray",
       "flashmsa: unexpected argument 'stray' (see flashmsa run --help)\n"},
      {"run --kv-dtype=fp4",
       "flashmsa: --kv-dtype must be one of bf16, fp16, fp8_e4m3, "
       "fp8_e5m2, nvfp4, got 'fp4'\n"},
      {"run --topk=0", "flashmsa: --topk must be an integer in [1, 1024], got '0'\n"},
      {"run --json /nonexistent-dir/report.json",
       "flashmsa: cannot write --json /nonexistent-dir/report.json: No such file or directory\n"},
      {"serve", "flashmsa: unknown command 'serve': expected one of run, info, help\n"},
      {"run --fused-projection",
       "flashmsa: --fused-projection takes --workload random (the needle and clustered workloads "
       "plant their structure in q and k, which random projection weights would not keep)\n"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = run_cli(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.output, message) << args;
  }
}

// --json - writes the report's JSON to stdout (alone with --quiet), and creates no file "-".
TEST(Cli, JsonToStdout) {
  std::remove("-");
  const Result r = run_cli(
      "run --backend cpu --requests 1 --context 512 --chunk 512 "
      "--decode-steps 1 --quiet --json -");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto json = nlohmann::json::parse(r.output);
  EXPECT_EQ(json["prefill"]["tokens"], 512);
  std::FILE* f = std::fopen("-", "r");
  EXPECT_EQ(f, nullptr) << "a file named '-' was written";
  if (f) std::fclose(f);
}

// The recall expectation counts the decode tokens: full coverage only when the top-k holds every
// block the last decode token sees.
TEST(Cli, RecallExpectationCountsDecodeTokens) {
  const char* full = "expect 1.000 (top-k covers every block)";
  // 2048 + 8 steps x 2 tokens = 2064 tokens: 17 blocks, more than the top-16.
  Result r = run_cli("run --backend cpu --requests 1 --context 2048 --chunk 2048 --spec-tokens 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find(full), std::string::npos) << r.output;
  // 1024 + 16: 9 blocks, all selected.
  r = run_cli("run --backend cpu --requests 1 --context 1024 --chunk 1024 --spec-tokens 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(full), std::string::npos) << r.output;
}

TEST(Cli, HelpAndInfo) {
  Result r = run_cli("run --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("usage: flashmsa run"), std::string::npos);
  // The text scripts/run.sh prints without a build is the binary's own, and names every option
  // with its range or choices and its default.
  std::ifstream help_file(std::string(FLASHMSA_SOURCE_DIR) + "/tools/run_help.txt");
  const std::string help_text((std::istreambuf_iterator<char>(help_file)),
                              std::istreambuf_iterator<char>());
  EXPECT_EQ(r.output, help_text);
  for (const char* option :
       {"--backend", "--workload", "--requests", "--context", "--chunk", "--decode-steps",
        "--spec-tokens", "--topk", "--kv-dtype", "--index-dtype", "--topk-order", "--seed",
        "--threads", "--json", "--quiet"}) {
    const auto at = r.output.find(std::string("\n  ") + option + " ");
    ASSERT_NE(at, std::string::npos) << option;
    const std::string line = r.output.substr(at + 1, r.output.find('\n', at + 1) - at - 1);
    if (std::string(option) != "--json" && std::string(option) != "--quiet" &&
        std::string(option) != "--workload" && std::string(option) != "--topk") {
      EXPECT_NE(line.find('['), std::string::npos) << "no default on: " << line;
    }
  }
  EXPECT_EQ(run_cli("--version").output, std::string("flashmsa ") + version() + "\n");
  r = run_cli("");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("commands:"), std::string::npos);
  r = run_cli("info");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("backend cpu        available"), std::string::npos) << r.output;
}

// Without an sm_90 GPU, --backend cuda stops with the reason; with one, it runs there.
TEST(Cli, CudaBackendRunsOrFailsClearly) {
  const Result r = run_cli("run --backend cuda --context 512 --chunk 256 --decode-steps 2");
  if (backend_unavailable_reason(Backend::kCudaSm90)) {
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(r.output.rfind("flashmsa: --backend cuda cannot run here: ", 0), 0u) << r.output;
  } else {
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("cuda_sm90"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("needle hit rate"), std::string::npos) << r.output;
  }
}

// The whole layer from hidden states (fp8 caches and indexer, as the fused path requires) on
// whichever backend runs here: the projection phase is timed and the attention still matches
// dense attention at full coverage (top-k covers all 4 blocks).
TEST(Cli, FusedProjectionRunsTheLayerFromHiddenStates) {
  RunOptions o = small(Workload::kRandom);
  o.fused_projection = true;
  o.kv_dtype = DType::kFp8E4m3;
  o.index_dtype = DType::kFp8E4m3;
  o.requests = 1;
  o.context = 512;
  o.chunk = 256;
  o.decode_steps = 1;
  o.spec_tokens = 0;
  const tools::Report r = tools::run_simulation(o);
  for (const auto* t : {&r.prefill, &r.decode}) {
    EXPECT_GT(t->projection, 0);
    EXPECT_GT(t->attention, 0);
  }
  EXPECT_GT(r.recall_mean, 0.999);
  EXPECT_LT(r.relative_error_mean, 0.02);
  const auto j = nlohmann::json::parse(tools::report_json(r, o));
  EXPECT_TRUE(j["fused_projection"].get<bool>());
  EXPECT_GT(j["prefill"]["projection_s"].get<double>(), 0);
}

TEST(Cli, SmallRunPrintsTheReportAndWritesJson) {
  const std::string json = ::testing::TempDir() + "flashmsa_cli.json";
  const Result r = run_cli("run --context 512 --chunk 256 --decode-steps 2 --json " + json);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("needle hit rate"), std::string::npos) << r.output;
  FILE* f = std::fopen(json.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
}

}  // namespace
}  // namespace flashmsa
