"""Bad input: each a typed error with a clear message, and the pool's books unchanged."""

from __future__ import annotations

import warnings

import pytest

import gpukeeper
from gpukeeper import (
    AllocationError,
    DeviceError,
    GpuError,
    InvalidInputError,
    MemoryPool,
    Precision,
)


@pytest.fixture
def warm(pool):
    """The pool with device 0's pool made and one live buffer, so that books are non-trivial."""
    held = pool.get_managed_buffer(0, 100, Precision.Fp32)
    yield pool
    held.release()


def unchanged(pool, fn, error=InvalidInputError, match=None):
    """Calls fn, expects `error`, and checks that nothing in the pool changed."""
    before = pool.stats(0).to_dict()
    with pytest.raises(error, match=match) as info:
        fn()
    assert pool.validate(0) == ""
    assert pool.stats(0).to_dict() == before
    return info.value


# ------------------------------------------------------------------ error types


def test_error_hierarchy():
    assert issubclass(InvalidInputError, GpuError)
    assert issubclass(InvalidInputError, ValueError)
    assert issubclass(AllocationError, GpuError)
    assert issubclass(AllocationError, MemoryError)
    assert issubclass(DeviceError, GpuError)
    assert issubclass(DeviceError, RuntimeError)
    assert issubclass(GpuError, Exception)
    assert not issubclass(InvalidInputError, MemoryError)
    assert not issubclass(AllocationError, ValueError)
    for cls in (GpuError, InvalidInputError, AllocationError, DeviceError):
        assert cls.__module__ == "gpukeeper"
        assert cls.__doc__
    from gpukeeper.base import errors

    assert errors.GpuError is GpuError and errors.InvalidInputError is InvalidInputError


def test_errors_are_raisable_and_catchable():
    with pytest.raises(ValueError):
        raise InvalidInputError("x")
    with pytest.raises(MemoryError):
        raise AllocationError("x")
    with pytest.raises(RuntimeError):
        raise DeviceError("x")


# ------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    "size, match",
    [
        (-1, "negative"),
        (-(2**70), "negative"),
        (0, "0 bytes"),
        (2**64, "beyond"),
        (1.5, "must be an int"),
        ("10", "must be an int"),
        (True, "must be an int"),
        (None, "must be an int"),
        ([4], "must be an int"),
    ],
)
def test_bad_sizes(warm, size, match):
    err = unchanged(warm, lambda: warm.get_managed_buffer(0, size, Precision.Fp32), match=match)
    assert isinstance(err, ValueError)


def test_size_overflowing_the_address_space(warm):
    unchanged(warm, lambda: warm.get_managed_buffer(0, 2**62, Precision.Fp64), match="overflow")


def test_size_beyond_any_device(warm):
    unchanged(warm, lambda: warm.get_managed_buffer(0, 2**51, Precision.Uint8), match="beyond")


def test_size_beyond_this_machine_is_allocation_error(warm, pool_books):
    before = pool_books(warm)
    with pytest.raises(AllocationError) as info:
        warm.get_managed_buffer(0, 2**45, Precision.Uint8)
    message = str(info.value)
    assert str(2**45) in message
    assert "32.0 TiB" in message
    assert "free" in message and "of" in message  # host/device free of total
    assert warm.validate(0) == ""
    assert pool_books(warm) == before
    assert warm.stats(0).oom_events == 1


def test_numpy_integer_sizes_are_fine(pool):
    np = pytest.importorskip("numpy")
    with pool.get_managed_buffer(0, np.int64(5), Precision.Fp32) as buf:
        assert buf.size == 5
    with pytest.raises(InvalidInputError):
        pool.get_managed_buffer(0, np.float32(2), Precision.Fp32)


# ------------------------------------------------------------------ devices


@pytest.mark.parametrize("device", [-1, 99, 2**40, "a", 1.0, None, True])
def test_unknown_devices(warm, device):
    unchanged(warm, lambda: warm.get_managed_buffer(device, 4, Precision.Fp32))
    unchanged(warm, lambda: warm.set_max_pool_size(device, 2**20))
    unchanged(warm, lambda: warm.add_watermark(device, 0.5, print))
    unchanged(warm, lambda: warm.add_reclaim_callback(device, print))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        unchanged(warm, lambda: warm.get_buffer(device, 4, Precision.Fp32))


