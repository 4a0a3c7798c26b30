"""gpukeeper in IPython and Jupyter: ``%load_ext gpukeeper``.

>>> %load_ext gpukeeper
>>> %gpu_report                          # who holds the device's memory
>>> %gpu_timeit -n 50 model(x)           # loop and device time per call, as benchmark_function
>>> r = %gpu_timeit -o -r 3 a @ b        # best of 3 rounds, the BenchmarkResult back

and, as a cell magic, the memory a cell uses and what it leaves behind::

    %%gpu_memory
    y = model(x)                         # before / peak / after per framework; leaks named

``%%gpu_timeit [options] SETUP`` times the cell's body after running the line once.
Each magic's ``?`` help lists its options (``%gpu_timeit?``). This package imports
IPython; ``import gpukeeper`` never imports it (the extension entry points in
``gpukeeper`` load this package only when IPython calls them).
"""

from __future__ import annotations

from typing import Any

from gpukeeper.ipython.magics import GPUKeeperMagics

__all__ = ["GPUKeeperMagics", "load_ipython_extension", "unload_ipython_extension"]

_MAGIC_NAMES = {"line": ("gpu_timeit", "gpu_report"), "cell": ("gpu_timeit", "gpu_memory")}


def load_ipython_extension(ipython: Any) -> None:
    """Registers gpukeeper's magics in ``ipython`` (``%load_ext gpukeeper`` calls this)."""
    ipython.register_magics(GPUKeeperMagics)


def unload_ipython_extension(ipython: Any) -> None:
    """Removes the magics ``load_ipython_extension`` registered (``%unload_ext gpukeeper``);
    magics of the same names registered by something else are left alone."""
    manager = ipython.magics_manager
    for kind, names in _MAGIC_NAMES.items():
        table = manager.magics.get(kind, {})
        for name in names:
            bound = table.get(name)
            if isinstance(getattr(bound, "__self__", None), GPUKeeperMagics):
                del table[name]
    manager.registry.pop(GPUKeeperMagics.__name__, None)
