#!/usr/bin/env bash
# Nsight Compute profile of one kernel of one benchmark case, on the H100/H200 machine:
#   scripts/profile.sh grid KIND,BATCH,CONTEXT,DQL KERNEL_REGEX NAME   (a decode-grid point)
#   scripts/profile.sh case "FILTER" KERNEL_REGEX NAME                 (any case, by --filter)
# e.g. scripts/profile.sh grid fp8,64,32768,4 attention_kernel fp8_64x32K_dql4_attention, or
#      scripts/profile.sh case "attention prefill, 1 x 32K, coherent" prefill_attention pa_32K.
# Profiles the kernel's third launch (after the warm-up and the graphs' capture) with the full
# section set and the SASS source counters (per-instruction stall samples), clocks left as the
# card runs them. Writes build-gpu/profile/NAME.ncu-rep, NAME.details.txt (every section) and
# NAME.sass.csv (the source page; scripts/sass_stalls.py reads it: the run prints its summary).
# BENCH names the benchmark binary (default build-gpu/bench/flashmsa_cuda_bench, built first if
# missing; e.g. an A/B variant's build-gpu/ab/bench_v1).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
usage="usage: $0 grid KIND,BATCH,CONTEXT,DQL KERNEL_REGEX NAME | $0 case FILTER KERNEL_REGEX NAME"
[ $# = 4 ] || { echo "$usage"; exit 2; }
mode=$1 what=$2 kernel=$3 name=$4
case $mode in
grid) select=(--filter "decode grid" --grid-point "$what") ;;
case) select=(--filter "$what") ;;
*) echo "$usage"; exit 2 ;;
esac
bench=${BENCH:-build-gpu/bench/flashmsa_cuda_bench}
if [ -n "${BENCH:-}" ]; then
  [ -x "$bench" ] || { echo "profile.sh: BENCH=$bench is not an executable"; exit 2; }
elif [ ! -x "$bench" ]; then
  cmake -S . -B build-gpu -G Ninja >/dev/null
  cmake --build build-gpu -j"$(nproc)" --target flashmsa_cuda_bench >/dev/null
fi
out=build-gpu/profile
mkdir -p "$out"
ncu --set full --import-source yes --clock-control none --kernel-name "regex:$kernel" \
  --launch-skip 2 --launch-count 1 -f -o "$out/$name" "$bench" "${select[@]}" \
  >"$out/$name.run.log" 2>&1
ncu -i "$out/$name.ncu-rep" --page details --print-details all >"$out/$name.details.txt"
ncu -i "$out/$name.ncu-rep" --page source --print-source sass --csv >"$out/$name.sass.csv"
grep -E "Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued" \
  "$out/$name.details.txt" | head -12
python3 scripts/sass_stalls.py "$out/$name.sass.csv" --top 12
