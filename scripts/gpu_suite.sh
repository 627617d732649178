#!/usr/bin/env bash
# Builds FlashMSA on a machine with an H100/H200 and runs the whole GPU suite: the GPU tests, the
# CPU, CLI and Python tests (torch tensors included), and with the options below the sanitizers,
# the reliability run, the benchmark and the microbenchmarks. Logs go to build-gpu/logs; with
# $OUT set (the device tool's output folder, which returns at most 8 files) they are also packed
# into $OUT/logs.tar.gz, the JSON results beside.
#
# From the development machine (after scripts/setup.sh, which fills .deps/):
#   device run, carry [".deps/googletest", ".deps/nanobind", ".deps/include", ".deps/cutlass"],
#   command "scripts/gpu_suite.sh --sanitize"
#
# Options: --quick (build and run only the GPU tests), --python (with --quick: also the Python
# tests), --sanitize (compute-sanitizer memcheck, racecheck and initcheck over the GPU tests),
# --reliability (10^4 differential cases against the CPU backend, a 10^5-step decode-graph soak,
# 100 bitwise repeats per op), --bench (the CUDA benchmark), --micro (the Hopper
# microbenchmarks, bench/hopper_microbench.cu, first and alone on the GPU).
# Environment: GTEST_FILTER narrows the GPU tests and GPU_TEST_SHARDS runs them as concurrent
# gtest shards (default 1); FLASHMSA_FUZZ_CASES, FLASHMSA_SOAK_STEPS, FLASHMSA_REPEATS,
# FLASHMSA_FUZZ_SEED size the reliability run and FLASHMSA_FUZZ_SHARDS splits its differential
# cases over concurrent processes (default 8); SANITIZE_FILTER, SANITIZE_TOOLS (default memcheck
# racecheck initcheck) and SANITIZE_SHARDS (concurrent shards per tool, default 4) shape the
# sanitizer runs; BENCH_FILTER (comma-separated case groups) and BENCH_ARGS (e.g. --quick-grid)
# the benchmark.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
sanitize=0 quick=0 bench=0 python=0 reliability=0 micro=0
for arg in "$@"; do
  case $arg in
    --sanitize) sanitize=1 ;;
    --quick) quick=1 ;;
    --bench) bench=1 ;;
    --python) python=1 ;;
    --reliability) reliability=1 ;;
    --micro) micro=1 ;;
    *) echo "gpu_suite.sh: unknown option $arg (--sanitize, --quick, --python, --bench," \
            "--reliability, --micro)"; exit 2 ;;
  esac
done
logs=$root/build-gpu/logs
rm -rf "$logs"
mkdir -p "$logs"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
python_args=()
[ $quick = 0 ] && python=1
if [ $python = 1 ] && [ -d .deps/nanobind/cmake ] && command -v python3 >/dev/null; then  # python3 there has torch
  python_args=(-DFLASHMSA_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$(command -v python3)"
               "-Dnanobind_ROOT=$root/.deps/nanobind/cmake")
  # The GPU image's compiler wrapper links libstdc++ statically into shared objects; an
  # extension with its own C++ runtime crashes on its first exception once numpy or torch has
  # loaded the system one. Name the system libstdc++.so explicitly so the module uses it.
  libstdcxx=/usr/lib/gcc/x86_64-linux-gnu/$(g++ -dumpversion | cut -d. -f1)/libstdc++.so
  [ -e "$libstdcxx" ] && python_args+=("-DFLASHMSA_PYTHON_LIBSTDCXX=$libstdcxx")
fi
cmake -S . -B build-gpu -G Ninja -DFLASHMSA_PTXAS_VERBOSE=ON "${python_args[@]}" \
  >"$logs/configure.log" 2>&1 ||
  { cat "$logs/configure.log"; exit 1; }
