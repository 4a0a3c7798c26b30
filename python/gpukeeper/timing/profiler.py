"""``ProfilerContext``: the PyTorch profiler with defaults that suit a quick look.

>>> with ProfilerContext("trace.json") as prof:
...     model(x)
>>> print(prof.table)        # the top operators; open trace.json in Perfetto/chrome://tracing
"""

from __future__ import annotations

import os
from typing import Any, Iterable, List, Optional, Union

from gpukeeper import frameworks
from gpukeeper.base.arg_checks import check_int
from gpukeeper.base.errors import GpuError, InvalidInputError

__all__ = ["ProfilerContext"]


def _import_torch() -> Any:
    try:
        # The caller asked for the PyTorch profiler: importing PyTorch is the point here.
        return frameworks.import_torch()
    except ImportError as exc:
        raise GpuError(
            f"ProfilerContext needs PyTorch (import torch failed: {exc}); install torch, or "
            "use gpukeeper.CUDATimer / benchmark_function, which work without it"
        ) from None


class ProfilerContext:
    """Runs ``torch.profiler.profile`` around a block.

    - ``activities``: None means CPU, plus CUDA when PyTorch can use CUDA; otherwise a
      list of ``"cpu"``/``"cuda"`` or ``torch.profiler.ProfilerActivity`` values.
    - ``path``: where the Chrome trace (JSON) is written on exit (parent folders are
      created); None writes none.
    - ``record_shapes``, ``with_stack``, ``profile_memory``: passed to the profiler.
    - ``sort_by``: the column the summary table is sorted by; None means
      ``"device_time_total"`` with CUDA, else ``"cpu_time_total"``. ``row_limit``: rows.

    After the block: ``table`` (the summary table as text), ``trace_path``,
    ``profiler`` (the torch profiler object) and ``key_averages()``.

    Raises ``GpuError`` when PyTorch is missing, ``InvalidInputError`` for bad arguments
    (e.g. asking for CUDA activity without a usable CUDA device).
    """

    def __init__(
        self,
        path: Optional[Union[str, "os.PathLike[str]"]] = None,
        activities: Optional[Iterable[Any]] = None,
        record_shapes: bool = True,
        with_stack: bool = False,
        sort_by: Optional[str] = None,
        row_limit: int = 20,
        profile_memory: bool = False,
    ) -> None:
        torch = _import_torch()
        self._torch = torch
        ProfilerActivity = torch.profiler.ProfilerActivity

        cuda = False
        try:
            cuda = bool(torch.cuda.is_available())
        except Exception:
            cuda = False  # a broken CUDA setup profiles the CPU only
        if activities is None:
            chosen: List[Any] = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        else:
            chosen = []
            for activity in activities:
                if isinstance(activity, str):
                    key = activity.strip().upper()
                    if key not in ("CPU", "CUDA"):
                        raise InvalidInputError(
                            f"unknown profiler activity {activity!r}: use 'cpu' or 'cuda'"
                        )
                    activity = getattr(ProfilerActivity, key)
                if not isinstance(activity, ProfilerActivity):
                    raise InvalidInputError(
                        "profiler activities must be 'cpu', 'cuda' or ProfilerActivity, "
                        f"got {activity!r}"
                    )
                if activity == ProfilerActivity.CUDA and not cuda:
                    raise InvalidInputError(
                        "CUDA profiler activity asked for, but PyTorch cannot use CUDA here"
                    )
                chosen.append(activity)
            if not chosen:
                raise InvalidInputError("activities must name at least one of 'cpu', 'cuda'")
        check_int(row_limit, "row_limit", 1)
        if sort_by is not None and not isinstance(sort_by, str):
            raise InvalidInputError(f"sort_by must be a column name, got {sort_by!r}")
        self.activities = chosen
        self.uses_cuda = ProfilerActivity.CUDA in chosen
        self.trace_path: Optional[str] = os.fspath(path) if path is not None else None
        self.record_shapes = bool(record_shapes)
        self.with_stack = bool(with_stack)
        self.profile_memory = bool(profile_memory)
        self.sort_by = sort_by or ("device_time_total" if self.uses_cuda else "cpu_time_total")
        self.row_limit = row_limit
        self.profiler: Any = None
        self.table: str = ""
        self._active = False

    def __enter__(self) -> "ProfilerContext":
        if self._active:
            raise GpuError("this ProfilerContext is already active; nest a new one instead")
        self.profiler = self._torch.profiler.profile(
            activities=self.activities,
            record_shapes=self.record_shapes,
            with_stack=self.with_stack,
            profile_memory=self.profile_memory,
        )
        self.profiler.__enter__()
        self._active = True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._active:
            return
        self._active = False
        if self.uses_cuda:
            # Kernels still queued would be missing from the trace.
            self._torch.cuda.synchronize()
        self.profiler.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return  # the body's exception matters more than a trace of it
        if self.trace_path is not None:
            parent = os.path.dirname(os.path.abspath(self.trace_path))
            os.makedirs(parent, exist_ok=True)
            try:
                self.profiler.export_chrome_trace(self.trace_path)
            except Exception as exc2:
                raise GpuError(
                    f"could not write the chrome trace to {self.trace_path!r}: {exc2}"
                ) from exc2
        self.table = self.key_averages().table(sort_by=self.sort_by, row_limit=self.row_limit)

    def key_averages(self, group_by_input_shape: bool = False) -> Any:
        """Per-operator averages (``torch.profiler.profile.key_averages``)."""
        if self.profiler is None:
            raise GpuError("ProfilerContext has not run yet")
        return self.profiler.key_averages(group_by_input_shape=group_by_input_shape)

    def __repr__(self) -> str:
        names = "+".join(str(a).split(".")[-1] for a in self.activities)
        state = "active" if self._active else ("done" if self.table else "idle")
        return f"<ProfilerContext {names} {state} trace={self.trace_path!r}>"
