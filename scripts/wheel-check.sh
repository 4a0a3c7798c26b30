#!/usr/bin/env bash
# The binary wheel as a user meets it: builds it (scripts/build-wheel.sh), installs it
# into a brand-new virtual environment with no compiler and no CUDA toolkit on PATH,
# imports it and runs `gpukeeper check`, which must PASS (in CPU mode on a machine
# without a GPU, with CUDA on a GPU machine). Prints the wheel's size and install time.
# It also checks the PyTorch allocator components the wheel carries: one per supported
# PyTorch release (GPUKEEPER_TORCH_MISSING_OK=1: those whose headers could be fetched),
# each needing PyTorch's libraries by SONAME and no path of the build machine, each
# chosen for its own release only (any patch version) and never for another. Loading
# them needs a CUDA build of PyTorch, which the GPU machine's suites do.
# GPUKEEPER_WHEEL_CUDA=12 checks the CUDA 12 wheel (gpukeeper-cu12) instead of the
# CUDA 13 one. GPUKEEPER_REQUIRE_GPU=1 passes --require-gpu to the check (the GPU machine's round);
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
wheel=$(ls "$work"/dist/gpukeeper_cu*-*.whl)
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
# The wheel is the one for its CUDA major release, by name and by the runtime inside.
"${clean[@]}" GK_CUDA="${GPUKEEPER_WHEEL_CUDA:-13}" python - <<'PY'
import os
import sys
from importlib import metadata

import gpukeeper

cuda = os.environ["GK_CUDA"]
info = gpukeeper.build_info()
print("import gpukeeper", gpukeeper.__version__, "CUDA", info["cuda_version"])
names = {d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].startswith("gpukeeper")}
if names != {f"gpukeeper-cu{cuda}"}:
    sys.exit(f"wheel-check: installed {sorted(names)}, not gpukeeper-cu{cuda}")
if not info["cuda"] or str(info["cuda_version"]).split(".")[0] != cuda:
    sys.exit(f"wheel-check: the core is built for CUDA {info['cuda_version']}, not {cuda}")
PY
say "the PyTorch allocator components"
"${clean[@]}" GPUKEEPER_TORCH_MISSING_OK="${GPUKEEPER_TORCH_MISSING_OK:-0}" python - <<'PY'
import os
import re
import sys

from gpukeeper.integrations import torch_builds as tb
from gpukeeper.integrations import torch_component as tc

folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(tc.__file__))), "torch_components")
carried = {tb.release_of_file(f): os.path.join(folder, f) for f in os.listdir(folder) if tb.release_of_file(f)}
problems = []
for release, path in sorted(carried.items()):
    if release not in tc.supported_releases():
        problems.append(f"{path}: torch {release} is not a supported release")
    dyn = tb.elf_dynamic(path)
    if not set(tb.TORCH_LIBRARIES) <= set(dyn["needed"]):
        problems.append(f"{path}: needs {dyn['needed']}, not all of {list(tb.TORCH_LIBRARIES)}")
    if dyn["rpath"] + dyn["runpath"] != ["$ORIGIN/../../torch/lib"]:
        problems.append(f"{path}: run-time search path {dyn['rpath'] + dyn['runpath']}")
    with open(path, "rb") as f:
        made_for = set(re.findall(rb"\0(\d+\.\d+\.\d+)\0", f.read()))
    if not any(tb.release_of(v.decode()) == release for v in made_for):
        problems.append(f"{path}: names no torch {release}.x version inside")
    for other in tc.supported_releases() + ("2.8", "3.0"):
        for version in (f"{other}.0", f"{other}.9+cu130"):
            got = tc.library_path(version)
            if other == release and (got is None or not os.path.samefile(got, path)):
                problems.append(f"torch {version}: chose {got}, not {path}")
            if other != release and got is not None and os.path.samefile(got, path):
                problems.append(f"torch {version}: chose {path}, made for {release}")
missing = [r for r in tc.supported_releases() if r not in carried]
if missing:
    text = f"no component for torch {', '.join(missing)}"
    if os.environ.get("GPUKEEPER_TORCH_MISSING_OK") == "1":
        print(f"wheel-check: warning: {text} (GPUKEEPER_TORCH_MISSING_OK=1)")
    else:
        problems.append(text)
for p in problems:
    print(f"wheel-check: {p}", file=sys.stderr)
print(f"components for torch {', '.join(sorted(carried, key=lambda r: tuple(map(int, r.split('.')))))}")
sys.exit(1 if problems else 0)
PY
check=(gpukeeper check)
if [ "${GPUKEEPER_REQUIRE_GPU:-0}" = 1 ]; then check+=(--require-gpu); fi
"${clean[@]}" "${check[@]}"
say "PASS"
