# shellcheck shell=bash
# Which Python the scripts install into. Sourced by scripts/install.sh, scripts/test-all.sh
# and scripts/gpukeeper; defines functions only. Both functions export PY (the
# interpreter) and, for an environment, put its bin directory first on PATH, so that the
# tools pip installs there (cmake, ninja, pytest, gpukeeper) are the ones the script runs.
#
#   gk_use_python     finds the Python, creating the virtual environment when needed:
#     1. an active environment: $VIRTUAL_ENV (venv, virtualenv, uv, pyenv-virtualenv), else
#        $CONDA_PREFIX (conda or mamba, the base environment included): its python;
#     2. else $PYTHON, when set: that interpreter, as it is (pip must be allowed to install
#        into it: Debian's and Ubuntu's /usr/bin/python3 refuse, PEP 668);
#     3. else the virtual environment ${GPUKEEPER_VENV:-.venv} (relative paths are taken from
#        the repository root), made with `python3 -m venv --system-site-packages` on first
#        use and reused after that.
#   gk_find_python    the same choice without creating anything; returns 1 when there is
#                     no environment yet (scripts/gpukeeper uses it).
#
# Why --system-site-packages: the venv sees what the base python3 already has, without
# copying or changing it. Where a CPU build of PyTorch is installed system-wide (CI
# machines have one), the tests use it instead of downloading torch again, and the
# venv's own pip installs go into the venv only: the base Python is never modified,
# which is what PEP 668 ("externally-managed-environment") asks for.

GK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

gk_say() { echo "gpukeeper: $*" >&2; }

# The venv directory, absolute (GPUKEEPER_VENV may be relative to the repository root).
gk_venv_dir() {
  local dir=${GPUKEEPER_VENV:-.venv}
  case $dir in /*) ;; *) dir=$GK_ROOT/$dir ;; esac
  echo "$dir"
}

# Puts DIR first on PATH (once) and exports PY.
gk_export() {
  PY=$1
  export PY
  local bin
  bin=$(dirname "$PY")
  if [ -n "${2:-}" ]; then
    case ":$PATH:" in *":$bin:"*) ;; *) PATH="$bin:$PATH"; export PATH ;; esac
  fi
}

# An active environment at DIR: its bin/python, or MESSAGE and status 2 when it has none.
gk_use_active() {
  GK_PY_KIND=active
  if [ ! -x "$1/bin/python" ]; then
    gk_say "$2"
    return 2
  fi
  gk_export "$1/bin/python" path
}

# Sets GK_PY_KIND (active|python|venv) and PY without creating anything.
gk_find_python() {
  if [ -n "${VIRTUAL_ENV:-}" ]; then
    gk_use_active "$VIRTUAL_ENV" "VIRTUAL_ENV=$VIRTUAL_ENV has no bin/python (a stale activation? run 'deactivate')"
  elif [ -n "${CONDA_PREFIX:-}" ]; then
    gk_use_active "$CONDA_PREFIX" "the conda environment $CONDA_PREFIX has no python: 'conda install python' there"
  elif [ -n "${PYTHON:-}" ]; then
    GK_PY_KIND=python
    if ! command -v "$PYTHON" >/dev/null; then
      gk_say "PYTHON=$PYTHON is not an interpreter that can be run"
      return 2
    fi
    gk_export "$(command -v "$PYTHON")"
  else
    GK_PY_KIND=venv
    local venv
    venv=$(gk_venv_dir)
    [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "" 2>/dev/null || return 1
    gk_export "$venv/bin/python" path
  fi
}

# Installs an apt package where that can be done without a password prompt: as root, or
# through `sudo -n`. Returns 1 (having said nothing) when neither is possible.
gk_apt_install() {
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null && sudo -n true 2>/dev/null || return 1
    sudo=(sudo -n)
  fi
  command -v apt-get >/dev/null || return 1
  gk_say "installing $* with apt-get"
  "${sudo[@]}" apt-get install -y -q "$@" || { "${sudo[@]}" apt-get update -q && "${sudo[@]}" apt-get install -y -q "$@"; }
}

gk_use_python() {
  local rc=0
  gk_find_python || rc=$?
  if [ "$rc" -eq 2 ]; then
    exit 1
  fi
  if [ "$rc" -eq 0 ] && [ "$GK_PY_KIND" = venv ] && ! "$PY" -m pip --version >/dev/null 2>&1; then
    rc=1  # a venv left without pip (python3-venv was missing): made again below
  fi
  if [ "$rc" -eq 0 ]; then
    case $GK_PY_KIND in
      active) gk_say "using the active environment ${VIRTUAL_ENV:-$CONDA_PREFIX} ($PY)" ;;
      python) gk_say "using PYTHON=$PY" ;;
      venv) gk_say "using the virtual environment $(gk_venv_dir) (activate it with: source $(gk_venv_dir)/bin/activate)" ;;
    esac
    if ! "$PY" -m pip --version >/dev/null 2>&1; then
      gk_say "$PY has no pip: install it there (e.g. '$PY -m ensurepip', or 'conda install pip')"
      exit 1
    fi
    return 0
  fi

  # No environment yet: make the venv from the python3 on PATH.
  local venv base
  venv=$(gk_venv_dir)
  base=$(command -v python3 || true)
  if [ -z "$base" ]; then
    gk_say "no python3 found: on Debian or Ubuntu, sudo apt-get install python3 python3-venv"
    exit 1
  fi
  # Debian and Ubuntu ship venv's ensurepip in a separate package (python3-venv); without
  # it `python3 -m venv` leaves a venv with no pip.
  if ! "$base" -c "import venv, ensurepip" 2>/dev/null; then
    gk_say "$base cannot make virtual environments: the package python3-venv is missing"
    gk_say "  sudo apt-get install python3-venv"
    if ! gk_apt_install python3-venv || ! "$base" -c "import venv, ensurepip" 2>/dev/null; then
      gk_say "run the command above (or set PYTHON, or activate a virtual environment), then run this script again"
      exit 1
    fi
  fi
  gk_say "creating the virtual environment $venv (python3 -m venv --system-site-packages, from $base)"
  "$base" -m venv --clear --system-site-packages "$venv"
  if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    gk_say "the new virtual environment $venv has no pip (is python3-venv installed?)"
    exit 1
  fi
  gk_export "$venv/bin/python" path
  gk_say "using the virtual environment $venv (activate it with: source $venv/bin/activate)"
}

# Whether the build finds a CUDA runtime to build the CUDA core against (its headers and
# static library; no nvcc is needed): a toolkit on PATH or in /usr/local/cuda, or NVIDIA's
# pip wheels in $PY's environment (cmake/pip_cuda_toolkit.cmake uses those).
gk_has_cuda_runtime() {
  command -v nvcc >/dev/null 2>&1 && return 0
  [ -f /usr/local/cuda/include/cuda_runtime_api.h ] && return 0
  local pip_root
  pip_root=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'] + '/nvidia/cu13')")
  [ -f "$pip_root/include/crt/host_defines.h" ] && [ -f "$pip_root/lib/libcudart_static.a" ]
}
