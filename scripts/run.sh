#!/usr/bin/env bash
# The README's main-job command: set-up, build, then `flashmsa run` with any options given
# (CPU by default; `--backend cuda` once the CUDA kernels exist). `scripts/run.sh --help` lists them.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh >&2
cmake -S . -B build -G Ninja ${FLASHMSA_CMAKE_ARGS:-} >build.configure.log 2>&1 ||
  { cat build.configure.log >&2; exit 1; }
cmake --build build -j"$(nproc)" --target flashmsa_cli >&2
exec build/tools/flashmsa run "$@"
