"""The magics: ``%gpu_timeit`` / ``%%gpu_timeit``, ``%%gpu_memory`` and ``%gpu_report``.

Each is a thin surface over a feature: ``benchmark_function``, ``GPUContext`` and
``memory_report``. Options are checked before anything runs; a bad one is a one-line
``UsageError``. The user's code runs in the shell's namespace. A ``%%gpu_memory``
cell's exception propagates as the cell's own error (with the magic's frames hidden
from the traceback), and the traceback IPython keeps holds no device memory: the
cell's ``GPUContext`` says so to gpukeeper's IPython hook. A ``%gpu_timeit`` statement
or setup that is not Python or raises is a one-line ``UsageError`` naming the
exception, as ``gpukeeper timeit`` reports it; the failed call's traceback is dropped,
and the device memory its frames held with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.display import display

from gpukeeper.account.account_reader import memory_report
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.statements import Statement, compile_statement, describe_exception
from gpukeeper.cleanup import CleanupReport, GPUContext
from gpukeeper.cleanup.ipython_refs import note_failed_block
from gpukeeper.cleanup.measure import devices_in_use, peaks, reset_peaks
from gpukeeper.ipython.cells import compile_cell
from gpukeeper.ipython.memory_cell import BufferWatch, CellMemory
from gpukeeper.ipython.options import (
    OptionSpec,
    Value,
    device_option,
    non_negative_float,
    parse_line,
    positive_int,
)
from gpukeeper.timing import BenchmarkResult, benchmark_function, timing_device

__all__ = ["GPUKeeperMagics"]

_MiB = 1 << 20
_LABEL_CHARS = 60

_TIMEIT_OPTIONS = (
    OptionSpec("n", ("-n",), True, "N"),
    OptionSpec("r", ("-r",), True, "R"),
    OptionSpec("w", ("-w",), True, "W"),
    OptionSpec("d", ("-d",), True, "DEVICE"),
    OptionSpec("no_flush", ("--no-flush",), False),
    OptionSpec("device_time", ("--device-time",), False),
    OptionSpec("o", ("-o",), False),
)
_MEMORY_OPTIONS = (
    OptionSpec("d", ("-d",), True, "DEVICE"),
    OptionSpec("tolerance", ("--tolerance-mb",), True, "MB"),
)
_REPORT_OPTIONS = (
    OptionSpec("d", ("-d",), True, "DEVICE"),
    OptionSpec("json", ("--json",), False),
)


def _show(text: str, rich: Any = None) -> None:
    """Displays ``text`` as the plain-text form, and ``rich``'s own HTML (when its class
    has one) for front ends that render HTML."""
    bundle: Dict[str, Any] = {"text/plain": text}
    html = getattr(type(rich), "_repr_html_", None)
    if html is not None:
        try:
            markup = html(rich)
        except Exception:
            markup = None  # a failing rich form must not hide the plain one
        if markup:
            bundle["text/html"] = markup
    display(bundle, raw=True)


def _usage(magic: str, call: Callable[[], Any]) -> Any:
    """``call()``, with gpukeeper's ``InvalidInputError`` (a device that does not exist
    here) turned into the magic's ``UsageError``."""
    try:
        return call()
    except InvalidInputError as exc:
        raise UsageError(f"{magic}: {exc}") from None


@dataclass(frozen=True)
class TimeitSettings:
    """``%gpu_timeit``'s options, checked."""

    n_calls: int
    rounds: int
    warmup: int
    device: Any
    l2_flush: bool
    return_result: bool
    measure: str = "loop"


def _timeit_settings(magic: str, opts: Dict[str, Value]) -> TimeitSettings:
    device = device_option(magic, opts.get("d"))
    spec = _usage(magic, lambda: timing_device(device))
    return TimeitSettings(
        n_calls=positive_int(magic, "-n", opts["n"]) if "n" in opts else 100,
        rounds=positive_int(magic, "-r", opts["r"]) if "r" in opts else 1,
        # 0 is allowed, as by benchmark_function and `gpukeeper timeit`: a cold first call
        # is what some users mean to time.
        warmup=positive_int(magic, "-w", opts["w"], minimum=0) if "w" in opts else 10,
        device=device,
        # Only a GPU's L2 is flushed: on the CPU the request would only add a warning.
        l2_flush=not opts.get("no_flush", False) and spec.is_cuda,
        return_result=bool(opts.get("o", False)),
        measure="device" if opts.get("device_time", False) else "loop",
    )


