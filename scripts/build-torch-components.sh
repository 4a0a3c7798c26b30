#!/usr/bin/env bash
# Builds the PyTorch allocator component for every supported PyTorch release
# (python/gpukeeper/integrations/torch_builds.py), one library per release, into
# build/torch-components/torch_components/ (GPUKEEPER_TORCH_COMPONENTS_DIR moves it).
#
#   bash scripts/build-torch-components.sh [--release 2.11]... [--headers [RELEASE=]DIR]...
#                                          [--missing-ok] [--fetch-only]
#
# Each release's C++ headers come from its wheel, fetched once into a per-user cache by
# scripts/torch_headers.py (--headers points at headers already on the machine instead,
# for machines without network); the builds link against stand-ins for PyTorch's
# libraries (cmake/torch_component.cmake), so no PyTorch needs to be installed. Needs a
# C++ compiler, CMake and CUDA's runtime headers (CUDA 13's toolkit). --fetch-only prints
# the header folders, one a line, and builds nothing (scripts/build-wheel.sh passes them
# to the wheel's build). --missing-ok leaves out, with a warning, releases whose headers
# cannot be fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/python-env.sh
gk_use_python
fetch_args=()
fetch_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --fetch-only) fetch_only=1 ;;
    --missing-ok) fetch_args+=("$1") ;;
    --release|--headers) fetch_args+=("$1" "$2"); shift ;;
    *) gk_say "build-torch-components: unknown argument $1"; exit 2 ;;
  esac
  shift
done
folders=$("$PY" scripts/torch_headers.py "${fetch_args[@]}")
if [ "$fetch_only" = 1 ]; then
  echo "$folders"
  exit 0
fi
if [ -z "$folders" ]; then
  gk_say "build-torch-components: no release's headers to build against"
  exit 1
fi
export PATH="$PATH:/usr/local/cuda/bin"
build=build/torch-components
need=()
for tool in cmake ninja; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then "$PY" -m pip install -q "${need[@]}"; fi
# Only the components: no Python module, no tests (CMakeLists.txt, GPUKEEPER_BUILD_PYTHON=OFF).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUKEEPER_BUILD_PYTHON=OFF \
  -DGPUKEEPER_TORCH_HEADERS="$(echo "$folders" | paste -sd';')" >"$build.log" 2>&1 \
  || { cat "$build.log" >&2; exit 1; }
grep "PyTorch allocator component" "$build.log" >&2 || true
cmake --build "$build" --target gpukeeper_torch_components
out=${GPUKEEPER_TORCH_COMPONENTS_DIR:-$build/torch_components}
if [ "$out" != "$build/torch_components" ]; then
  mkdir -p "$out"
  cp "$build"/torch_components/libgpukeeper_torch_*.so "$out"/
fi
ls -l "$out"/libgpukeeper_torch_*.so