def test_unknown_device_error_message(pool):
    with pytest.raises(InvalidInputError, match="device 99 does not exist"):
        pool.get_managed_buffer(99, 4)


def test_queries_on_bad_device_ids(pool):
    assert pool.memory_pressure(99) is None
    assert pool.memory_usage(99) is None
    for bad in (-1, "a", 1.5):
        with pytest.raises(InvalidInputError):
            pool.memory_pressure(bad)
        with pytest.raises(InvalidInputError):
            pool.memory_usage(bad)
        with pytest.raises(InvalidInputError):
            pool.emergency_cleanup(bad)


# ------------------------------------------------------------------ precisions


@pytest.mark.parametrize("precision", ["fp13", "", 42, object(), 3.5, b"fp32"])
def test_unknown_precisions(warm, precision):
    err = unchanged(warm, lambda: warm.get_managed_buffer(0, 4, precision), match="precision")
    assert "fp32" in str(err)  # lists the valid names


def test_precision_parse_errors():
    with pytest.raises(InvalidInputError):
        Precision.parse("fp13")
    with pytest.raises(InvalidInputError):
        Precision.parse(42)


# ------------------------------------------------------------------ streams


@pytest.mark.parametrize("stream", ["x", 1.5, -1, object(), True, 2**64])
def test_bad_streams(warm, stream):
    unchanged(warm, lambda: warm.get_managed_buffer(0, 4, Precision.Fp32, stream), match="stream")


def test_stream_like_objects(host_pool):
    class TorchLike:
        cuda_stream = 0

    class CupyLike:
        ptr = 0

    class BadHandle:
        cuda_stream = "zero"

    with host_pool.get_managed_buffer(0, 4, stream=TorchLike()) as buf:
        assert buf.stream == 0
    with host_pool.get_managed_buffer(0, 4, stream=CupyLike()) as buf:
        assert buf.stream == 0
    with pytest.raises(InvalidInputError):
        host_pool.get_managed_buffer(0, 4, stream=BadHandle())


# ------------------------------------------------------------------ kinds


def test_bad_kind():
    with pytest.raises(InvalidInputError, match="vram"):
        MemoryPool("vram")
    with pytest.raises((InvalidInputError, TypeError)):
        MemoryPool(3)


def test_cuda_kinds_without_cuda_fail_cleanly():
    if gpukeeper.cuda_available():
        pytest.skip("CUDA is available here")
    for kind in ("device", "async", "pinned"):
        pool = MemoryPool(kind)
        assert pool.kind == kind
        with pytest.raises(GpuError) as info:
            pool.get_managed_buffer(0, 4)
        assert "CUDA" in str(info.value)
        assert pool.memory_pressure(0) is None
        assert pool.memory_usage(0) is None


# ------------------------------------------------------------------ legacy raw API


def get_raw(pool, *args):
    with pytest.warns(DeprecationWarning):
        return pool.get_buffer(*args)


def test_double_return(pool, balanced):
    ptr = get_raw(pool, 0, 16, Precision.Fp32)
    pool.return_buffer(0, ptr, 16, Precision.Fp32)
    balanced(pool)
    unchanged(pool, lambda: pool.return_buffer(0, ptr, 16, Precision.Fp32), match="returned already")
    balanced(pool)


def test_double_return_after_reuse_does_not_free_the_new_owner(pool, balanced):
    # BUG (reported to the lead): once a returned raw block is reused by a ManagedBuffer,
    # a second return_buffer of the stale pointer (right size) is accepted and frees the
    # managed buffer's block; the next allocation then gets the same memory, so two live
    # buffers share it. The raw API should only take back blocks that get_buffer handed
    # out (e.g. a per-block "raw" flag checked by return_buffer).
    ptr = get_raw(pool, 0, 16, Precision.Fp32)
    pool.return_buffer(0, ptr, 16, Precision.Fp32)
    with pool.get_managed_buffer(0, 16, Precision.Fp32) as buf:
        assert buf.ptr == ptr  # same block, new owner
        unchanged(pool, lambda: pool.return_buffer(0, ptr, 15, Precision.Fp32))
        unchanged(pool, lambda: pool.return_buffer(0, ptr, 16, Precision.Fp32))
        assert pool.owns(0, buf.ptr)
        balanced(pool, 256)
    balanced(pool)


