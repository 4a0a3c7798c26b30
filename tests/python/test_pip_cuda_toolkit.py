"""cmake/pip_cuda_toolkit.cmake: a source build without a system CUDA toolkit finds the CUDA
runtime NVIDIA's pip wheels lay out under site-packages/nvidia/cu13, or names exactly the
wheels to install; a runtime tree given by GPUKEEPER_CUDA_RUNTIME_ROOT (the binary wheels'
way) is used as it is, or refused by what it lacks. Run against fake trees in a throwaway
CMake project; the wheel builds use real ones (scripts/cuda_runtime_tree.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

CMAKE = shutil.which("cmake")
MODULE = Path(__file__).resolve().parents[2] / "cmake" / "pip_cuda_toolkit.cmake"
# No nvcc: the core's device code is PTX that the driver compiles.
PIECES = {
    "nvidia-cuda-runtime": ["include/cuda_runtime_api.h", "lib/libcudart_static.a"],
    "nvidia-cuda-crt": ["include/crt/host_defines.h"],
}

pytestmark = pytest.mark.skipif(CMAKE is None, reason="needs cmake")


def _site(tmp_path: Path, wheels: List[str]) -> Path:
    """A site-packages holding the files of ``wheels``, and an interpreter stand-in that
    reports it as its purelib."""
    purelib = tmp_path / "site-packages"
    for wheel in wheels:
        for rel in PIECES[wheel]:
            f = purelib / "nvidia" / "cu13" / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho {purelib}\n")
    python.chmod(0o755)
    return python


def _configure(tmp_path: Path, python: Path, *defines: str) -> subprocess.CompletedProcess:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(t LANGUAGES NONE)\n"
        "option(GPUKEEPER_WITH_CUDA \"\" ON)\n"
        f"include({MODULE.as_posix()})\n"
        "if(TARGET CUDA::cudart_static)\n"
        "  get_target_property(lib CUDA::cudart_static IMPORTED_LOCATION)\n"
        "endif()\n"
        "message(STATUS \"tree=[${GPUKEEPER_CUDA_RUNTIME_TREE}] lib=[${lib}] "
        "include=[${CUDAToolkit_INCLUDE_DIRS}]\")\n")
    return subprocess.run([CMAKE, "-S", str(src), "-B", str(tmp_path / "build"),
                           f"-DPython_EXECUTABLE={python}", *defines],
                          capture_output=True, text=True, timeout=120)


def test_a_complete_pip_toolkit_is_used(tmp_path: Path):
    python = _site(tmp_path, list(PIECES))
    proc = _configure(tmp_path, python, "-DGPUKEEPER_PIP_CUDA=ON")
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "site-packages" / "nvidia" / "cu13"
    assert f"CUDA runtime from NVIDIA's pip wheels at {root}" in proc.stdout
    assert f"tree=[{root}] lib=[{root}/lib/libcudart_static.a] include=[{root}/include]" in proc.stdout


@pytest.mark.parametrize("absent", sorted(PIECES))
def test_a_missing_wheel_is_named_with_the_command_to_install(tmp_path: Path, absent: str):
    python = _site(tmp_path, [w for w in PIECES if w != absent])
    proc = _configure(tmp_path, python, "-DGPUKEEPER_PIP_CUDA=ON")
    assert proc.returncode != 0
    err = " ".join(proc.stderr.split())
    assert f"the pip runtime lacks {absent}" in err
    assert 'pip install "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*"' in err


def test_a_system_toolkit_comes_first(tmp_path: Path):
    python = _site(tmp_path, list(PIECES))
    proc = _configure(tmp_path, python, f"-DCUDAToolkit_ROOT={tmp_path / 'system-cuda'}")
    assert proc.returncode == 0, proc.stderr
    assert "pip wheels" not in proc.stdout and "tree=[]" in proc.stdout


def test_off_never_looks(tmp_path: Path):
    python = _site(tmp_path, list(PIECES))
    proc = _configure(tmp_path, python, "-DGPUKEEPER_PIP_CUDA=OFF")
    assert proc.returncode == 0, proc.stderr
    assert "pip wheels" not in proc.stdout and "tree=[]" in proc.stdout


def test_a_given_runtime_tree_is_used_before_any_other(tmp_path: Path):
    python = _site(tmp_path, [])
    tree = tmp_path / "site-packages" / "nvidia" / "cu13"
    _site(tmp_path, list(PIECES))
    proc = _configure(tmp_path, python, f"-DGPUKEEPER_CUDA_RUNTIME_ROOT={tree}",
                      f"-DCUDAToolkit_ROOT={tmp_path / 'system-cuda'}")
    assert proc.returncode == 0, proc.stderr
    assert f"CUDA runtime from {tree}" in proc.stdout
    assert f"tree=[{tree}] lib=[{tree}/lib/libcudart_static.a]" in proc.stdout


@pytest.mark.parametrize("absent", sorted(PIECES))
def test_a_given_tree_that_lacks_a_piece_is_refused_by_name(tmp_path: Path, absent: str):
    python = _site(tmp_path, [w for w in PIECES if w != absent])
    tree = tmp_path / "site-packages" / "nvidia" / "cu13"
    proc = _configure(tmp_path, python, f"-DGPUKEEPER_CUDA_RUNTIME_ROOT={tree}")
    assert proc.returncode != 0
    err = " ".join(proc.stderr.split())
    assert f"is not a CUDA runtime tree: it lacks the files of {absent}" in err
    assert "scripts/cuda_runtime_tree.py" in err
