"""Expandable segments: pages follow allocated memory, data survives page moves."""

import random

import pytest

import gpukeeper
from gpukeeper import AllocationError, InvalidInputError, MemoryPool, Precision

MiB = 1 << 20


def replay(pool, seed, steps=1500):
    """Random alloc/free with sizes that change every step; returns peak requested bytes.

    Every live buffer carries its own byte pattern, checked when it is freed, so a page
    moved from under a live block would be caught.
    """
    rng = random.Random(seed)
    live = []
    requested = peak = 0
    for step in range(steps):
        if live and rng.random() < 0.5:
            buf, mark = live.pop(rng.randrange(len(live)))
            head = buf.to_bytes()[:64]
            assert head == bytes([mark]) * min(64, buf.nbytes)
            requested -= buf.nbytes
            buf.release()
            continue
        n = rng.choice([rng.randint(1, 4096), rng.randint(64 << 10, 4 * MiB),
                        rng.randint(4 * MiB, 24 * MiB)])
        buf = pool.get_managed_buffer(0, n, Precision.Uint8)
        mark = step % 251
        buf.copy_from_host(bytes([mark]) * min(64, n))
        live.append((buf, mark))
        requested += n
        peak = max(peak, requested)
    for buf, mark in live:
        assert buf.to_bytes()[:1] == bytes([mark])
        buf.release()
    return peak


def test_expandable_holds_less_than_fixed_segments_and_balances():
    fixed = MemoryPool("host", expandable=False)
    expandable = MemoryPool("host", expandable=True)
    assert expandable.expandable is True and fixed.expandable is False
    peak_fixed = replay(fixed, seed=7)
    peak_exp = replay(expandable, seed=7)
    assert peak_fixed == peak_exp
    ratio_fixed = fixed.stats(0).peak_reserved_bytes / peak_fixed
    ratio_exp = expandable.stats(0).peak_reserved_bytes / peak_exp
    assert ratio_exp < ratio_fixed
    assert ratio_exp < 1.15
    stats = expandable.stats(0)
    assert stats.pages_moved > 0  # pages were moved rather than made
    assert expandable.validate(0) == ""
    assert stats.allocated_bytes == 0
    assert expandable.emergency_cleanup(0) > 0
    stats = expandable.stats(0)
    assert stats.reserved_bytes == 0 and stats.segment_count == 0


def test_expandable_reuses_pages_under_a_limit():
    pool = MemoryPool("host", expandable=True)
    pool.set_max_pool_size(0, 64 * MiB)
    a = pool.get_managed_buffer(0, 30 * MiB, Precision.Uint8)
    b = pool.get_managed_buffer(0, 30 * MiB, Precision.Uint8)
    a.release()
    # 34 MiB does not fit the 30 MiB hole; its pages come from the freed block instead.
    c = pool.get_managed_buffer(0, 34 * MiB, Precision.Uint8)
    assert pool.stats(0).reserved_bytes <= 64 * MiB
    with pytest.raises(AllocationError):
        pool.get_managed_buffer(0, 40 * MiB, Precision.Uint8)
    assert pool.validate(0) == ""
    b.release()
    c.release()
    assert pool.stats(0).allocated_bytes == 0


def test_expandable_small_blocks_share_pages():
    pool = MemoryPool("host", expandable=True)
    bufs = [pool.get_managed_buffer(0, 256, Precision.Fp32) for _ in range(100)]
    assert pool.stats(0).reserved_bytes == 2 * MiB  # 100 KiB of blocks on one page
    for buf in bufs:
        buf.release()
    assert pool.validate(0) == ""


def test_hybrid_layout_keeps_small_blocks_in_fixed_segments_and_data_intact():
    pool = MemoryPool("host", expandable="hybrid")
    assert pool.expandable == "hybrid" and "expandable='hybrid'" in repr(pool)
    peak = replay(pool, seed=11)
    layouts = {(seg.small, seg.expandable) for seg in pool.snapshot(0)}
    assert layouts <= {(True, False), (False, True)}  # small fixed, large expandable
    assert (False, True) in layouts
    assert pool.stats(0).peak_reserved_bytes / peak < 1.15
    assert pool.validate(0) == ""
    assert pool.stats(0).allocated_bytes == 0
    pool.emergency_cleanup(0)
    assert pool.stats(0).reserved_bytes == 0


