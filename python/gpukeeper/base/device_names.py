"""One device vocabulary: every spelling of a device is resolved here, once, the same way.

Every public entry point that takes a device accepts the same spellings:

- ``None`` (or ``"auto"``): the current CUDA device when CUDA is usable, else the CPU.
  This is the only spelling that falls back to the host silently; the fallback's reason
  travels in :attr:`DeviceSpec.reason`.
- ``"cpu"``, a ``torch.device("cpu")``: the host.
- an ``int``, ``"cuda"``, ``"cuda:N"``, a ``torch.device("cuda", N)``, a CuPy ``Device``:
  that CUDA device. Where CUDA is unusable, or device N does not exist, this is an
  :class:`~gpukeeper.base.errors.InvalidInputError`: measuring or cleaning the host instead
  would give answers that look right and are not.

Anything else (a bool, a negative index, ``"gpu"``, ``"cuda:x"``, a ``torch.device``
of another type) is an ``InvalidInputError`` too.

The CUDA state comes from gpukeeper's own core (``_core.cuda_status``), which asks the
runtime without creating a context. Tests fake a machine by patching
:func:`cuda_status` and :func:`current_cuda_index` in this module: every resolution
goes through them.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import gpukeeper._core as _core
from gpukeeper.base.errors import InvalidInputError

__all__ = [
    "AUTO",
    "CPU",
    "CUDA",
    "DeviceSpec",
    "check_index",
    "cuda_status",
    "current_cuda_index",
    "parse_device",
    "resolve_device",
]

AUTO = "auto"
CPU = "cpu"
CUDA = "cuda"


@dataclass(frozen=True)
class DeviceSpec:
    """A resolved device: ``kind`` is ``"cpu"`` or ``"cuda"``; ``index`` the CUDA ordinal
    (None on the CPU); ``reason`` says why the CPU was chosen when it was."""

    kind: str
    index: Optional[int] = None
    reason: str = ""

    @property
    def is_cuda(self) -> bool:
        """Whether this is a CUDA device."""
        return self.kind == CUDA

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def check_index(value: Any, what: str = "device") -> int:
    """``value`` as a non-negative int ordinal; ``InvalidInputError`` for bools,
    non-integers and negatives."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidInputError(f"{what} must be an int, got {type(value).__name__}")
    if value < 0:
        raise InvalidInputError(f"{what} must not be negative, got {value}")
    return int(value)


def parse_device(device: Any, what: str = "device") -> Tuple[str, Optional[int]]:
    """The spelling alone, without asking the machine: ``("auto", None)``,
    ``("cpu", None)``, ``("cuda", None)`` (the current CUDA device) or ``("cuda", N)``."""
    if device is None:
        return AUTO, None
    if isinstance(device, bool):
        raise InvalidInputError(f"{what} must be a device, a name or an index, got {device!r}")
    if isinstance(device, numbers.Integral):
        return CUDA, check_index(device, what)
    if isinstance(device, str):
        return _parse_name(device, what)
    kind = getattr(device, "type", None)
    if isinstance(kind, str):  # torch.device and alikes
        if kind not in (CPU, CUDA):
            raise InvalidInputError(f"{what} must be a CUDA device or the CPU, got {device!r}")
        index = getattr(device, "index", None)
        return (
            (CPU, None)
            if kind == CPU
            else (CUDA, None if index is None else check_index(index, what))
        )
    ident = getattr(device, "id", None)
    if isinstance(ident, numbers.Integral) and not isinstance(ident, bool):  # cupy.cuda.Device
        return CUDA, check_index(ident, what)
    raise InvalidInputError(
        f"{what} must be a device, a name or an index, got {type(device).__name__}"
    )


def _parse_name(text: str, what: str) -> Tuple[str, Optional[int]]:
    name, colon, rest = text.strip().lower().partition(":")
    if name in (AUTO, CPU) and not colon:
        return name, None
    if name == CUDA and not colon:
        return CUDA, None
    if name == CUDA and rest.isdigit():
        return CUDA, int(rest)
    raise InvalidInputError(
        f"unknown {what} {text!r}: use None, 'auto', 'cpu', 'cuda', 'cuda:N' or an index"
    )


def cuda_status() -> Tuple[int, str]:
    """(visible CUDA devices, why none when 0), asked of the runtime without creating a
    context."""
    status = _core.cuda_status()
    if not status["available"]:
        return 0, str(status.get("reason") or "CUDA unavailable")
    return int(status["device_count"]), ""


def _no_current_index() -> Optional[int]:
    """The source before a framework layer sets one: no framework is asked."""
    return None


# Which device a loaded framework calls current is the framework layer's to say, and it
# sits above this module: gpukeeper.frameworks sets this source when it is imported (and
# importing gpukeeper imports it). Until then no framework is asked.
_current_index_source: Callable[[], Optional[int]] = _no_current_index


def set_current_index_source(source: Callable[[], Optional[int]]) -> None:
    """Sets what :func:`current_cuda_index` asks first (the framework layer does)."""
    global _current_index_source
    _current_index_source = source


def current_cuda_index() -> int:
    """The device a framework in use calls current (PyTorch's once it has initialised
    CUDA, else CuPy's, as gpukeeper.frameworks answers), else 0. Never imports a framework
    or initialises CUDA."""
    try:
        index = _current_index_source()
    except Exception:
        index = None
    return 0 if index is None else int(index)


def resolve_device(
    device: Any = None, what: str = "device", *, auto_cuda: bool = True
) -> DeviceSpec:
    """Resolves any spelling (see the module's text) to a :class:`DeviceSpec`.

    ``InvalidInputError`` for a malformed device, for a CUDA device where CUDA is
    unusable, and for an ordinal beyond the visible devices. ``what`` names the argument
    in the message. ``auto_cuda=False`` makes "auto" mean the CPU: timing does that when
    no loaded framework uses CUDA, since GPU events around host work would read zero.
    """
    kind, index = parse_device(device, what)
    if kind == CPU:
        return DeviceSpec(CPU, reason="the CPU was asked for")
    count, why = cuda_status()
    if kind == AUTO and not auto_cuda:
        # The first cause a reader can act on: no CUDA at all, before no framework using it.
        return DeviceSpec(
            CPU,
            reason=f"CUDA unavailable: {why}" if count == 0 else "no loaded framework uses CUDA",
        )
    if kind == AUTO:
        if count == 0:
            return DeviceSpec(CPU, reason=f"CUDA unavailable: {why}")
        return DeviceSpec(CUDA, min(current_cuda_index(), count - 1))
    if count == 0:
        raise InvalidInputError(
            f"{what} {device!r} asks for CUDA, but CUDA is unusable here ({why}); "
            "pass 'cpu', or None for the current device or the CPU"
        )
    if index is None:
        index = current_cuda_index()
    if index >= count:
        asked = f"{device!r} (CUDA device {index})" if isinstance(device, str) else f"{index}"
        raise InvalidInputError(f"{what} {asked} does not exist ({count} CUDA device(s) visible)")
    return DeviceSpec(CUDA, index)
