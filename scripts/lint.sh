#!/usr/bin/env bash
# The package's hygiene: ruff's lint (pycodestyle, pyflakes, import sorting, bugbear), its
# formatter in check mode, and mypy's type check, over python/gpukeeper, with the settings
# in pyproject.toml. Zero findings pass. Installs the pinned ruff and mypy into the
# project's environment.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/python-env.sh
gk_use_python
# Pinned: a new ruff or mypy release may add findings, which should come as a change of
# its own. mypy needs none of the frameworks: the ones the environment lacks are ignored
# (pyproject.toml), and the package checks clean with or without them.
"$PY" -m pip install -q "ruff==0.17.6" "mypy==2.4.1"
"$PY" -m ruff check python/gpukeeper
"$PY" -m ruff format --check python/gpukeeper
"$PY" -m mypy
