#!/usr/bin/env bash
# The whole GPU round in one call of the device tool: build, `gpukeeper check`, the C++
# and Python suites, and the benchmarks. Logs and JSON go to $OUT (or ./gpu-results).
# Usage: bash scripts/gpu-check.sh [--no-bench | --timing-bench | --plugin-bench]
# Wheels in .whl/ (carried to the machine) are installed first, into /tmp/site; Debian
# packages in .whl/debs/ are unpacked into /tmp/debroot.
#   --no-bench      build, check and tests only
#   --timing-bench  and only issue 4's benchmarks (timing accuracy, trajectory overhead)
#   --plugin-bench  and only the pytest plugin's per-test cost (issue 11)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT/logs"
LOG=$OUT/logs
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
status=0
step() { echo; echo "=== $* ==="; }
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

step environment
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  "$PY" -c "import cupy; print('cupy', cupy.__version__)" 2>&1
  "$PY" -c "import triton; print('triton', triton.__version__)" 2>&1
  nvcc --version | tail -2; cmake --version | head -1; g++ --version | head -1
} 2>&1 | tee "$LOG/env.txt"
summary "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"

# Packages the machine lacks (OpenMM for the engine tests) travel as wheels in .whl/.
if ls .whl/*.whl >/dev/null 2>&1; then
  step "carried wheels"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$LOG/wheels.txt" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  summary "wheels: $(ls .whl | tr '\n' ' ')"
fi

# Command-line tools the machine lacks (tmux, for the watch test) travel as Debian
# packages in .whl/debs/, unpacked beside the system, never over it.
if ls .whl/debs/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/debroot
  for deb in .whl/debs/*.deb; do dpkg -x "$deb" /tmp/debroot; done
  export PATH=/tmp/debroot/usr/bin:$PATH
  export LD_LIBRARY_PATH=/tmp/debroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

step "build and install (pip, no isolation)"
if "$PY" -m pip install --no-build-isolation --no-deps . >"$LOG/pip.txt" 2>&1; then
  summary "install: ok"
else
  tail -40 "$LOG/pip.txt"; summary "install: FAILED"; exit 1
fi

step "gpukeeper check"
(cd /tmp && "$PY" -m gpukeeper check --require-gpu --json "$LOG/check.json") 2>&1 | tee "$LOG/check.txt"
rc=${PIPESTATUS[0]}; summary "gpukeeper check: $(tail -1 "$LOG/check.txt") (rc=$rc)"; [ "$rc" = 0 ] || status=1
# What a user sees first: info's table (NVML figures with nvidia-ml-py, no hint) and report.
(cd /tmp && COLUMNS=120 "$PY" -m gpukeeper info && COLUMNS=120 "$PY" -m gpukeeper report) > "$LOG/info.txt" 2>&1
summary "gpukeeper info/report: rc=$? $(grep -E '^NVML' "$LOG/info.txt" | head -1 | cut -c1-100)"
summary "tmux: $(command -v tmux || echo 'not installed (the watch-under-tmux test skips)')"

step "C++ tests"
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
if cmake -S . -B build/gpu-tests "${GEN[@]}" -DGPUKEEPER_BUILD_TESTS=ON -DGPUKEEPER_BUILD_PYTHON=OFF \
     >"$LOG/cpp-configure.txt" 2>&1 && cmake --build build/gpu-tests -j >"$LOG/cpp-build.txt" 2>&1; then
  ctest --test-dir build/gpu-tests -V > "$LOG/ctest.txt" 2>&1
  rc=$?
  grep -E "Test +#|tests passed|tests failed|test cases:|All tests passed" "$LOG/ctest.txt"
  summary "C++: $(grep -E 'tests passed|tests failed' "$LOG/ctest.txt" | tail -1); cases: $(grep -E 'All tests passed|test cases:' "$LOG/ctest.txt" | sed 's/^[0-9]*: //' | sort | uniq -c | tr '\n' ';')"
  [ "$rc" = 0 ] || status=1
else
  tail -30 "$LOG/cpp-configure.txt" "$LOG/cpp-build.txt"; summary "C++: BUILD FAILED"; status=1
fi

step "Python tests"
# GPUKEEPER_PYTEST_ARGS narrows the run (e.g. a few files) when iterating.
"$PY" -m pytest ${GPUKEEPER_PYTEST_ARGS:-tests/python} -q -p no:cacheprovider -rs 2>&1 | tee "$LOG/pytest.txt"
rc=${PIPESTATUS[0]}; summary "pytest: $(tail -1 "$LOG/pytest.txt") (rc=$rc)"; [ "$rc" = 0 ] || status=1

if [ "${1:-}" = "--timing-bench" ]; then
  step "timing benchmarks"
  mkdir -p "$OUT/bench"
  { "$PY" benchmarks/python/timing_accuracy_bench.py --json "$OUT/bench/timing_accuracy.json"
    echo "timing_accuracy rc=$?"
    "$PY" benchmarks/python/md_overhead_bench.py --json "$OUT/bench/md_overhead.json"
    echo "md_overhead rc=$?"; } 2>&1 | tee "$LOG/bench.txt"
  summary "benchmarks: $(grep -E '^(timing_accuracy|md_overhead) rc=' "$LOG/bench.txt" | tr '\n' ' ')"
elif [ "${1:-}" = "--plugin-bench" ]; then
  step "pytest plugin benchmark"
  mkdir -p "$OUT/bench"
  (cd benchmarks/python && "$PY" pytest_plugin_bench.py --cuda --skip-runs --rounds 5 \
    --json "$OUT/bench/pytest_plugin.json") 2>&1 | tee "$LOG/bench.txt"
  summary "plugin benchmark: rc=${PIPESTATUS[0]}"; grep -E "^(leak|memory|GPUContext|plugin|--gpu| )" "$LOG/bench.txt" >> "$OUT/summary.txt"
elif [ "${1:-}" != "--no-bench" ]; then
  step benchmarks
  bash benchmarks/run_all.sh "$OUT/bench" 2>&1 | tee "$LOG/bench.txt"
  summary "benchmarks: rc=${PIPESTATUS[0]}"
fi

tar -czf "$OUT/results.tar.gz" -C "$OUT" logs $( [ -d "$OUT/bench" ] && echo bench ) 2>/dev/null
rm -rf "$LOG" "$OUT/bench"
echo; echo "=== summary ==="; cat "$OUT/summary.txt"
exit $status
