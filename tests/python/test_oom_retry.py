"""retry_on_oom: the GPU fundamentals guide's out-of-memory pattern.

The CPU tests run out of memory for real: a host pool with a size limit raises
gpukeeper's AllocationError, and the memory that blocks the next attempt is held the
ways it is in practice (a failed call's local variables, garbage in a reference cycle).
"""

from __future__ import annotations

import gc
import logging

import pytest
from torch_cuda import torch_cuda

import gpukeeper
from gpukeeper import frameworks
from gpukeeper.base.errors import AllocationError, InvalidInputError
from gpukeeper.pool.oom_retry import is_oom_error, release_for_retry, retry_on_oom

CUDA = gpukeeper.cuda_available()
MiB = 1 << 20
GiB = 1 << 30
gpu = pytest.mark.skipif(not CUDA, reason=f"no usable CUDA device: {CUDA.reason}")


@pytest.fixture
def small_pool(pools):
    """A host pool limited to 4 MiB: two 3 MiB buffers cannot be live at once."""
    pool = pools("host")
    pool.set_max_pool_size(0, 4 * MiB)
    return pool


def take(pool, nbytes=3 * MiB):
    return pool.get_managed_buffer(0, nbytes, "uint8")


# --------------------------------------------------------------------- what counts as OOM


