"""The one progress bar of gpukeeper's long runs (an MD trajectory, a benchmark with many
calls), drawn by rich.

By default a bar appears only where someone watches: stderr is a terminal, and neither CI
(``CI`` set) nor pytest (``PYTEST_CURRENT_TEST`` set) runs the code; ``GPUKEEPER_PROGRESS=0``
turns it off and ``=1`` on. The bar is host work between two measured calls, so it is
redrawn only between them: every ``every`` steps (1% of the run by default), and by a
caller that reads the clock, every quarter second as well; never inside a measurement.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

__all__ = ["REDRAW_S", "ProgressBar", "progress_wanted"]

#: A bar is redrawn at most this often by callers that can tell (and at least every 1%).
REDRAW_S = 0.25


def progress_wanted(explicit: Optional[bool], stream: Any = None) -> bool:
    """Whether to show a bar: ``explicit`` when given, else the environment's answer
    (see the module's text)."""
    if explicit is not None:
        return bool(explicit)
    setting = os.environ.get("GPUKEEPER_PROGRESS")
    if setting in ("0", "1"):
        return setting == "1"
    if os.environ.get("CI") or os.environ.get("PYTEST_CURRENT_TEST"):
        return False
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


class ProgressBar:
    """A bar of ``total`` steps on ``stream`` (stderr): ``update(done)`` redraws,
    ``close()`` draws 100% (or where an interrupted run stopped) and ends the line.
    ``every``: the steps between redraws the caller should keep to."""

    def __init__(
        self, total: int, description: str, unit: str = "steps", stream: Any = None
    ) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )

        self.total = total
        self.every = max(1, total // 100)
        console = Console(file=stream if stream is not None else sys.stderr, highlight=False)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            MofNCompleteColumn(),
            TextColumn(unit),
            TimeRemainingColumn(),
            console=console,
            auto_refresh=False,
            transient=False,
        )
        self._task = self._progress.add_task(description, total=total)
        self._progress.start()

    def update(self, done: int) -> None:
        """Shows ``done`` of the total."""
        self._progress.update(self._task, completed=done, refresh=True)

    def close(self, done: Optional[int] = None) -> None:
        """Shows the end (``done`` steps when the run stopped early, else the total) and
        releases the terminal."""
        completed = self.total if done is None else done
        self._progress.update(self._task, completed=completed, refresh=True)
        self._progress.stop()
