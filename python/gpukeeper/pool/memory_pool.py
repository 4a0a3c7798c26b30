"""The caching memory pool: ``MemoryPool``, ``ManagedBuffer``, ``BufferBatch``.

>>> pool = MemoryPool()                      # device memory, or host memory without CUDA
>>> with pool.get_managed_buffer(0, 1024, Precision.Fp32) as buf:
...     tensor = torch.from_dlpack(buf)      # zero copy
>>> pool.memory_usage(0)                     # (allocated, peak) bytes
(0, 4096)

One pool per device, made on first use. Blocks freed on a stream are reused on that
stream at once; whole free segments go back to the driver on ``emergency_cleanup``.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterator, List, Set, Tuple, Union

import gpukeeper._core as _core
from gpukeeper import frameworks
from gpukeeper._core import ManagedBuffer, PoolStats, Precision
from gpukeeper.base.device_names import check_index
from gpukeeper.base.errors import InvalidInputError

__all__ = ["MemoryPool", "ManagedBuffer", "BufferBatch", "Precision", "PoolStats"]

# Methods inherited from the C++ base (documented there, typed in _core.pyi):
# get_managed_buffer, memory_pressure, emergency_cleanup, emergency_cleanup_all,
# capture_pools, trim, set_max_pool_size, max_pool_size, memory_usage, total_memory_usage,
# stats, reset_peaks, validate, owns, add_watermark, remove_watermark,
# add_reclaim_callback, remove_reclaim_callback, devices.


class MemoryPool(_core._MemoryPoolBase):
    """One caching pool per device for one kind of memory.

    ``kind`` is ``"auto"`` (device memory when CUDA is usable, else host memory),
    ``"device"`` (cudaMalloc), ``"async"`` (cudaMallocAsync), ``"pinned"``
    (cudaMallocHost) or ``"host"``. Host memory has a single device id, 0.

    ``expandable`` chooses where blocks live. ``expandable=True`` (device and host kinds)
    reserves one large address range per size class and maps physical pages only under
    allocated blocks, moving free pages to where they are needed before making new ones:
    reserved memory then follows allocated memory closely on workloads whose sizes change
    every step, at the cost of page remapping on cache misses. ``expandable="hybrid"`` does
    this for requests over 1 MiB only and keeps small ones in fixed segments, which moves
    far fewer pages for about the same footprint. ``False`` keeps every request in fixed
    segments. The words are the C++ layouts' (``"fixed"`` and ``"expandable"`` name
    ``False`` and ``True`` too); ``"large"``, the former word for ``"hybrid"``, warns and
    goes in the next release. The default, ``"auto"``, is ``"hybrid"`` for device memory
    on a device and driver with virtual memory management (every recorded trace then
    holds at most 1.05 times the memory it asked for at once, against 1.15-3.40 with fixed
    segments) and ``False`` otherwise (docs/performance.md).
    """

    def __init__(self, kind: str = "auto", expandable: Union[bool, str] = "auto") -> None:
        if not isinstance(kind, str):
            raise InvalidInputError(
                "kind must be 'auto', 'device', 'async', 'pinned' or 'host', got "
                f"{type(kind).__name__} {kind!r}"
            )
        super().__init__(kind, expandable)
        # Pointers handed out by get_buffer and not yet returned: return_buffer takes back
        # only these, never a block a ManagedBuffer owns (a stale pointer can alias one).
        self._raw_buffers: Set[Tuple[int, int]] = set()
        frameworks.register_pool(self)

    def get_buffer(
        self, device_id: int, size: int, precision: Any = Precision.Fp32, stream: Any = None
    ) -> int:
        """Legacy raw API: a pointer to ``size`` elements. Prefer ``get_managed_buffer``.

        The pointer must go back through ``return_buffer`` with the same size and
        precision; returning it twice, or a pointer the pool does not own, raises
        ``InvalidInputError`` and leaves the pool unchanged.
        """
        warnings.warn(
            "get_buffer/return_buffer are discouraged: use get_managed_buffer, which "
            "returns its memory by itself",
            DeprecationWarning,
            stacklevel=2,
        )
        ptr = int(self._get_buffer(device_id, size, precision, stream))
        self._raw_buffers.add((check_index(device_id, "device_id"), ptr))
        return ptr

    def return_buffer(
        self, device_id: int, buffer: int, size: int, precision: Any = Precision.Fp32
    ) -> None:
        """Returns a pointer from ``get_buffer``; size and precision must match.

        A pointer that ``get_buffer`` did not hand out, or that was returned already,
        raises ``InvalidInputError`` and changes nothing.
        """
        key = (check_index(device_id, "device_id"), buffer if isinstance(buffer, int) else -1)
        if key not in self._raw_buffers:
            raise InvalidInputError(
                f"pointer {buffer!r} on device {device_id} was not handed out by get_buffer, "
                "or was returned already; nothing was freed"
            )
        self._return_buffer(device_id, buffer, size, precision)
        self._raw_buffers.discard(key)

    def create_buffer_batch(self, device_id: int, stream: Any = None) -> "BufferBatch":
        """A ``BufferBatch`` whose buffers come from this pool on ``device_id``."""
        return BufferBatch(self, device_id, stream)

    def __repr__(self) -> str:
        extra = f", expandable={self.expandable!r}" if self.expandable != "auto" else ""
        return f"MemoryPool(kind={self.kind!r}{extra}, devices={self.devices()})"


class BufferBatch:
    """Many buffers with one lifetime: all go back to the pool together.

    >>> with pool.create_buffer_batch(0) as batch:
    ...     batch.add_buffer(bytes(256), 64, Precision.Fp32)   # host data copied in
    ...     batch.add_buffer(128, Precision.Fp16)              # 128 uninitialised fp16
    """

    def __init__(self, pool: MemoryPool, device_id: int, stream: Any = None) -> None:
        device_id = check_index(device_id, "device_id")
        if device_id >= pool.device_count:
            raise InvalidInputError(
                f"device {device_id!r} does not exist for {pool.kind} memory "
                f"(valid ids: 0..{pool.device_count - 1})"
            )
        self._pool = pool
        self._device = device_id
        self._stream = stream
        self._buffers: List[ManagedBuffer] = []

    def add_buffer(self, data: Any, count: Any = None, precision: Any = None) -> ManagedBuffer:
        """Adds one buffer and returns it.

        ``data`` is either an element count, or host data (anything with the buffer
        protocol: bytes, bytearray, numpy array) that is copied into the new buffer. The
        element count may follow (it must then match the data's size), and the precision
        last; ``add_buffer(64, Precision.Fp32)`` and ``add_buffer(data, 64,
        Precision.Fp32)`` both work. On failure the batch is unchanged.
        """
        if isinstance(count, Precision) or (isinstance(count, str) and precision is None):
            count, precision = None, count
        prec = Precision.parse(precision)
        if isinstance(data, int) and not isinstance(data, bool):
            if count is not None and count != data:
                raise InvalidInputError(f"add_buffer: count given twice ({data} and {count})")
            return self._append(
                self._pool.get_managed_buffer(self._device, data, prec, self._stream)
            )
        try:
            view = memoryview(data)
        except TypeError:
            raise InvalidInputError(
                "add_buffer: data must be an element count or host data with the buffer "
                f"protocol, got {type(data).__name__}"
            ) from None
        if not view.c_contiguous:
            raise InvalidInputError("add_buffer: data must be C-contiguous (copy it first)")
        nbytes = view.nbytes
        if count is None:
            if nbytes % prec.itemsize:
                raise InvalidInputError(
                    f"add_buffer: {nbytes} bytes are not a whole number of {prec.label} elements"
                )
            count = nbytes // prec.itemsize
        elif count * prec.itemsize != nbytes:
            raise InvalidInputError(
                f"add_buffer: {count} {prec.label} elements need {count * prec.itemsize} "
                f"bytes, the data has {nbytes}"
            )
        buf = self._pool.get_managed_buffer(self._device, count, prec, self._stream)
        try:
            if nbytes:
                buf.copy_from_host(view.cast("B") if view.ndim != 1 or view.format != "B" else view)
        except BaseException:
            buf.release()
            raise
        return self._append(buf)

    def _append(self, buf: ManagedBuffer) -> ManagedBuffer:
        self._buffers.append(buf)
        return buf

    def release(self) -> None:
        """Returns every buffer to the pool, newest first."""
        while self._buffers:
            self._buffers.pop().release()

    @property
    def total_bytes(self) -> int:
        """Bytes held by the batch's buffers."""
        return sum(b.nbytes for b in self._buffers)

    @property
    def device(self) -> int:
        return self._device

    def __len__(self) -> int:
        return len(self._buffers)

    def __getitem__(self, index: int) -> ManagedBuffer:
        return self._buffers[index]

    def __iter__(self) -> Iterator[ManagedBuffer]:
        return iter(list(self._buffers))

    def __enter__(self) -> "BufferBatch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"BufferBatch(device={self._device}, buffers={len(self)}, bytes={self.total_bytes})"
