"""The PyTorch allocator component: gpukeeper's pools as PyTorch's ``CUDAAllocator``.

PyTorch's pluggable-allocator interface carries two functions (allocate, free); what
else PyTorch asks of its allocator from C++ fails under it: cuDNN's ``cacheInfo`` (with
``torch.backends.cudnn.benchmark``), CUDA graph trees' pool checks and checkpoints
(``torch.compile(mode="reduce-overhead")``), CUDA IPC (CUDA tensors through
``torch.multiprocessing``), memory history (``torch.cuda.memory._record_memory_history``)
and the out-of-memory observer. The component (``libgpukeeper_torch.so``, from
``csrc/torch_ext``) answers all of them from the same pools. It is built against the
PyTorch installed when gpukeeper is built, and loads only under that PyTorch release:
``status()`` says why it is not in use otherwise, and ``use_torch_allocator()`` then
falls back to the pluggable interface.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Any, Optional

import gpukeeper._core as _core
from gpukeeper.base.errors import GpuError

__all__ = ["library_path", "built_for", "status", "install"]

_LIBRARY = "libgpukeeper_torch.so"


def library_path() -> Optional[str]:
    """Where the component is (beside gpukeeper's module), or None when it was not built."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = sorted(glob.glob(os.path.join(here, _LIBRARY)))
    return found[0] if found else None


def _release(version: str) -> str:
    """'2.11.0' of '2.11.0+cu130': the part that names PyTorch's C++ interface."""
    return version.split("+", 1)[0]


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
    """The PyTorch release the component was built against, or None without one."""
    path = library_path()
    if path is None:
        return None
    import torch  # noqa: F401  (its libraries must be loaded first)

    return _load(path).gpukeeper_torch_built_for().decode()


def status(torch: Any) -> str:
    """'' when the component can serve this PyTorch, else why not (one sentence)."""
    path = library_path()
    if path is None:
        return (
            "gpukeeper was built without its PyTorch allocator component (no CUDA build "
            "of PyTorch was importable when it was built); reinstall gpukeeper with "
            "`pip install --no-build-isolation .` beside a CUDA build of PyTorch"
        )
    try:
        made_for = _load(path).gpukeeper_torch_built_for().decode()
    except OSError as exc:
        return f"the PyTorch allocator component at {path} does not load: {exc}"
    if _release(made_for) != _release(torch.__version__):
        return (
            f"the PyTorch allocator component was built for torch {made_for}, and "
            f"torch {torch.__version__} is installed; reinstall gpukeeper to rebuild it"
        )
    return ""


def install(torch: Any) -> None:
    """Makes the component PyTorch's CUDA allocator. Raises ``GpuError`` with the reason
    when it cannot (see ``status``), or when PyTorch already allocated CUDA memory."""
    why = status(torch)
    if why:
        raise GpuError(f"use_torch_allocator(): {why}")
    path = library_path()
    assert path is not None
    lib = _load(path)
    error = ctypes.create_string_buffer(2048)
    api = _core._torch_pool_api()
    version = _core._torch_pool_api_version
    rc = lib.gpukeeper_torch_install(api, version, error, len(error))
    if rc != 0:
        raise GpuError(f"use_torch_allocator(): {error.value.decode(errors='replace')}")