def _compile_timed(shell: Any, magic: str, what: str, text: str, first_line: int) -> Statement:
    """``text`` (IPython syntax allowed: ``%magics``, ``!commands``) as a ``Statement``,
    cached by IPython's compiler under the cell's name, so that the user's functions
    it defines show their lines in tracebacks. ``first_line``: the number of its first
    line in the notebook cell. Text that is not Python is a one-line ``UsageError``."""
    try:
        source = "\n" * (first_line - 1) + shell.transform_cell(text)
        filename = shell.compile.cache(source, shell.execution_count, raw_code=source)
        tree = shell.transform_ast(shell.compile.ast_parse(source, filename=filename))
        return compile_statement(tree, filename, shell.compile)
    except SyntaxError as exc:
        where = f"line {exc.lineno}: {exc.text.strip()}" if exc.text else f"line {exc.lineno}"
        raise UsageError(f"{magic}: the {what} is not Python: {exc.msg} ({where})") from None


def _label(statement: str) -> str:
    lines = [ln.strip() for ln in statement.strip().splitlines() if ln.strip()]
    text = lines[0] + (" ..." if len(lines) > 1 else "")
    return text if len(text) <= _LABEL_CHARS else text[: _LABEL_CHARS - 3] + "..."


def _best_of(fn: Callable[[], Any], settings: TimeitSettings, label: str) -> List[BenchmarkResult]:
    """``settings.rounds`` runs of ``benchmark_function``, best (lowest median) first."""
    __tracebackhide__ = True
    results = []
    for _ in range(settings.rounds):
        results.append(
            benchmark_function(
                fn,
                n_calls=settings.n_calls,
                warmup=settings.warmup,
                device=settings.device,
                name=label,
                l2_flush=settings.l2_flush,
                measure=settings.measure,
            )
        )
    return sorted(results, key=lambda r: r.median_ms)


def _rounds_text(results: List[BenchmarkResult]) -> str:
    best = results[0]
    if len(results) == 1:
        return best.summary()
    medians = ", ".join(f"{r.median_ms:.4f}" for r in results)
    return f"best of {len(results)} rounds (medians {medians} ms):\n{best.summary()}"


