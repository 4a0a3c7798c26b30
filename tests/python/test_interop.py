"""Zero-copy views of buffers: numpy (buffer protocol), torch and numpy (DLPack), torch and
CuPy on the GPU (DLPack and __cuda_array_interface__)."""

from __future__ import annotations

import gc

import pytest

from gpukeeper import InvalidInputError, Precision

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

MiB = 1 << 20

# Precision -> (buffer-protocol format, numpy dtype, torch dtype)
TYPES = {
    Precision.Fp64: ("d", np.float64, torch.float64),
    Precision.Fp32: ("f", np.float32, torch.float32),
    Precision.Fp16: ("e", np.float16, torch.float16),
    Precision.Bf16: ("H", np.uint16, torch.bfloat16),  # no struct code: raw 16-bit words
    Precision.Int64: ("q", np.int64, torch.int64),
    Precision.Int32: ("i", np.int32, torch.int32),
    Precision.Int16: ("h", np.int16, torch.int16),
    Precision.Int8: ("b", np.int8, torch.int8),
    Precision.Uint8: ("B", np.uint8, torch.uint8),
    Precision.Bool: ("?", np.bool_, torch.bool),
}

CAI_TYPESTR = {
    Precision.Fp64: "<f8",
    Precision.Fp32: "<f4",
    Precision.Fp16: "<f2",
    Precision.Bf16: "<V2",
    Precision.Int64: "<i8",
    Precision.Int32: "<i4",
    Precision.Int16: "<i2",
    Precision.Int8: "|i1",
    Precision.Uint8: "|u1",
    Precision.Bool: "|b1",
}


def test_every_precision_is_mapped():
    assert set(TYPES) == set(Precision.__members__.values())


# ------------------------------------------------------------------ host: buffer protocol


@pytest.mark.parametrize("precision", list(TYPES), ids=lambda p: p.label)
def test_numpy_view_dtype(host_pool, precision):
    fmt, np_dtype, _ = TYPES[precision]
    with host_pool.get_managed_buffer(0, 12, precision) as buf:
        view = memoryview(buf)
        assert view.format == fmt
        assert view.itemsize == precision.itemsize
        assert view.shape == (12,)
        view.release()
        arr = np.asarray(buf)
        assert arr.dtype == np_dtype
        assert arr.shape == (12,)
        assert arr.ctypes.data == buf.ptr
        assert arr.flags.writeable
        del arr


def test_numpy_writes_are_seen_by_to_bytes(host_pool):
    with host_pool.get_managed_buffer(0, 8, Precision.Int32) as buf:
        arr = np.asarray(buf)
        arr[:] = np.arange(8, dtype=np.int32) * 3
        assert buf.to_bytes() == (np.arange(8, dtype=np.int32) * 3).tobytes()
        buf.copy_from_host(np.full(8, 5, dtype=np.int32))
        assert arr.tolist() == [5] * 8  # and host copies are seen by the view
        del arr


# ------------------------------------------------------------------ host: DLPack


def test_host_dlpack_device(host_pool):
    with host_pool.get_managed_buffer(0, 4) as buf:
        assert buf.__dlpack_device__() == (1, 0)  # kDLCPU


def test_host_buffer_has_no_cuda_array_interface(host_pool):
    with host_pool.get_managed_buffer(0, 4) as buf:
        assert not hasattr(buf, "__cuda_array_interface__")
    assert not hasattr(buf, "__cuda_array_interface__")


@pytest.mark.parametrize("precision", list(TYPES), ids=lambda p: p.label)
def test_torch_from_dlpack_dtype(host_pool, precision):
    _, _, torch_dtype = TYPES[precision]
    with host_pool.get_managed_buffer(0, 10, precision) as buf:
        t = torch.from_dlpack(buf)
        assert t.dtype == torch_dtype
        assert t.shape == (10,)
        assert t.device.type == "cpu"
        assert t.data_ptr() == buf.ptr
        assert buf.exports == 1
        del t
        gc.collect()
        assert buf.exports == 0


def test_torch_writes_are_seen_by_to_bytes(host_pool):
    with host_pool.get_managed_buffer(0, 16, Precision.Fp32) as buf:
        t = torch.from_dlpack(buf)
        t.copy_(torch.arange(16, dtype=torch.float32))
        assert np.frombuffer(buf.to_bytes(), dtype=np.float32).tolist() == list(range(16))
        arr = np.asarray(buf)  # a second view of the same memory
        arr[0] = 100.0
        assert t[0].item() == 100.0
        del t, arr


def test_torch_bfloat16_round_trip(host_pool):
    with host_pool.get_managed_buffer(0, 4, Precision.Bf16) as buf:
        t = torch.from_dlpack(buf)
        t.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.bfloat16))
        words = np.frombuffer(buf.to_bytes(), dtype=np.uint16)
        expected = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.bfloat16).view(torch.int16)
        assert words.tolist() == (expected.numpy().astype(np.uint16)).tolist()
        del t


