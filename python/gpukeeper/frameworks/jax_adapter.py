"""The JAX adapter: its GPU devices' allocator statistics, its caches, its barrier, and
the helpers that find JAX arrays in a result and wait for them."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Iterator, List, Optional

from gpukeeper.frameworks.adapter import FrameworkAdapter, FrameworkMemory, InUseReader

__all__ = [
    "JaxAdapter",
    "holds_jax_arrays",
    "jax_block_until_ready",
    "jax_device_index",
    "jax_gpu_devices",
    "jax_memory_stats",
    "jax_release_hint",
]


def jax_gpu_devices() -> List[Any]:
    """JAX's GPU devices when JAX is loaded (never imported here), else []."""
    jax = sys.modules.get("jax")
    if jax is None:
        return []
    try:
        return [d for d in jax.devices() if d.platform == "gpu"]
    except Exception:
        return []


def _jax_arrays(value: Any) -> Iterator[Any]:
    """The JAX arrays among the leaves of ``value`` (any pytree), none without JAX."""
    jax = sys.modules.get("jax")
    if jax is None:
        return
    array_type = getattr(jax, "Array", None)
    if array_type is None:
        return
    try:
        leaves = jax.tree_util.tree_leaves(value)
    except Exception:
        leaves = [value]
    for leaf in leaves:
        if isinstance(leaf, array_type):
            yield leaf


def holds_jax_arrays(value: Any) -> bool:
    """True when ``value`` (any pytree: an array, a tuple, a dict ...) holds a JAX array
    on a GPU: the work that made it ran in JAX, on JAX's own streams."""
    for leaf in _jax_arrays(value):
        try:
            if all(d.platform == "gpu" for d in leaf.devices()):
                return True
        except Exception:
            return True  # an array whose devices cannot be read: JAX work all the same
    return False


def jax_device_index(value: Any) -> Optional[int]:
    """The id of the GPU device holding the first JAX array in ``value`` (JAX numbers a
    process's GPUs as CUDA does), or None."""
    for leaf in _jax_arrays(value):
        try:
            for d in leaf.devices():
                if d.platform == "gpu":
                    return int(d.id)
        except Exception:
            continue
    return None


def jax_block_until_ready(value: Any) -> Any:
    """``jax.block_until_ready(value)``: waits for the JAX work that produces ``value``
    (every array leaf of it). No-op without JAX."""
    jax = sys.modules.get("jax")
    if jax is None:
        return value
    return jax.block_until_ready(value)


def jax_memory_stats(device: int = 0) -> Optional[Dict[str, int]]:
    """JAX's allocator statistics of its GPU device ``device`` (``bytes_in_use``,
    ``peak_bytes_in_use``, ``pool_bytes`` ...), or None when unavailable."""
    devices = jax_gpu_devices()
    if device >= len(devices):
        return None
    try:
        stats = devices[device].memory_stats()
    except Exception:
        return None
    return dict(stats) if stats else None


def jax_release_hint() -> str:
    """How to make JAX give its device memory back, given this process's settings.

    XLA's default allocator preallocates 75% of the device (``XLA_PYTHON_CLIENT_PREALLOCATE``)
    and, preallocated or grown on demand, never returns a byte to the driver; only the
    ``platform`` allocator frees memory when arrays are freed (slower: no cache).
    The variables are read when JAX's GPU backend starts, so they must be set before.
    """
    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").strip().lower()
    if allocator == "platform":
        return (
            "XLA_PYTHON_CLIENT_ALLOCATOR=platform is set: JAX frees memory when arrays "
            "are freed; what is still reserved is held by live arrays"
        )
    preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").strip().lower()
    if preallocate in ("false", "0"):
        return (
            "JAX's allocator never returns memory to the driver: set "
            "XLA_PYTHON_CLIENT_ALLOCATOR=platform before JAX starts to make it returnable"
        )
    return (
        "JAX preallocates 75% of the device and never returns it: set "
        "XLA_PYTHON_CLIENT_PREALLOCATE=false (allocate on demand) or "
        "XLA_PYTHON_CLIENT_ALLOCATOR=platform (return memory when arrays are freed) "
        "before JAX starts"
    )


class JaxAdapter(FrameworkAdapter):
    """XLA's allocator on JAX's GPU devices. Its buffer pool has no public release:
    ``release`` clears compiled executables and ``release_hint`` says what to set."""

    name = "jax"
    display_name = "JAX"
    modules = ()  # its frames are not skipped in allocation sites: it records none
    distributions = ("jax", "jaxlib")
    waits_on_result = True
    result_wait = "jax.block_until_ready"

    def in_use(self) -> bool:
        return bool(jax_gpu_devices())

    def gpu_device_ids(self) -> List[int]:
        return [int(getattr(d, "id", 0)) for d in jax_gpu_devices()]

    def holds_arrays(self, value: Any) -> bool:
        return holds_jax_arrays(value)

    def result_device(self, value: Any) -> Optional[int]:
        return jax_device_index(value)

    def block_until_ready(self, value: Any) -> Any:
        return jax_block_until_ready(value)

    def in_use_reader(self, device: int) -> Optional[InUseReader]:
        # JAX's peak cannot be reset: a run's peak is the process's so far
        stats = jax_memory_stats(device)
        if stats is None or "bytes_in_use" not in stats:
            return None

        def read() -> int:
            return int((jax_memory_stats(device) or {}).get("bytes_in_use", 0))

        def peak() -> Optional[int]:
            value = (jax_memory_stats(device) or {}).get("peak_bytes_in_use")
            return None if value is None else int(value)

        return read, peak

    def memory(self, device: int) -> Optional[FrameworkMemory]:
        devices = jax_gpu_devices()
        if device >= len(devices):
            return None
        try:
            stats = devices[device].memory_stats() or {}
        except Exception:
            stats = {}
        allocated = stats.get("bytes_in_use")
        reserved = stats.get("pool_bytes", stats.get("bytes_reserved", allocated))
        return FrameworkMemory("jax", allocated, reserved)

    def release(self, devices: Optional[List[int]]) -> int:
        jax = sys.modules.get("jax")
        if jax is None or not jax_gpu_devices():
            return 0
        try:
            jax.clear_caches()  # compiled executables; JAX's buffer pool has no public release
        except Exception:
            pass
        return 0

    def synchronize(self, devices: Optional[List[int]]) -> None:
        jax = sys.modules.get("jax")
        if jax is None or not jax_gpu_devices():
            return
        try:
            jax.effects_barrier()
        except Exception:
            pass

    def release_hint(self) -> Optional[str]:
        return jax_release_hint()
