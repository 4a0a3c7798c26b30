"""scripts/cuda_runtime_tree.py, which assembles the CUDA runtime a binary wheel is built
against from NVIDIA's pip wheels, checked on fake wheels (no download); and the core's
device code (csrc/gpukeeper/kernels/timing_kernels.ptx), assembled by ptxas for the GPUs
the wheels serve where ptxas is on PATH."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import cuda_runtime_tree as crt  # noqa: E402  (scripts/cuda_runtime_tree.py)

PTX = ROOT / "csrc" / "gpukeeper" / "kernels" / "timing_kernels.ptx"


def _fake_wheels(folder: Path, major: int, skip: str = "") -> None:
    """One wheel file per requirement of `major`, holding a file under each of its pieces."""
    folder.mkdir(parents=True, exist_ok=True)
    by_requirement = {}
    for piece in crt.RUNTIMES[major]:
        by_requirement.setdefault(piece.requirement, []).append(piece)
    for requirement, pieces in by_requirement.items():
        path = folder / (crt._wheel_name(requirement) + "py3-none-manylinux_2_17_x86_64.whl")
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("nvidia/__init__.py", "")
            for piece in pieces:
                if piece.prefix.endswith("/"):
                    for rel in crt.NEEDED:
                        if rel.startswith(piece.into) and rel[len(piece.into):] != skip:
                            archive.writestr(piece.prefix + rel[len(piece.into):], "header")
                    archive.writestr(piece.prefix + "__init__.py", "")
                else:
                    archive.writestr(piece.prefix, "archive")


@pytest.mark.parametrize("major", sorted(crt.RUNTIMES))
def test_a_tree_is_assembled_from_the_wheels_and_reused(tmp_path, monkeypatch, major):
    monkeypatch.setenv("GPUKEEPER_CACHE_DIR", str(tmp_path / "cache"))
    _fake_wheels(tmp_path / "wheels", major)
    tree = crt.assemble(major, sys.executable, tmp_path / "wheels")
    assert tree == tmp_path / "cache" / "cuda-runtime" / f"cu{major}"
    for rel in crt.NEEDED:
        assert (tree / rel).is_file(), rel
    assert not list(tree.rglob("__init__.py"))
    assert f"cuda={major}" in (tree / "facts.txt").read_text()
    # Reused without looking at the wheels again.
    shutil.rmtree(tmp_path / "wheels")
    assert crt.assemble(major, sys.executable, tmp_path / "wheels") == tree


def test_missing_wheels_and_pieces_are_named_and_leave_no_tree(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUKEEPER_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="has no wheel of nvidia-cuda"):
        crt.assemble(12, sys.executable, tmp_path / "empty")
    _fake_wheels(tmp_path / "partial", 12, skip="cuda.h")
    with pytest.raises(RuntimeError, match="lack include/cuda.h"):
        crt.assemble(12, sys.executable, tmp_path / "partial")
    assert not (tmp_path / "cache" / "cuda-runtime" / "cu12").exists()
    with pytest.raises(ValueError, match="CUDA 12 and 13"):
        crt.assemble(11, sys.executable, tmp_path / "empty")
    assert crt.main(["--cuda", "12", "--from", str(tmp_path / "empty")]) == 1


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_the_device_code_assembles_for_each_gpu_generation(tmp_path, arch):
    out = tmp_path / f"{arch}.cubin"
    done = subprocess.run(["ptxas", f"-arch={arch}", str(PTX), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0


def test_the_device_code_names_the_entries_the_loader_asks_for():
    text = PTX.read_text()
    loader = (ROOT / "csrc" / "gpukeeper" / "kernels" / "kernel_module.cpp").read_text()
    # ISA 7.0 for sm_70: what every driver from CUDA 11.0 on compiles.
    assert ".version 7.0" in text and ".target sm_70" in text
    for entry in ("gk_spin_kernel", "gk_gate_kernel"):
        assert f".visible .entry {entry}(" in text
        assert f'"{entry}"' in loader
