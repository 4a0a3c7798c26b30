"""MemoryPool: allocation, statistics, reuse, cleanup, limits, pressure, callbacks, threads.

Runs on whatever ``MemoryPool()`` gives (host memory without CUDA, device memory with it);
``any_pool`` tests repeat on every memory kind the machine has.
"""

from __future__ import annotations

import random
import threading

import pytest

import gpukeeper
from gpukeeper import AllocationError, GpuError, MemoryPool, PoolStats, Precision

ALIGN = 256
MiB = 1 << 20


def round_up(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


# ------------------------------------------------------------------ construction


def test_auto_kind_follows_cuda_availability():
    pool = MemoryPool()
    assert pool.kind == ("device" if gpukeeper.cuda_available() else "host")
    assert MemoryPool("host").kind == "host"
    assert MemoryPool("host").device_count == 1


def test_new_pool_is_empty(pool):
    assert pool.devices() == []
    stats = pool.stats(0)
    assert isinstance(stats, PoolStats)
    assert stats.allocated_bytes == 0
    assert stats.reserved_bytes == 0
    assert stats.segment_count == 0
    assert stats.cache_hits == 0 and stats.cache_misses == 0
    assert stats.fragmentation == 0.0
    assert pool.devices() == [0]
    assert pool.memory_usage(0) == (0, 0)
    assert pool.total_memory_usage() == (0, 0)
    assert "MemoryPool(kind=" in repr(pool)


def test_pools_are_independent(pools):
    a, b = pools(), pools()
    with a.get_managed_buffer(0, 1000, Precision.Fp32):
        assert a.stats(0).allocated_bytes == round_up(4000)
        assert b.memory_usage(0) == (0, 0)


# ------------------------------------------------------------------ allocation and stats


def test_allocation_is_aligned_and_counted(any_pool, balanced):
    pool = any_pool
    sizes = [1, 3, 255, 256, 257, 1000, 4096, 12345]
    bufs = [pool.get_managed_buffer(0, n, Precision.Uint8) for n in sizes]
    for buf in bufs:
        assert buf.ptr % ALIGN == 0
    stats = pool.stats(0)
    assert stats.allocated_count == len(sizes)
    assert stats.requested_bytes == sum(sizes)
    assert stats.allocated_bytes == sum(round_up(n) for n in sizes)
    assert stats.peak_allocated_bytes == stats.allocated_bytes
    assert stats.cached_bytes == stats.reserved_bytes - stats.allocated_bytes
    assert pool.memory_usage(0) == (stats.allocated_bytes, stats.peak_allocated_bytes)
    balanced(pool, stats.allocated_bytes)
    for buf in bufs:
        buf.release()
    balanced(pool)
    assert pool.stats(0).peak_allocated_bytes == sum(round_up(n) for n in sizes)


def test_size_counts_elements_of_the_precision(pool):
    for prec, itemsize in [
        (Precision.Fp64, 8),
        (Precision.Fp32, 4),
        (Precision.Fp16, 2),
        (Precision.Bf16, 2),
        (Precision.Int64, 8),
        (Precision.Int32, 4),
        (Precision.Int16, 2),
        (Precision.Int8, 1),
        (Precision.Uint8, 1),
        (Precision.Bool, 1),
    ]:
        assert prec.itemsize == itemsize
        with pool.get_managed_buffer(0, 1000, prec) as buf:
            assert buf.nbytes == 1000 * itemsize
            assert buf.size == len(buf) == 1000
            assert buf.precision == prec
            assert pool.stats(0).requested_bytes == 1000 * itemsize


def test_default_precision_is_fp32(pool):
    with pool.get_managed_buffer(0, 10) as buf:
        assert buf.precision == Precision.Fp32
        assert buf.nbytes == 40


def test_precision_aliases(pool):
    assert Precision.parse("fp32") == Precision.Fp32
    assert Precision.parse("float32") == Precision.Fp32
    assert Precision.parse("FP16") == Precision.Fp16
    assert Precision.parse("half") == Precision.Fp16
    assert Precision.parse("bfloat16") == Precision.Bf16
    assert Precision.parse("torch.bfloat16") == Precision.Bf16
    assert Precision.parse(float) == Precision.Fp64
    assert Precision.parse(bool) == Precision.Bool
    assert Precision.Bf16.label == "bf16"
    np = pytest.importorskip("numpy")
    assert Precision.parse(np.float16) == Precision.Fp16
    assert Precision.parse(np.dtype("int16")) == Precision.Int16
    with pool.get_managed_buffer(0, 4, "float64") as buf:
        assert buf.precision == Precision.Fp64


def test_freed_block_is_reused(any_pool):
    pool = any_pool
    buf = pool.get_managed_buffer(0, 1024, Precision.Fp32)
    ptr = buf.ptr
    misses = pool.stats(0).cache_misses
    buf.release()
    again = pool.get_managed_buffer(0, 1024, Precision.Fp32)
    assert again.ptr == ptr
    stats = pool.stats(0)
    assert stats.cache_misses == misses
    assert stats.cache_hits >= 1
    assert stats.upstream_allocations == 1
    again.release()


def test_hits_and_misses(pool):
    first = pool.get_managed_buffer(0, 64, Precision.Fp32)
    assert (pool.stats(0).cache_hits, pool.stats(0).cache_misses) == (0, 1)
    second = pool.get_managed_buffer(0, 64, Precision.Fp32)  # carved from the same segment
    assert (pool.stats(0).cache_hits, pool.stats(0).cache_misses) == (1, 1)
    assert pool.stats(0).segment_count == 1
    first.release()
    second.release()


def test_small_requests_share_a_segment(pool):
    bufs = [pool.get_managed_buffer(0, 1024, Precision.Uint8) for _ in range(20)]
    stats = pool.stats(0)
    assert stats.segment_count == 1
    assert stats.upstream_allocations == 1
    assert stats.reserved_bytes >= 20 * 1024
    for b in bufs:
        b.release()


def test_live_blocks_never_overlap(pool):
    rng = random.Random(1)
    live = []
    for _ in range(300):
        if live and rng.random() < 0.4:
            live.pop(rng.randrange(len(live))).release()
        else:
            n = rng.choice([1, 100, 256, 4000, 70000, 1 << 20, 3 << 20])
            live.append(pool.get_managed_buffer(0, n, Precision.Uint8))
        spans = sorted((b.ptr, b.ptr + b.nbytes) for b in live)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start, "two live buffers overlap"
    assert pool.validate(0) == ""
    for b in live:
        b.release()


def test_freed_neighbours_are_merged(pool, balanced):
    # Eight 256 KiB blocks fill one 2 MiB small-request segment exactly.
    quarter = 256 << 10
    bufs = [pool.get_managed_buffer(0, quarter, Precision.Uint8) for _ in range(8)]
    base = bufs[0].ptr
    assert [b.ptr - base for b in bufs] == [i * quarter for i in range(8)]  # carved in order
    stats = pool.stats(0)
    assert (stats.segment_count, stats.upstream_allocations, stats.cached_bytes) == (1, 1, 0)
    bufs[0].release()
    bufs[2].release()
    holes = pool.stats(0)
    assert holes.cached_bytes == 2 * quarter
    assert holes.largest_free_block == quarter
    assert holes.fragmentation == pytest.approx(0.5)
    for b in bufs:
        b.release()
    # Merging may be lazy, but a request bigger than any one freed piece must be served
    # from the same segment, by joining its free neighbours.
    big = pool.get_managed_buffer(0, 4 * quarter, Precision.Uint8)
    assert base <= big.ptr and big.ptr + big.nbytes <= base + 8 * quarter
    stats = pool.stats(0)
    assert (stats.segment_count, stats.upstream_allocations) == (1, 1)
    assert stats.cache_misses == 1
    big.release()
    # And the whole segment is free again: it goes back in one piece.
    assert pool.emergency_cleanup(0) == 8 * quarter
    balanced(pool)


def test_largest_free_block(pool):
    with pool.get_managed_buffer(0, 256, Precision.Uint8):
        stats = pool.stats(0)
        assert stats.largest_free_block == stats.reserved_bytes - 256
        assert stats.cached_bytes == stats.reserved_bytes - 256
        assert stats.fragmentation == 0.0
    stats = pool.stats(0)
    assert stats.cached_bytes == stats.reserved_bytes
    # The freed block may wait to be merged with its free neighbour.
    assert stats.largest_free_block in (stats.reserved_bytes - 256, stats.reserved_bytes)


def test_peaks_and_reset(pool):
    big = pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8)
    big.release()
    small = pool.get_managed_buffer(0, 1000, Precision.Uint8)
    stats = pool.stats(0)
    assert stats.peak_allocated_bytes == 3 * MiB
    assert stats.peak_reserved_bytes >= stats.reserved_bytes
    pool.reset_peaks(0)
    stats = pool.stats(0)
    assert stats.peak_allocated_bytes == stats.allocated_bytes == round_up(1000)
    assert stats.peak_reserved_bytes == stats.reserved_bytes
    assert pool.memory_usage(0) == (round_up(1000), round_up(1000))
    small.release()


