#!/usr/bin/env bash
# Installs gpukeeper from this checkout. Builds the CUDA core when a CUDA toolkit is found
# (headers + static runtime), else the CPU-only core.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.10" cmake ninja
"$PY" -m pip install -q --no-build-isolation --no-deps .
"$PY" -c "import gpukeeper; print('installed gpukeeper', gpukeeper.__version__, gpukeeper.build_info()['cuda'] and 'CUDA core' or 'CPU-only core')"
