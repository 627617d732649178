#!/usr/bin/env bash
# A/B runs of code variants on one H100/H200 machine: every variant built there and measured in
# alternating rounds, so the machine's own speed cancels out of the comparison.
#
# Variants are patches on top of the tree as it is (variant "base"): ab/NAME/*.patch, made on the
# development machine with e.g. `mkdir -p ab/v1 && git diff main wip/x > ab/v1/change.patch`
# (ab/ is git-ignored: name it in the device tool's `carry`). Each build applies the variant's
# patches, builds the GPU tests and the benchmark (build-gpu/ab/{tests,bench}_NAME) and reverts
# them; applying rewrites the files, so the build always sees them as changed.
#
#   scripts/ab_device.sh build NAME...                 (base for the tree as it is; a name
#                                                       already built on this warm machine is
#                                                       kept unless REBUILD=1)
#   scripts/ab_device.sh test NAME FILTER [SHARDS]     (concurrent gtest shards, default 8; the
#                                                       failed tests named with their messages)
#   scripts/ab_device.sh sanitize NAME FILTER [SHARDS] (memcheck, racecheck, initcheck)
#   scripts/ab_device.sh bench ROUNDS NAME...          (POINTS="fp8,64,32768,1 ..." grid points,
#                                                       PHASES=1 adds the decode phases)
#   scripts/ab_device.sh bench-cases ROUNDS NAME...    (any benchmark cases: FILTER="indexer
#                                                       prefill 8K,indexer prefill fp8 32K")
#   scripts/ab_device.sh summary NAME...               (medians over the rounds, first = baseline;
#                                                       the geometric mean of the grid steps' or
#                                                       the cases' time ratios to it)
#   scripts/ab_device.sh pack FILE                     (the logs as $OUT/FILE.tgz)
#   scripts/ab_device.sh bundle NAME...                (development machine: the variants' built
#                                                       binaries as build-gpu/abx/bins.tar.xz)
#   scripts/ab_device.sh unbundle                      (GPU machine: back into build-gpu/ab)
# KERNELS="regex" at the first build restricts the sm_90 kernel instantiations built
# (FLASHMSA_SM90_KERNELS: cmake/sm90_kernels.cmake), e.g. KERNELS='index_score' for the prefill
# indexer and the prefill attention of 16-bit caches (their kernels are always built);
# CMAKE_ARGS adds configure options. The builds also run on the development machine (nvcc
# compiles sm_90a there): with CMAKE_ARGS=-DFLASHMSA_USE_CBLAS=OFF (the GPU machine has no
# OpenBLAS) the binaries need only the CUDA 13 runtime, and carrying them saves the device the
# build. A variant's two binaries take ~23 MB (the device tool carries 64 MiB at most) but
# compress ~15x: `bundle` them, carry build-gpu/abx and `unbundle` first on the device.
# Every test shard and benchmark run is limited to STEP_TIMEOUT seconds (default 240; raise it
# for compute-sanitizer): a kernel that hangs reports "timed out" instead of taking the device
# call with it. Keep a call's steps under the call's own limit.
# Logs and JSON go to build-gpu/ab/logs.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1
mode=${1:?usage: see the header of $0}
shift
logs=build-gpu/ab/logs
mkdir -p "$logs"