def test_stats_dict_and_items(pool):
    with pool.get_managed_buffer(0, 10, Precision.Fp32):
        stats = pool.stats(0)
        d = stats.to_dict()
        for key in (
            "allocated_bytes",
            "reserved_bytes",
            "peak_allocated_bytes",
            "cache_hits",
            "cache_misses",
            "segment_count",
            "largest_free_block",
            "fragmentation",
            "callback_errors",
            "oom_events",
        ):
            assert d[key] == getattr(stats, key) == stats[key]
        with pytest.raises(KeyError):
            stats["no_such_counter"]
        assert "allocated=256" in repr(stats)


def test_garbage_buffer_returns_its_block(pool):
    buf = pool.get_managed_buffer(0, 100, Precision.Fp32)
    assert pool.stats(0).allocated_count == 1
    del buf
    assert pool.stats(0).allocated_count == 0


def test_buffer_outlives_its_pool_object():
    pool = MemoryPool("host")
    buf = pool.get_managed_buffer(0, 100, Precision.Fp32)
    del pool
    import gc

    gc.collect()
    buf.copy_from_host(bytes(400))
    assert buf.to_bytes() == bytes(400)
    buf.release()


# ------------------------------------------------------------------ usage across devices


def test_total_memory_usage_sums_devices(pool):
    with pool.get_managed_buffer(0, 1000, Precision.Fp32):
        alloc, peak = pool.total_memory_usage()
        assert alloc == round_up(4000) == pool.memory_usage(0)[0]
        assert peak >= alloc
    assert pool.total_memory_usage() == (0, round_up(4000))


