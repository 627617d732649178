#!/usr/bin/env bash
# The benchmark command (bench/README.md). With a usable sm_90 GPU: builds, runs
# flashmsa_cuda_bench (ceilings, indexer, attention, decode grid, prefill end to end, the
# production case set) and the torch SDPA baseline, writes bench/results/{cuda,sdpa}.{json,txt}
# and, where matplotlib is installed, PNG plots. Without one: the CPU backend's benchmark
# (bench/results/cpu.{json,txt}).
#   scripts/bench.sh [--filter SUBSTRING]   # --filter narrows the CUDA cases
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
results=bench/results
mkdir -p "$results"
# FLASHMSA_REVISION names the commit when the tree was copied without its history (device runs).
revision=${FLASHMSA_REVISION:-$(git describe --always --dirty --abbrev=40 2>/dev/null ||
  echo "unknown (not a git checkout)")}

# Its own build folder without the tests: a fresh machine needs no GoogleTest to benchmark.
build=build-bench
cmake -S . -B "$build" -G Ninja -DFLASHMSA_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target flashmsa_cpu_bench $(
  [ -x "$(command -v nvcc || true)" ] && echo flashmsa_cuda_bench) >/dev/null
if [ -x "$build/bench/flashmsa_cuda_bench" ] && nvidia-smi >/dev/null 2>&1; then
  "$build/bench/flashmsa_cuda_bench" --json "$results/cuda.json" "$@" | tee "$results/cuda.txt"
  if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    python3 bench/sdpa_baseline.py --json "$results/sdpa.json" | tee "$results/sdpa.txt"
  else
    echo "bench.sh: no torch with CUDA here: no SDPA baseline"
  fi
  python3 bench/report.py "$results" || true
  kind=cuda
else
  "$build/bench/flashmsa_cpu_bench" --tokens 8192 --json "$results/cpu.json" | tee "$results/cpu.txt"
  kind=cpu
fi
printf 'command: scripts/bench.sh %s\nrevision: %s\nbackend: %s\ndate: %s\n' "$*" "$revision" \
  "$kind" "$(date -u +%FT%TZ)" >"$results/$kind.command.txt"