def test_torch_tensor_keeps_memory_after_release(host_pool, balanced):
    buf = host_pool.get_managed_buffer(0, 256, Precision.Fp32)
    t = torch.from_dlpack(buf)
    buf.release()
    balanced(host_pool, 1024)  # still held by the tensor
    t.fill_(1.5)
    assert t.sum().item() == 384.0
    with pytest.raises(InvalidInputError):
        torch.from_dlpack(buf)  # no new views of a released buffer
    del t
    gc.collect()
    assert buf.exports == 0
    balanced(host_pool)


def test_torch_from_temporary_buffer(host_pool, balanced):
    t = torch.from_dlpack(host_pool.get_managed_buffer(0, 64, Precision.Fp32))
    t.fill_(2.0)
    balanced(host_pool, 256)
    del t
    gc.collect()
    balanced(host_pool)


def test_torch_as_tensor_and_frombuffer(host_pool):
    with host_pool.get_managed_buffer(0, 8, Precision.Fp32) as buf:
        u = torch.as_tensor(buf)
        assert u.data_ptr() == buf.ptr and u.dtype == torch.float32
        assert buf.exports == 1
        t = torch.frombuffer(buf, dtype=torch.float32)
        assert t.data_ptr() == buf.ptr
        del t, u
        gc.collect()
        assert buf.exports == 0


@pytest.mark.xfail(
    strict=True,
    reason="torch.frombuffer releases its Py_buffer at once and only keeps a reference to "
    "the object, so release() cannot see the view: do not release() a buffer that "
    "torch.frombuffer still views (use torch.from_dlpack or torch.as_tensor)",
)
def test_torch_frombuffer_view_survives_release(host_pool):
    buf = host_pool.get_managed_buffer(0, 8, Precision.Fp32)
    t = torch.frombuffer(buf, dtype=torch.float32)
    buf.release()
    try:
        assert host_pool.stats(0).allocated_bytes == 256  # the view should keep the block
    finally:
        del t


def test_numpy_from_dlpack(host_pool):
    with host_pool.get_managed_buffer(0, 8, Precision.Int16) as buf:
        arr = np.from_dlpack(buf)
        assert arr.dtype == np.int16 and arr.ctypes.data == buf.ptr
        assert buf.exports == 1
        del arr
        gc.collect()
        assert buf.exports == 0


@pytest.mark.parametrize("max_version", [None, (1, 0), (0, 8)])
def test_unconsumed_capsule_is_freed(host_pool, balanced, max_version):
    buf = host_pool.get_managed_buffer(0, 8, Precision.Fp32)
    cap = buf.__dlpack__(max_version=max_version)
    expected = "dltensor_versioned" if max_version and max_version[0] >= 1 else "dltensor"
    assert f'"{expected}"' in repr(cap)
    assert buf.exports == 1
    buf.release()
    balanced(host_pool, 256)  # the capsule still owns the block
    del cap
    gc.collect()
    assert buf.exports == 0
    balanced(host_pool)


def test_capsule_consumed_by_legacy_torch_api(host_pool):
    with host_pool.get_managed_buffer(0, 8, Precision.Fp32) as buf:
        cap = buf.__dlpack__()
        t = torch.utils.dlpack.from_dlpack(cap)
        del cap
        assert buf.exports == 1  # the tensor owns the export now
        del t
        gc.collect()
        assert buf.exports == 0


def test_many_views_then_release(host_pool, balanced):
    buf = host_pool.get_managed_buffer(0, 32, Precision.Fp32)
    views = [np.asarray(buf), torch.from_dlpack(buf), memoryview(buf), np.from_dlpack(buf)]
    assert buf.exports == 4
    buf.release()
    views.pop(2).release()
    views.pop(0)
    gc.collect()
    assert buf.exports == 2
    balanced(host_pool, 256)
    views.clear()
    gc.collect()
    assert buf.exports == 0
    balanced(host_pool)


# ================================================================== GPU

cuda_ok = torch.cuda.is_available()
gpu = pytest.mark.gpu


def _cupy():
    return pytest.importorskip("cupy")


@pytest.fixture
def dev_pool(pools):
    if not cuda_ok:
        pytest.skip("torch sees no CUDA device")
    return pools("device")


@gpu
def test_device_buffer_views_and_interfaces(dev_pool):
    with dev_pool.get_managed_buffer(0, 1024, Precision.Fp32) as buf:
        assert buf.kind == "device"
        assert buf.__dlpack_device__() == (2, 0)  # kDLCUDA
        cai = buf.__cuda_array_interface__
        assert cai["version"] == 3
        assert cai["shape"] == (1024,)
        assert cai["typestr"] == "<f4"
        assert cai["data"] == (buf.ptr, False)
        assert cai["strides"] is None
        assert cai["stream"] == 1  # the legacy default stream
        with pytest.raises(BufferError):
            memoryview(buf)  # device memory has no buffer protocol


