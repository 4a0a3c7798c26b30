#!/usr/bin/env bash
# README's two commands as a new user runs them on a clean Debian or Ubuntu machine,
# on a copy of this checkout: its tracked files plus untracked
# files git does not ignore, so no build directory and no .venv come along. A clean
# environment (env -i: HOME, locale, the machine's pip and proxy settings, PATH
# /usr/local/bin:/usr/bin:/bin with python3 being the system Python) runs
#   1. nothing active:   bash scripts/install.sh && scripts/gpukeeper check
#      install.sh must make .venv from the system Python, and the check must PASS;
#   2. a brand-new venv from the system Python (no --system-site-packages, no packages),
#      activated:        bash scripts/install.sh && scripts/gpukeeper check   (PASS again)
#                        bash scripts/test-all.sh, bounded for time: GPUKEEPER_SKIP_CPP=1
#                        (CI runs the C++ suites anyway) and the pytest arguments below;
#      torch comes from PyTorch's CPU index there, and afterwards the venv must hold no
#      nvidia-* CUDA library wheel (nvidia-ml-py, NVML's Python bindings, is expected).
# Usage: scripts/fresh-venv-check.sh [pytest arguments]   (default: -m "not notebooks")
# GPUKEEPER_SYSTEM_PYTHON (default /usr/bin/python3) names the system Python;
# GPUKEEPER_KEEP=1 keeps the temporary directory. 4 to 5 minutes on a 2-core machine with
# pip's cache warm: two builds of the core, one pytest run of about a minute.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
SYS_PY=${GPUKEEPER_SYSTEM_PYTHON:-/usr/bin/python3}
if [ "$#" -eq 0 ]; then set -- -m "not notebooks"; fi

work=$(mktemp -d "${TMPDIR:-/tmp}/gpukeeper-fresh.XXXXXX")
if [ "${GPUKEEPER_KEEP:-0}" = 1 ]; then
  echo "fresh-venv-check: keeping $work"
else
  trap 'rm -rf "$work"' EXIT
fi
say() { echo "== fresh-venv-check [$(date +%T), ${SECONDS}s]: $*"; }

say "copying the checkout to $work/repo"
mkdir -p "$work/repo" "$work/bin"
(cd "$root" && git ls-files -z --cached --others --exclude-standard \
   | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
   | tar --null -T - -cf -) | tar -xf - -C "$work/repo"
ln -s "$SYS_PY" "$work/bin/python3"

# The clean environment: what a new login shell on the machine has, nothing from ours.
keep=(HOME="$HOME" USER="${USER:-$(id -un)}" LANG=C.UTF-8 TERM="${TERM:-dumb}" TMPDIR="${TMPDIR:-/tmp}"
      PATH="$work/bin:/usr/local/bin:/usr/bin:/bin")
while IFS='=' read -r name _; do
  case $name in
    PIP_*|http_proxy|https_proxy|no_proxy|HTTP_PROXY|HTTPS_PROXY|NO_PROXY|SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE)
      keep+=("$name=${!name}") ;;
  esac
done < <(env)
clean() { env -i "${keep[@]}" bash -c "$1" _ "$work/repo" "${@:2}"; }

say "1. no environment active: bash scripts/install.sh && scripts/gpukeeper check"
clean 'cd "$1" && bash scripts/install.sh && scripts/gpukeeper check'
[ -x "$work/repo/.venv/bin/python" ] || { echo "install.sh made no .venv"; exit 1; }

say "2. a new venv from $SYS_PY, no packages: bash scripts/install.sh && scripts/gpukeeper check"
"$SYS_PY" -m venv "$work/venv"
clean '. "$2/bin/activate" && cd "$1" && bash scripts/install.sh && scripts/gpukeeper check' "$work/venv"

say "2. bash scripts/test-all.sh $* (GPUKEEPER_SKIP_CPP=1)"
tests=0
clean '. "$2/bin/activate" && cd "$1" && shift 2 && GPUKEEPER_SKIP_CPP=1 bash scripts/test-all.sh "$@"' \
  "$work/venv" "$@" || tests=$?

torch=$("$work/venv/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null || echo "none (the torch tests skipped)")
cuda_wheels=$("$work/venv/bin/python" -m pip list --format=freeze 2>/dev/null | grep -i '^nvidia-' | grep -vi '^nvidia-ml-py=' || true)
if [ -n "$cuda_wheels" ]; then
  say "FAIL: CUDA libraries were installed into the fresh venv (torch: $torch):"; echo "$cuda_wheels"; exit 1
fi
if [ "$tests" -ne 0 ]; then
  say "FAIL: test-all.sh exited $tests (torch in the fresh venv: $torch; no CUDA library wheels)"; exit "$tests"
fi
say "PASS: torch in the fresh venv: $torch; no CUDA library wheels"
