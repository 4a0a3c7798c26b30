"""The migration guide's API: get_gpu_memory_manager() and the FAISS helpers."""

from __future__ import annotations

import logging
import math
import sys
import threading
from fractions import Fraction

import pytest
from torch_cuda import torch_cuda

import gpukeeper
from gpukeeper import _core, frameworks
from gpukeeper.account import memory_manager as manager
from gpukeeper.base.errors import GpuError, InvalidInputError
from gpukeeper.account.memory_manager import (
    FaissUnavailableError,
    GPUMemoryManager,
    calculate_faiss_temp_memory,
    create_faiss_gpu_resources,
    create_faiss_index,
    get_gpu_memory_manager,
)

CUDA = gpukeeper.cuda_available()
MiB = 1 << 20
GiB = 1 << 30
gpu = pytest.mark.skipif(not CUDA, reason=f"no usable CUDA device: {CUDA.reason}")


# --------------------------------------------------------------------- the manager


def test_one_manager_per_device():
    m = get_gpu_memory_manager()
    assert get_gpu_memory_manager() is m
    assert get_gpu_memory_manager(None) is m
    assert get_gpu_memory_manager("cpu") is get_gpu_memory_manager("cpu")
    assert isinstance(m, GPUMemoryManager)


def test_creation_is_thread_safe(monkeypatch):
    monkeypatch.setattr(manager, "_managers", {})
    barrier = threading.Barrier(16)
    got = []

    def worker():
        barrier.wait()
        got.append(get_gpu_memory_manager())

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 16 and all(m is got[0] for m in got)
    assert len(manager._managers) == 1


def test_memory_info_is_consistent():
    m = get_gpu_memory_manager()
    used, available, total = m.get_memory_info()
    assert total > 0 and 0 < available <= total and used >= 0
    assert used + available == pytest.approx(total, abs=1e-9)
    # Separate calls may see the memory move a little, never a different scale.
    assert m.get_total_memory() == pytest.approx(total, rel=1e-6)
    assert m.get_available_memory() == pytest.approx(available, abs=0.5)
    assert m.get_used_memory() == pytest.approx(used, abs=0.5)


def test_host_manager_reports_host_memory():
    m = get_gpu_memory_manager("cpu")
    assert m.cpu_mode and m.device is None
    assert m.get_total_memory() == pytest.approx(_core.host_memory_info()[1] / GiB)
    text = str(m)
    assert text.startswith("CPU mode") and "GB used" in text and "GB total" in text
    assert "allocate() is False" in text and m.reason and m.reason in text
    assert repr(m) == "GPUMemoryManager(device='cpu')"
    assert m.report().mode == "cpu"


@pytest.mark.skipif(bool(CUDA), reason="checks the CPU mode of a machine without CUDA")
def test_without_cuda_the_default_manager_is_cpu_mode():
    m = get_gpu_memory_manager()
    assert m.cpu_mode and m is get_gpu_memory_manager("cpu")
    with pytest.raises(InvalidInputError, match="CUDA is unusable"):
        get_gpu_memory_manager(0)  # a named GPU that is not there is an error, not the host
    assert "CUDA unavailable" in str(m)
    assert m.reason.startswith("CUDA unavailable") and m.reason == m.cpu_reason


@pytest.mark.skipif(bool(CUDA), reason="checks the CPU mode of a machine without CUDA")
def test_migration_guide_fallback_takes_the_cpu_path_without_a_gpu():
    gpu_mem = get_gpu_memory_manager()
    ran = []
    for required_gb in (0, 0.1, 1e-9):
        if gpu_mem.allocate(size_gb=required_gb):
            ran.append("gpu_process")
        else:
            ran.append("cpu_process")
    assert ran == ["cpu_process"] * 3
    assert gpu_mem.reason and gpu_mem.reason in str(gpu_mem)


def test_cpu_mode_allocate_is_false_whatever_the_size_and_says_why():
    m = GPUMemoryManager(None, "no driver on this host")
    for size in (0, 0.1, Fraction(1, 100), 10_000, math.inf):
        assert m.allocate(size) is False
    assert m.reason == "no driver on this host"
    assert "no usable GPU (no driver on this host)" in str(m)
    assert GPUMemoryManager(None).reason == "no usable CUDA device"
    with pytest.raises(InvalidInputError):
        m.allocate(-1)  # bad input is still an error, not a quiet False


def test_a_usable_gpu_has_no_reason():
    assert GPUMemoryManager(0).reason == ""