targets=()
[ $quick = 1 ] && targets=(--target flashmsa_gpu_tests)
[ $quick = 1 ] && [ $bench = 1 ] && targets+=(flashmsa_cuda_bench)
[ $quick = 1 ] && [ $micro = 1 ] && targets+=(flashmsa_hopper_microbench)
[ $quick = 1 ] && [ ${#python_args[@]} -gt 0 ] && targets+=(_flashmsa)
if ! cmake --build build-gpu -j"$(nproc)" "${targets[@]}" >"$logs/build.log" 2>&1; then
  tail -50 "$logs/build.log"
  exit 1
fi

status=0
summary=()
run() {  # run NAME COMMAND...: log to $logs/NAME.log, remember the verdict
  local name=$1
  shift
  local start=$SECONDS
  if "$@" >"$logs/$name.log" 2>&1; then
    summary+=("PASS  $name ($((SECONDS - start)) s)")
  else
    summary+=("FAIL  $name ($((SECONDS - start)) s): see $name.log")
    tail -30 "$logs/$name.log"
    status=1
  fi
}
# Concurrent runs on the one GPU (its many SMs and the 16 cores serve several processes):
# `start NAME COMMAND...` launches one in the background, `finish` waits for all and records them.
jobs_names=() jobs_pids=() jobs_start=$SECONDS
start() {
  local name=$1
  shift
  "$@" >"$logs/$name.log" 2>&1 &
  jobs_names+=("$name")
  jobs_pids+=($!)
}
finish() {
  for i in "${!jobs_pids[@]}"; do
    if wait "${jobs_pids[$i]}"; then
      summary+=("PASS  ${jobs_names[$i]} (concurrent, $((SECONDS - jobs_start)) s for all)")
    else
      summary+=("FAIL  ${jobs_names[$i]}: see ${jobs_names[$i]}.log")
      tail -30 "$logs/${jobs_names[$i]}.log"
      status=1
    fi
  done
  jobs_names=() jobs_pids=() jobs_start=$SECONDS
}
if [ $micro = 1 ]; then  # before anything else, alone on the GPU
  run microbench build-gpu/bench/flashmsa_hopper_microbench --json "$logs/microbench.json"
  cat "$logs/microbench.log"
fi
gpu_filter=${GTEST_FILTER:-*}
# The reliability tests run once, below, at their full size.
[ $reliability = 1 ] && [ -z "${GTEST_FILTER:-}" ] && gpu_filter='-GpuReliability.*'
if [ "${GPU_TEST_SHARDS:-1}" -gt 1 ]; then  # concurrent gtest shards on the one GPU
  for ((i = 0; i < GPU_TEST_SHARDS; i++)); do
    start "gpu_tests.$i" env GTEST_TOTAL_SHARDS="$GPU_TEST_SHARDS" GTEST_SHARD_INDEX=$i \
      build-gpu/tests/cpp/flashmsa_gpu_tests --gtest_filter="$gpu_filter"
  done
  finish
else
  run gpu_tests build-gpu/tests/cpp/flashmsa_gpu_tests --gtest_filter="$gpu_filter"
fi
gpu_tests=build-gpu/tests/cpp/flashmsa_gpu_tests
if [ $reliability = 1 ]; then
  # The differential cases in FLASHMSA_FUZZ_SHARDS processes at once, each with its own seed (the
  # CPU backend's side of each case takes most of the time), beside the soak and the repeats.
  shards=${FLASHMSA_FUZZ_SHARDS:-8}
  cases=${FLASHMSA_FUZZ_CASES:-10000}
  seed=${FLASHMSA_FUZZ_SEED:-20261203}
  for ((i = 0; i < shards; i++)); do
    start "differential.$i" env FLASHMSA_FUZZ_CASES=$(((cases + shards - 1) / shards)) \
      FLASHMSA_FUZZ_SEED=$((seed + 7919 * i)) "$gpu_tests" \
      --gtest_filter=GpuReliability.DifferentialAgainstTheCpuBackend
  done
  start reliability env FLASHMSA_SOAK_STEPS="${FLASHMSA_SOAK_STEPS:-100000}" \
    FLASHMSA_REPEATS="${FLASHMSA_REPEATS:-100}" \
    "$gpu_tests" --gtest_filter='GpuReliability.*:-GpuReliability.DifferentialAgainstTheCpuBackend'
  finish
  grep -h -E "^(differential|soak):" "$logs"/reliability.log "$logs"/differential.*.log || true
fi
if [ $quick = 0 ]; then
  run cpu_tests build-gpu/tests/cpp/flashmsa_tests
  run cli_tests build-gpu/tests/cpp/flashmsa_cli_tests
fi
if [ ${#python_args[@]} -gt 0 ]; then
  if readelf -d build-gpu/python/flashmsa/_flashmsa*.so | grep -q 'libstdc++'; then
    run python_tests env PYTHONPATH=build-gpu/python python3 -m pytest -q -rs tests/python
  else
    summary+=("SKIP  python_tests: the extension has a static libstdc++ (see above), it would crash")
  fi
fi
if [ $sanitize = 1 ]; then
  # Each tool over the whole GPU suite, split into SANITIZE_SHARDS gtest shards, all at once.
  sanitize_shards=${SANITIZE_SHARDS:-4}
  # No more shards than tests: compute-sanitizer fails a process that never initialises CUDA.
  tests=$(GTEST_FILTER="${SANITIZE_FILTER:-*}" "$gpu_tests" --gtest_list_tests | grep -c '^  ')
  [ "$tests" -lt "$sanitize_shards" ] && sanitize_shards=$((tests > 0 ? tests : 1))
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck}; do
    # racecheck skips cuBLASLt's own GEMM kernels (nvjet_*, the projection's): it reported 3
    # hazards inside one of them on the H200; ours are all checked.
    exclude=()
    [ "$tool" = racecheck ] && exclude=(--kernel-name-exclude kns=nvjet)
    for ((i = 0; i < sanitize_shards; i++)); do
      start "sanitizer_$tool.$i" env GTEST_TOTAL_SHARDS="$sanitize_shards" GTEST_SHARD_INDEX=$i \
        ${SANITIZE_FILTER:+GTEST_FILTER="$SANITIZE_FILTER"} \
        compute-sanitizer --tool "$tool" "${exclude[@]}" --error-exitcode 1 "$gpu_tests"
    done
  done
  finish
fi
if [ $bench = 1 ]; then
  # BENCH_FILTER in the environment narrows the benchmark cases (flashmsa_cuda_bench --filter).
  run cuda_bench build-gpu/bench/flashmsa_cuda_bench --json "$logs/cuda_bench.json" \
    ${BENCH_FILTER:+--filter "$BENCH_FILTER"} ${BENCH_ARGS:-}
  cat "$logs/cuda_bench.log"
fi
grep -h -E "^\[  (PASSED|SKIPPED|FAILED) " "$logs"/gpu_tests*.log "$logs"/cpu_tests.log 2>/dev/null || true
tail -n 1 "$logs"/python_tests.log 2>/dev/null || true
printf '%s\n' "${summary[@]}" | tee "$logs/summary.txt"
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/logs.tar.gz" -C "$logs" .
  cp "$logs"/*.json "$OUT"/ 2>/dev/null || true
fi
exit $status
