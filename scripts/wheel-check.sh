#!/usr/bin/env bash
# The binary wheel as a user meets it: builds it (scripts/build-wheel.sh), installs it
# into a brand-new virtual environment with no compiler and no CUDA toolkit on PATH,
# imports it and runs `gpukeeper check`, which must PASS (in CPU mode on a machine
# without a GPU, with CUDA on a GPU machine). Prints the wheel's size and install time.
# GPUKEEPER_REQUIRE_GPU=1 passes --require-gpu to the check (the GPU machine's round);
# GPUKEEPER_WHEEL_VENV_ARGS adds arguments to `python -m venv`. On a machine without
# network, PIP_NO_INDEX=1 and PIP_FIND_LINKS=<folder of rich and its dependencies' wheels>
# let pip install the wheel's dependencies; both pass into the clean environment.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
SYS_PY=${GPUKEEPER_SYSTEM_PYTHON:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpukeeper-wheelcheck.XXXXXX")
trap 'rm -rf "$work"' EXIT
say() { echo "== wheel-check [${SECONDS}s]: $*"; }

say "building the wheel"
GPUKEEPER_WHEEL_DIR="$work/dist" bash scripts/build-wheel.sh
wheel=$(ls "$work"/dist/gpukeeper-*.whl)
say "wheel $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB"

say "a fresh venv; PATH holds only its bin: no compiler, no nvcc"
# shellcheck disable=SC2086
"$SYS_PY" -m venv ${GPUKEEPER_WHEEL_VENV_ARGS:-} "$work/venv"
mkdir -p "$work/bin"
for tool in sh bash env; do ln -s "$(command -v "$tool")" "$work/bin/$tool"; done
clean=(env -i HOME="$HOME" LANG=C.UTF-8 TMPDIR="${TMPDIR:-/tmp}" PATH="$work/venv/bin:$work/bin")
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_FIND_LINKS PIP_NO_INDEX HTTPS_PROXY HTTP_PROXY NO_PROXY; do
  if [ -n "${!var:-}" ]; then clean+=("$var=${!var}"); fi
done
if "${clean[@]}" sh -c 'command -v cc || command -v gcc || command -v c++ || command -v nvcc' >/dev/null; then
  echo "wheel-check: a compiler is still on the clean PATH" >&2
  exit 1
fi
start=$SECONDS
"${clean[@]}" python -m pip install -q "$wheel"
say "installed in $((SECONDS - start)) s"
cd "$work"  # away from the checkout: the installed package, not the source tree
"${clean[@]}" python -c "import gpukeeper; print('import gpukeeper', gpukeeper.__version__, gpukeeper.build_info()['cuda'])"
check=(gpukeeper check)
if [ "${GPUKEEPER_REQUIRE_GPU:-0}" = 1 ]; then check+=(--require-gpu); fi
"${clean[@]}" "${check[@]}"
say "PASS"
