#!/usr/bin/env bash
# The README's main-job command: set-up, build, then `flashmsa run` with any options given (on
# the GPU when an sm_90 GPU is present, else on the CPU). `scripts/run.sh --help` lists them.
#   FLASHMSA_CMAKE_ARGS="-DFLASHMSA_ENABLE_CUDA=OFF" scripts/run.sh   # CPU-only build: no CUDA
#   kernels compiled (most of the build's time where nvcc exists but no GPU does)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# --help needs no build: the command's help text is this file (compiled into the binary too).
for arg in "$@"; do
  if [ "$arg" = --help ] || [ "$arg" = -h ]; then
    cat tools/run_help.txt
    exit 0
  fi
done
# The main job needs the C++ build only, not the Python package.
scripts/setup.sh --no-python-package >&2
cmake -S . -B build -G Ninja ${FLASHMSA_CMAKE_ARGS:-} >build.configure.log 2>&1 ||
  { cat build.configure.log >&2; exit 1; }
cmake --build build -j"$(nproc)" --target flashmsa_cli >&2
exec build/tools/flashmsa run "$@"
