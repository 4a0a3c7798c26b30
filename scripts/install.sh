#!/usr/bin/env bash
# Installs gpukeeper from this checkout. Builds the CUDA core when the CUDA runtime is found
# (its headers and static library: a toolkit, or NVIDIA's pip wheels), else the CPU-only core.
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
# A machine with an NVIDIA driver but no CUDA runtime to build against would get a
# CPU-only core that cannot use its GPU: say what to install before building that. The
# runtime of NVIDIA's pip wheels, in this environment, serves (cmake/pip_cuda_toolkit.cmake).
if ! gk_has_cuda_runtime; then
  if ls /dev/nvidia0 >/dev/null 2>&1 || ldconfig -p 2>/dev/null | grep -q "libcuda.so.1"; then
    gk_say "this machine has an NVIDIA driver but no CUDA runtime to build against: the core built"
    gk_say "now is CPU-only and will not use the GPU. Install the runtime from pip into this"
    gk_say "environment (about 3 MB; no nvcc is needed) and run this again:"
    gk_say "  $PY -m pip install \"nvidia-cuda-runtime==13.0.*\" \"nvidia-cuda-crt==13.0.*\""
    gk_say "or install CUDA's toolkit, or the binary wheel (bash scripts/build-wheel.sh, then"
    gk_say "pip install dist/gpukeeper_cu13-*.whl)"
  fi
else
  export PATH="$PATH:/usr/local/cuda/bin"
fi
# With its dependencies (rich) and the `nvml` extra: nvidia-ml-py (pure Python) gives
# gpukeeper the device's clocks, driver and per-process memory; without it those figures
# say what to install.
"$PY" -m pip install -q --no-build-isolation ".[nvml]"
"$PY" -c "import gpukeeper; print('installed gpukeeper', gpukeeper.__version__, gpukeeper.build_info()['cuda'] and 'CUDA core' or 'CPU-only core', 'into', __import__('sys').prefix)"
