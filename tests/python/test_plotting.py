"""plotting.finish: a figure returned to a Jupyter kernel is shown once (closed in pyplot
there, left open for plt.show() elsewhere)."""

from __future__ import annotations

import sys
import types

import pytest

from gpukeeper import plotting

plt = pytest.importorskip("matplotlib.pyplot")


class ZMQInteractiveShell:  # the name IPython's kernel shell goes by
    pass


def test_a_figure_stays_open_outside_a_kernel():
    fig = plt.figure()
    assert plotting.finish(fig, None) is fig
    assert plt.fignum_exists(fig.number)
    plt.close(fig)


def test_a_figure_returned_to_a_kernel_is_not_shown_twice(monkeypatch):
    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: ZMQInteractiveShell()
    monkeypatch.setitem(sys.modules, "IPython", fake)
    fig = plt.figure()
    assert plotting.finish(fig, None) is fig
    assert not plt.fignum_exists(fig.number)  # only the returned figure is displayed