@gpu
@pytest.mark.parametrize("precision", list(TYPES), ids=lambda p: p.label)
def test_device_dtypes(dev_pool, precision):
    with dev_pool.get_managed_buffer(0, 10, precision) as buf:
        assert buf.__cuda_array_interface__["typestr"] == CAI_TYPESTR[precision]
        t = torch.from_dlpack(buf)
        assert t.dtype == TYPES[precision][2]
        assert t.device == torch.device("cuda", 0)
        assert t.data_ptr() == buf.ptr
        del t


@gpu
def test_torch_from_dlpack_on_device(dev_pool, balanced):
    buf = dev_pool.get_managed_buffer(0, 4096, Precision.Fp32)
    t = torch.from_dlpack(buf)
    assert t.is_cuda and t.data_ptr() == buf.ptr
    t.copy_(torch.arange(4096, dtype=torch.float32, device="cuda"))
    torch.cuda.synchronize()
    assert np.frombuffer(buf.to_bytes(), dtype=np.float32).tolist() == list(range(4096))
    buf.release()
    balanced(dev_pool, 4096 * 4)  # the tensor still holds it
    assert t.sum().item() == sum(range(4096))
    del t
    gc.collect()
    balanced(dev_pool)


@gpu
def test_torch_as_tensor_via_cuda_array_interface(dev_pool):
    with dev_pool.get_managed_buffer(0, 256, Precision.Int32) as buf:
        t = torch.as_tensor(buf, device="cuda")
        assert t.data_ptr() == buf.ptr
        assert t.dtype == torch.int32 and t.shape == (256,)
        t.fill_(-7)
        torch.cuda.synchronize()
        assert np.frombuffer(buf.to_bytes(), dtype=np.int32).tolist() == [-7] * 256
        del t


@gpu
def test_host_data_copied_in_is_read_by_torch(dev_pool):
    with dev_pool.get_managed_buffer(0, 100, Precision.Fp64) as buf:
        buf.copy_from_host(np.linspace(0, 1, 100))
        t = torch.from_dlpack(buf)
        assert torch.allclose(t.cpu(), torch.linspace(0, 1, 100, dtype=torch.float64))
        del t


@gpu
def test_cupy_asarray_and_from_dlpack(dev_pool):
    cupy = _cupy()
    with dev_pool.get_managed_buffer(0, 512, Precision.Fp16) as buf:
        a = cupy.asarray(buf)
        assert a.data.ptr == buf.ptr
        assert a.dtype == cupy.float16 and a.shape == (512,)
        b = cupy.from_dlpack(buf)
        assert b.data.ptr == buf.ptr
        assert buf.exports >= 1
        del a, b


@gpu
def test_torch_writes_cupy_reads(dev_pool):
    cupy = _cupy()
    with dev_pool.get_managed_buffer(0, 1000, Precision.Fp32) as buf:
        t = torch.from_dlpack(buf)
        t.copy_(torch.arange(1000, dtype=torch.float32, device="cuda") * 0.5)
        torch.cuda.synchronize()
        c = cupy.asarray(buf)
        assert cupy.asnumpy(c).tolist() == [i * 0.5 for i in range(1000)]
        c2 = cupy.from_dlpack(buf)
        c2 += 1
        cupy.cuda.runtime.deviceSynchronize()
        assert t[3].item() == 2.5  # and CuPy's writes are seen by torch
        del t, c, c2


@gpu
def test_buffer_on_a_torch_stream(dev_pool):
    s = torch.cuda.Stream()
    for stream_arg in (s, s.cuda_stream):
        with dev_pool.get_managed_buffer(0, 1 << 16, Precision.Fp32, stream=stream_arg) as buf:
            assert buf.stream == s.cuda_stream
            assert buf.__cuda_array_interface__["stream"] == s.cuda_stream
            with torch.cuda.stream(s):
                t = torch.from_dlpack(buf)
                t.fill_(3.0)
            # to_bytes orders itself after the buffer's stream: no explicit sync needed.
            data = np.frombuffer(buf.to_bytes(), dtype=np.float32)
            assert (data == 3.0).all()
            del t


@gpu
def test_buffer_on_a_cupy_stream(dev_pool):
    cupy = _cupy()
    s = cupy.cuda.Stream(non_blocking=True)
    with dev_pool.get_managed_buffer(0, 1024, Precision.Int64, stream=s) as buf:
        assert buf.stream == s.ptr
        with s:
            a = cupy.asarray(buf)
            a[:] = 42
        assert np.frombuffer(buf.to_bytes(), dtype=np.int64).tolist() == [42] * 1024
        del a