@pytest.mark.parametrize("bad", ["small", "yes", "Auto", "automatic", 1, 0, None, 1.0])
def test_expandable_takes_auto_true_false_or_hybrid(bad):
    with pytest.raises(InvalidInputError, match="expandable must be 'auto', True, False") as exc:
        MemoryPool("host", expandable=bad)
    assert "'hybrid'" in str(exc.value) and f"got {bad!r}" in str(exc.value)
    assert "'fixed', 'expandable'" in str(exc.value)


@pytest.mark.parametrize("word, value", [("fixed", False), ("expandable", True), ("auto", "auto")])
def test_the_c_plus_plus_words_name_the_same_layouts(word, value):
    pool = MemoryPool("host", expandable=word)
    assert pool.expandable == value  # the property gives the one value for the layout


def test_the_former_word_large_warns_and_means_hybrid():
    with pytest.warns(DeprecationWarning, match="expandable='large' is now expandable='hybrid'"):
        pool = MemoryPool("host", expandable="large")
    assert pool.expandable == "hybrid"


def layouts_of(pool):
    """(small, expandable) of each segment of device 0's pool."""
    return {(seg.small, seg.expandable) for seg in pool.snapshot(0)}


@pytest.mark.parametrize("kind", ["host", "pinned", "async"])
def test_default_layout_is_fixed_where_pages_cannot_help(kind):
    if kind != "host" and not gpukeeper.cuda_available():
        pytest.skip("needs a CUDA device")
    pool = MemoryPool(kind)
    assert pool.expandable == "auto" and "expandable" not in repr(pool)
    with pool.get_managed_buffer(0, 5 * MiB, Precision.Uint8), \
            pool.get_managed_buffer(0, 4096, Precision.Uint8):
        assert all(not expandable for _, expandable in layouts_of(pool))


@pytest.mark.skipif(not gpukeeper.cuda_available(), reason="needs a CUDA device")
def test_default_device_pool_is_hybrid():
    """Large requests in an expandable range, small ones in fixed segments."""
    pool = MemoryPool("device")
    assert pool.expandable == "auto"
    with pool.get_managed_buffer(0, 5 * MiB, Precision.Uint8) as big, \
            pool.get_managed_buffer(0, 4096, Precision.Uint8):
        assert layouts_of(pool) == {(True, False), (False, True)}
        big.copy_from_host(bytes(range(256)) * (5 * MiB // 256))
        assert big.to_bytes()[:512] == bytes(range(256)) * 2
    peak = replay(pool, seed=5, steps=600)
    assert pool.stats(0).peak_reserved_bytes / peak < 1.15
    assert pool.validate(0) == ""
    assert pool.emergency_cleanup(0) > 0
    assert pool.stats(0).reserved_bytes == 0


@pytest.mark.parametrize("kind", ["pinned", "async"])
def test_expandable_needs_device_or_host_memory(kind):
    with pytest.raises(InvalidInputError):
        MemoryPool(kind, expandable=True)


@pytest.mark.skipif(not gpukeeper.cuda_available(), reason="needs a CUDA device")
def test_expandable_device_pool_with_torch():
    torch = pytest.importorskip("torch")
    pool = MemoryPool("device", expandable=True)
    peak = replay(pool, seed=3, steps=600)
    stats = pool.stats(0)
    assert stats.peak_reserved_bytes / peak < 1.15
    assert pool.validate(0) == ""
    with pool.get_managed_buffer(0, 3 * MiB, Precision.Fp32) as buf:
        t = torch.from_dlpack(buf)
        t.copy_(torch.arange(t.numel(), device="cuda", dtype=torch.float32))
        assert float(t.sum()) == pytest.approx(t.numel() * (t.numel() - 1) / 2, rel=1e-6)
        del t  # the DLPack view holds the block until it is gone
    pool.emergency_cleanup(0)
    assert pool.stats(0).reserved_bytes == 0