patches_of() { [ "$1" = base ] || ls ab/"$1"/*.patch; }
# apply [-R] FILE: git apply (which also works outside a repository), else patch(1).
apply() {
  if command -v git >/dev/null; then
    git apply "$@"
    return
  fi
  local reverse=()
  [ "$1" = -R ] && { reverse=(-R); shift; }
  patch -s -p1 "${reverse[@]}" <"$1"
}

step_timeout=${STEP_TIMEOUT:-240}

# bench_run NAME OUT ARGS...: variant NAME's benchmark with ARGS, JSON to $logs/OUT.json and its
# output to $logs/OUT.txt, within the step timeout; a failure is reported, not fatal.
bench_run() {
  local v=$1 out=$2
  shift 2
  timeout "$step_timeout" "build-gpu/ab/bench_$v" "$@" --json "$logs/$out.json" \
    >"$logs/$out.txt" 2>&1
  local code=$?
  [ $code = 0 ] || echo "$out failed (exit $code$([ $code = 124 ] && echo ': timed out'))"
}

case $mode in
build)
  configure=(cmake -S . -B build-gpu -G Ninja)
  [ -n "${KERNELS:-}" ] && configure+=("-DFLASHMSA_SM90_KERNELS=$KERNELS")
  # shellcheck disable=SC2206  # CMAKE_ARGS is a list of words
  configure+=(${CMAKE_ARGS:-})
  "${configure[@]}" >"$logs/configure.log" 2>&1 || { cat "$logs/configure.log"; exit 1; }
  for v in "$@"; do
    if [ -z "${REBUILD:-}" ] && [ -x "build-gpu/ab/bench_$v" ] && [ -x "build-gpu/ab/tests_$v" ]; then
      echo "$v: built before (REBUILD=1 builds it again)"
      continue
    fi
    start=$SECONDS
    for p in $(patches_of "$v"); do apply "$p" || { echo "$v: $p does not apply"; exit 1; }; done
    cmake --build build-gpu -j"$(nproc)" --target flashmsa_gpu_tests flashmsa_cuda_bench \
      >"$logs/build_$v.log" 2>&1
    rc=$?
    for p in $(patches_of "$v" | tac); do apply -R "$p"; done
    [ $rc = 0 ] || { tail -40 "$logs/build_$v.log"; exit 1; }
    cp build-gpu/tests/cpp/flashmsa_gpu_tests "build-gpu/ab/tests_$v"
    cp build-gpu/bench/flashmsa_cuda_bench "build-gpu/ab/bench_$v"
    echo "built $v in $((SECONDS - start)) s"
  done
  ;;
test | sanitize)
  v=$1 filter=$2 shards=${3:-8} status=0
  # No more shards than tests: compute-sanitizer fails a process that never initialises CUDA.
  tests=$("build-gpu/ab/tests_$v" --gtest_filter="$filter" --gtest_list_tests | grep -c '^  ')
  [ "$tests" -lt "$shards" ] && shards=$((tests > 0 ? tests : 1))
  tools=(none)
  [ "$mode" = sanitize ] && tools=(memcheck racecheck initcheck)
  for tool in "${tools[@]}"; do
    pids=()
    for ((i = 0; i < shards; ++i)); do
      run=(timeout "$step_timeout" "build-gpu/ab/tests_$v" --gtest_filter="$filter")
      [ "$tool" = none ] || run=(timeout "$step_timeout" compute-sanitizer --tool "$tool" \
        --error-exitcode 9 "${run[@]:2}")
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "${run[@]}" >"$logs/${mode}_${v}_${tool}_$i.log" 2>&1 &
      pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do
      wait "$p"
      code=$?
      [ $code = 124 ] && echo "$mode $v $tool: a shard timed out after $step_timeout s (a hang?)"
      [ $code = 0 ] || rc=1
    done
    status=$((status | rc))
    echo "$mode $v $tool: rc $rc;" \
      "$(cat "$logs/${mode}_${v}_${tool}"_*.log | grep -hoE '^\[  (PASSED|FAILED)  \] [0-9]+ tests?|(ERROR|RACECHECK) SUMMARY: .*' | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
    # The failed tests by name, each with its first failure message.
    for log in "$logs/${mode}_${v}_${tool}"_*.log; do
      grep -hE -B8 '^\[  FAILED  \] [A-Za-z_].* \([0-9]+ ms\)$' "$log" |
        grep -hE '^\[  FAILED  \]|Failure|exception|Expected|Which is' | head -6
    done
  done
  exit $status
  ;;
bench)
  rounds=$1
  shift
  points=()
  for p in ${POINTS:-}; do points+=(--grid-point "$p"); done
  # A machine may keep an earlier run's logs: the summary reads every round of a name.
  for v in "$@"; do rm -f "$logs/grid_${v}"_* "$logs/phases_${v}"_*; done
  for ((r = 0; r < rounds; ++r)); do
    for v in "$@"; do
      bench_run "$v" "grid_${v}_$r" --filter "decode grid" "${points[@]}"
      [ -z "${PHASES:-}" ] || bench_run "$v" "phases_${v}_$r" --filter "decode phases"
    done
  done
  ;;
bench-cases)
  rounds=$1
  shift
  for v in "$@"; do rm -f "$logs/cases_${v}"_*; done
  for ((r = 0; r < rounds; ++r)); do
    for v in "$@"; do
      bench_run "$v" "cases_${v}_$r" --filter "${FILTER:?FILTER=cases}"
    done
  done
  ;;
summary)
  python3 - "$logs" "$@" <<'EOF'
import collections, glob, json, math, re, sys
logs, variants = sys.argv[1], sys.argv[2:]
values = collections.defaultdict(lambda: collections.defaultdict(list))
times = collections.defaultdict(lambda: collections.defaultdict(list))  # bench-cases' median_us
listed = set()  # bench-cases names: all shown
for v in variants:
    for f in sorted(glob.glob(f"{logs}/grid_{v}_*.json") + glob.glob(f"{logs}/phases_{v}_*.json")
                    + glob.glob(f"{logs}/cases_{v}_*.json")):
        for c in json.load(open(f)).get("cases", []):
            # grid cases: their time; phase and bench-cases cases: their value (unit as reported)
            grid = "/grid_" in f
            x = c.get("median_us") if grid else c.get("value")
            if x is not None:
                values[c["name"]][v].append(x)
                if "/cases_" in f:
                    listed.add(c["name"])
                    ceiling = "ceiling" in c["name"] or "cuBLAS" in c["name"]  # not the variant's code
                    if c.get("median_us") and not ceiling:
                        times[c["name"]][v].append(c["median_us"])
median = lambda x: sorted(x)[len(x) // 2]
ratios = collections.defaultdict(list)
shown = re.compile(r": (step|attention|indexer scoring|top-k)|last CTA ends|per CTA|within an SM")
print(f"{'':78s}" + "".join(f"{v[:8]:>9s}" for v in variants))
for name, by in values.items():
    if not all(v in by for v in variants):
        continue
    m = [median(by[v]) for v in variants]
    if name in listed or shown.search(name):
        print(f"{name[:78]:78s}" + "".join(f"{x:9.2f}" for x in m))
    if name.startswith("decode grid") and name.endswith(": step"):
        for v, x in zip(variants[1:], m[1:]):
            ratios[v].append(x / m[0])
# bench-cases: each case's time against the baseline's (the ceilings' runs left out).
case_ratios = collections.defaultdict(list)
for name, by in times.items():
    if all(v in by for v in variants):
        for v in variants[1:]:
            case_ratios[v].append(median(by[v]) / median(by[variants[0]]))
geomean = lambda r: math.exp(sum(map(math.log, r)) / len(r))
for v in variants[1:]:
    if ratios[v]:
        print(f"steps {v} / {variants[0]}: {geomean(ratios[v]):.4f} (geometric mean of "
              f"{len(ratios[v])} points)")
    if case_ratios[v]:
        print(f"case times {v} / {variants[0]}: {geomean(case_ratios[v]):.4f} (geometric mean of "
              f"{len(case_ratios[v])} cases; below 1: faster)")
EOF
  ;;
pack)
  tar czf "$OUT/${1:?a file name}.tgz" -C build-gpu/ab logs
  ;;
bundle)
  files=()
  for v in "${@:?variant names}"; do files+=("bench_$v" "tests_$v"); done
  mkdir -p build-gpu/abx
  tar cf - -C build-gpu/ab "${files[@]}" | xz -T0 -6 >build-gpu/abx/bins.tar.xz || exit 1
  ls -l build-gpu/abx/bins.tar.xz
  ;;
unbundle)
  tar xJf build-gpu/abx/bins.tar.xz -C build-gpu/ab
  ;;
*)
  echo "ab_device.sh: unknown mode $mode (build, test, sanitize, bench, bench-cases, summary, pack, bundle, unbundle)"
  exit 2
  ;;
esac
