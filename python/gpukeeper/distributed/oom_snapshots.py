"""OOM forensics, opt-in: on an out-of-memory error a rank writes what held its memory to
its own file, so that a job that died on one rank of many can be read afterwards.

>>> enable_oom_snapshots("oom-snapshots")     # every rank, early
... # an OOM on rank 5 writes oom-snapshots/oom-rank5-pid4242-1.json
... # (and oom-rank5-pid4242-1.torch.pickle, for PyTorch's memory_viz)

A snapshot holds the rank, host, pid and time; the error; :func:`gpukeeper.memory_report`
over every device the rank sees; the largest live tensors and arrays; and, where PyTorch
has CUDA in use, ``torch.cuda.memory._snapshot()`` in PyTorch's own format (gpukeeper's
pool answers it when ``use_torch_allocator()`` routes PyTorch to it).

Snapshots are taken for an OOM error that nobody catches (``sys.excepthook`` and
``threading.excepthook``), and, for PyTorch's own caching allocator, at the moment it
runs out (its out-of-memory observer), caught or not. Code that catches an OOM itself
calls :func:`write_oom_snapshot`.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from gpukeeper import frameworks
from gpukeeper.account.account_reader import memory_report
from gpukeeper.base.arg_checks import check_int
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.frameworks import ranks
from gpukeeper.pool.oom_retry import is_oom_error

__all__ = [
    "disable_oom_snapshots",
    "enable_oom_snapshots",
    "oom_snapshots_enabled",
    "write_oom_snapshot",
]


@dataclass
class _Settings:
    directory: Path
    max_blocks: int
    max_snapshots: int
    torch_snapshot: bool
    written: int = 0


_settings: Optional[_Settings] = None
_lock = threading.Lock()
_previous_hooks: Dict[str, Any] = {}
_torch_observer_attached = False
_count = 0  # snapshots this process has written (numbers the files)


def _rank_tag() -> str:
    info = ranks.current_rank()
    return f"rank{info.rank}" if info is not None else "norank"


def _largest_blocks(limit: int) -> List[Dict[str, Any]]:
    try:
        arrays = frameworks.live_arrays(None)
    except Exception as e:
        return [{"error": f"{type(e).__name__}: {e}"}]
    return [asdict(a) for a in arrays[:limit]]


def _torch_snapshot(path: Path) -> Optional[str]:
    """PyTorch's allocator snapshot pickled to ``path`` (memory_viz reads it); None
    when PyTorch has no CUDA in use, else the file's name or why it failed."""
    torch = frameworks.torch_in_use()
    if torch is None:
        return None
    try:
        snapshot = torch.cuda.memory._snapshot()
        with open(path, "wb") as f:
            pickle.dump(snapshot, f)
        return path.name
    except Exception as e:
        return f"failed: {type(e).__name__}: {e}"


def _report_dict() -> Dict[str, Any]:
    try:
        return memory_report().to_dict()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def write_oom_snapshot(
    directory: Union[str, os.PathLike, None] = None,
    exc: Optional[BaseException] = None,
    *,
    max_blocks: int = 20,
    torch_snapshot: bool = True,
) -> Path:
    """Writes this rank's OOM snapshot now and returns its JSON file's path.

    ``directory``: where (made if missing); None for the one given to
    :func:`enable_oom_snapshots`. ``exc``: the error, recorded with its traceback. The
    file is ``oom-rank{R}-pid{P}-{N}.json`` (``norank`` outside a distributed job; ``N``
    counts this process's snapshots), with a ``.torch.pickle`` beside it when PyTorch has
    CUDA in use and ``torch_snapshot``. Raises ``InvalidInputError`` without a directory
    or for a ``max_blocks`` that is not an int >= 0.
    """
    settings = _settings
    if directory is None:
        if settings is None:
            raise InvalidInputError(
                "write_oom_snapshot: no directory given and enable_oom_snapshots() was not called"
            )
        directory = settings.directory
    check_int(max_blocks, "write_oom_snapshot: max_blocks", 0)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    with _lock:
        global _count
        _count += 1
        n = _count
    stem = f"oom-{_rank_tag()}-pid{os.getpid()}-{n}"
    info = ranks.current_rank()
    snapshot: Dict[str, Any] = {
        "rank": None if info is None else info.rank,
        "world_size": None if info is None else info.world_size,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "time": time.time(),
        "error": None
        if exc is None
        else {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exception(type(exc), exc, exc.__traceback__),
        },
        "memory_report": _report_dict(),
        "largest_live_blocks": _largest_blocks(max_blocks),
        "torch_snapshot": _torch_snapshot(folder / f"{stem}.torch.pickle")
        if torch_snapshot
        else None,
    }
    path = folder / f"{stem}.json"
    path.write_text(json.dumps(snapshot, indent=2, default=str))
    return path


