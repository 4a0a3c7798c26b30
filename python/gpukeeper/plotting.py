"""The one place that imports matplotlib, which stays optional: ``pyplot`` and ``finish``.

Nothing in gpukeeper imports matplotlib when it is imported itself; the ``plot()``
methods (benchmark results, comparisons, MD trajectories) call :func:`pyplot` when they
run, which says how to get matplotlib when it is missing, and :func:`finish` to save the
figure they drew.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Union

__all__ = ["PathLike", "finish", "pyplot"]

#: Where a figure may be saved: a path as text or an ``os.PathLike``.
PathLike = Union[str, "os.PathLike[str]"]


def pyplot(path: Optional[PathLike], what: str) -> Any:
    """``matplotlib.pyplot``, imported now.

    When the figure goes to a file (``path`` given) and nothing has imported pyplot yet,
    the Agg backend is chosen first, so that saving works on a machine without a display.
    ``what`` names the caller (``"BenchmarkResult.plot()"``) in the ``ImportError``
    raised when matplotlib is not installed, which names the fix:
    ``pip install matplotlib``.
    """
    try:
        import matplotlib

        if path is not None and "matplotlib.pyplot" not in sys.modules:
            matplotlib.use("Agg")  # writing a file needs no display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(f"{what} needs matplotlib: pip install matplotlib") from exc
    return plt


def finish(fig: Any, path: Optional[PathLike]) -> Any:
    """Saves ``fig`` to ``path`` (any format matplotlib infers from the suffix) when a
    path is given, and returns ``fig``."""
    if path is not None:
        fig.savefig(os.fspath(path), dpi=100)
    return fig
