"""Fixtures of the Python test suite.

Every pool a test gets comes from the ``pools`` factory, which checks the pool's books when
the test ends: ``validate(d) == ''`` for each device, and (unless the test is marked
``live_buffers``) nothing allocated and nothing left reserved after ``emergency_cleanup``.

``pool`` is ``MemoryPool()`` (device memory with CUDA, host memory without);
``host_pool`` is always host memory; ``any_pool`` runs a test once per memory kind that
this machine has. Tests marked ``gpu`` are skipped when ``gpukeeper.cuda_available()``
is False, with its reason.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, List

import pytest

import gpukeeper
from gpukeeper import MemoryPool

CUDA = gpukeeper.cuda_available()
KINDS = ["host", "device", "async", "pinned"]
MiB = 1 << 20

# The counters that describe what a pool holds (as opposed to what happened to it).
BOOK_KEYS = (
    "allocated_bytes",
    "allocated_count",
    "requested_bytes",
    "reserved_bytes",
    "segment_count",
    "cached_bytes",
    "largest_free_block",
    "limit_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a usable CUDA device (skipped otherwise)")
    config.addinivalue_line(
        "markers",
        "live_buffers: the test leaves blocks allocated on purpose; the end-of-test pool "
        "check then only validates the books",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if CUDA:
        return
    skip = pytest.mark.skip(reason=f"no usable CUDA device: {CUDA.reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def require_gpu() -> None:
    """Skips the calling test without a usable CUDA device (for tests not marked gpu)."""
    if not CUDA:
        pytest.skip(f"no usable CUDA device: {CUDA.reason}")


def books(pool: MemoryPool, device: int = 0) -> dict:
    """The holding counters of a pool (see BOOK_KEYS)."""
    d = pool.stats(device).to_dict()
    return {k: d[k] for k in BOOK_KEYS}


def _allocated(pool: MemoryPool) -> List[int]:
    return [pool.stats(d).allocated_bytes for d in pool.devices()]


def check_balanced(pool: MemoryPool, allocated: int = 0, *, collect: bool = True) -> None:
    """Asserts that every device's pool validates and holds ``allocated`` bytes.

    A full gc.collect() costs ~60 ms once torch is imported, so it only runs when the
    books do not match at first (a buffer caught in a reference cycle).
    """
    if collect and any(a != allocated for a in _allocated(pool)):
        gc.collect()
    for d in pool.devices():
        problems = pool.validate(d)
        assert problems == "", f"pool {pool!r} device {d}: {problems}"
        stats = pool.stats(d)
        assert stats.allocated_bytes == allocated, f"device {d}: {stats!r}"
        if allocated == 0:
            assert stats.allocated_count == 0, stats
            assert stats.requested_bytes == 0, stats


class PoolFactory:
    def __init__(self) -> None:
        self.made: List[MemoryPool] = []

    def __call__(self, kind: str = "auto", expandable: Any = "auto") -> MemoryPool:
        if kind not in ("auto", "host"):
            require_gpu()
        pool = MemoryPool(kind, expandable=expandable)
        self.made.append(pool)
        return pool

    def finish(self, expect_empty: bool) -> None:
        if any(any(_allocated(p)) for p in self.made):
            gc.collect()
        for pool in self.made:
            for d in pool.devices():
                assert pool.validate(d) == "", f"{pool!r} device {d}: {pool.validate(d)}"
            if not expect_empty:
                continue
            check_balanced(pool, 0, collect=False)
            pool.emergency_cleanup_all()
            for d in pool.devices():
                stats = pool.stats(d)
                assert stats.reserved_bytes == 0, f"after emergency_cleanup: {stats!r}"
                assert stats.segment_count == 0, stats
                assert pool.validate(d) == ""


@pytest.fixture
def pools(request: pytest.FixtureRequest):
    """Factory of MemoryPools, each checked for balance when the test ends."""
    factory = PoolFactory()
    yield factory
    factory.finish(expect_empty=request.node.get_closest_marker("live_buffers") is None)


@pytest.fixture
def pool(pools: PoolFactory) -> MemoryPool:
    """MemoryPool() with the automatic kind: device memory with CUDA, else host memory."""
    return pools()


@pytest.fixture
def fixed_pool(pools: PoolFactory) -> MemoryPool:
    """MemoryPool(expandable=False): for tests whose numbers are those of fixed segments
    (their sizes and counts). The default is expandable ranges for large device requests."""
    return pools(expandable=False)


@pytest.fixture
def host_pool(pools: PoolFactory) -> MemoryPool:
    """A pool of plain host memory (buffer protocol, DLPack device kDLCPU)."""
    return pools("host")


@pytest.fixture(params=KINDS)
def any_pool(request: pytest.FixtureRequest, pools: PoolFactory) -> MemoryPool:
    """A pool of each memory kind; the CUDA kinds are skipped without a device."""
    return pools(request.param)


@pytest.fixture
def balanced() -> Callable[..., None]:
    """``balanced(pool, allocated=0)``: assert the pool's books mid-test."""
    return check_balanced


@pytest.fixture
def pool_books() -> Callable[..., dict]:
    """``pool_books(pool, device=0)``: the holding counters, to compare before/after."""
    return books


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> list:
    """Collects what sys.unraisablehook receives (errors raised inside pool callbacks)."""
    import sys

    seen: list = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u))
    return seen