def _auto_snapshot(exc: Optional[BaseException], where: str) -> None:
    """A snapshot taken by a hook: within the per-process budget, never raising."""
    settings = _settings
    if settings is None:
        return
    with _lock:
        if settings.written >= settings.max_snapshots:
            return
        settings.written += 1
    try:
        path = write_oom_snapshot(
            settings.directory,
            exc,
            max_blocks=settings.max_blocks,
            torch_snapshot=settings.torch_snapshot,
        )
        sys.stderr.write(f"gpukeeper: out of memory ({where}); snapshot written to {path}\n")
    except Exception as e:  # forensics must never hide the error being reported
        try:
            sys.stderr.write(f"gpukeeper: OOM snapshot failed: {type(e).__name__}: {e}\n")
        except Exception:
            pass


def _excepthook(exc_type: Any, exc: BaseException, tb: Any) -> None:
    if exc is not None and is_oom_error(exc):
        _auto_snapshot(exc, "uncaught")
    _previous_hooks.get("sys", sys.__excepthook__)(exc_type, exc, tb)


def _thread_excepthook(args: Any) -> None:
    if args.exc_value is not None and is_oom_error(args.exc_value):
        _auto_snapshot(args.exc_value, f"uncaught in thread {getattr(args.thread, 'name', '?')}")
    _previous_hooks.get("threading", threading.__excepthook__)(args)


def _torch_observer(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    _auto_snapshot(None, f"PyTorch's allocator on cuda:{device}, asked for {alloc} bytes")


def _attach_torch_observer() -> None:
    """PyTorch's caching allocator calls its OOM observers before raising; they cannot be
    removed, so one is attached once and asks whether snapshots are still enabled."""
    global _torch_observer_attached
    if _torch_observer_attached:
        return
    torch = frameworks.torch_cuda()  # usable, if not yet initialised: attach before the first OOM
    attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
    if torch is None or attach is None or frameworks.torch_uses_gpukeeper():
        return  # gpukeeper's pool raises through PyTorch: the excepthooks see it
    try:
        attach(_torch_observer)
        _torch_observer_attached = True
    except Exception:
        pass


def enable_oom_snapshots(
    directory: Union[str, os.PathLike],
    *,
    max_blocks: int = 20,
    max_snapshots: int = 5,
    torch_snapshot: bool = True,
) -> None:
    """Makes this process (this rank) write an OOM snapshot to ``directory`` when it runs
    out of memory (see the module's docs for when). Call on every rank; each writes its
    own files. ``max_snapshots`` bounds the automatic ones per process (a retry loop
    must not fill a disk); ``max_blocks``: live tensors/arrays listed, largest first.

    Calling again changes the settings. Raises ``InvalidInputError`` for bad settings.
    """
    global _settings
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise InvalidInputError(
            f"enable_oom_snapshots: directory must be a path, got {directory!r}"
        )
    check_int(max_blocks, "enable_oom_snapshots: max_blocks", 0)
    check_int(max_snapshots, "enable_oom_snapshots: max_snapshots", 1)
    if not isinstance(torch_snapshot, bool):
        raise InvalidInputError(
            f"enable_oom_snapshots: torch_snapshot must be a bool, got {torch_snapshot!r}"
        )
    with _lock:
        _settings = _Settings(Path(directory), max_blocks, max_snapshots, torch_snapshot)
        if sys.excepthook is not _excepthook and "sys" not in _previous_hooks:
            _previous_hooks["sys"] = sys.excepthook
            sys.excepthook = _excepthook
        if threading.excepthook is not _thread_excepthook and "threading" not in _previous_hooks:
            _previous_hooks["threading"] = threading.excepthook
            threading.excepthook = _thread_excepthook
    _attach_torch_observer()


def disable_oom_snapshots() -> bool:
    """Stops the automatic snapshots and puts the previous excepthooks back; False when
    they were not enabled."""
    global _settings
    with _lock:
        if _settings is None:
            return False
        _settings = None
        # A hook installed after ours chains to ours, which then only passes on: ours
        # stays, and so does what it passes to.
        if sys.excepthook is _excepthook:
            sys.excepthook = _previous_hooks.pop("sys")
        if threading.excepthook is _thread_excepthook:
            threading.excepthook = _previous_hooks.pop("threading")
        return True


def oom_snapshots_enabled() -> bool:
    """Whether :func:`enable_oom_snapshots` is in effect."""
    return _settings is not None
