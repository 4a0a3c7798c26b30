#!/usr/bin/env bash
# Installs what the tests need and runs every test: the C++ suite (Catch2 via ctest) in
# the default build and in a CPU-only build under AddressSanitizer and UBSan, then the
# Python suite (pytest). Arguments go to pytest.
#
# Python: the active virtual environment or conda environment; else $PYTHON; else the
# virtual environment .venv in the repository root, made on first use with the system
# site-packages visible (scripts/lib/python-env.sh).
# GPUKEEPER_SKIP_CPP=1 skips the C++ part (and Catch2); scripts/fresh-venv-check.sh uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/python-env.sh
gk_use_python
BUILD=${GPUKEEPER_TEST_BUILD:-build/tests}
SKIP_CPP=${GPUKEEPER_SKIP_CPP:-0}

if [ "$SKIP_CPP" != 1 ] && [ ! -e /usr/include/catch2/catch.hpp ] && [ ! -e /usr/include/catch2/catch_all.hpp ] \
   && [ ! -e /usr/local/include/catch2/catch_all.hpp ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get install -y -q catch2 || { $SUDO apt-get update -q && $SUDO apt-get install -y -q catch2; }
fi
# PyTorch: the one the environment has (CI machines have the CPU build), else torch
# 2.13.0 from PyTorch's CPU index. PyPI's Linux torch wheel depends on about 2.7 GB of
# CUDA libraries (nvidia-* wheels); the CPU index's wheels depend on none. Without
# either (offline, or no wheel for this Python), the torch tests skip and the rest runs.
# --retries 0: where that index cannot be reached but pip's configuration names other
# sources (find-links, extra indexes), pip takes those at once instead of retrying the
# index and warning for torch and for each dependency.
if ! "$PY" -c "import torch; torch.__version__" 2>/dev/null; then
  "$PY" -m pip install -q --retries 0 "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
    || gk_say "no CPU build of torch 2.13.0 could be installed: the torch tests will skip"
fi
"$PY" -m pip install -q pytest numpy "scikit-build-core>=0.10" "pybind11>=2.10" cmake ninja \
  pytest-xdist pytest-benchmark pytest-memray matplotlib ipython ipykernel nbclient nbformat rich

if [ "$SKIP_CPP" != 1 ]; then
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  echo "== C++ tests (default build: CUDA when a toolkit is found) =="
  cmake -S . -B "$BUILD" "${GEN[@]}" -DGPUKEEPER_BUILD_TESTS=ON -DGPUKEEPER_BUILD_PYTHON=OFF >/dev/null
  cmake --build "$BUILD" -j "$(nproc)"
  ctest --test-dir "$BUILD" --output-on-failure

  # The CPU-only build is the sanitized one too: AddressSanitizer and UndefinedBehavior-
  # Sanitizer over every C++ test, any finding a failure (scripts/sanitizers.sh).
  echo "== C++ tests (CPU-only build, under ASan + UBSan) =="
  GPUKEEPER_ASAN_BUILD="$BUILD-cpu" bash scripts/sanitizers.sh asan
fi

echo "== Python tests =="
"$PY" -m pip install -q --no-build-isolation --no-deps .
"$PY" -m pytest tests/python -q -p no:cacheprovider "$@"
