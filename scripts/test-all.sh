#!/usr/bin/env bash
# Installs what the tests need and runs every test: the C++ suite (Catch2 via ctest) in
# the default build and in a CPU-only build, then the Python suite (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUILD=${GPUKEEPER_TEST_BUILD:-build/tests}

if [ ! -e /usr/include/catch2/catch.hpp ] && [ ! -e /usr/include/catch2/catch_all.hpp ] \
   && [ ! -e /usr/local/include/catch2/catch_all.hpp ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get install -y -q catch2 || { $SUDO apt-get update -q && $SUDO apt-get install -y -q catch2; }
fi
# PyTorch is pinned: an unpinned torch would pull several GB of CUDA wheels.
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q pytest numpy "scikit-build-core>=0.10" "pybind11>=2.10" cmake ninja \
  pytest-xdist pytest-benchmark pytest-memray matplotlib ipython ipykernel nbclient nbformat

GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
echo "== C++ tests (default build: CUDA when a toolkit is found) =="
cmake -S . -B "$BUILD" "${GEN[@]}" -DGPUKEEPER_BUILD_TESTS=ON -DGPUKEEPER_BUILD_PYTHON=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
ctest --test-dir "$BUILD" --output-on-failure

echo "== C++ tests (CPU-only build) =="
cmake -S . -B "$BUILD-cpu" "${GEN[@]}" -DGPUKEEPER_BUILD_TESTS=ON -DGPUKEEPER_BUILD_PYTHON=OFF \
  -DGPUKEEPER_WITH_CUDA=OFF >/dev/null
cmake --build "$BUILD-cpu" -j "$(nproc)"
ctest --test-dir "$BUILD-cpu" --output-on-failure

echo "== Python tests =="
"$PY" -m pip install -q --no-build-isolation --no-deps .
"$PY" -m pytest tests/python -q -p no:cacheprovider "$@"
