#!/usr/bin/env bash
# The C++ suite under sanitizers, CPU-only builds (no GPU in CI):
#   AddressSanitizer + UndefinedBehaviorSanitizer over every C++ test (ctest), and
#   ThreadSanitizer over the multithreaded stress tests ([stress], bounded);
# and, as `asan-python` (not part of `all`), the Python module gpukeeper._core built with
# ASan + UBSan under a part of the Python suite (scripts/lib/asan-python.sh says which).
# Any finding fails: UBSan is made fatal, ASan and TSan exit non-zero by themselves.
# Usage: bash scripts/sanitizers.sh [asan|tsan|asan-python|all]   (default: all = asan, tsan)
# GPUKEEPER_ASAN_BUILD / GPUKEEPER_TSAN_BUILD / GPUKEEPER_ASAN_PY_BUILD name the build folders
# (build/asan, build/tsan, build/asan-py); scripts/test-all.sh uses its CPU-only build folder
# for the ASan build.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
jobs=$(nproc 2>/dev/null || echo 2)

build() {  # build DIR FLAGS
  cmake -S . -B "$1" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUKEEPER_BUILD_TESTS=ON \
    -DGPUKEEPER_BUILD_PYTHON=OFF -DGPUKEEPER_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="$2 -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS="$2" >/dev/null
  cmake --build "$1" -j "$jobs" --target gpukeeper_cpp_tests trace_replay
}

if [ "$which" = asan ] || [ "$which" = all ]; then
  echo "== C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer =="
  asan_dir=${GPUKEEPER_ASAN_BUILD:-build/asan}
  build "$asan_dir" "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
  # allocator_may_return_null: the OOM tests ask the host upstream for a petabyte on
  # purpose and expect nullptr (an AllocationError), as malloc gives; ASan would abort.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:strict_string_checks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$asan_dir" --output-on-failure
fi

if [ "$which" = tsan ] || [ "$which" = all ]; then
  echo "== stress tests under ThreadSanitizer =="
  tsan_dir=${GPUKEEPER_TSAN_BUILD:-build/tsan}
  build "$tsan_dir" "-fsanitize=thread"
  # The multithreaded stress tests, bounded: ThreadSanitizer slows them 10-20 times, so the
  # fault-injection stress runs 64 000 operations here, and the high-churn small-block test
  # (2 million operations) is left to the plain builds.
  GPUKEEPER_STRESS_OPS=64000 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    "$tsan_dir/tests/cpp/gpukeeper_cpp_tests" "[stress]~stress: small blocks*"
fi
if [ "$which" = asan-python ]; then
  echo "== Python suite (part) over gpukeeper._core under AddressSanitizer + UBSan =="
  GPUKEEPER_ASAN_PY_BUILD=${GPUKEEPER_ASAN_PY_BUILD:-build/asan-py} bash scripts/lib/asan-python.sh
fi
echo "sanitizers: no findings"
