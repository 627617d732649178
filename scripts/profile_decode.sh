#!/usr/bin/env bash
# Nsight Compute profile of one kernel of one decode-grid point, on the H100/H200 machine:
#   scripts/profile_decode.sh KIND,BATCH,CONTEXT,DQL KERNEL_REGEX NAME
# e.g. scripts/profile_decode.sh fp8,64,32768,4 attention_kernel fp8_64x32K_dql4_attention.
# Profiles the kernel's third launch (after the warm-up of the graphs' capture) with the full
# section set and the SASS source counters (per-instruction stall samples), clocks left as the
# card runs them. Writes build-gpu/profile/NAME.ncu-rep, NAME.details.txt (every section) and
# NAME.sass.csv (the source page); builds flashmsa_cuda_bench first if it is missing.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
[ $# = 3 ] || { echo "usage: $0 KIND,BATCH,CONTEXT,DQL KERNEL_REGEX NAME"; exit 2; }
point=$1 kernel=$2 name=$3
if [ ! -x build-gpu/bench/flashmsa_cuda_bench ]; then
  cmake -S . -B build-gpu -G Ninja >/dev/null
  cmake --build build-gpu -j"$(nproc)" --target flashmsa_cuda_bench >/dev/null
fi
out=build-gpu/profile
mkdir -p "$out"
ncu --set full --import-source yes --clock-control none --kernel-name "regex:$kernel" \
  --launch-skip 2 --launch-count 1 -f -o "$out/$name" \
  build-gpu/bench/flashmsa_cuda_bench --filter "decode grid" --grid-point "$point" \
  >"$out/$name.run.log" 2>&1
ncu -i "$out/$name.ncu-rep" --page details --print-details all >"$out/$name.details.txt"
ncu -i "$out/$name.ncu-rep" --page source --print-source sass --csv >"$out/$name.sass.csv"
grep -E "Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued" \
  "$out/$name.details.txt" | head -12