def test_return_buffer_refuses_a_managed_buffers_block(pool, balanced):
    # BUG (reported to the lead): same root cause as above.
    with pool.get_managed_buffer(0, 16, Precision.Fp32) as buf:
        unchanged(pool, lambda: pool.return_buffer(0, buf.ptr, 16, Precision.Fp32))
        with pool.get_managed_buffer(0, 16, Precision.Fp32) as other:
            assert other.ptr != buf.ptr  # never two owners of one block
        balanced(pool, 256)
    balanced(pool)


def test_foreign_pointers(warm):
    held_ptr = warm.get_managed_buffer(0, 1, Precision.Uint8)
    try:
        for ptr in (12345, 0, 2**63, held_ptr.ptr + 256, held_ptr.ptr + 1):
            unchanged(warm, lambda: warm.return_buffer(0, ptr, 1, Precision.Uint8))
        for ptr in (-5, "0x1000", 1.5, None):
            unchanged(warm, lambda: warm.return_buffer(0, ptr, 1, Precision.Uint8))
    finally:
        held_ptr.release()


def test_pointer_from_another_pool(pools):
    a, b = pools("host"), pools("host")
    ptr = get_raw(a, 0, 8, Precision.Fp32)
    b.stats(0)
    with pytest.raises(InvalidInputError):
        b.return_buffer(0, ptr, 8, Precision.Fp32)
    assert a.owns(0, ptr) and not b.owns(0, ptr)
    a.return_buffer(0, ptr, 8, Precision.Fp32)


def test_wrong_size_or_precision_on_return(pool, balanced):
    ptr = get_raw(pool, 0, 16, Precision.Fp32)
    unchanged(pool, lambda: pool.return_buffer(0, ptr, 15, Precision.Fp32), match="64 bytes")
    unchanged(pool, lambda: pool.return_buffer(0, ptr, 16, Precision.Fp16))
    unchanged(pool, lambda: pool.return_buffer(0, ptr, 0, Precision.Fp32))
    unchanged(pool, lambda: pool.return_buffer(0, ptr, 16, "fp13"))
    unchanged(pool, lambda: pool.return_buffer(0, ptr, -16, Precision.Fp32))
    unchanged(pool, lambda: pool.return_buffer(99, ptr, 16, Precision.Fp32))
    assert pool.owns(0, ptr)
    pool.return_buffer(0, ptr, 16, Precision.Fp32)  # the right call still works
    assert not pool.owns(0, ptr)
    balanced(pool)


def test_same_bytes_in_another_precision_is_accepted(pool, balanced):
    # 16 fp32 and 32 fp16 are the same 64 bytes: the pool checks bytes.
    ptr = get_raw(pool, 0, 16, Precision.Fp32)
    pool.return_buffer(0, ptr, 32, Precision.Fp16)
    balanced(pool)


# ------------------------------------------------------------------ limits and tuning


def test_limit_below_current_usage(pool, balanced):
    with pool.get_managed_buffer(0, 1 << 20, Precision.Uint8):
        unchanged(pool, lambda: pool.set_max_pool_size(0, 1000), match="below")
        unchanged(pool, lambda: pool.set_max_pool_size(0, -1))
        unchanged(pool, lambda: pool.set_max_pool_size(0, 1.5))
        unchanged(pool, lambda: pool.set_max_pool_size(0, "1GB"))
        balanced(pool, 1 << 20)


def test_bad_trim_and_watermarks(warm):
    unchanged(warm, lambda: warm.trim(0, -1))
    unchanged(warm, lambda: warm.trim(0, "all"))
    unchanged(warm, lambda: warm.add_watermark(0, 2.0, print))
    unchanged(warm, lambda: warm.add_watermark(0, 0.5, None))
    unchanged(warm, lambda: warm.add_reclaim_callback(0, "nope"))
    assert warm.remove_watermark(0, 12345) is False
    assert warm.remove_reclaim_callback(0, 12345) is False


# ------------------------------------------------------------------ DLPack arguments


def test_bad_dlpack_requests(host_pool):
    with host_pool.get_managed_buffer(0, 4, Precision.Fp32) as buf:
        with pytest.raises(BufferError):
            buf.__dlpack__(copy=True)
        with pytest.raises(BufferError):
            buf.__dlpack__(dl_device=(2, 0))
        with pytest.raises(BufferError):
            buf.__dlpack__(stream=5)  # host memory has no stream
        assert buf.exports == 0  # nothing leaked by the refusals


