"""The PyTorch allocator component's builds, one per PyTorch release: the release list, which
build is chosen for which PyTorch (never one made for another release), the messages when
none serves, the per-user cache, the header fetcher's wheel reading, a real build linked
against stand-ins for PyTorch's libraries (CPU-only: the headers of the installed
PyTorch), and a first-use build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from gpukeeper.base.errors import GpuError
from gpukeeper.integrations import torch_builds as tb
from gpukeeper.integrations import torch_component as tc

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import torch_headers  # noqa: E402  (scripts/torch_headers.py)


@pytest.fixture
def places(tmp_path, monkeypatch):
    """The package's component folder and the user cache, both empty, under tmp_path."""
    packaged = tmp_path / "torch_components"
    packaged.mkdir()
    monkeypatch.setattr(tc, "_PACKAGED", str(packaged))
    monkeypatch.setenv("GPUKEEPER_CACHE_DIR", str(tmp_path / "cache"))
    return packaged


def fake_torch(version: str, cuda="13.0", file=None):
    return types.SimpleNamespace(
        __version__=version, __file__=file, version=types.SimpleNamespace(cuda=cuda),
        _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True))


def test_the_release_list():
    releases = tc.supported_releases()
    assert releases == tb.SUPPORTED
    assert {"2.9", "2.10", "2.11", "2.12", "2.13"} <= set(releases)
    assert list(releases) == sorted(releases, key=lambda r: tuple(map(int, r.split("."))))
    assert set(tb.HEADER_PINS) == set(releases)
    assert all(tb.release_of(pin) == r for r, pin in tb.HEADER_PINS.items())
    # The fetcher reads the same list (it loads torch_builds by path).
    assert torch_headers.builds.SUPPORTED == releases


def test_names_carry_the_release_only():
    assert tb.release_of("2.11.0+cu130") == "2.11" == tb.release_of("2.11")
    assert tb.release_of("2.10.0a0+git1234") == "2.10"
    assert tb.release_of("2.1.2") == "2.1" != tb.release_of("2.12.0")
    with pytest.raises(ValueError):
        tb.release_of("main")
    assert tb.file_name("2.11.0+cu130") == "libgpukeeper_torch_2_11.so"
    assert tb.release_of_file("libgpukeeper_torch_2_11.so") == "2.11"
    assert tb.release_of_file("libgpukeeper_torch.so") is None
    assert tb.cxx_standard("2.13") == 17 and tb.cxx_standard("2.14.1") == 20


def test_a_build_is_chosen_for_its_own_release_only(places):
    (places / "libgpukeeper_torch_2_12.so").write_bytes(b"")
    assert tc.library_path("2.11.0") is None
    assert tc.library_path("2.1.2") is None
    assert tc.library_path("2.13.0+cu130") is None
    for version in ("2.12.0", "2.12.1+cu130", "2.12.7+cu126"):
        assert tc.library_path(version) == str(places / "libgpukeeper_torch_2_12.so")
    assert tc.library_path(fake_torch("2.12.1+cu130")) == str(places / "libgpukeeper_torch_2_12.so")


