"""A ManagedBuffer kept alive past a GPUContext or a leak-checked test is named in the
report, with its creating line when allocations are tracked: buffers are not gc-tracked
objects, so the core keeps the list of live ones (``_core._live_buffers``)."""

from __future__ import annotations

import gc

import pytest

from gpukeeper import GPUContext, MemoryPool, _core
from gpukeeper.base.errors import LeakWarning
from gpukeeper.frameworks import live_buffers

KEPT = []


def test_live_buffers_lists_unreleased_buffers_only():
    pool = MemoryPool("host")
    a = pool.get_managed_buffer(0, 1024)
    b = pool.get_managed_buffer(0, 2048)
    b.release()
    ptrs = {e.data_ptr for e in live_buffers("host")}
    assert a.ptr in ptrs
    assert all(e.framework == "gpukeeper" and e.kind == "ManagedBuffer" for e in live_buffers("host"))
    del a, b
    gc.collect()
    assert not any(obj for obj in _core._live_buffers() if not obj.released and obj.kind == "host"
                   and obj.nbytes in (4096,))


def test_gpucontext_names_a_buffer_kept_in_a_module_list():
    pool = MemoryPool("host")
    with pytest.warns(LeakWarning):
        with GPUContext(track_allocations=True) as ctx:
            KEPT.append(pool.get_managed_buffer(0, 1 << 20))  # the line the report must name
    try:
        [leak] = ctx.report.leaks
        assert leak.framework == "gpukeeper" and leak.nbytes == 4 << 20
        assert leak.created_at and "test_buffer_leaks.py" in leak.created_at[0]
        text = ctx.report.table()
        assert "ManagedBuffer" in text and "no live tensor or array visible" not in text
    finally:
        KEPT.clear()


def test_the_plugin_names_the_creating_line(pytester: pytest.Pytester):
    pytester.makepyfile("""
import pytest
from gpukeeper import MemoryPool

POOL = MemoryPool("host")
KEPT = []

def test_leaks():
    KEPT.append(POOL.get_managed_buffer(0, 1 << 20))
""")
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "--gpu-leaks", "--gpu-leaks-track")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "ManagedBuffer (1048576,) fp32, 4.0 MiB on host, created at" in out
    assert "test_the_plugin_names_the_creating_line.py:8 in test_leaks" in out
    assert "no live tensor or array visible" not in out
    assert "pluggy" not in out.split("created at", 1)[1].splitlines()[0]
