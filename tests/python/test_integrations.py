"""PyTorch and CuPy allocating through gpukeeper's pool."""

import ctypes
from pathlib import Path

import pytest
from child_process import run_child

import gpukeeper
from gpukeeper import _core, frameworks
from gpukeeper.base.errors import GpuError
from gpukeeper.integrations import torch_allocator

CHILD = Path(__file__).with_name("torch_allocator_child.py")
needs_cuda = pytest.mark.skipif(not gpukeeper.cuda_available(), reason="needs a CUDA device")


def test_the_module_exports_the_pluggable_allocator_symbols():
    lib = ctypes.CDLL(_core.__file__)
    malloc = lib.gpukeeper_torch_malloc
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    assert malloc(0, 0, None) is None  # empty tensors get no memory, as PyTorch's own
    # A failing request throws a C++ exception for PyTorch's frames to catch (through
    # ctypes it would end the process): tested under PyTorch on the GPU, and by
    # test_torch_memory_api's probe of the error type here.
    if gpukeeper.cuda_available():
        ptr = malloc(1024, 0, None)
        assert ptr is not None
        assert torch_allocator.stats(0).allocated_bytes >= 1024
        lib.gpukeeper_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                             ctypes.c_void_p]
        lib.gpukeeper_torch_free(ptr, 1024, 0, None)
        lib.gpukeeper_torch_free(ptr, 1024, 0, None)  # a second free is ignored, not a crash
        assert _core._torch_pool_validate(0) == ""


def test_use_torch_allocator_without_cuda_says_why():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("PyTorch has CUDA here")
    with pytest.raises(GpuError, match="no CUDA device"):
        torch_allocator.use_torch_allocator()
    assert not torch_allocator.is_active()
    assert torch_allocator.stats(0) is None
    assert torch_allocator.pool_usage(0) == (0, 0)
    assert torch_allocator.release() == 0


def test_use_cupy_allocator_without_cupy_says_why():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    with pytest.raises(GpuError, match="needs CuPy"):
        gpukeeper.integrations.use_cupy_allocator()


def test_host_pools_are_not_counted_as_device_memory():
    pool = gpukeeper.MemoryPool("host")
    with pool.get_managed_buffer(0, 1 << 20, gpukeeper.Precision.Uint8):
        report = frameworks.memory_by_framework(0)
        assert report["gpukeeper"].allocated == 0
        assert pool in frameworks.live_pools()


@needs_cuda
def test_torch_trains_the_same_on_gpukeeper_and_books_match_live_tensors():
    ours = run_child(CHILD, "gpukeeper", timeout=240)
    theirs = run_child(CHILD, "torch", timeout=240)
    assert ours["requested"] == ours["tensor_bytes"]
    assert ours["torch_view"] == ours["pool_allocated"] >= ours["tensor_bytes"]
    assert ours["requested_after_del"] == 0
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-6, abs=1e-7)
    assert ours["losses"][-1] < ours["losses"][0]  # it did train
    assert ours["validate"] == ""
    assert ours["released"] > 0
    # Only segments with live blocks stay: at most one small and one large segment's
    # worth of cache beyond what is still allocated.
    assert ours["reserved_after_release"] - ours["allocated_after_release"] <= 22 << 20


@needs_cuda
def test_use_torch_allocator_after_the_first_tensor_is_a_clear_error():
    late = run_child(CHILD, "late", timeout=240)
    assert late["error"] and "before the first CUDA tensor" in late["error"]


@needs_cuda
def test_cupy_allocates_on_a_gpukeeper_pool():
    cupy = pytest.importorskip("cupy")
    from gpukeeper.integrations import restore_cupy_allocator, use_cupy_allocator

    pool = use_cupy_allocator()
    try:
        a = cupy.arange(1 << 20, dtype=cupy.float64)
        assert pool.stats(0).allocated_bytes >= 8 << 20
        assert float(a.sum()) == pytest.approx((1 << 20) * ((1 << 20) - 1) / 2)
        assert frameworks.memory_by_framework(0)["gpukeeper"].allocated >= 8 << 20
        del a
        assert pool.stats(0).allocated_bytes == 0
        assert pool.validate(0) == ""
    finally:
        restore_cupy_allocator()
    pool.emergency_cleanup(0)
    assert pool.stats(0).reserved_bytes == 0


# --------------------------------------------------------------------- CuPy's requests


class _FakeCupy:
    """The few pieces of CuPy that use_cupy_allocator touches, as CuPy 14 has them."""

    def __init__(self):
        import types

        class OutOfMemoryError(MemoryError):
            def __init__(self, size, total, limit=0):
                self._size, self._total, self._limit = size, total, limit
                super().__init__(f"Out of memory allocating {size:,} bytes")

            def __reduce__(self):
                return (type(self), (self._size, self._total, self._limit))

        class Memory:
            def __init__(self, size):
                self.size, self.ptr = size, 0  # CuPy's Memory(0) holds no memory

        class MemoryPointer:
            def __init__(self, mem, offset):
                self.mem, self.ptr = mem, mem.ptr + offset

        class UnownedMemory:
            def __init__(self, ptr, size, owner, device_id):
                self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

        memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError, Memory=Memory,
                                       MemoryPointer=MemoryPointer, UnownedMemory=UnownedMemory)
        self.allocator = None
        stream = types.SimpleNamespace(ptr=0)
        self.cuda = types.SimpleNamespace(
            memory=memory, MemoryPointer=MemoryPointer, UnownedMemory=UnownedMemory,
            runtime=types.SimpleNamespace(getDevice=lambda: 0),
            get_current_stream=lambda: stream,
            set_allocator=lambda f: setattr(self, "allocator", f))


class _AsDevicePool:
    """A host pool that says it holds device memory (CuPy's hook accepts only those)."""

    kind = "device"

    def __init__(self, pool):
        self._pool = pool

    def __getattr__(self, name):
        return getattr(self._pool, name)


def test_cupy_hook_answers_zero_bytes_and_oom_as_cupys_own_pool(monkeypatch):
    import pickle

    from gpukeeper.base.errors import AllocationError
    from gpukeeper.integrations import cupy_allocator

    fake = _FakeCupy()
    monkeypatch.setattr(cupy_allocator, "_import_cupy", lambda: fake)
    host = gpukeeper.MemoryPool("host")
    host.set_max_pool_size(0, 4 << 20)
    cupy_allocator.use_cupy_allocator(_AsDevicePool(host))
    empty = fake.allocator(0)
    assert empty.ptr == 0 and empty.mem.size == 0
    assert host.stats(0).allocated_bytes == 0
    live = fake.allocator(1000)
    assert live.ptr != 0 and host.stats(0).allocated_bytes == 1024
    assert live.mem.size == 1024  # CuPy's 512-byte unit, as its own pool reports
    odd = fake.allocator(1)
    assert odd.mem.size == 512
    del odd
    for size in (64 << 20, 1 << 60):  # beyond the limit; beyond any device
        with pytest.raises(fake.cuda.memory.OutOfMemoryError) as info:
            fake.allocator(size)
        assert isinstance(info.value, AllocationError) and isinstance(info.value, MemoryError)
        assert str(size) in str(info.value).replace(",", "") or "bytes" in str(info.value)
        again = pickle.loads(pickle.dumps(info.value))
        assert isinstance(again, fake.cuda.memory.OutOfMemoryError)
    with pytest.raises(ValueError):
        fake.allocator(-1)
    del live
    assert host.stats(0).allocated_bytes == 0
    assert host.validate(0) == ""
