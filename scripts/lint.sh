#!/usr/bin/env bash
# The package's hygiene: ruff's lint (pycodestyle, pyflakes, import sorting, bugbear) and
# its formatter in check mode, over python/gpukeeper, with the settings in pyproject.toml.
# Zero findings pass. Installs the pinned ruff into the project's environment.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/python-env.sh
gk_use_python
# Pinned: a new ruff release may add findings, which should come as a change of its own.
"$PY" -m pip install -q "ruff==0.17.6"
"$PY" -m ruff check python/gpukeeper
"$PY" -m ruff format --check python/gpukeeper
