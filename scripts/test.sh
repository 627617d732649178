#!/usr/bin/env bash
# The README's test command: set-up, build (CUDA code too when nvcc is found) and every test:
# the C++ suites through CTest, then the Python package's through pytest, then the C++ CPU suite
# again in an AddressSanitizer + UndefinedBehaviorSanitizer build.
# GPU tests skip, with the reason, on machines without an sm_90 GPU.
#   FLASHMSA_CMAKE_ARGS="-DFLASHMSA_ENABLE_CUDA=OFF" scripts/test.sh   # CPU-only build
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

scripts/setup.sh
jobs=$(nproc)
# Formatting: every C++/CUDA file as .clang-format says (clang-format -i fixes it).
git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror ||
  { echo "test.sh: files above are not clang-formatted (run clang-format -i on them)"; exit 1; }
# shellcheck disable=SC2086  # FLASHMSA_CMAKE_ARGS is a list of words
cmake -S . -B build -G Ninja ${FLASHMSA_CMAKE_ARGS:-} >build.configure.log 2>&1 ||
  { cat build.configure.log; exit 1; }
grep '^-- FlashMSA' build.configure.log || true
cmake --build build -j"$jobs"
# Why GPU tests will be skipped (CTest's summary does not show the reason).
skip_reason=""
if [ -x build/tests/cpp/flashmsa_gpu_tests ]; then
  skip_reason=$(build/tests/cpp/flashmsa_gpu_tests \
    --gtest_filter='FormatsGpu.ApproximateReciprocalAsEmulated' 2>&1 |
    grep -o "GPU test skipped: .*" | head -1 || true)
fi
# CTest, with the skipped tests summarised in one line instead of one line each.
set +e
ctest --test-dir build -j"$jobs" --output-on-failure 2>&1 | tee build/ctest.log |
  grep -v -E '\*\*\*Skipped|\(Skipped\)|^The following tests did not run:'
ctest_status=${PIPESTATUS[0]}
set -e
skipped=$(grep -c '\*\*\*Skipped' build/ctest.log || true)
if [ "${skipped:-0}" -gt 0 ]; then
  echo "test.sh: ${skipped} tests skipped: ${skip_reason:-see build/ctest.log}"
fi
[ "$ctest_status" -eq 0 ] || exit "$ctest_status"
# The Python package (installed into .venv by scripts/setup.sh), on the CPU with numpy.
.venv/bin/python -m pytest -q tests/python  # conftest.py prints one line per skip reason
# The whole C++ CPU suite again under AddressSanitizer + UndefinedBehaviorSanitizer (host code,
# CPU backend; any report fails the run). About 3 min to build and 6 to run on 2 cores.
# FLASHMSA_SKIP_SANITIZERS=1 skips it (e.g. for a quick local iteration).
if [ "${FLASHMSA_SKIP_SANITIZERS:-0}" != 1 ]; then
  cmake -S . -B build-asan -G Ninja -DFLASHMSA_ENABLE_CUDA=OFF -DFLASHMSA_SANITIZE=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >build-asan.configure.log 2>&1 ||
    { cat build-asan.configure.log; exit 1; }
  cmake --build build-asan -j"$jobs"
  echo "test.sh: the C++ CPU suite under ASan + UBSan"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -j"$jobs" --output-on-failure
fi
