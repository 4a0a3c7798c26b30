"""A buffer whose MemoryPool object is gone (returned from a function that made its own
pool) stays in the process's account until it is released: the account follows the C++
pool, which the buffer keeps alive, not the Python object."""

from __future__ import annotations

import gc

import pytest

import gpukeeper
from gpukeeper import MemoryPool, Precision, _core
from gpukeeper.frameworks import pools_adapter

MiB = 1 << 20


def _orphan_buffer():
    return MemoryPool("host").get_managed_buffer(0, 8 << 20, Precision.Fp32)  # 32 MiB


def test_the_account_sees_a_buffer_whose_pool_object_is_gone():
    buf = _orphan_buffer()
    gc.collect()
    assert len(_core._orphaned_pools()) == 1
    held = pools_adapter.host_pool_memory()
    assert held is not None and held.allocated >= 32 * MiB
    assert gpukeeper.get_gpu_memory_info("cpu")["host_pools_allocated_bytes"] >= 32 * MiB
    assert "32.0 MiB" in gpukeeper.memory_report("cpu").table()
    buf.release()
    gc.collect()
    # Released: the pool dies with its last block, and leaves the account.
    assert _core._orphaned_pools() == []
    assert pools_adapter.host_pool_memory() is None or pools_adapter.host_pool_memory().allocated == 0


def test_a_pool_without_blocks_out_is_no_orphan():
    pool = MemoryPool("host")
    pool.get_managed_buffer(0, 1024).release()
    del pool
    gc.collect()
    assert _core._orphaned_pools() == []


def test_no_gpu_leak_catches_a_leak_through_a_dropped_pool(pytester: pytest.Pytester):
    pytester.makepyfile("""
import pytest
from gpukeeper import MemoryPool, Precision

KEPT = []

def make():
    return MemoryPool("host").get_managed_buffer(0, 8 << 20, Precision.Fp32)

@pytest.mark.no_gpu_leak(tolerance_mb=0)
def test_leaks():
    KEPT.append(make())
""")
    # In its own process: the leaked buffer must not stay in this one's account.
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert "32.0 MiB" in result.stdout.str()
