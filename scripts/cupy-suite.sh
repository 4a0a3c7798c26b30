#!/usr/bin/env bash
# Runs CuPy's own test suite twice on the GPU machine, on CuPy's pool and under
# gpukeeper's use_cupy_allocator(), and compares the outcomes test by test.
#
#   bash scripts/cupy-suite.sh CUPY_TESTS_DIR [FOLDER ...]
#
# CUPY_TESTS_DIR is the tests/ folder of CuPy's source at the installed version (e.g. from
# the sdist: tar xzf cupy-14.2.0.tar.gz cupy-14.2.0/tests). Default folders: fft, linalg,
# sorting, statistics, creation and sparse. Results go to $OUT (default ./gpu-results):
# cupy-default.log.gz, cupy-gpukeeper.log.gz (pytest -v: one line per test as it ends),
# cupy-compare.json/.txt. Both runs go side by side (-n workers each, default 6); CuPy's
# tests marked slow are left out. A run cut by CUPY_SUITE_TIMEOUT is still compared on
# the tests both runs finished.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tests=$(cd "${1:?CuPy tests folder}" && pwd); shift
folders=("$@")
[ ${#folders[@]} -gt 0 ] || folders=(cupy_tests/fft_tests cupy_tests/linalg_tests cupy_tests/sorting_tests
  cupy_tests/statistics_tests cupy_tests/creation_tests cupyx_tests/scipy_tests/sparse_tests)
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
workers=${CUPY_SUITE_WORKERS:-6}
export PYTHONPATH="$root/tests/external${PYTHONPATH:+:$PYTHONPATH}"
run() {  # run MODE HOOK
  (cd "$tests" && GPUKEEPER_CUPY_HOOK=$2 timeout "${CUPY_SUITE_TIMEOUT:-420}" "$PY" -m pytest \
     -p gpukeeper_cupy_hook -p no:cacheprovider -v -n "$workers" -m "not slow" \
     "${folders[@]}" > "$OUT/cupy-$1.log" 2>&1)
  echo "cupy suite ($1): $(tail -1 "$OUT/cupy-$1.log")"
}
run default 0 & run gpukeeper 1 & wait
"$PY" "$root/tests/external/compare_runs.py" "$OUT/cupy-default.log" "$OUT/cupy-gpukeeper.log" \
  --json "$OUT/cupy-compare.json" | tee "$OUT/cupy-compare.txt"
gzip -f "$OUT/cupy-default.log" "$OUT/cupy-gpukeeper.log"
