"""The PyTorch allocator component: gpukeeper's pools as PyTorch's ``CUDAAllocator``.

PyTorch's pluggable-allocator interface carries two functions (allocate, free); what
else PyTorch asks of its allocator from C++ fails under it: cuDNN's ``cacheInfo`` (with
``torch.backends.cudnn.benchmark``), CUDA graph trees' pool checks and checkpoints
(``torch.compile(mode="reduce-overhead")``), CUDA IPC (CUDA tensors through
``torch.multiprocessing``), memory history (``torch.cuda.memory._record_memory_history``)
and the out-of-memory observer. The component (from ``csrc/torch_ext``) answers all of
them from the same pools.

PyTorch's allocator interface is not part of its stable ABI, so there is one build per
PyTorch release (major.minor): ``gpukeeper/torch_components/libgpukeeper_torch_2_11.so``
serves every 2.11.x. The wheel carries one for each release in ``supported_releases()``.
For another release, ``build(torch)`` compiles one at first use into a per-user cache,
where a C++ compiler and the CUDA runtime's headers are present. A build is chosen by its
file name and is never loaded under another release; after loading, the release it
reports (``gpukeeper_torch_built_for``) is checked as well. ``status()`` says why the
component cannot serve, and ``use_torch_allocator()`` then raises ``GpuError`` with that
reason (the pluggable interface is taken only when asked for).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from typing import Any, List, Optional, Tuple, Union

import gpukeeper._core as _core
from gpukeeper.base.errors import GpuError
from gpukeeper.integrations import torch_builds

__all__ = [
    "library_path",
    "built_for",
    "status",
    "install",
    "build",
    "supported_releases",
    "cache_dir",
    "BUILD_COMMAND",
]

#: The command that builds the component for the installed PyTorch (``build``).
BUILD_COMMAND = "python -m gpukeeper.integrations.build_torch_component"

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGED = os.path.join(_PACKAGE, "torch_components")
_SOURCES = os.path.join(_PACKAGED, "src")


def supported_releases() -> Tuple[str, ...]:
    """The PyTorch releases (major.minor) the wheel carries a component for."""
    return torch_builds.SUPPORTED


def _gpukeeper_version() -> str:
    try:
        return metadata.version("gpukeeper")
    except metadata.PackageNotFoundError:
        from gpukeeper.base.runtime import __version__

        return __version__


def cache_dir(torch_version: str) -> str:
    """Where a component built on this machine for ``torch_version`` lives:
    ``${XDG_CACHE_HOME:-~/.cache}/gpukeeper/torch-components/<gpukeeper version>-table<N>/
    <torch version>`` (``GPUKEEPER_CACHE_DIR`` replaces ``${XDG_CACHE_HOME:-~/.cache}/gpukeeper``).
    Keyed by gpukeeper's version too, as the component and gpukeeper's module share a
    table of pool functions."""
    base = os.environ.get("GPUKEEPER_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "gpukeeper")
    # The table's version too: a build made by an earlier checkout of the same version
    # would be refused at install.
    made_for = f"{_gpukeeper_version()}-table{_core._torch_pool_api_version}"
    return os.path.join(base, "torch-components", made_for, torch_version)


def _torch_version(torch: Union[Any, str, None]) -> Optional[str]:
    """The version of `torch` (a module or a version string); without one, of the torch
    already imported, else of the installed distribution (read without importing it)."""
    if isinstance(torch, str):
        return torch
    if torch is None:
        torch = sys.modules.get("torch")
    if torch is not None:
        version = getattr(torch, "__version__", None)
        return str(version) if version is not None else None
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def library_path(torch: Union[Any, str, None] = None) -> Optional[str]:
    """The component build for ``torch`` (the module, or a version such as '2.11.0+cu130';
    by default the imported or installed PyTorch): the one whose release (major.minor)
    matches, carried by the package or built on this machine; None when there is none. A
    build made for another release is never returned."""
    version = _torch_version(torch)
    if version is None:
        return None
    try:
        name = torch_builds.file_name(version)
    except ValueError:
        return None
    for folder in (_PACKAGED, cache_dir(version)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def _load(path: str) -> Any:
    lib = ctypes.CDLL(path)
    lib.gpukeeper_torch_built_for.restype = ctypes.c_char_p
    lib.gpukeeper_torch_install.restype = ctypes.c_int
    lib.gpukeeper_torch_install.argtypes = [
        ctypes.c_size_t,
        ctypes.c_uint32,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    return lib


def built_for() -> Optional[str]:
    """The PyTorch version the component for the installed PyTorch was built against
    (its headers: '2.11.0'), or None without one."""
    import torch  # its libraries must be loaded first

    path = library_path(torch)
    if path is None:
        return None
    return str(_load(path).gpukeeper_torch_built_for().decode())


def _releases_text() -> str:
    releases = supported_releases()
    return f"{releases[0]} to {releases[-1]}" if len(releases) > 1 else releases[0]


def _cuda_mismatch(torch: Any) -> str:
    """Why this core cannot serve ``torch`` for their CUDA releases, or ''. The component
    calls the CUDA runtime PyTorch loaded, with the types of the release gpukeeper was
    built against: the two major releases must agree."""
    torch_cuda = getattr(getattr(torch, "version", None), "cuda", None)
    core_cuda = _core.build_info().get("cuda_version")
    if not torch_cuda or not core_cuda:
        return ""
    theirs, ours = str(torch_cuda).split(".")[0], str(core_cuda).split(".")[0]
    if theirs == ours:
        return ""
    return (
        f"this gpukeeper is built for CUDA {ours} and torch {torch.__version__} for CUDA "
        f"{theirs}: install the gpukeeper wheel for CUDA {theirs} "
        f"(pip install gpukeeper-cu{theirs})"
    )


def status(torch: Any) -> str:
    """'' when the component can serve this PyTorch, else why not (one sentence). For a
    release the package carries no build for, builds one first where this machine can
    (``build``)."""
    version = str(getattr(torch, "__version__", "unknown"))
    try:
        release = torch_builds.release_of(version)
    except ValueError:
        return f"torch {version} is not a PyTorch version the allocator component can be built for"
    mismatch = _cuda_mismatch(torch)
    if mismatch:
        return mismatch
    path = library_path(torch)
    if path is None:
        why = _why_not_buildable(torch)
        if why:
            return (
                f"gpukeeper carries its PyTorch allocator component for torch {_releases_text()} "
                f"and none for torch {version}, and cannot build one here ({why}); "
                f"`{BUILD_COMMAND}` builds it once that is fixed"
            )
        try:
            path = build(torch)
        except GpuError as exc:
            return str(exc)
    try:
        made_for = _load(path).gpukeeper_torch_built_for().decode()
    except OSError as exc:
        return f"the PyTorch allocator component at {path} does not load: {exc}"
    if torch_builds.release_of(made_for) != release:
        return (
            f"the PyTorch allocator component at {path} was built for torch {made_for}, and "
            f"torch {version} is installed; `{BUILD_COMMAND}` builds one for it"
        )
    return ""


def install(torch: Any) -> None:
    """Makes the component PyTorch's CUDA allocator. Raises ``GpuError`` with the reason
    when it cannot (see ``status``), or when PyTorch already allocated CUDA memory."""
    why = status(torch)
    if why:
        raise GpuError(f"use_torch_allocator(): {why}")
    path = library_path(torch)
    assert path is not None
    lib = _load(path)
    error = ctypes.create_string_buffer(2048)
    api = _core._torch_pool_api()
    version = _core._torch_pool_api_version
    rc = lib.gpukeeper_torch_install(api, version, error, len(error))
    if rc != 0:
        raise GpuError(f"use_torch_allocator(): {error.value.decode(errors='replace')}")


# ---------------------------------------------------------------- building on this machine


def _sources() -> Optional[str]:
    """The component's sources: installed with the package, or a source checkout's."""
    for root in (_SOURCES, os.path.join(os.path.dirname(os.path.dirname(_PACKAGE)), "csrc")):
        if os.path.isfile(os.path.join(root, "torch_ext", "allocator.cpp")):
            return root
    return None


def _compiler() -> Optional[str]:
    for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def _cuda_include() -> Optional[str]:
    """The CUDA runtime's headers: a system toolkit's, or those of NVIDIA's pip wheels
    that a CUDA build of PyTorch installs beside it (cmake/pip_cuda_toolkit.cmake)."""
    candidates: List[str] = []
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "include"))
    candidates.append("/usr/local/cuda/include")
    for entry in sys.path:
        candidates += [
            os.path.join(entry, "nvidia", "cu13", "include"),
            os.path.join(entry, "nvidia", "cuda_runtime", "include"),
        ]
    candidates.append("/usr/include")
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, "cuda_runtime_api.h")):
            return folder
    return None


def _torch_dir(torch: Any) -> Optional[str]:
    path = getattr(torch, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) if path else None


def _why_not_buildable(torch: Any) -> str:
    """'' when this machine can build the component for `torch`, else what it lacks."""
    if getattr(getattr(torch, "version", None), "cuda", "") is None:
        return f"torch {torch.__version__} is a CPU build"
    here = _torch_dir(torch)
    if here is None or not os.path.isfile(
        os.path.join(here, "include", "c10", "cuda", "CUDACachingAllocator.h")
    ):
        return "PyTorch's C++ headers are not installed"
    missing = [
        n for n in torch_builds.TORCH_LIBRARIES if not os.path.isfile(os.path.join(here, "lib", n))
    ]
    if missing:
        return f"PyTorch's {', '.join(missing)} is missing"
    if _sources() is None:
        return "this install of gpukeeper lacks the component's sources"
    if _compiler() is None:
        return "no C++ compiler (c++, g++ or clang++; or $CXX) is on PATH"
    if _cuda_include() is None:
        return (
            "the CUDA runtime's headers are missing (install CUDA's toolkit, or "
            "`pip install nvidia-cuda-runtime`)"
        )
    return ""


def _run(command: List[str]) -> "subprocess.Popen[str]":
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def build(torch: Any) -> str:
    """Builds the component for this PyTorch into ``cache_dir(torch.__version__)`` (once:
    later calls and processes reuse it) and returns its path; a build the package carries
    is returned as it is. Prints one line to stderr before building and one after. Raises
    ``GpuError`` with the reason when it cannot."""
    found = library_path(torch)
    if found is not None:
        return found
    version = str(torch.__version__)
    release = torch_builds.release_of(version)
    why = _why_not_buildable(torch)
    if why:
        raise GpuError(f"cannot build the PyTorch allocator component for torch {version}: {why}")
    here = _torch_dir(torch)
    sources, compiler, cuda = _sources(), _compiler(), _cuda_include()
    assert here is not None and sources is not None and compiler is not None and cuda is not None
    dest = cache_dir(version)
    os.makedirs(dest, exist_ok=True)
    name = torch_builds.file_name(release)
    print(
        f"gpukeeper: building the PyTorch allocator component for torch {version} into {dest} "
        "(once; under a minute)",
        file=sys.stderr,
        flush=True,
    )
    start = time.monotonic()
    include = os.path.join(here, "include")
    lib = os.path.join(here, "lib")
    flags = [
        f"-std=c++{torch_builds.cxx_standard(release)}",
        "-O2",
        "-DNDEBUG",
        "-fPIC",
        "-Wall",
        "-Wextra",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(getattr(torch._C, '_GLIBCXX_USE_CXX11_ABI', 1))}",
        f"-I{sources}",
        "-isystem",
        include,
        "-isystem",
        os.path.join(include, "torch", "csrc", "api", "include"),
        "-isystem",
        cuda,
    ]
    units = sorted(
        os.path.join(sources, "torch_ext", f)
        for f in os.listdir(os.path.join(sources, "torch_ext"))
        if f.endswith(".cpp")
    )
    with tempfile.TemporaryDirectory(prefix=".build.", dir=dest) as work:
        objects = [os.path.join(work, os.path.basename(u) + ".o") for u in units]
        jobs = [_run([compiler, *flags, "-c", u, "-o", o]) for u, o in zip(units, objects)]
        failures = []
        for unit, job in zip(units, jobs):
            out, _ = job.communicate()
            if job.returncode != 0:
                failures.append(f"{os.path.basename(unit)}: {out.strip()[-1500:]}")
        if not failures:
            target = os.path.join(work, name)
            libraries = [os.path.join(lib, n) for n in torch_builds.TORCH_LIBRARIES]
            link = _run(
                [compiler, "-shared", "-o", target, *objects, f"-Wl,-soname,{name}",
                 "-Wl,--no-as-needed", *libraries, f"-Wl,-rpath,{lib}",
                 # A static part of the C++ runtime stays private (cmake/torch_component.cmake).
                 "-Wl,--exclude-libs,ALL"]
            )  # fmt: skip
            out, _ = link.communicate()
            if link.returncode != 0:
                failures.append(f"linking: {out.strip()[-1500:]}")
            else:
                # Whole or not at all: a process that starts now finds the old state or
                # the finished file.
                os.replace(target, os.path.join(dest, name))
        if failures:
            raise GpuError(
                f"building the PyTorch allocator component for torch {version} failed: "
                + " | ".join(failures)
            )
    path = os.path.join(dest, name)
    print(
        f"gpukeeper: built {path} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True
    )
    return path
