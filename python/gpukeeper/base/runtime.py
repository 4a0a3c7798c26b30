"""What was built and what the machine offers: ``build_info()`` and ``cuda_available()``."""

from __future__ import annotations

from typing import Any, Dict

import gpukeeper._core as _core

__all__ = ["__version__", "build_info", "cuda_available", "CudaAvailability"]

# The version lives with the build facts so that build_info() need not import the package
# face above it; pyproject.toml's version must match.
__version__ = "0.1.0"


class CudaAvailability:
    """Truthy when CUDA is usable; otherwise ``reason`` says why not.

    >>> if not gpukeeper.cuda_available():
    ...     print(gpukeeper.cuda_available().reason)
    """

    __slots__ = ("available", "device_count", "driver_version", "runtime_version", "reason")

    def __init__(self, status: Dict[str, Any]) -> None:
        self.available: bool = bool(status["available"])
        self.device_count: int = int(status["device_count"])
        self.driver_version: int = int(status["driver_version"])
        self.runtime_version: int = int(status["runtime_version"])
        self.reason: str = str(status["reason"])

    def __bool__(self) -> bool:
        return self.available

    def __repr__(self) -> str:
        if self.available:
            return f"CudaAvailability(True, devices={self.device_count})"
        return f"CudaAvailability(False, reason={self.reason!r})"


def build_info() -> Dict[str, Any]:
    """How the installed core was built.

    Keys: ``cuda`` (bool: built against the CUDA runtime), ``cuda_version`` (e.g.
    ``"13.0"``, None without CUDA), ``static_cudart`` (no libcudart needed at run time),
    ``compiler``, ``cxx_standard``, ``build_type``, ``pybind11_version`` and
    ``version`` (the package's).
    """
    info = _core.build_info()
    info["version"] = __version__
    return info


def cuda_available() -> CudaAvailability:
    """Whether CUDA is usable now; falsy with a ``reason`` when it is not.

    Never raises: a CPU-only build, a missing driver or no device all give a reason.
    """
    return CudaAvailability(_core.cuda_status())
