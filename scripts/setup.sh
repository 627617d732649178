#!/usr/bin/env bash
# Installs what FlashMSA's build and tests need, from Debian's packages and PyPI only.
# Idempotent: a second run checks and returns in about a second.
#   - Debian: compiler, CMake, Ninja, GoogleTest, ccache, OpenBLAS (used single-threaded: the CPU
#     backend parallelises itself); only what is missing is installed
#   - PyPI, into the project-local virtual environment .venv: requirements-dev.txt, then this
#     project's own Python package (pip install .)
#   - CUTLASS/CuTe C++ headers from PyPI nvidia-cutlass (no deps) into .deps/cutlass;
#     CMake finds them there (FLASHMSA_CUTLASS_DIR overrides).
#   - a copy of Debian's GoogleTest sources in .deps/googletest, and of the CLI11 and
#     nlohmann/json headers in .deps/include, for the GPU machine (its image has neither).
#   --no-python-package: skip building the Python package (scripts/run.sh needs only C++).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
python_package=1
for arg in "$@"; do
  case $arg in
    --no-python-package) python_package=0 ;;
    *) echo "setup.sh: unknown option $arg (--no-python-package)" >&2; exit 2 ;;
  esac
done

cutlass_version=4.2.0.0
apt_packages=(g++ cmake ninja-build libgtest-dev ccache libopenblas-pthread-dev libcli11-dev
              nlohmann-json3-dev clang-format)

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The stamp records what was installed; when it matches, the Python side is already done.
stamp_want="$(sha256sum requirements-dev.txt | cut -d' ' -f1) cutlass=$cutlass_version"
stamp=.venv/.flashmsa-setup
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$stamp_want" ] ||
   [ ! -d .deps/cutlass/cutlass_library/source/include/cute ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  rm -rf .deps/cutlass
  .venv/bin/python -m pip install -q --no-deps --no-compile --target .deps/cutlass \
    "nvidia-cutlass==$cutlass_version"
  echo "$stamp_want" >"$stamp"
fi
# The Python package, built from this tree by scikit-build-core (incrementally, in
# build/python-*); rebuilt only when a source file changed.
package_want=$(find src include python tools CMakeLists.txt pyproject.toml -type f \
  -not -name '*.pyc' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
package_stamp=.venv/.flashmsa-package
if [ $python_package = 1 ] &&
   { [ ! -f "$package_stamp" ] || [ "$(cat "$package_stamp")" != "$package_want" ]; }; then
  echo "setup: building and installing the flashmsa Python package (pip install .)"
  .venv/bin/python -m pip install -q --no-build-isolation --no-deps . >.venv/pip-install.log 2>&1 ||
    { tail -40 .venv/pip-install.log; exit 1; }
  echo "$package_want" >"$package_stamp"
fi

# GoogleTest's and nanobind's sources travel with the tree to GPU machines, which have no
# GoogleTest and may have another nanobind.
if [ ! -f .deps/googletest/CMakeLists.txt ] && [ -f /usr/src/googletest/CMakeLists.txt ]; then
  mkdir -p .deps && cp -r /usr/src/googletest .deps/googletest
fi
for header_dir in CLI nlohmann; do
  if [ ! -d ".deps/include/$header_dir" ] && [ -d "/usr/include/$header_dir" ]; then
    mkdir -p .deps/include && cp -r "/usr/include/$header_dir" ".deps/include/$header_dir"
  fi
done
nanobind_dir=$(.venv/bin/python -c "import nanobind, os; print(os.path.dirname(nanobind.__file__))")
if ! cmp -s "$nanobind_dir/__init__.py" .deps/nanobind/__init__.py; then
  rm -rf .deps/nanobind && cp -r "$nanobind_dir" .deps/nanobind
fi
echo "setup: ok (.venv, CUTLASS headers in .deps/cutlass/cutlass_library/source/include)"
