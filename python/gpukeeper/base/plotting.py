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
    path is given, and returns ``fig``.

    In a Jupyter kernel with the inline backend the figure is shown exactly once, whether
    the cell ends with the call, assigns its figure or ends in ``;``: see
    :func:`_show_once`."""
    if path is not None:
        fig.savefig(os.fspath(path), dpi=100)
    _show_once(fig)
    return fig


def _show_once(fig: Any) -> None:
    """Inline, a pyplot figure would be drawn twice when it is also the cell's value: once
    as the value, once by the backend's flush at the end of the cell. The figure is
    therefore taken out of pyplot, and after the cell it is displayed only if the cell's
    value was not this figure (assigned, or silenced with ``;``). Other backends
    (interactive widgets, scripts) keep pyplot's own behaviour."""
    shell = _kernel_shell()
    if shell is None or "inline" not in str(sys.modules["matplotlib"].get_backend()):
        return
    import matplotlib.pyplot as plt
    from IPython.display import display

    plt.close(fig)

    def after_cell(result: Any) -> None:
        shell.events.unregister("post_run_cell", after_cell)
        if getattr(result, "result", None) is not fig:
            display(fig)

    shell.events.register("post_run_cell", after_cell)


def _kernel_shell() -> Any:
    """IPython's shell when this runs in a Jupyter kernel (IPython's ZMQ shell), else None.
    Read from ``sys.modules``: plotting never imports IPython itself."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    return shell if shell is not None and type(shell).__name__ == "ZMQInteractiveShell" else None
