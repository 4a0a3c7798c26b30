#!/usr/bin/env bash
# Installs gpukeeper from this checkout. Builds the CUDA core when a CUDA toolkit is found
# (headers + static runtime), else the CPU-only core.
#
# Where: the active virtual environment or conda environment; else $PYTHON; else the
# virtual environment .venv in the repository root (GPUKEEPER_VENV names another), made
# on first use (scripts/lib/python-env.sh says how and why). Then
#   scripts/gpukeeper check      runs that environment's gpukeeper from any shell
#   source .venv/bin/activate    puts gpukeeper (and its python) on PATH
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/python-env.sh
gk_use_python

"$PY" -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.10" cmake ninja
# With its dependencies (rich) and the `nvml` extra: nvidia-ml-py (pure Python) gives
# gpukeeper the device's clocks, driver and per-process memory; without it those figures
# say what to install.
"$PY" -m pip install -q --no-build-isolation ".[nvml]"
"$PY" -c "import gpukeeper; print('installed gpukeeper', gpukeeper.__version__, gpukeeper.build_info()['cuda'] and 'CUDA core' or 'CPU-only core', 'into', __import__('sys').prefix)"