def test_is_oom_error(small_pool):
    held = take(small_pool)
    with pytest.raises(AllocationError) as real:
        take(small_pool)
    held.release()
    assert is_oom_error(real.value)
    assert is_oom_error(MemoryError())
    assert is_oom_error(RuntimeError("CUDA error: out of memory"))
    assert is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom_error(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert is_oom_error(RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate"))

    class CupyLikeOOM(MemoryError):  # cupy.cuda.memory.OutOfMemoryError is a MemoryError
        pass

    assert is_oom_error(CupyLikeOOM("Out of memory allocating 1,024 bytes"))
    assert not is_oom_error(ValueError("out of memory"))  # only RuntimeErrors are read
    assert not is_oom_error(RuntimeError("shape mismatch"))
    assert not is_oom_error(KeyError("x"))


def test_torch_oom_type_is_recognised():
    torch = pytest.importorskip("torch")
    assert is_oom_error(torch.cuda.OutOfMemoryError("anything"))


# --------------------------------------------------------------------- retries


def test_retry_after_failure_returns_the_result():
    calls = []

    def flaky(x, scale=1):
        calls.append(x)
        if len(calls) == 1:
            raise AllocationError("out of memory (simulated)")
        return x * scale

    assert retry_on_oom(flaky, 21, scale=2) == 42
    assert calls == [21, 21]


def test_memory_held_by_the_failed_calls_locals_is_freed(small_pool):
    # Attempt 1 holds 3 MiB in a local, then fails to get 3 MiB more. Attempt 2 needs
    # only one 3 MiB buffer: it fits only if attempt 1's local was freed, which the
    # stored error's traceback would prevent if its frames were not cleared.
    frameworks.release_all_caches(None)
    calls = []

    def work():
        calls.append(1)
        first = take(small_pool)
        if len(calls) == 1:
            second = take(small_pool)  # AllocationError: the pool's limit
            second.release()
        return first

    buf = retry_on_oom(work, retries=1)
    assert len(calls) == 2 and buf.nbytes == 3 * MiB
    buf.release()


def test_garbage_in_a_reference_cycle_is_collected_before_the_retry(small_pool):
    frameworks.release_all_caches(None)  # nothing cached: the cheap release finds nothing
    gc.disable()  # keep the cycle alive until retry_on_oom collects it
    try:
        cycle = {"buf": take(small_pool)}
        cycle["self"] = cycle
        del cycle
        assert small_pool.stats(0).allocated_bytes == 3 * MiB
        calls = []

        def work():
            calls.append(1)
            return take(small_pool)

        buf = retry_on_oom(work)
        assert len(calls) == 2
        buf.release()
    finally:
        gc.enable()


def test_fallback_gets_the_same_arguments_after_the_retries():
    calls, fallback_calls = [], []

    def always_oom(batch, *, device):
        calls.append((batch, device))
        raise RuntimeError("CUDA out of memory. Tried to allocate 80.00 GiB")

    def on_cpu(batch, *, device):
        fallback_calls.append((batch, device))
        return "cpu result"

    assert retry_on_oom(always_oom, [1, 2], device="cuda", retries=2, fallback=on_cpu) == "cpu result"
    assert len(calls) == 3
    assert fallback_calls == [([1, 2], "cuda")]


def test_without_fallback_the_last_oom_is_raised():
    calls = []

    def always_oom():
        calls.append(1)
        raise AllocationError(f"out of memory #{len(calls)}")

    with pytest.raises(AllocationError, match="#2") as info:
        retry_on_oom(always_oom)
    assert len(calls) == 2
    assert info.traceback[-1].name == "always_oom"  # where it failed, not only where re-raised


def test_retries_zero_goes_straight_to_the_fallback():
    calls = []

    def oom():
        calls.append(1)
        raise MemoryError

    assert retry_on_oom(oom, retries=0, fallback=lambda: "small batch") == "small batch"
    assert calls == [1]
    with pytest.raises(MemoryError):
        retry_on_oom(oom, retries=0)
    assert calls == [1, 1]


def test_other_errors_propagate_at_once():
    calls, fallback_calls = [], []

    def broken():
        calls.append(1)
        raise ValueError("bad shape")

    with pytest.raises(ValueError, match="bad shape"):
        retry_on_oom(broken, retries=3, fallback=lambda: fallback_calls.append(1))
    assert calls == [1] and fallback_calls == []


def test_fallback_errors_propagate():
    def oom():
        raise MemoryError

    def fallback():
        raise KeyError("fallback broke")

    with pytest.raises(KeyError, match="fallback broke"):
        retry_on_oom(oom, fallback=fallback)


def test_a_failing_release_does_not_hide_anything(monkeypatch, caplog):
    def broken(device=None):
        raise RuntimeError("release failed")

    monkeypatch.setattr(frameworks, "release_all_caches", broken)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError
        return "ok"

    with caplog.at_level(logging.WARNING, logger="gpukeeper"):
        assert retry_on_oom(flaky) == "ok"
    assert "release failed" in caplog.text
    assert release_for_retry() == 0


# --------------------------------------------------------------------- decorator


def test_decorator_with_fallback():
    calls = []

    def smaller(batch):
        return ("fallback", len(batch) // 2)

    @retry_on_oom(fallback=smaller)
    def predict(batch):
        """Predicts a batch."""
        calls.append(len(batch))
        if len(batch) > 4:
            raise RuntimeError("CUDA out of memory")
        return ("gpu", len(batch))

    assert predict.__name__ == "predict" and predict.__doc__ == "Predicts a batch."
    assert predict([1, 2]) == ("gpu", 2)
    assert predict(list(range(8))) == ("fallback", 4)
    assert calls == [2, 8, 8]


def test_decorator_with_defaults_reraises():
    @retry_on_oom()
    def step():
        raise MemoryError("still too big")

    with pytest.raises(MemoryError, match="still too big"):
        step()


def test_real_recovery_through_the_decorator(small_pool):
    frameworks.release_all_caches(None)
    state = {"calls": 0}

    @retry_on_oom(retries=1)
    def work(nbytes):
        state["calls"] += 1
        first = take(small_pool, nbytes)
        if state["calls"] == 1:
            take(small_pool, nbytes)  # fails; `first` is only freed by the frame clearing
        return first

    buf = work(3 * MiB)
    assert state["calls"] == 2
    buf.release()


@pytest.mark.parametrize(
    "call",
    [
        lambda: retry_on_oom(lambda: 1, retries=-1),
        lambda: retry_on_oom(lambda: 1, retries=1.5),
        lambda: retry_on_oom(lambda: 1, retries=True),
        lambda: retry_on_oom(lambda: 1, fallback="cpu"),
        lambda: retry_on_oom("not callable"),
        lambda: retry_on_oom(None, 1, 2),
        lambda: retry_on_oom(fallback=42),
        lambda: retry_on_oom()(3),
    ],
)
def test_bad_options_are_invalid_input(call):
    with pytest.raises(InvalidInputError):
        call()


# --------------------------------------------------------------------- real GPU


def _fill_with_cached_torch_block(torch, keep_free):
    """Fills the device but `keep_free` bytes with a PyTorch block, then frees it into
    PyTorch's cache: the memory is reserved by PyTorch but used by nothing."""
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(0)
    if free < keep_free + 16 * GiB:
        pytest.skip(f"needs {keep_free / GiB + 16:.0f} GiB free, {free / GiB:.1f} GiB are")
    block = torch.empty(free - keep_free, dtype=torch.uint8, device="cuda:0")
    del block
    return torch.cuda.memory_reserved(0)


@gpu
def test_gpu_cached_torch_block_blocks_a_gpukeeper_pool_until_released(pools):
    torch = torch_cuda()
    pool = pools("device")
    cached = _fill_with_cached_torch_block(torch, keep_free=4 * GiB)
    calls = []

    def work():
        calls.append(1)
        return pool.get_managed_buffer(0, 8 * GiB, "uint8")

    try:
        buf = retry_on_oom(work)
        assert buf.nbytes == 8 * GiB
        # However the memory came back (our retry, or a reclaim callback of the pool),
        # PyTorch's cached block had to go.
        assert torch.cuda.memory_reserved(0) < cached
        buf.release()
    finally:
        torch.cuda.empty_cache()
        pool.emergency_cleanup(0)


@gpu
def test_gpu_torch_oom_from_a_cupy_cache_is_retried():
    torch = torch_cuda()
    cupy = pytest.importorskip("cupy")
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(0)
    if free < 24 * GiB:
        pytest.skip(f"needs 24 GiB free, {free / GiB:.1f} GiB are")
    with cupy.cuda.Device(0):
        block = cupy.empty(free - 4 * GiB, dtype=cupy.uint8)
        del block  # cached in CuPy's pool, which PyTorch cannot release
    calls = []

    def work():
        calls.append(1)
        return torch.empty(8 * GiB, dtype=torch.uint8, device="cuda:0")

    try:
        x = retry_on_oom(work)
        assert len(calls) == 2  # PyTorch raised OutOfMemoryError once; the retry worked
        assert x.numel() == 8 * GiB
        del x
    finally:
        cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()


@gpu
def test_gpu_oom_falls_back_to_cpu():
    torch = torch_cuda()
    total = torch.cuda.get_device_properties(0).total_memory
    calls = []

    def ones(n, device):
        calls.append(device)
        return torch.ones(n, dtype=torch.uint8, device=device).sum().item()

    result = retry_on_oom(ones, 2 * total, "cuda:0", fallback=lambda n, device: ones(1000, "cpu"))
    assert result == 1000
    assert calls == ["cuda:0", "cuda:0", "cpu"]
