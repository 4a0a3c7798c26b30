"""The out-of-memory retry pattern as one helper: ``retry_on_oom``.

Call form: run ``fn`` now, retrying after an out-of-memory error::

    result = retry_on_oom(model, batch, retries=1, fallback=lambda batch: model_cpu(batch))

Decorator form (always with parentheses)::

    @retry_on_oom(fallback=predict_on_cpu)
    def predict(batch): ...

    @retry_on_oom()              # defaults: one retry, then re-raise
    def step(x): ...

What happens on an out-of-memory error (see :func:`is_oom_error`):

1. the error's traceback frames are cleared, so that the tensors the failed call held
   in its local variables are freed now rather than when the error is discarded;
2. every framework's cached memory is released (:func:`gpukeeper.frameworks.
   release_all_caches`: PyTorch, CuPy, JAX, gpukeeper pools); when that releases
   nothing, or on a second retry, ``gc.collect()`` runs first (it costs ~20 ms with
   torch imported, but frees tensors kept alive by reference cycles) and the caches
   are released again;
3. ``fn`` is called again, up to ``retries`` times; then ``fallback(*args, **kwargs)``
   is called if given (e.g. a smaller batch, or the CPU), else the last out-of-memory
   error is raised again.

Any other exception propagates at once, untouched. ``retries`` and ``fallback`` are
keyword-only and taken by ``retry_on_oom`` itself: to pass arguments of those names to
``fn``, bind them first (``functools.partial``).

Careful: a bare ``@retry_on_oom`` (no parentheses) would call the function at once,
with no arguments, when it is defined; write ``@retry_on_oom()``.
"""

from __future__ import annotations

import functools
import gc
import logging
import traceback
from typing import Any, Callable, Optional, TypeVar

from gpukeeper import frameworks
from gpukeeper.base.arg_checks import check_callable, check_int
from gpukeeper.base.errors import InvalidInputError

__all__ = ["retry_on_oom", "is_oom_error", "release_for_retry"]

_log = logging.getLogger("gpukeeper")
T = TypeVar("T")

# Lower-cased fragments of the messages that frameworks put in a RuntimeError when the
# device ran out of memory (PyTorch, CuPy's CUDARuntimeError, cuBLAS/cuDNN workspace
# failures, JAX/XLA's RESOURCE_EXHAUSTED).
_OOM_TEXT = (
    "out of memory",
    "cudaerrormemoryallocation",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "resource_exhausted",
)


def is_oom_error(exc: BaseException) -> bool:
    """True for an out-of-memory error of any framework.

    That is: ``MemoryError`` and its subclasses (gpukeeper's ``AllocationError``,
    CuPy's ``OutOfMemoryError``, NumPy's host allocation failure),
    ``torch.cuda.OutOfMemoryError`` (``torch.OutOfMemoryError``), and a
    ``RuntimeError`` whose message says the device is out of memory (e.g. "CUDA error:
    out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "RESOURCE_EXHAUSTED").
    """
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, frameworks.oom_error_types()):
        return True
    if isinstance(exc, RuntimeError):
        try:
            text = str(exc).lower()
        except Exception:
            return False
        return any(fragment in text for fragment in _OOM_TEXT)
    return False


def _clear_frames(exc: BaseException) -> None:
    """Drops the local variables of the finished frames of ``exc`` (and of the errors
    it chains to): they hold the failed attempt's tensors. Line numbers stay for the
    traceback; frames still running (ours) are skipped by ``clear_frames``."""
    seen = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


def release_for_retry(collect: bool = False) -> int:
    """Releases every framework's caches (all devices) and returns the bytes released;
    with ``collect``, or when the first release frees nothing, runs ``gc.collect()``
    and releases again. Never raises (a failure is logged)."""
    released = 0
    try:
        if not collect:
            released = sum(frameworks.release_all_caches(None).values())
        if collect or released == 0:
            gc.collect()
            released += sum(frameworks.release_all_caches(None).values())
    except Exception as exc:  # never hide the out-of-memory error behind our own
        _log.warning("gpukeeper: releasing caches after out-of-memory failed: %s", exc)
    return released


def _check_options(retries: Any, fallback: Any) -> int:
    check_int(retries, "retries", 0)
    check_callable(fallback, "fallback", optional=True)
    return retries


def _run(
    fn: Callable[..., T],
    args: tuple,
    kwargs: dict,
    retries: int,
    fallback: Optional[Callable[..., T]],
) -> T:
    last: Optional[BaseException] = None
    for attempt in range(retries + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            _clear_frames(exc)
            last = exc
        # Out of the except block, so that the interpreter's reference to the error (and
        # through it, the failed call's frames) is gone before memory is released.
        if attempt < retries or fallback is not None:
            name = getattr(fn, "__qualname__", repr(fn))
            _log.info("gpukeeper: %s ran out of memory (attempt %d): %s", name, attempt + 1, last)
            release_for_retry(collect=attempt > 0)
    if fallback is not None:
        last = None
        return fallback(*args, **kwargs)
    assert last is not None
    raise last


def retry_on_oom(
    fn: Optional[Callable[..., T]] = None,
    *args: Any,
    retries: int = 1,
    fallback: Optional[Callable[..., T]] = None,
    **kwargs: Any,
) -> Any:
    """Calls ``fn(*args, **kwargs)``, releasing memory and retrying after an
    out-of-memory error, then calling ``fallback(*args, **kwargs)`` if given, else
    re-raising the last out-of-memory error; returns what ``fn`` (or the fallback)
    returned. With no ``fn``, returns a decorator that does this for every call.

    ``retries``: how many times to call ``fn`` again after the first failure (0: never;
    the fallback, or the re-raise, comes right after the first one). See the module's
    docstring for what is released between attempts. Non-out-of-memory errors, and
    errors raised by the fallback, propagate unchanged. ``InvalidInputError`` for a
    negative or non-int ``retries``, or a ``fallback`` that is not callable.
    """
    retries = _check_options(retries, fallback)
    if fn is None:
        if args or kwargs:
            raise InvalidInputError("retry_on_oom: arguments given without a function to call")

        def decorator(func: Callable[..., T]) -> Callable[..., T]:
            if not callable(func):
                raise InvalidInputError(
                    f"retry_on_oom decorates a callable, got {type(func).__name__}"
                )

            @functools.wraps(func)
            def wrapper(*a: Any, **kw: Any) -> T:
                return _run(func, a, kw, retries, fallback)

            return wrapper

        return decorator
    check_callable(fn, "retry_on_oom: fn")
    return _run(fn, args, kwargs, retries, fallback)
