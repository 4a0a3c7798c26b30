#!/usr/bin/env bash
# The C++ suite under sanitizers, CPU-only builds (no GPU in CI):
#   AddressSanitizer + UndefinedBehaviorSanitizer over every C++ test (ctest), and
#   ThreadSanitizer over the multithreaded stress tests ([stress]).
# Any finding fails: UBSan is made fatal, ASan and TSan exit non-zero by themselves.
# Usage: bash scripts/sanitizers.sh [asan|tsan|all]   (default: all)
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
  build build/asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
  # allocator_may_return_null: the OOM tests ask the host upstream for a petabyte on
  # purpose and expect nullptr (an AllocationError), as malloc gives; ASan would abort.
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:strict_string_checks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan --output-on-failure
fi

if [ "$which" = tsan ] || [ "$which" = all ]; then
  echo "== stress tests under ThreadSanitizer =="
  build build/tsan "-fsanitize=thread"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    build/tsan/tests/cpp/gpukeeper_cpp_tests "[stress]"
fi
echo "sanitizers: no findings"