def test_unknown_device_queries_give_none(pool):
    assert pool.memory_pressure(99) is None
    assert pool.memory_usage(99) is None
    assert pool.stats(99) is None
    assert pool.emergency_cleanup(99) == 0
    assert pool.devices() == []


# ------------------------------------------------------------------ releasing cache


def test_emergency_cleanup_returns_everything_cached(any_pool, balanced):
    pool = any_pool
    bufs = [pool.get_managed_buffer(0, n, Precision.Uint8) for n in (100, 5000, 3 * MiB, 12 * MiB)]
    for b in bufs:
        b.release()
    before = pool.stats(0)
    assert before.reserved_bytes > 0 and before.allocated_bytes == 0
    # What goes back to the upstream: each fixed segment, and each page of a range.
    handed_back = sum(seg.mapped_bytes // (2 * MiB) if seg.expandable else 1
                      for seg in pool.snapshot(0))
    released = pool.emergency_cleanup(0)
    assert released == before.reserved_bytes
    after = pool.stats(0)
    assert after.reserved_bytes == 0
    assert after.segment_count == 0
    assert after.upstream_frees == before.upstream_frees + handed_back
    balanced(pool)


def test_emergency_cleanup_keeps_live_blocks(pool):
    keep = pool.get_managed_buffer(0, 100, Precision.Fp32)
    drop = pool.get_managed_buffer(0, 12 * MiB, Precision.Uint8)
    keep.copy_from_host(bytes(range(256)) + bytes(144))
    drop.release()
    assert pool.emergency_cleanup(0) == 12 * MiB
    stats = pool.stats(0)
    assert stats.segment_count == 1  # the segment holding `keep` stays
    assert stats.allocated_bytes == round_up(400)
    assert keep.to_bytes() == bytes(range(256)) + bytes(144)
    keep.release()
    assert pool.emergency_cleanup(0) > 0
    assert pool.stats(0).reserved_bytes == 0


