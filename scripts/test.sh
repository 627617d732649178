#!/usr/bin/env bash
# The README's test command: set-up, build (CUDA code too when nvcc is found) and every test:
# the C++ suites through CTest, then the Python package's through pytest.
# GPU tests skip, with the reason, on machines without an sm_90 GPU.
#   FLASHMSA_CMAKE_ARGS="-DFLASHMSA_ENABLE_CUDA=OFF" scripts/test.sh   # CPU-only build
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

scripts/setup.sh
jobs=$(nproc)
# shellcheck disable=SC2086  # FLASHMSA_CMAKE_ARGS is a list of words
cmake -S . -B build -G Ninja ${FLASHMSA_CMAKE_ARGS:-} >build.configure.log 2>&1 ||
  { cat build.configure.log; exit 1; }
grep '^-- FlashMSA' build.configure.log || true
cmake --build build -j"$jobs"
# Say why GPU tests will be skipped (CTest's summary does not show the reason).
if [ -x build/tests/cpp/flashmsa_gpu_tests ]; then
  build/tests/cpp/flashmsa_gpu_tests --gtest_filter='FormatsGpu.ApproximateReciprocalAsEmulated' 2>&1 |
    grep -o "GPU test skipped: .*" | head -1 || true
fi
ctest --test-dir build -j"$jobs" --output-on-failure
# The Python package (installed into .venv by scripts/setup.sh), on the CPU with numpy.
.venv/bin/python -m pytest -q -rs tests/python
