"""cmake/pip_cuda_toolkit.cmake: a source build without a system CUDA toolkit finds the one
NVIDIA's pip wheels lay out under site-packages/nvidia/cu13, or names exactly the wheels
to install. Run against fake trees in a throwaway CMake project (the real build with the
wheels is documented in docs/getting-started.md; it downloads about 130 MB)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

CMAKE = shutil.which("cmake")
MODULE = Path(__file__).resolve().parents[2] / "cmake" / "pip_cuda_toolkit.cmake"
PIECES = {
    "nvidia-cuda-runtime": ["include/cuda_runtime.h", "lib/libcudart_static.a"],
    "nvidia-cuda-crt": ["include/crt/host_config.h"],
    "nvidia-cuda-cccl": ["include/cccl/cuda/version"],
    "nvidia-cuda-nvcc": ["bin/nvcc"],
    "nvidia-nvvm": ["nvvm/bin/cicc"],
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
        "message(STATUS \"root=[${CUDAToolkit_ROOT}] nvcc=[${CMAKE_CUDA_COMPILER}]\")\n")
    return subprocess.run([CMAKE, "-S", str(src), "-B", str(tmp_path / "build"),
                           f"-DPython_EXECUTABLE={python}", *defines],
                          capture_output=True, text=True, timeout=120)


def test_a_complete_pip_toolkit_is_used(tmp_path: Path):
    python = _site(tmp_path, list(PIECES))
    proc = _configure(tmp_path, python, "-DGPUKEEPER_PIP_CUDA=ON")
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "site-packages" / "nvidia" / "cu13"
    assert f"CUDA toolkit from NVIDIA's pip wheels at {root}" in proc.stdout
    assert f"root=[{root}] nvcc=[{root}/bin/nvcc]" in proc.stdout


@pytest.mark.parametrize("absent", sorted(PIECES))
def test_a_missing_wheel_is_named_with_the_command_to_install(tmp_path: Path, absent: str):
    python = _site(tmp_path, [w for w in PIECES if w != absent])
    proc = _configure(tmp_path, python, "-DGPUKEEPER_PIP_CUDA=ON")
    assert proc.returncode != 0
    err = " ".join(proc.stderr.split())
    assert f"the pip toolkit lacks {absent}" in err
    assert 'pip install "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*" ' \
        '"nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*"' in err


def test_a_system_toolkit_comes_first(tmp_path: Path):
    python = _site(tmp_path, list(PIECES))
    proc = _configure(tmp_path, python, f"-DCUDAToolkit_ROOT={tmp_path / 'system-cuda'}")
    assert proc.returncode == 0, proc.stderr
    assert "pip wheels" not in proc.stdout
    assert f"root=[{tmp_path / 'system-cuda'}]" in proc.stdout


def test_off_never_looks(tmp_path: Path):
    python = _site(tmp_path, list(PIECES))
    proc = _configure(tmp_path, python, "-DGPUKEEPER_PIP_CUDA=OFF")
    assert proc.returncode == 0, proc.stderr
    assert "pip wheels" not in proc.stdout and "root=[]" in proc.stdout