def test_emergency_cleanup_all(pool):
    pool.get_managed_buffer(0, 1000, Precision.Fp32).release()
    reserved = pool.stats(0).reserved_bytes
    assert reserved > 0
    assert pool.emergency_cleanup_all() == reserved
    assert pool.stats(0).reserved_bytes == 0
    assert pool.emergency_cleanup_all() == 0


def test_trim_keeps_at_most_the_given_bytes(fixed_pool):
    pool = fixed_pool
    a = pool.get_managed_buffer(0, 12 * MiB, Precision.Uint8)
    b = pool.get_managed_buffer(0, 12 * MiB, Precision.Uint8)
    assert pool.stats(0).segment_count == 2
    a.release()
    b.release()
    assert pool.trim(0, 30 * MiB) == 0  # already below
    assert pool.trim(0, 16 * MiB) == 12 * MiB
    assert pool.stats(0).reserved_bytes == 12 * MiB
    assert pool.stats(0).segment_count == 1
    assert pool.trim(0) == 12 * MiB
    assert pool.stats(0).reserved_bytes == 0


# ------------------------------------------------------------------ limits


def test_set_max_pool_size_and_allocation_error(pool, balanced):
    pool.set_max_pool_size(0, 4 * MiB)
    assert pool.max_pool_size(0) == 4 * MiB
    assert pool.stats(0).limit_bytes == 4 * MiB
    with pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8):
        assert pool.stats(0).reserved_bytes <= 4 * MiB
        with pytest.raises(AllocationError) as info:
            pool.get_managed_buffer(0, 5 * MiB, Precision.Uint8)
        message = str(info.value)
        assert str(5 * MiB) in message  # requested bytes
        assert "limit 4.0 MiB" in message
        assert "allocated" in message and "reserved" in message
        assert "largest free block" in message
        assert isinstance(info.value, MemoryError)
        assert isinstance(info.value, GpuError)
        balanced(pool, 3 * MiB)
    assert pool.stats(0).oom_events >= 1


def test_limit_counts_reserved_not_allocated(pool):
    pool.set_max_pool_size(0, 4 * MiB)
    a = pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8)
    with pytest.raises(AllocationError):
        pool.get_managed_buffer(0, 2 * MiB, Precision.Uint8)  # 3 + 2 > 4 MiB
    a.release()
    # The cached 3 MiB block serves 2 MiB without growing.
    with pool.get_managed_buffer(0, 2 * MiB, Precision.Uint8):
        assert pool.stats(0).reserved_bytes <= 4 * MiB


def test_limit_releases_cache_before_failing(fixed_pool):
    pool = fixed_pool
    pool.set_max_pool_size(0, 4 * MiB)
    calls = []
    pool.add_reclaim_callback(0, lambda n: calls.append(n))
    pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8).release()
    assert pool.stats(0).reserved_bytes == 3 * MiB
    # 3.5 MiB does not fit the cached 3 MiB block, and 3 + 3.5 > 4: the pool drops its
    # cache and grows again, without asking the reclaim callbacks.
    with pool.get_managed_buffer(0, 3 * MiB + MiB // 2, Precision.Uint8):
        stats = pool.stats(0)
        assert stats.reserved_bytes == 3 * MiB + MiB // 2
        assert stats.upstream_frees == 1
        assert stats.oom_events == 1
    assert calls == []


def test_lowering_the_limit_releases_cache(pool):
    bufs = [pool.get_managed_buffer(0, 12 * MiB, Precision.Uint8) for _ in range(2)]
    for b in bufs:
        b.release()
    assert pool.stats(0).reserved_bytes == 24 * MiB
    pool.set_max_pool_size(0, 16 * MiB)
    assert pool.stats(0).reserved_bytes <= 16 * MiB
    pool.set_max_pool_size(0, 0)  # no limit
    assert pool.max_pool_size(0) == 0
    with pool.get_managed_buffer(0, 20 * MiB, Precision.Uint8):
        pass


def test_limit_below_usage_is_refused(pool, balanced):
    pool.set_max_pool_size(0, 8 * MiB)
    with pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8):
        with pytest.raises(gpukeeper.InvalidInputError, match="below"):
            pool.set_max_pool_size(0, 1 * MiB)
        assert pool.max_pool_size(0) == 8 * MiB  # unchanged
        balanced(pool, 3 * MiB)


