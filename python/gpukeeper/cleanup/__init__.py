"""Cleanup that really returns memory: ``GPUContext``, ``cleanup_models``, ``cleanup_cuda``
and an opt-in exit guard.

>>> with GPUContext() as ctx:              # all devices in use, or GPUContext(0)
...     model = MyModel().cuda()
...     train(model)
...     del model                          # or build the model inside a function
>>> print(ctx.report)                      # before/after per framework, what is still held

On exit (normal, exception or KeyboardInterrupt) the context waits for the queued GPU work
of every framework loaded in the process (PyTorch, CuPy, JAX, gpukeeper's pools), releases
their cached memory (PyTorch's ``empty_cache``, IPC handles and cuBLAS workspaces, CuPy's
device and pinned pools, the pools' free segments) and compares what the frameworks still
hold with what they held on entry. Only if something is still held does it run the garbage
collector (young generations first, then a full collection), release the caches again and
measure again: reference cycles are broken, while an exit with nothing left costs well
under a millisecond. What is still held after that is named: each live tensor or array on
the device with its shape, dtype and bytes, and with ``track_allocations=True`` the line
that created it.

A ``with`` block is not a scope: names bound inside it keep their objects alive after it
ends. When memory is still held at exit, the context arms finalizers on what holds it, so
that ``del model`` after the block gives the memory back to the driver at once, without a
second call (``report.deferred``). ``cleanup_models(model, optimizer)`` frees their memory
even while the names live, and ``GPUContext(release_names=True)`` does that at exit for
every object the block bound to a name (opt-in: it destroys them). In IPython, a failed
cell's traceback and the output history do not keep a GPUContext's memory alive;
``release_ipython_references()`` drops every result holding device memory.

``install_exit_guard()`` makes a script release its memory, and say what it still held, at
interpreter exit and on SIGINT/SIGTERM, without ever hanging there on a stuck GPU.

Without a GPU everything runs: there is no device memory to watch, only gpukeeper's host
pools, and the garbage collector runs only when those still hold memory.
"""

from gpukeeper.base.errors import EmptiedObjectError, LeakWarning, MemoryLeakError
from gpukeeper.cleanup.cleanup_report import CleanupReport, LeakedArray
from gpukeeper.cleanup.context import ExitListener, GPUContext, add_exit_listener, cleanup_cuda
from gpukeeper.cleanup.exit_guard import (
    exit_guard_installed,
    install_exit_guard,
    uninstall_exit_guard,
)
from gpukeeper.cleanup.ipython_refs import (
    note_failed_block,
    release_ipython_references,
    watch_shell,
)
from gpukeeper.cleanup.models import cleanup_models

# The IPython support plugs into GPUContext here: the context itself knows no shell.
add_exit_listener(ExitListener(deferred_armed=watch_shell, block_failed=note_failed_block))

__all__ = [
    "GPUContext",
    "CleanupReport",
    "LeakedArray",
    "MemoryLeakError",
    "EmptiedObjectError",
    "LeakWarning",
    "cleanup_models",
    "cleanup_cuda",
    "install_exit_guard",
    "uninstall_exit_guard",
    "exit_guard_installed",
    "release_ipython_references",
]
