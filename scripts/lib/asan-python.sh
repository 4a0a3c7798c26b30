#!/usr/bin/env bash
# The Python module gpukeeper._core under AddressSanitizer + UndefinedBehaviorSanitizer:
# a CPU-only build of the module with -fsanitize=address,undefined, put into a temporary
# copy of the package, and a part of the Python suite run over it. Run by
# `bash scripts/sanitizers.sh asan-python`; the build folder is $GPUKEEPER_ASAN_PY_BUILD.
#
# The interpreter is not instrumented, so libasan is preloaded (it must be the first
# library of the process), and libstdc++ with it (see below). What is checked, and why:
#   - every ASan or UBSan report fails the run, from pytest or any process a test starts:
#     reports go to files under a temporary folder (log_path), printed in full when one
#     holds anything but the warning named below; UBSan is fatal (-fno-sanitize-recover,
#     halt_on_error).
#   - leaks are not checked here (detect_leaks=0): CPython, numpy and torch keep much of
#     what they allocate until exit, and every gpukeeper allocation made from Python has
#     the interpreter on its stack, so no suppression could tell theirs from ours. The
#     C++ suite runs under LeakSanitizer (`sanitizers.sh asan`), and the Python tests
#     check the pool's books themselves. Nothing else is suppressed.
#   - PYTHONMALLOC=malloc: Python objects come from malloc, so ASan also sees an overflow
#     of the core into a Python buffer (bytes, bytearray, numpy arrays' own data already do).
#   - allocator_may_return_null=1: tests ask for petabytes on purpose and expect an
#     AllocationError, as malloc's nullptr gives; ASan would abort instead. ASan still
#     logs "WARNING: AddressSanitizer failed to allocate 0x... bytes" for each: that one
#     line is the only thing a report file may hold; anything else fails the run.
#   - three tests read glibc's malloc statistics (mallinfo2), which ASan's allocator
#     replaces (they read 0 under it): DESELECT below; the ordinary suite runs them.
#
# The part of the suite (TESTS below): the tests of the core's own surface, where
# its code runs with Python's arguments: the pool, buffers, bad input, the memory API,
# expandable segments, OOM retry, cleanup, devices and runtime, the timing core, and
# DLPack / torch / CuPy interop with the allocator hooks.
# The rest (the CLI, plugins, notebooks, docs, engines, displays) is Python calling the
# same entry points, and is left to the ordinary suite to keep this step short.
# torch: the CPU build of torch imports and runs under the preloaded ASan; the torch tests
# of these files run here (they skip where torch is missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/python-env.sh
gk_use_python
build=${GPUKEEPER_ASAN_PY_BUILD:-build/asan-py}
jobs=$(nproc 2>/dev/null || echo 2)
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
TESTS=(
  tests/python/test_bad_input.py
  tests/python/test_memory_pool.py
  tests/python/test_buffers.py
  tests/python/test_expandable.py
  tests/python/test_oom_retry.py
  tests/python/test_memory_guide.py
  tests/python/test_manager.py
  tests/python/test_cleanup.py
  tests/python/test_cleanup_deferred.py
  tests/python/test_devices.py
  tests/python/test_device_utils.py
  tests/python/test_runtime.py
  tests/python/test_host.py
  tests/python/test_core_stub.py
  tests/python/test_timing_core.py
  tests/python/test_timing_api.py
  tests/python/test_timing_gates.py
  tests/python/test_interop.py
  tests/python/test_integrations.py
  tests/python/test_torch_memory_api.py
)
DESELECT=(
  tests/python/test_device_utils.py::test_memory_info_cpu_mode_tracks_host_memory
  tests/python/test_device_utils.py::test_check_memory_leak_cpu_mode
  tests/python/test_host.py::test_malloc_in_use_sees_a_live_array_and_its_release
)

# The interpreter itself, not a wrapper (a pyenv shim is a shell script).
real_py=$("$PY" -c 'import sys; print(sys.executable)')
sanitize="-fsanitize=address,undefined"
cmake -S . -B "$build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGPUKEEPER_BUILD_PYTHON=ON -DGPUKEEPER_BUILD_TESTS=OFF -DGPUKEEPER_WITH_CUDA=OFF \
  -DPython_EXECUTABLE="$real_py" -Dpybind11_DIR="$("$real_py" -m pybind11 --cmakedir)" \
  -DCMAKE_CXX_FLAGS="$sanitize -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  -DCMAKE_MODULE_LINKER_FLAGS="$sanitize" >/dev/null
cmake --build "$build" -j "$jobs" --target _core
module=$(ls "$build"/_core*.so)
# The libasan the module was linked against (GCC's; clang links its runtime statically
# into executables only, and is not supported here).
libasan=$(ldd "$module" | awk '/libasan\.so/ {print $3}')
if [ -z "$libasan" ]; then
  echo "asan-python: $module is not linked against libasan (GCC is needed)" >&2
  exit 1
fi
# libstdc++ is preloaded too: the interpreter does not link it, and ASan looks up the real
# __cxa_throw once, at start-up; without it there the first C++ exception aborts ASan.
libstdcxx=$(ldd "$module" | awk '/libstdc\+\+\.so/ {print $3}')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/site" "$work/reports"
cp -r python/gpukeeper "$work/site/"
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$work"/site/gpukeeper/_core*.so
cp "$module" "$work/site/gpukeeper/"

run_suite() {
  PYTHONPATH="$work/site" PYTHONMALLOC=malloc LD_PRELOAD="$libasan${libstdcxx:+ $libstdcxx}" \
  ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:halt_on_error=1:log_path=$work/reports/asan" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$work/reports/ubsan" \
    "$real_py" -m pytest "$@" -q -p no:cacheprovider
}

status=0
run_suite "${TESTS[@]}" "${DESELECT[@]/#/--deselect=}" || status=$?
expected='^==[0-9]+==WARNING: AddressSanitizer failed to allocate 0x[0-9a-f]+ bytes$'
if compgen -G "$work/reports/*" >/dev/null; then
  if grep -hvE "$expected" "$work"/reports/* | grep -q .; then
    echo "asan-python: sanitizer reports:" >&2
    cat "$work"/reports/* >&2
    exit 1
  fi
  echo "asan-python: $(cat "$work"/reports/* | wc -l) refused allocations of the OOM tests (expected)"
fi
[ "$status" = 0 ] || { echo "asan-python: the Python suite failed (rc=$status)" >&2; exit "$status"; }
echo "asan-python: no findings over ${#TESTS[@]} test files"