@magics_class
class GPUKeeperMagics(Magics):
    """gpukeeper's IPython magics (``%load_ext gpukeeper`` registers them)."""

    @line_cell_magic
    def gpu_timeit(self, line: str, cell: Optional[str] = None) -> Optional[BenchmarkResult]:
        """Times a statement the way ``gpukeeper.benchmark_function`` does.

        Usage::

            %gpu_timeit [-n N] [-r R] [-w W] [-d DEVICE] [--no-flush] [--device-time] [-o] STATEMENT
            %%gpu_timeit [options] [SETUP]
            STATEMENTS

        In the cell form the rest of the first line is set-up code (run once, not
        timed) and the cell's body is timed.

        - ``-n N``: calls measured (default 100), each timed on its own: GPU time from
          CUDA events on a GPU (launch latency hidden behind a gate where the build has
          one), host time on the CPU; ``-w W`` warm-up calls first (default 10). On a GPU
          the calls then run back to back in batches: the loop time, the headline.
        - ``--device-time``: lead with the device time (the GPU work alone) instead of
          the loop time (what a loop of calls sees).
        - ``-r R``: R rounds, each a whole ``benchmark_function`` run with its own
          warm-up; the round with the lowest median is shown (default 1).
        - ``--no-flush``: do not flush the GPU's L2 cache before each call (by default
          each call starts with a cold L2 on a GPU; nothing is flushed on the CPU).
        - ``-d DEVICE``: ``cpu``, ``cuda``, ``cuda:N`` or ``N`` (default: the GPU when a
          loaded PyTorch or CuPy uses it, else the CPU).
        - ``-o``: return the ``BenchmarkResult`` (as ``%timeit -o`` does).

        The statement (and the set-up code) runs in the notebook's namespace as a cell's
        code does: it reads and rebinds the notebook's names (after ``x = 0``, each call
        of ``%gpu_timeit x += 1`` adds one to ``x``), and the names the set-up binds
        land there. A statement or set-up that is not Python or raises is a one-line
        ``UsageError`` naming the exception; run the statement on its own for its
        traceback.
        """
        __tracebackhide__ = True  # an interrupt's traceback starts at the user's frames
        magic = "%gpu_timeit" if cell is None else "%%gpu_timeit"
        opts, rest = parse_line(magic, line, _TIMEIT_OPTIONS)
        settings = _timeit_settings(magic, opts)
        statement, setup = (rest, "") if cell is None else (cell, rest)
        if not statement.strip():
            where = "after the options" if cell is None else "in the cell's body"
            raise UsageError(f"{magic}: no statement to time {where}")
        timed = _compile_timed(self.shell, magic, "statement", statement, 1 if cell is None else 2)
        if timed.empty:
            raise UsageError(f"{magic}: no statement to time (only comments or blank lines)")
        prepare = _compile_timed(self.shell, magic, "setup", setup, 1)
        shell = self.shell
        assert shell is not None  # IPython gives a registered magic its shell
        namespace = shell.user_ns
        failure = None
        try:
            prepare.function(namespace)()
        except Exception as exc:
            failure = f"{magic}: the setup raised {describe_exception(exc)}"
        if failure is None:
            try:
                results = _best_of(timed.function(namespace), settings, _label(statement))
            except BaseException as exc:
                if not (isinstance(exc, Exception) and timed.raised(exc)):
                    # An interrupt, or a failure of the timing itself, keeps its traceback,
                    # whose frames hold the statement's locals (tensors of the call that
                    # stopped): gpukeeper's post-cell hook clears them once IPython has
                    # shown it.
                    note_failed_block(exc)
                    raise
                failure = f"{magic}: the statement raised {describe_exception(exc)}"
        if failure is not None:
            # Raised here, outside the handlers, so that the failed call's exception is
            # not kept as this one's context: its traceback's frames, and the device
            # memory they hold, go now.
            raise UsageError(failure)
        _show(_rounds_text(results), results[0])
        return results[0] if settings.return_result else None

    @cell_magic
    def gpu_memory(self, line: str, cell: str) -> Any:
        """Runs the cell inside a ``gpukeeper.GPUContext`` and shows, per framework and
        location, the memory allocated before, at peak and after it, and what it left
        behind (leaks are named: shape, dtype, bytes).

        Usage::

            %%gpu_memory [-d DEVICE] [--tolerance-mb MB]

        - ``-d DEVICE``: watch one device (``cuda:N``, ``N`` or ``cpu`` for gpukeeper's
          host pools only); default: every device the process uses.
        - ``--tolerance-mb MB``: memory still held above this is a LEAK (default 1 MiB;
          below it the objects are listed as within tolerance).

        The peak is PyTorch's ``max_memory_allocated`` and gpukeeper pools'
        ``peak_allocated_bytes``, both restarted when the cell starts; "n/a" for
        frameworks without a resettable peak. The cell's value (a last expression) is
        returned as usual, and an exception it raises is the cell's error: the table is
        shown first, and the traceback keeps none of the cell's device memory.
        """
        __tracebackhide__ = True
        magic = "%%gpu_memory"
        opts, rest = parse_line(magic, line, _MEMORY_OPTIONS)
        if rest:
            raise UsageError(
                f"{magic}: unexpected {rest!r} on the magic's line (the cell's body is what runs)"
            )
        device = device_option(magic, opts.get("d"))
        tolerance = non_negative_float(magic, "--tolerance-mb", opts.get("tolerance", "1"))
        ctx = _usage(
            magic,
            lambda: GPUContext(device, warn_on_leak=False, tolerance_bytes=int(tolerance * _MiB)),
        )
        code = compile_cell(self.shell, cell)
        # Restarted, as torch.cuda.reset_peak_memory_stats does: the peak shown is the cell's.
        reset_peaks(devices_in_use(None))
        shell = self.shell
        assert shell is not None  # IPython gives a registered magic its shell
        buffers = BufferWatch(shell.user_ns)
        started = time.perf_counter()
        try:
            with ctx:
                value = code.run(shell.user_ns)
        finally:
            if ctx.report is not None:  # None only when entering the context failed
                _show_cell(ctx.report, buffers, ctx.tolerance_bytes, time.perf_counter() - started)
        return value

    @line_magic
    def gpu_report(self, line: str) -> None:
        """Shows ``gpukeeper.memory_report()``: who holds the devices' memory.

        Usage::

            %gpu_report [-d DEVICE] [--json]

        Without ``-d``: every visible device, one section each, and their total (a
        ``DevicesReport``; the host without CUDA). ``-d DEVICE``: that one device's
        ``MemoryReport``: ``cuda:N``, ``N``, ``cuda`` (the current one) or ``cpu``.
        ``--json``: the report as JSON (its ``to_json()``).
        """
        magic = "%gpu_report"
        opts, rest = parse_line(magic, line, _REPORT_OPTIONS)
        if rest:
            raise UsageError(f"{magic}: unexpected {rest!r} (options: [-d DEVICE] [--json])")
        device = device_option(magic, opts.get("d"))
        report = _usage(magic, lambda: memory_report(device))
        if opts.get("json"):
            display(
                {"application/json": report.to_dict(), "text/plain": report.to_json()}, raw=True
            )
        else:
            _show(report.table(), report)


def _show_cell(report: CleanupReport, buffers: BufferWatch, tolerance: int, wall_s: float) -> None:
    """Displays one ``%%gpu_memory`` cell's table."""
    held_by_pools = {loc for loc, per in report.held.items() if "gpukeeper" in per}
    cell = CellMemory(
        report=report,
        peaks=peaks(report.devices),
        tolerance_bytes=tolerance,
        wall_s=wall_s,
        buffers=buffers.new_buffers(held_by_pools) if held_by_pools else [],
    )
    _show(cell.table(), cell)
