"""What this process holds in host memory, read as cheaply as possible.

Three instruments, because each sees something the others do not:

- **resident set size** (:func:`process_rss_bytes`, :class:`RssReader`): the pages the
  process has in RAM, whoever allocated them (malloc, mmap, a library's own allocator).
  It is also what the C allocator keeps after ``free()`` and hands out again, so it moves
  by megabytes in a loop that allocates and frees big temporaries without leaking.
- **malloc in-use bytes** (:func:`malloc_in_use_bytes`): glibc's ``mallinfo2()``,
  ``uordblks + hblkhd`` (bytes in chunks handed out from the arenas plus those mapped
  one by one): what is allocated *now*, not what the allocator keeps. It misses memory
  taken with ``mmap`` directly. ``None`` off glibc, or before glibc 2.33.
- **tracemalloc traced bytes** (:func:`tracemalloc_bytes`): Python's own allocations and
  the buffers that extensions report to it (numpy does), when ``tracemalloc`` is
  tracing. Never started here: tracing slows every Python allocation.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
import tracemalloc
from typing import Any, Callable, Optional

__all__ = [
    "current_rss_bytes",
    "process_rss_bytes",
    "peak_rss_bytes",
    "RssReader",
    "malloc_in_use_bytes",
    "malloc_in_use_reader",
    "tracemalloc_bytes",
]


def current_rss_bytes() -> Optional[int]:
    """Resident set size of this process in bytes (``/proc/self/statm``), None where
    there is no procfs."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def process_rss_bytes() -> int:
    """Resident set size of this process in bytes (``/proc/self/statm``; ``ru_maxrss`` as
    a last resort on systems without procfs, which is the peak rather than the current)."""
    rss = current_rss_bytes()
    return rss if rss is not None else _ru_maxrss()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process in bytes (``VmHWM``, else ``ru_maxrss``)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _ru_maxrss()


def _ru_maxrss() -> int:
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


class RssReader:
    """Process RSS through one open ``/proc/self/statm`` descriptor (pread: ~1 us a read,
    against ~10 us for open/read/close). Call it; ``close()`` when done."""

    source = "process_rss"

    def __init__(self) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self._fd: Optional[int] = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> int:
        if self._fd is None:
            return process_rss_bytes()
        return int(os.pread(self._fd, 128, 0).split()[1]) * self._page

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RssReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------- malloc


class _MallInfo2(ctypes.Structure):
    # struct mallinfo2 (glibc >= 2.33): every field a size_t.
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_mallinfo2: Any = None  # the bound function once looked up; False where there is none
_mallinfo2_lock = threading.Lock()


def _load_mallinfo2() -> Any:
    global _mallinfo2
    if _mallinfo2 is not None:
        return _mallinfo2
    with _mallinfo2_lock:
        if _mallinfo2 is None:
            fn: Any = False
            if sys.platform.startswith("linux"):
                try:
                    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                    fn = libc.mallinfo2  # AttributeError before glibc 2.33, or on musl
                    fn.argtypes = []
                    fn.restype = _MallInfo2
                except (OSError, AttributeError):
                    fn = False
            _mallinfo2 = fn
    return _mallinfo2


def malloc_in_use_reader() -> Optional[Callable[[], int]]:
    """A function returning glibc's in-use bytes (``uordblks + hblkhd`` of
    ``mallinfo2()``), or None where ``mallinfo2`` does not exist. mallinfo2 walks the
    arenas' free lists: about a microsecond in a tidy heap, more in a fragmented one."""
    fn = _load_mallinfo2()
    if not fn:
        return None

    def read() -> int:
        info = fn()
        return int(info.uordblks) + int(info.hblkhd)

    return read


def malloc_in_use_bytes() -> Optional[int]:
    """Bytes the C allocator has handed out and not had back (glibc ``mallinfo2()``:
    ``uordblks + hblkhd``); None where that cannot be read."""
    reader = malloc_in_use_reader()
    return None if reader is None else reader()


# --------------------------------------------------------------------- tracemalloc


def tracemalloc_bytes() -> Optional[int]:
    """Bytes traced by ``tracemalloc`` now, or None when it is not tracing (it is never
    started here: tracing slows every allocation by a factor of several)."""
    if not tracemalloc.is_tracing():
        return None
    return int(tracemalloc.get_traced_memory()[0])