@gpu
def test_stream_block_reuse_keeps_data_correct(dev_pool):
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a = dev_pool.get_managed_buffer(0, 1 << 20, Precision.Fp32, stream=s1)
    with torch.cuda.stream(s1):
        torch.from_dlpack(a).fill_(1.0)
    a.release()
    b = dev_pool.get_managed_buffer(0, 1 << 20, Precision.Fp32, stream=s2)
    with torch.cuda.stream(s2):
        torch.from_dlpack(b).fill_(2.0)
    assert (np.frombuffer(b.to_bytes(), dtype=np.float32) == 2.0).all()
    b.release()


@gpu
@pytest.mark.parametrize("kind", ["device", "async", "pinned"])
def test_cuda_kinds(pools, kind):
    pool = pools(kind)
    with pool.get_managed_buffer(0, 256, Precision.Fp32) as buf:
        buf.copy_from_host(np.arange(256, dtype=np.float32))
        cai = buf.__cuda_array_interface__
        assert cai["data"][0] == buf.ptr
        t = torch.as_tensor(buf, device="cuda")
        assert t.data_ptr() == buf.ptr
        assert t.sum().item() == sum(range(256))
        del t
        if kind == "pinned":
            assert buf.__dlpack_device__() == (3, 0)  # kDLCUDAHost
            arr = np.asarray(buf)  # host-visible: numpy views it too
            assert arr.ctypes.data == buf.ptr
            assert arr.tolist() == list(range(256))
            arr[:] = 9.0
            t = torch.as_tensor(buf, device="cuda")
            assert t.sum().item() == 9.0 * 256
            del arr, t
        else:
            assert buf.__dlpack_device__() == (2, 0)
            with pytest.raises(BufferError):
                memoryview(buf)
            c = torch.from_dlpack(buf)
            assert c.data_ptr() == buf.ptr
            del c


@gpu
@pytest.mark.parametrize("kind", ["device", "async", "pinned"])
def test_cuda_kinds_with_cupy(pools, kind):
    cupy = _cupy()
    pool = pools(kind)
    with pool.get_managed_buffer(0, 128, Precision.Int32) as buf:
        buf.copy_from_host(np.arange(128, dtype=np.int32))
        a = cupy.asarray(buf)
        assert a.data.ptr == buf.ptr
        assert int(a.sum()) == sum(range(128))
        del a


@gpu
def test_released_device_buffer_has_no_interfaces(dev_pool):
    buf = dev_pool.get_managed_buffer(0, 16, Precision.Fp32)
    buf.release()
    with pytest.raises(InvalidInputError):
        buf.__cuda_array_interface__
    with pytest.raises(InvalidInputError):
        torch.from_dlpack(buf)
    with pytest.raises(Exception):  # whichever path torch takes, it gets no memory
        torch.as_tensor(buf, device="cuda")


@gpu
def test_emergency_cleanup_gives_memory_back_to_the_device(dev_pool, balanced):
    size = 512 * MiB
    torch.cuda.synchronize()
    free_start, _ = torch.cuda.mem_get_info()
    buf = dev_pool.get_managed_buffer(0, size, Precision.Uint8)
    buf.release()
    assert dev_pool.stats(0).reserved_bytes >= size
    free_cached, _ = torch.cuda.mem_get_info()
    assert free_cached <= free_start - size + 64 * MiB  # the cache holds the memory
    released = dev_pool.emergency_cleanup(0)
    assert released >= size
    assert dev_pool.stats(0).reserved_bytes == 0
    free_after, _ = torch.cuda.mem_get_info()
    assert free_after >= free_cached + size - 64 * MiB
    balanced(dev_pool)


@gpu
def test_allocation_bigger_than_the_device(dev_pool, balanced):
    _, total = torch.cuda.mem_get_info()
    too_big = total + (1 << 30)
    with pytest.raises(MemoryError) as info:
        dev_pool.get_managed_buffer(0, too_big, Precision.Uint8)
    message = str(info.value)
    assert str(too_big) in message
    assert "device free" in message and " of " in message
    assert "device 0" in message
    balanced(dev_pool)
    assert dev_pool.stats(0).reserved_bytes == 0


@gpu
def test_async_pool_on_a_stream(pools):
    pool = pools("async")
    s = torch.cuda.Stream()
    with pool.get_managed_buffer(0, 1 << 20, Precision.Fp32, stream=s) as buf:
        with torch.cuda.stream(s):
            torch.from_dlpack(buf).fill_(4.0)
        assert (np.frombuffer(buf.to_bytes(), dtype=np.float32) == 4.0).all()
    assert pool.emergency_cleanup(0) > 0