def test_allocate_small_and_huge():
    m = get_gpu_memory_manager()
    expected = not m.cpu_mode  # without a GPU every size is False
    assert m.allocate(0) is expected
    assert m.allocate(0.1) is expected
    assert m.allocate(Fraction(1, 100)) is expected
    assert m.allocate(10_000) is False
    assert m.allocate(999_999) is False
    assert m.allocate(math.inf) is False


def test_host_allocate_small_and_huge():
    m = get_gpu_memory_manager()
    assert m.host_allocate(0) is True
    assert m.host_allocate(0.1) is True
    assert m.host_allocate(Fraction(1, 100)) is True
    assert m.host_allocate(999_999) is False
    assert m.host_allocate(math.inf) is False


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, "1", None, True, [1], 1j])
def test_allocate_rejects_bad_sizes(bad):
    with pytest.raises(InvalidInputError):
        get_gpu_memory_manager().allocate(bad)
    with pytest.raises(InvalidInputError):
        get_gpu_memory_manager().host_allocate(bad)
    with pytest.raises(InvalidInputError):
        GPUMemoryManager(None, "cpu").allocate(bad)


def test_host_allocate_releases_only_host_pools_when_needed(monkeypatch, pools):
    pool = pools("host")
    pool.get_managed_buffer(0, 8 * MiB, "uint8").release()
    assert pool.stats(0).reserved_bytes >= 8 * MiB
    state = {"free": 1 * GiB}
    monkeypatch.setattr(manager, "_host_free_total", lambda: (state["free"], 10 * GiB))
    device_releases = []
    monkeypatch.setattr(frameworks, "release_all_caches", lambda d=None: device_releases.append(d) or {})
    m = GPUMemoryManager(0)
    assert m.host_allocate(0.5) is True and pool.stats(0).reserved_bytes >= 8 * MiB  # fits
    assert m.host_allocate(20) is False and pool.stats(0).reserved_bytes >= 8 * MiB  # above total
    assert m.host_allocate(3) is False  # short even after releasing the host pool's cache
    assert pool.stats(0).reserved_bytes == 0
    assert device_releases == []  # a host question never empties the GPU's caches


def test_allocate_releases_caches_only_when_needed(monkeypatch):
    m = GPUMemoryManager(0)  # figures and release stood in below: no device is touched
    state = {"free": 1 * GiB, "released": 0}

    def free_total():
        return state["free"], 10 * GiB

    def free_cache(collect=False):
        state["released"] += 1
        state["free"] = 5 * GiB
        return 4 * GiB

    monkeypatch.setattr(m, "_free_total", free_total)
    monkeypatch.setattr(m, "free_cache", free_cache)
    assert m.allocate(0.5) is True and state["released"] == 0  # fits: nothing released
    assert m.allocate(20) is False and state["released"] == 0  # above total: no release
    assert m.allocate(3) is True and state["released"] == 1  # fits after the release
    assert m.allocate(8) is False and state["released"] == 2  # still short after it


def test_free_cache_releases_a_host_pools_cache(pools):
    pool = pools("host")
    pool.get_managed_buffer(0, 8 * MiB, "uint8").release()
    cached = pool.stats(0).reserved_bytes
    assert cached >= 8 * MiB
    m = get_gpu_memory_manager("cpu")
    released = m.free_cache()
    assert released >= cached
    assert pool.stats(0).reserved_bytes == 0


def test_free_cache_never_raises(monkeypatch, caplog):
    def broken(device=None):
        raise RuntimeError("driver fell over")

    monkeypatch.setattr(frameworks, "release_all_caches", broken)
    with caplog.at_level(logging.WARNING, logger="gpukeeper"):
        assert get_gpu_memory_manager().free_cache() == 0
        assert get_gpu_memory_manager().free_cache(collect=True) == 0
    assert "driver fell over" in caplog.text


def test_bad_device_is_invalid_input():
    with pytest.raises(InvalidInputError):
        get_gpu_memory_manager(-1)
    with pytest.raises(InvalidInputError):
        get_gpu_memory_manager("tpu:0")


# --------------------------------------------------------------------- FAISS memory formula