# ------------------------------------------------------------------ pressure


def test_memory_pressure_is_reserved_over_limit(pool):
    pool.set_max_pool_size(0, 8 * MiB)
    assert pool.memory_pressure(0) == 0.0
    with pool.get_managed_buffer(0, 2 * MiB, Precision.Uint8):
        stats = pool.stats(0)
        assert pool.memory_pressure(0) == pytest.approx(stats.reserved_bytes / (8 * MiB))
        assert 0.0 < pool.memory_pressure(0) <= 1.0
    pool.emergency_cleanup(0)
    assert pool.memory_pressure(0) == 0.0


def test_memory_pressure_without_limit_is_a_fraction(pool):
    p = pool.memory_pressure(0)
    assert isinstance(p, float)
    assert 0.0 <= p <= 1.0


# ------------------------------------------------------------------ watermarks


def test_watermark_fires_once_on_crossing_and_rearms(fixed_pool):
    pool = fixed_pool
    seen = []
    wid = pool.add_watermark(0, 0.5, seen.append)
    pool.set_max_pool_size(0, 8 * MiB)
    small = pool.get_managed_buffer(0, 100, Precision.Fp32)  # 2 MiB segment: 0.25
    assert seen == []
    a = pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8)  # 5 MiB: 0.625
    assert seen == [pytest.approx(5 / 8)]
    b = pool.get_managed_buffer(0, 2 * MiB, Precision.Uint8)  # 7 MiB: still above
    assert len(seen) == 1
    a.release()
    b.release()
    pool.emergency_cleanup(0)  # back to 0.25: re-armed
    assert len(seen) == 1
    a = pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8)
    assert len(seen) == 2
    assert pool.remove_watermark(0, wid) is True
    assert pool.remove_watermark(0, wid) is False
    a.release()
    pool.emergency_cleanup(0)
    a = pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8)
    assert len(seen) == 2  # removed
    a.release()
    small.release()


def test_watermark_callback_may_use_the_pool(fixed_pool):
    pool = fixed_pool
    seen = []

    def on_high(pressure):
        seen.append((pressure, pool.stats(0).reserved_bytes))

    pool.add_watermark(0, 0.5, on_high)
    pool.set_max_pool_size(0, 4 * MiB)
    with pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8):
        assert seen == [(pytest.approx(0.75), 3 * MiB)]


def test_two_watermarks(fixed_pool):
    pool = fixed_pool
    warn, clean = [], []
    pool.add_watermark(0, 0.8, warn.append)
    pool.add_watermark(0, 0.9, clean.append)
    pool.set_max_pool_size(0, 10 * MiB)
    a = pool.get_managed_buffer(0, 8 * MiB + MiB // 2, Precision.Uint8)  # 0.85
    assert warn == [pytest.approx(0.85)] and clean == []
    # A small request whose usual 2 MiB segment would pass the limit gets one of its own
    # size: 9.25 MiB reserved, 0.925.
    b = pool.get_managed_buffer(0, 3 * MiB // 4, Precision.Uint8)
    assert pool.stats(0).reserved_bytes == 8 * MiB + 3 * MiB // 2 - MiB // 4
    assert len(warn) == 1 and clean == [pytest.approx(0.925)]
    a.release()
    b.release()


def test_watermark_callback_error_is_counted(pool, unraisable):
    def boom(pressure):
        raise RuntimeError("watermark boom")

    pool.add_watermark(0, 0.5, boom)
    pool.set_max_pool_size(0, 4 * MiB)
    with pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8) as buf:
        assert buf.nbytes == 3 * MiB  # the allocation itself succeeded
    assert pool.stats(0).callback_errors == 1
    assert len(unraisable) == 1
    assert isinstance(unraisable[0].exc_value, RuntimeError)


def test_watermark_level_must_be_in_range(pool):
    for level in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(gpukeeper.InvalidInputError):
            pool.add_watermark(0, level, print)
    with pytest.raises(gpukeeper.InvalidInputError):
        pool.add_watermark(0, 0.5, "not callable")


# ------------------------------------------------------------------ reclaim callbacks


def test_reclaim_callback_frees_memory_and_retry_succeeds(pool, balanced):
    pool.set_max_pool_size(0, 4 * MiB)
    held = [pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8)]
    old_ptr = held[0].ptr
    calls = []

    def reclaim(needed):
        calls.append(needed)
        held.pop().release()
        return 3 * MiB

    cid = pool.add_reclaim_callback(0, reclaim)
    buf = pool.get_managed_buffer(0, 2 * MiB, Precision.Uint8)
    assert calls == [2 * MiB]
    assert buf.ptr == old_ptr  # the released block served the retry
    balanced(pool, 2 * MiB)
    buf.release()
    assert pool.remove_reclaim_callback(0, cid) is True
    assert pool.remove_reclaim_callback(0, cid) is False


