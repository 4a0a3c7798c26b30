"""host.py: RSS, malloc in-use bytes, tracemalloc, loaded libraries."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from gpukeeper.base import host_memory as host

glibc = pytest.mark.skipif(host.malloc_in_use_reader() is None, reason="no glibc mallinfo2 here")


def test_rss_readers_agree() -> None:
    with host.RssReader() as read:
        a, b = read(), host.process_rss_bytes()
    assert a > 0 and abs(a - b) < 64 << 20
    assert host.peak_rss_bytes() >= host.current_rss_bytes() > 0


@glibc
def test_malloc_in_use_sees_a_live_array_and_its_release() -> None:
    before = host.malloc_in_use_bytes()
    x = np.ones(4 << 20, dtype=np.uint8)  # 4 MiB, malloc'd by numpy
    during = host.malloc_in_use_bytes()
    del x
    after = host.malloc_in_use_bytes()
    assert during - before >= 4 << 20
    assert abs(after - before) < 1 << 20


def test_tracemalloc_only_when_tracing() -> None:
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc already on")
    assert host.tracemalloc_bytes() is None
    tracemalloc.start()
    try:
        before = host.tracemalloc_bytes()
        x = np.ones(1 << 20, dtype=np.uint8)  # numpy reports its buffers to tracemalloc
        assert host.tracemalloc_bytes() - before >= 1 << 20
        del x
    finally:
        tracemalloc.stop()