def _expected(n, k, dims, queries=None, tile_target=GiB):
    """The docstring's formula, written out."""
    align = lambda b: -(-b // 256) * 256  # noqa: E731
    q = n if queries is None else queries
    preferred = 1024 if dims <= 32 else 512
    rows = min(preferred, q)
    cols = min(tile_target // 8 // preferred, n)
    tiles = -(-n // cols)
    page = min(q, (256 * MiB) // (4 * dims))
    return (
        2 * align(rows * cols * 4)
        + 2 * align(rows * tiles * k * 4)
        + 2 * align(rows * tiles * k * 8)
        + align(page * 4)
        + align(page * dims * 4)
        + align(page * k * 4)
        + align(page * k * 8)
    )


def test_faiss_temp_memory_formula():
    big = dict(total_bytes=141 * GiB, available_bytes=140 * GiB)
    # The migration guide's example: a million 3-D points, k = 30.
    got = calculate_faiss_temp_memory(1_000_000, 30, **big)
    assert got == _expected(1_000_000, 30, 3)
    assert 1.3 * GiB < got < 1.4 * GiB  # 1 GiB of tiles + 343 MiB of results
    # A small search needs only its own buffers.
    assert calculate_faiss_temp_memory(1000, 10, **big) == _expected(1000, 10, 3)
    assert calculate_faiss_temp_memory(5000, 8, dims=64, n_queries=100, **big) == _expected(
        5000, 8, 64, queries=100
    )


def test_faiss_temp_memory_caps():
    # StandardGpuResources never takes more than 1.5 GiB (GPU > 8 GiB) ...
    assert calculate_faiss_temp_memory(10_000_000, 100, total_bytes=80 * GiB, available_bytes=80 * GiB) == 1536 * MiB
    # ... 1 GiB on GPUs up to 8 GiB, 512 MiB up to 4 GiB, with smaller tiles there.
    assert calculate_faiss_temp_memory(10_000_000, 100, total_bytes=8 * GiB, available_bytes=8 * GiB) == GiB
    assert calculate_faiss_temp_memory(10_000_000, 1, total_bytes=4 * GiB, available_bytes=4 * GiB) == 512 * MiB
    mid_gpu = calculate_faiss_temp_memory(200_000, 10, total_bytes=8 * GiB, available_bytes=8 * GiB)
    assert mid_gpu == _expected(200_000, 10, 3, tile_target=768 * MiB) < GiB
    assert mid_gpu < calculate_faiss_temp_memory(200_000, 10, total_bytes=16 * GiB, available_bytes=16 * GiB)
    # ... and never more than max_fraction of what is available.
    assert calculate_faiss_temp_memory(1_000_000, 30, total_bytes=80 * GiB, available_bytes=2 * GiB) == GiB // 4 * 2
    assert calculate_faiss_temp_memory(
        1_000_000, 30, total_bytes=80 * GiB, available_bytes=2 * GiB, max_fraction=0.1
    ) == int(0.1 * 2 * GiB)


def test_faiss_temp_memory_grows_with_the_problem():
    big = dict(total_bytes=141 * GiB, available_bytes=140 * GiB)
    sizes = [calculate_faiss_temp_memory(n, 16, **big) for n in (100, 10_000, 100_000, 400_000)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    ks = [calculate_faiss_temp_memory(50_000, k, **big) for k in (1, 8, 64, 512)]
    assert ks == sorted(ks) and ks[0] < ks[-1]


def test_faiss_temp_memory_on_this_machine():
    temp = calculate_faiss_temp_memory(1_000_000, 30)  # the guide's call, as written
    assert temp > 0
    if not CUDA:  # documented: a GPU over 8 GiB, no availability cap
        assert temp == _expected(1_000_000, 30, 3)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((0, 30), {}),
        ((-5, 30), {}),
        ((1.5, 30), {}),
        ((100, 0), {}),
        ((100, 4096), {}),
        ((100, True), {}),
        ((100, 3), {"dims": 0}),
        ((100, 3), {"n_queries": 0}),
        ((100, 3), {"max_fraction": 0}),
        ((100, 3), {"max_fraction": 1.5}),
        (("100", 3), {}),
    ],
)
def test_faiss_temp_memory_bad_input(args, kwargs):
    with pytest.raises(InvalidInputError):
        calculate_faiss_temp_memory(*args, **kwargs)


# --------------------------------------------------------------------- FAISS objects


def test_faiss_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(FaissUnavailableError, match="faiss is not installed") as info:
        create_faiss_gpu_resources(n_points=1000, k=10)
    assert isinstance(info.value, GpuError) and isinstance(info.value, ImportError)
    with pytest.raises(ImportError):
        create_faiss_index(n_dims=3, n_points=1000)


def test_faiss_index_bad_input():
    with pytest.raises(InvalidInputError):
        create_faiss_index(n_dims=0, n_points=10)
    with pytest.raises(InvalidInputError):
        create_faiss_index(n_dims=3, n_points=10, metric="cosine")
    with pytest.raises(InvalidInputError):
        create_faiss_gpu_resources(n_points=10, k=3, device=-1)


def test_faiss_flat_index_searches_on_cpu():
    faiss = pytest.importorskip("faiss")
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    points = rng.random((2000, 3), dtype=np.float32)
    index, res = create_faiss_index(n_dims=3, n_points=len(points), use_gpu=False, approximate=True)
    assert res is None and isinstance(index, faiss.IndexFlatL2)  # <= 100k points: exact
    index.add(points)
    distances, labels = index.search(points[:50], 4)
    assert (labels[:, 0] == np.arange(50)).all()  # each point's nearest is itself
    assert (distances[:, 0] == 0).all() and (np.diff(distances, axis=1) >= 0).all()


def test_faiss_ivf_parameters():
    faiss = pytest.importorskip("faiss")
    index, res = create_faiss_index(n_dims=3, n_points=1_000_000, use_gpu=False, approximate=True)
    assert isinstance(index, faiss.IndexIVFFlat) and res is None
    assert index.nlist == 4000 and index.nprobe == 250 and not index.is_trained
    small, _ = create_faiss_index(n_dims=3, n_points=200_000, use_gpu=False, approximate=True, nlist=100_000)
    assert small.nlist == 200_000 // 39  # capped so that each list has 39 training points
    exact, _ = create_faiss_index(n_dims=3, n_points=1_000_000, use_gpu=False, metric="ip")
    assert isinstance(exact, faiss.IndexFlatIP)


def test_faiss_without_gpu_support_falls_back_or_raises():
    faiss = pytest.importorskip("faiss")
    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        pytest.skip("this faiss has a GPU")
    with pytest.warns(RuntimeWarning, match="FAISS GPU unavailable"):
        index, res = create_faiss_index(n_dims=3, n_points=1000, use_gpu=True)
    assert res is None and isinstance(index, faiss.IndexFlatL2)
    with pytest.raises(FaissUnavailableError):
        create_faiss_index(n_dims=3, n_points=1000, use_gpu=True, fallback_to_cpu=False)
    with pytest.raises(FaissUnavailableError, match="FAISS GPU resources unavailable"):
        create_faiss_gpu_resources(n_points=1000, k=3)


# --------------------------------------------------------------------- real GPU


@gpu
def test_gpu_manager_figures():
    m = get_gpu_memory_manager(0)
    assert not m.cpu_mode and m.device == 0
    used, available, total = m.get_memory_info()
    assert used + available == pytest.approx(total, abs=1e-9)
    assert 0 < available <= total
    assert str(m).startswith("GPU 0") and "GB free" in str(m)
    assert m.reason == "" and "no usable GPU" not in str(m)
    assert m.allocate(0.1) is True
    assert m.allocate(10_000) is False


@gpu
def test_gpu_free_cache_releases_torch_cache():
    torch = torch_cuda()
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda:0")
    del x
    assert torch.cuda.memory_reserved(0) >= 256 * MiB
    released = get_gpu_memory_manager(0).free_cache()
    assert released >= 256 * MiB
    assert torch.cuda.memory_reserved(0) < 256 * MiB


@gpu
def test_gpu_allocate_releases_a_cached_torch_block():
    torch = torch_cuda()
    m = get_gpu_memory_manager(0)
    m.free_cache()
    free = m.get_available_memory()
    if free < 24:
        pytest.skip(f"needs 24 GB free, {free:.1f} GB are")
    # Fill all but ~4 GB with a block that PyTorch keeps cached after del.
    x = torch.empty(int((free - 4) * GiB), dtype=torch.uint8, device="cuda:0")
    del x
    try:
        assert m.get_available_memory() < 8
        assert m.allocate(8) is True  # only after the cached block went back
        assert torch.cuda.memory_reserved(0) < GiB
    finally:
        torch.cuda.empty_cache()


@gpu
def test_gpu_faiss_resources():
    faiss = pytest.importorskip("faiss")
    np = pytest.importorskip("numpy")
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        pytest.skip("faiss has no GPU support here")
    points = np.random.default_rng(1).random((5000, 3), dtype=np.float32)
    index, res = create_faiss_index(n_dims=3, n_points=len(points), k=8)
    assert res is not None
    index.add(points)
    _, labels = index.search(points[:10], 8)
    assert (labels[:, 0] == np.arange(10)).all()