# ------------------------------------------------------------------ everything at once


def test_books_balance_after_a_storm_of_bad_calls(pool, balanced):
    live = [pool.get_managed_buffer(0, n, Precision.Uint8) for n in (10, 1000, 100000)]
    calls = [
        lambda: pool.get_managed_buffer(0, -1),
        lambda: pool.get_managed_buffer(0, 0),
        lambda: pool.get_managed_buffer(7, 4),
        lambda: pool.get_managed_buffer(0, 4, "fp13"),
        lambda: pool.return_buffer(0, live[0].ptr + 256, 10, Precision.Uint8),
        lambda: pool.return_buffer(0, 42, 10, Precision.Uint8),
        lambda: pool.set_max_pool_size(0, 1),
        lambda: pool.get_managed_buffer(0, 2**62, Precision.Fp64),
    ]
    for _ in range(20):
        for call in calls:
            with pytest.raises(InvalidInputError):
                call()
    balanced(pool, sum(b.nbytes + (-b.nbytes % 256) for b in live))
    for b in live:
        b.release()


# ------------------------------------------------------------------ inputs that escaped the error types


@pytest.mark.parametrize("kind", [None, 0, b"host", ["host"]])
def test_pool_kind_of_the_wrong_type_is_a_typed_error(kind):
    with pytest.raises(InvalidInputError, match="kind must be"):
        MemoryPool(kind)


@pytest.mark.parametrize("data", [None, 3, "text", object()])
def test_copy_from_host_of_something_without_the_buffer_protocol(warm, data):
    with warm.get_managed_buffer(0, 4, Precision.Uint8) as buf:
        buf.copy_from_host(b"\x01\x02\x03\x04")
        unchanged(warm, lambda: buf.copy_from_host(data), match="buffer protocol")
        assert buf.to_bytes() == b"\x01\x02\x03\x04"  # the contents are untouched


def test_gpu_context_exit_without_enter_is_a_typed_error():
    from gpukeeper import GPUContext

    ctx = GPUContext()
    with pytest.raises(InvalidInputError, match="without a matching __enter__"):
        ctx.__exit__(None, None, None)
    with ctx:  # the context is still usable
        pass
    with pytest.raises(InvalidInputError):
        ctx.__exit__(None, None, None)  # the one enter was matched already


# ------------------------------------------------------------------ one table across the public entry points

_MANY_BAD = [
    # (label, call on a warm host pool `p` and its live buffer `b`, a word the message names)
    ("size beyond any machine", lambda p, b: p.get_managed_buffer(0, 2**60), "size"),
    ("size a float", lambda p, b: p.get_managed_buffer(0, 1.5), "size"),
    ("size negative", lambda p, b: p.get_managed_buffer(0, -1), "size"),
    ("precision unknown", lambda p, b: p.get_managed_buffer(0, 4, "fp99"), "fp99"),
    ("stream a string", lambda p, b: p.get_managed_buffer(0, 4, stream="x"), "stream"),
    ("device id beyond the kind", lambda p, b: p.get_managed_buffer(5, 4), "device"),
    ("device id negative", lambda p, b: p.get_managed_buffer(-1, 4), "device_id"),
    ("device id a bool", lambda p, b: p.get_managed_buffer(True, 4), "device_id"),
    ("device id a string", lambda p, b: p.get_managed_buffer("a", 4), "device_id"),
    ("limit a string", lambda p, b: p.set_max_pool_size(0, "a"), "max"),
    ("limit negative", lambda p, b: p.set_max_pool_size(0, -5), "max pool size"),
    ("trim keep negative", lambda p, b: p.trim(0, -1), "keep_bytes"),
    ("trim keep a string", lambda p, b: p.trim(0, "x"), "keep_bytes"),
    ("pressure of a string device", lambda p, b: p.memory_pressure("a"), "device_id"),
    ("watermark level 0", lambda p, b: p.add_watermark(0, 0, print), "level"),
    ("watermark level 2", lambda p, b: p.add_watermark(0, 2.0, print), "level"),
    ("watermark level nan", lambda p, b: p.add_watermark(0, float("nan"), print), "level"),
    ("watermark level a string", lambda p, b: p.add_watermark(0, "0.5", print), "level"),
    ("watermark level a bool", lambda p, b: p.add_watermark(0, True, print), "level"),
    ("watermark callback not callable", lambda p, b: p.add_watermark(0, 0.5, 3), "callable"),
    ("watermark id a string", lambda p, b: p.remove_watermark(0, "x"), "callback_id"),
    ("watermark id negative", lambda p, b: p.remove_watermark(0, -2), "callback_id"),
    ("reclaim callback None", lambda p, b: p.add_reclaim_callback(0, None), "callable"),
    ("reclaim id a string", lambda p, b: p.remove_reclaim_callback(0, "x"), "callback_id"),
    ("stats of None", lambda p, b: p.stats(None), "device_id"),
    ("history of a string", lambda p, b: p.history("x"), "device_id"),
    ("snapshot of a negative id", lambda p, b: p.snapshot(-3), "device_id"),
    ("batch on a string device", lambda p, b: p.create_buffer_batch("x"), "device_id"),
    ("copy more than fits", lambda p, b: b.copy_from_host(b"x" * 1000), "fit"),
    ("copy of None", lambda p, b: b.copy_from_host(None), "buffer protocol"),
    ("precision parse unknown", lambda p, b: Precision.parse("nope"), "nope"),
    ("pool kind None", lambda p, b: MemoryPool(None), "kind"),
    ("pool kind unknown", lambda p, b: MemoryPool("gpu"), "gpu"),
    ("pool expandable 'small'", lambda p, b: MemoryPool("host", expandable="small"), "expandable"),
]