def test_the_cache_folder_and_its_builds(places, tmp_path, monkeypatch):
    from gpukeeper import __version__

    monkeypatch.delenv("GPUKEEPER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = Path(tc.cache_dir("2.15.0+cu130"))
    assert folder.parent.parent == tmp_path / "xdg" / "gpukeeper" / "torch-components"
    import gpukeeper._core as core

    # Keyed by gpukeeper's version and the pool table's: a build made by another checkout
    # of the same version may not fit this module's table.
    assert folder.name == "2.15.0+cu130"
    assert folder.parent.name == f"{__version__}-table{core._torch_pool_api_version}"
    monkeypatch.setenv("GPUKEEPER_CACHE_DIR", str(tmp_path / "mine"))
    folder = Path(tc.cache_dir("2.15.0+cu130"))
    assert str(folder).startswith(str(tmp_path / "mine" / "torch-components"))
    folder.mkdir(parents=True)
    (folder / "libgpukeeper_torch_2_15.so").write_bytes(b"")
    assert tc.library_path("2.15.0+cu130") == str(folder / "libgpukeeper_torch_2_15.so")
    assert tc.library_path("2.16.0+cu130") is None
    # The package's own build comes first.
    (places / "libgpukeeper_torch_2_15.so").write_bytes(b"")
    assert tc.library_path("2.15.0+cu130") == str(places / "libgpukeeper_torch_2_15.so")


def test_status_names_the_releases_and_the_command(places):
    why = tc.status(fake_torch("2.11.0+cu130"))
    assert "none for torch 2.11.0+cu130" in why
    assert f"torch {tc.supported_releases()[0]} to {tc.supported_releases()[-1]}" in why
    assert tc.BUILD_COMMAND in why and "PyTorch's C++ headers are not installed" in why
    assert "CPU build" in tc.status(fake_torch("2.15.0+cpu", cuda=None))
    assert "not a PyTorch version" in tc.status(fake_torch("nightly"))
    with pytest.raises(GpuError, match="CPU build"):
        tc.build(fake_torch("2.15.0+cpu", cuda=None))


def test_a_build_that_reports_another_release_is_refused(places, monkeypatch):
    (places / "libgpukeeper_torch_2_11.so").write_bytes(b"")

    class Lib:
        def __init__(self, made_for: bytes):
            self.gpukeeper_torch_built_for = lambda: made_for

    monkeypatch.setattr(tc, "_load", lambda _path: Lib(b"2.12.1"))
    why = tc.status(fake_torch("2.11.0+cu130"))
    assert "was built for torch 2.12.1" in why and "2.11.0+cu130" in why
    monkeypatch.setattr(tc, "_load", lambda _path: Lib(b"2.11.0"))
    assert tc.status(fake_torch("2.11.3+cu126")) == ""


def test_a_core_of_another_cuda_release_is_refused_by_name(places, monkeypatch):
    (places / "libgpukeeper_torch_2_11.so").write_bytes(b"")
    monkeypatch.setattr(tc._core, "build_info", lambda: {"cuda": True, "cuda_version": "12.9"})
    why = tc.status(fake_torch("2.11.0+cu130", cuda="13.0"))
    assert "built for CUDA 12" in why and "for CUDA 13" in why
    assert "pip install gpukeeper-cu13" in why
    with pytest.raises(GpuError, match="gpukeeper-cu13"):
        tc.install(fake_torch("2.11.0+cu130", cuda="13.0"))

    class Lib:
        gpukeeper_torch_built_for = staticmethod(lambda: b"2.11.0")

    monkeypatch.setattr(tc, "_load", lambda _path: Lib())
    assert tc.status(fake_torch("2.11.0+cu126", cuda="12.6")) == ""
    # A CPU-only core, or a CPU build of PyTorch, has no release to disagree with.
    monkeypatch.setattr(tc._core, "build_info", lambda: {"cuda": False, "cuda_version": None})
    assert "CUDA 1" not in tc.status(fake_torch("2.11.0+cu130", cuda="13.0"))


def _compiler():
    return shutil.which("c++") or shutil.which("g++")


def _stand_in(folder: Path, soname: str) -> Path:
    src = folder / "empty.cpp"
    # A function taking std::string: its symbol names std::__cxx11 under the new C++ ABI.
    src.write_text("#include <string>\nstd::string gpukeeper_test_stand_in(std::string s) { return s; }\n")
    out = folder / soname
    subprocess.run([_compiler(), "-shared", "-fPIC", "-o", str(out), f"-Wl,-soname,{soname}", str(src)],
                   check=True)
    return out


def test_the_fetcher_reads_a_wheel(tmp_path, monkeypatch):
    """A torch wheel's headers, version, C++ ABI and library SONAMEs, into the cache."""
    if _compiler() is None:
        pytest.skip("needs a C++ compiler")
    libs = tmp_path / "libs"
    libs.mkdir()
    wheel = tmp_path / "torch-2.12.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("torch/version.py", "__version__ = '2.12.1+cu130'\ncuda: Optional[str] = '13.0'\n")
        z.writestr("torch/include/c10/cuda/CUDACachingAllocator.h", "#pragma once\n")
        for name in tb.TORCH_LIBRARIES:
            z.write(_stand_in(libs, name), f"torch/lib/{name}")
    monkeypatch.setenv("GPUKEEPER_CACHE_DIR", str(tmp_path / "cache"))
    folder = torch_headers.fetch("2.12", sys.executable, {"2.12": wheel})
    facts = torch_headers.read_facts(folder)
    assert facts["version"] == "2.12.1+cu130" and facts["release"] == "2.12"
    assert facts["cuda"] == "13.0" and facts["sonames"] == ",".join(tb.TORCH_LIBRARIES)
    assert facts["cxx11_abi"] == "1"  # the C++ compiler here uses the new ABI
    assert (folder / "include" / "c10" / "cuda" / "CUDACachingAllocator.h").exists()
    assert (folder / "extra" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists()
    # A prepared folder is taken as it is.
    assert torch_headers.fetch("2.12", sys.executable, {"2.12": folder}) == folder


def _cuda_include():
    return tc._cuda_include()


def test_a_component_linked_against_stand_ins(tmp_path, monkeypatch):
    """The wheel's way: a component built by CMake against the installed PyTorch's headers
    (a CPU build ships them) and stand-ins for its libraries needs them by SONAME, with no
    path of this machine, and reports its release."""
    torch = pytest.importorskip("torch")
    here = Path(torch.__file__).parent
    nvcc = shutil.which("nvcc") or (Path("/usr/local/cuda/bin/nvcc") if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if not (here / "include" / "c10" / "cuda" / "CUDACachingAllocator.h").exists() or not _compiler() \
            or not shutil.which("cmake") or not nvcc or not _cuda_include():
        pytest.skip("needs PyTorch's C++ headers, a C++ compiler, CMake and CUDA's toolkit")
    monkeypatch.setenv("GPUKEEPER_CACHE_DIR", str(tmp_path / "cache"))
    folder = torch_headers.fetch(tb.release_of(torch.__version__), sys.executable, {tb.release_of(torch.__version__): here})
    build = tmp_path / "build"
    env = dict(os.environ, PATH=f"{os.environ['PATH']}:{Path(nvcc).parent}")
    done = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                           "-DGPUKEEPER_BUILD_PYTHON=OFF", f"-DGPUKEEPER_TORCH_HEADERS={folder}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    done = subprocess.run(["cmake", "--build", str(build), "--target", "gpukeeper_torch_components", "-j2"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "warning" not in done.stdout + done.stderr  # -Wall -Wextra, cleanly
    release = tb.release_of(torch.__version__)
    lib = build / "torch_components" / tb.file_name(release)
    dyn = tb.elf_dynamic(str(lib))
    assert list(tb.TORCH_LIBRARIES) == [n for n in dyn["needed"] if n in tb.TORCH_LIBRARIES]
    assert not [n for n in dyn["needed"] if "/" in n]
    assert dyn["rpath"] + dyn["runpath"] == ["$ORIGIN/../../torch/lib"]
    readelf = shutil.which("readelf")
    if readelf:
        shown = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True).stdout
        for name in tb.TORCH_LIBRARIES:
            assert f"Shared library: [{name}]" in shown
        assert str(tmp_path) not in shown
    version = torch.__version__.split("+")[0].encode()
    assert b"\0" + version + b"\0" in lib.read_bytes()  # gpukeeper_torch_built_for's answer


def test_a_first_use_build_goes_to_the_cache_once(tmp_path, places, capfd):
    """build(): a PyTorch release the package carries no build for is compiled once into the
    user cache (with one line before and one after), then reused. A CUDA PyTorch is faked
    by the installed one's headers and stand-ins for its CUDA libraries."""
    torch = pytest.importorskip("torch")
    include = Path(torch.__file__).parent / "include"
    if not (include / "c10" / "cuda" / "CUDACachingAllocator.h").exists() or not _compiler() \
            or not _cuda_include() or tc._sources() is None:
        pytest.skip("needs PyTorch's C++ headers, a C++ compiler, CUDA's runtime headers and the sources")
    fake = tmp_path / "site" / "torch"
    (fake / "lib").mkdir(parents=True)
    shutil.copytree(include, fake / "include", symlinks=True)
    macros = fake / "include" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    if not macros.exists():
        macros.write_text(torch_headers.CUDA_MACROS)
    for name in tb.TORCH_LIBRARIES:
        _stand_in(fake / "lib", name)
    version = torch.__version__.split("+")[0] + "+cu130"
    faked = fake_torch(version, file=str(fake / "__init__.py"))
    path = tc.build(faked)
    assert path == os.path.join(tc.cache_dir(version), tb.file_name(version))
    err = capfd.readouterr().err
    assert "building the PyTorch allocator component" in err and "built " in err
    dyn = tb.elf_dynamic(path)
    assert set(tb.TORCH_LIBRARIES) <= set(dyn["needed"])
    assert dyn["rpath"] + dyn["runpath"] == [str(fake / "lib")]
    assert tc.library_path(faked) == path
    assert tc.build(faked) == path  # reused, nothing printed
    assert capfd.readouterr().err == ""
