#!/usr/bin/env bash
# Builds the C++ benchmarks, runs every benchmark, writes JSON (and a log per step) under
# the directory given as $1 (default bench-results/), and prints the tables.
#
#   benchmarks/run_all.sh [OUT_DIR]
#
# Environment:
#   PYTHON                  the interpreter (default python3; gpukeeper installed in it)
#   GPUKEEPER_BENCH_BUILD   the CMake build folder (default build/bench)
#   GPUKEEPER_BENCH_QUICK=1 a smoke test: short timings, few training steps
#   GPUKEEPER_BENCH_TRACES  extra trace files to replay (space-separated)
#   GPUKEEPER_BENCH_RECORD=0  do not record new PyTorch traces (replay benchmarks/traces/)
#   GPUKEEPER_BENCH_REPLAY_ARGS  extra trace_replay flags (e.g. --no-min-capacity)
#
# Steps (each runs even if an earlier one failed; the exit status is 1 if any failed):
#   1. build      cmake -DGPUKEEPER_BUILD_BENCHMARKS=ON -DGPUKEEPER_BUILD_PYTHON=OFF
#   2. alloc_pair C++ alloc+free pair latency           -> alloc_pair.json
#   3. roundtrip  Python allocation round trip          -> alloc_roundtrip.json
#      torch_allocator, cleanup_bench, report_bench      -> <name>.json
#      torch_steps, torch_compat (PyTorch's features)    -> <name>.json
#      timing_accuracy, md_overhead                      -> <name>.json
#   4. traces     record PyTorch traces (GPU only)      -> traces/*.trace, traces/record_traces.json
#                 and synthetic traces (always)         -> traces/synth/*.trace
#   5. replay     trace_replay over all of them         -> trace_replay.json
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
out=${1:-bench-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${GPUKEEPER_BENCH_BUILD:-$root/build/bench}
py=${PYTHON:-python3}
quick=${GPUKEEPER_BENCH_QUICK:-0}

failed=()
step() {  # step NAME COMMAND...: runs it, output to the terminal and to OUT/NAME.log
  local name=$1
  shift
  echo
  echo "==== $name: $*"
  "$@" 2>&1 | tee "$out/$name.log"
  local status=${PIPESTATUS[0]}
  if [ "$status" -ne 0 ]; then
    echo "!!!! $name exited with status $status"
    failed+=("$name")
  fi
  return 0
}

# ---------------------------------------------------------------- 1. build
gen=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
  gen=(-G Ninja)
fi
configure() {
  cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGPUKEEPER_BUILD_BENCHMARKS=ON -DGPUKEEPER_BUILD_PYTHON=OFF -DGPUKEEPER_BUILD_TESTS=OFF &&
    cmake --build "$build" -j "$(nproc 2>/dev/null || echo 4)" --target alloc_pair_bench trace_replay
}
step build configure
bin=$build/benchmarks/cpp

quick_flag=()
record_steps=()
if [ "$quick" = 1 ]; then
  quick_flag=(--quick)
  record_steps=(--steps-transformer 6 --steps-forcefield 10)
fi

# ---------------------------------------------------------------- 2. C++ pairs
if [ -x "$bin/alloc_pair_bench" ]; then
  step alloc_pair "$bin/alloc_pair_bench" --json "$out/alloc_pair.json" "${quick_flag[@]}"
else
  echo "!!!! alloc_pair: not built"
  failed+=(alloc_pair)
fi

# ---------------------------------------------------------------- 3. Python round trip
step roundtrip "$py" "$here/python/alloc_roundtrip.py" --json "$out/alloc_roundtrip.json" "${quick_flag[@]}"

# ---------------------------------------------------------------- 3b. frameworks on the pool, cleanup, report
step torch_allocator "$py" "$here/python/torch_allocator_bench.py" --json "$out/torch_allocator.json" "${quick_flag[@]}"
step torch_steps "$py" "$here/python/torch_steps_bench.py" --json "$out/torch_steps.json" "${quick_flag[@]}"
step torch_compat "$py" "$here/python/torch_compat_matrix.py" --json "$out/torch_compat.json"
for bench in cleanup_bench report_bench; do
  if [ -f "$here/python/$bench.py" ]; then
    step "$bench" "$py" "$here/python/$bench.py" --json "$out/$bench.json" "${quick_flag[@]}"
  fi
done

# ---------------------------------------------------------------- 3c. timing accuracy and trajectory overhead
step timing_accuracy "$py" "$here/python/timing_accuracy_bench.py" --json "$out/timing_accuracy.json" "${quick_flag[@]}"
md_args=()
[ "$quick" = 1 ] && md_args=(--steps 2000 --busy-steps 200 --repeats 2)
step md_overhead "$py" "$here/python/md_overhead_bench.py" --json "$out/md_overhead.json" "${md_args[@]}"

# ---------------------------------------------------------------- 4. traces
mkdir -p "$out/traces/synth"
rm -f "$out"/traces/*.trace "$out"/traces/synth/*.trace
step traces_synth "$py" "$here/python/synth_trace.py" --kind all --out-dir "$out/traces/synth"
if [ "${GPUKEEPER_BENCH_RECORD:-1}" = 0 ]; then
  echo
  echo "==== traces_torch: not recorded (GPUKEEPER_BENCH_RECORD=0); replaying benchmarks/traces/"
  cp "$here"/traces/*.trace "$here"/traces/*.json "$out/traces/" 2>/dev/null || true
elif "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  step traces_torch "$py" "$here/python/record_traces.py" --out-dir "$out/traces" "${record_steps[@]}"
else
  echo
  echo "==== traces_torch: skipped (PyTorch with CUDA not available); replaying synthetic traces only"
fi

# ---------------------------------------------------------------- 5. replay
traces=()
for f in "$out"/traces/*.trace "$out"/traces/synth/*.trace ${GPUKEEPER_BENCH_TRACES:-}; do
  [ -f "$f" ] && traces+=("$f")
done
if [ ! -x "$bin/trace_replay" ]; then
  echo "!!!! replay: not built"
  failed+=(replay)
elif [ ${#traces[@]} -eq 0 ]; then
  echo "!!!! replay: no traces"
  failed+=(replay)
else
  passes=5
  [ "$quick" = 1 ] && passes=2
  # shellcheck disable=SC2086
  step replay "$bin/trace_replay" --passes "$passes" ${GPUKEEPER_BENCH_REPLAY_ARGS:-} \
    --json "$out/trace_replay.json" "${traces[@]}"
fi

# ---------------------------------------------------------------- summary
echo
echo "==== results in $out:"
ls -1 "$out"/*.json "$out"/traces/*.json 2>/dev/null | sed 's/^/  /'
if [ ${#failed[@]} -ne 0 ]; then
  echo "FAILED steps: ${failed[*]}"
  exit 1
fi
echo "all benchmark steps completed"