@pytest.mark.parametrize("label, call, word", _MANY_BAD, ids=[row[0] for row in _MANY_BAD])
def test_bad_input_table_pool_and_buffers(warm, label, call, word):
    """Each bad input is a typed gpukeeper error naming what was wrong; the pool's books
    are unchanged afterwards."""
    with warm.get_managed_buffer(0, 10, Precision.Fp32) as buf:
        error = unchanged(warm, lambda: call(warm, buf), error=GpuError)
        assert isinstance(error, InvalidInputError), (label, type(error))
        assert word.lower() in str(error).lower(), (label, str(error))


_API_BAD = [
    ("GPUContext tolerance negative", lambda: gpukeeper.GPUContext(tolerance_bytes=-1), "tolerance"),
    ("GPUContext warn_on_leak a string", lambda: gpukeeper.GPUContext(warn_on_leak="yes"), "warn_on_leak"),
    ("GPUContext raise_on_leak 1", lambda: gpukeeper.GPUContext(raise_on_leak=1), "raise_on_leak"),
    ("GPUContext track_allocations None", lambda: gpukeeper.GPUContext(track_allocations=None), "track"),
    ("GPUContext collect a string", lambda: gpukeeper.GPUContext(collect="x"), "collect"),
    ("GPUContext device a word", lambda: gpukeeper.GPUContext("gpu9"), "gpu9"),
    ("benchmark of a non-callable", lambda: gpukeeper.benchmark_function(3), "callable"),
    ("benchmark with no calls", lambda: gpukeeper.benchmark_function(print, n_calls=0), "n_calls"),
    ("benchmark on a bad device", lambda: gpukeeper.benchmark_function(print, device="gpu9"), "gpu9"),
    ("timer on a bad device", lambda: gpukeeper.CUDATimer(device="x"), "device"),
    ("timer stopped before start", lambda: gpukeeper.CUDATimer(device="cpu").stop(), "start()"),
    ("timer read before start", lambda: gpukeeper.CUDATimer(device="cpu").elapsed_ms, "never started"),
    ("report of a bad device", lambda: gpukeeper.memory_report(device="x"), "device"),
    ("report of a missing device", lambda: gpukeeper.memory_report(device=99), "99"),
    ("cleanup of an int", lambda: gpukeeper.cleanup_models(3), "int"),
    ("trajectory of an int", lambda: gpukeeper.benchmark_md_trajectory(print, 5), "int"),
    ("trajectory timestep negative",
     lambda: gpukeeper.benchmark_md_trajectory(print, [1], timestep_fs=-1), "timestep"),
    ("compare of nothing", lambda: gpukeeper.compare_implementations({}), "impls"),
]


@pytest.mark.parametrize("label, call, word", _API_BAD, ids=[row[0] for row in _API_BAD])
def test_bad_input_table_api(label, call, word):
    with pytest.raises(GpuError) as info:
        call()
    assert isinstance(info.value, InvalidInputError), (label, type(info.value))
    assert word.lower() in str(info.value).lower(), (label, str(info.value))