def test_reclaim_callback_that_raises_is_counted(pool, balanced, unraisable):
    pool.set_max_pool_size(0, 4 * MiB)
    held = [pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8)]

    def broken(needed):
        raise RuntimeError("reclaim boom")

    def good(needed):
        if held:
            held.pop().release()
        return None

    pool.add_reclaim_callback(0, broken)
    pool.add_reclaim_callback(0, good)
    with pool.get_managed_buffer(0, 2 * MiB, Precision.Uint8):
        assert pool.stats(0).callback_errors == 1
    assert len(unraisable) == 1
    assert isinstance(unraisable[0].exc_value, RuntimeError)
    balanced(pool)


def test_only_a_failing_reclaim_callback_gives_allocation_error(pool, balanced, unraisable):
    pool.set_max_pool_size(0, 4 * MiB)
    pool.add_reclaim_callback(0, lambda n: 1 / 0)
    with pool.get_managed_buffer(0, 3 * MiB, Precision.Uint8):
        with pytest.raises(AllocationError):
            pool.get_managed_buffer(0, 2 * MiB, Precision.Uint8)
        assert pool.stats(0).callback_errors == 1
        balanced(pool, 3 * MiB)
    assert isinstance(unraisable[0].exc_value, ZeroDivisionError)


def test_reclaim_callback_must_be_callable(pool):
    with pytest.raises(gpukeeper.InvalidInputError):
        pool.add_reclaim_callback(0, 42)


# ------------------------------------------------------------------ threads


def test_threads_allocate_and_release_concurrently(pool, balanced):
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        live = []
        try:
            for i in range(150):
                if live and rng.random() < 0.5:
                    buf, tag = live.pop(rng.randrange(len(live)))
                    assert buf.to_bytes()[:8] == tag
                    buf.release()
                else:
                    n = rng.choice([8, 256, 3000, 70000, 600000])
                    buf = pool.get_managed_buffer(0, n, Precision.Uint8)
                    tag = bytes([seed, i % 256]) * 4
                    buf.copy_from_host(tag)
                    live.append((buf, tag))
            for buf, tag in live:
                assert buf.to_bytes()[:8] == tag  # nobody else wrote into it
                buf.release()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    balanced(pool)
    assert pool.emergency_cleanup(0) > 0
    assert pool.stats(0).reserved_bytes == 0


def test_threads_share_one_buffer_view(host_pool, balanced):
    np = pytest.importorskip("numpy")
    with host_pool.get_managed_buffer(0, 4096, Precision.Int32) as buf:
        arr = np.asarray(buf)
        arr[:] = 0

        def fill(k):
            arr[k::4] = k + 1

        threads = [threading.Thread(target=fill, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert np.frombuffer(buf.to_bytes(), dtype=np.int32).tolist() == [1, 2, 3, 4] * 1024
        del arr
    balanced(host_pool)


@pytest.mark.gpu
def test_cuda_kinds_all_allocate(pools):
    for kind in ("device", "async", "pinned"):
        pool = pools(kind)
        assert pool.kind == kind
        with pool.get_managed_buffer(0, 1000, Precision.Fp32) as buf:
            buf.copy_from_host(bytes(range(256)) * 15 + bytes(160))
            assert buf.to_bytes() == bytes(range(256)) * 15 + bytes(160)
            assert buf.kind == kind
        assert pool.emergency_cleanup(0) > 0
