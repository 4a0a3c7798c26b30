"""ManagedBuffer and BufferBatch: RAII, use after release, views that keep memory alive,
host copies."""

from __future__ import annotations

import gc

import pytest

from gpukeeper import BufferBatch, InvalidInputError, ManagedBuffer, Precision

np = pytest.importorskip("numpy")

RELEASED = (InvalidInputError, BufferError)


# ------------------------------------------------------------------ lifetime


def test_with_block_returns_the_buffer(pool, balanced):
    with pool.get_managed_buffer(0, 1024, Precision.Fp32) as buf:
        assert isinstance(buf, ManagedBuffer)
        assert not buf.released
        assert pool.stats(0).allocated_bytes == 4096
    assert buf.released
    balanced(pool)


def test_with_block_returns_the_buffer_on_exception(pool, balanced):
    with pytest.raises(KeyError):
        with pool.get_managed_buffer(0, 1024, Precision.Fp32):
            raise KeyError("inside")
    balanced(pool)


def test_context_protocol_methods_called_directly(pool, balanced):
    buf = pool.get_managed_buffer(0, 8, Precision.Fp32)
    assert buf.__enter__() is buf
    for bad in ((), (None,), (None, None, None, None)):
        with pytest.raises(TypeError, match="takes 3 arguments"):
            buf.__exit__(*bad)
    assert not buf.released  # a refused call changes nothing
    assert buf.__exit__(None, None, None) is False  # exceptions propagate
    assert buf.released
    balanced(pool)


def test_default_precision_is_fp32(pool, balanced):
    for precision in (None, Precision.Fp32, "fp32"):
        with pool.get_managed_buffer(0, 10, precision) as buf:
            assert buf.precision == Precision.Fp32 and buf.nbytes == 40
    with pool.get_managed_buffer(0, 10) as buf:
        assert buf.precision == Precision.Fp32
    balanced(pool)


def test_release_twice_is_harmless(pool, balanced):
    buf = pool.get_managed_buffer(0, 10, Precision.Fp32)
    buf.release()
    buf.release()
    with buf:
        pass
    balanced(pool)
    assert pool.stats(0).allocated_count == 0


def test_buffer_objects_are_reused_clean(pool, balanced):
    # The objects of dead buffers are kept for new ones: none may carry old state.
    import weakref

    for _ in range(3):
        bufs = [pool.get_managed_buffer(0, 16 * (i + 1), Precision.Int8) for i in range(40)]
        views = [weakref.ref(b) for b in bufs]
        bufs[0].release()
        del bufs
        assert all(v() is None for v in views)
        with pool.get_managed_buffer(0, 24, Precision.Fp64) as buf:
            assert not buf.released and buf.exports == 0
            assert buf.size == 24 and buf.nbytes == 192 and buf.precision == Precision.Fp64
            assert pool.owns(0, buf.ptr)
            assert weakref.ref(buf)() is buf
        assert buf.released
    balanced(pool)


def test_buffer_type_is_not_constructible(pool):
    with pytest.raises(TypeError, match="No constructor"):
        ManagedBuffer()
    with pytest.raises(TypeError):
        ManagedBuffer.__new__(ManagedBuffer)
    with pytest.raises(TypeError):
        ManagedBuffer.release(object())
    with pytest.raises(TypeError):
        ManagedBuffer.to_bytes(object())
    with pool.get_managed_buffer(0, 4) as buf:
        with pytest.raises(AttributeError):
            buf.ptr = 1
        with pytest.raises(AttributeError):
            buf.anything = 1


def test_precision_objects_that_are_not_the_members(pool, balanced):
    with pool.get_managed_buffer(0, 8, Precision.Fp16) as first:
        same = first.precision  # equal to Precision.Fp16, not the member object itself
        with pool.get_managed_buffer(0, 8, same) as buf:
            assert buf.precision == Precision.Fp16 and buf.nbytes == 16
    balanced(pool)


def test_buffers_from_many_threads(pool, balanced):
    import threading

    errors = []

    def work() -> None:
        try:
            for i in range(2000):
                with pool.get_managed_buffer(0, 1 + i % 300, Precision.Uint8) as buf:
                    assert buf.size == 1 + i % 300
                keep = pool.get_managed_buffer(0, 64)
                del keep
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    balanced(pool)
    assert pool.validate(0) == ""


def test_buffer_attributes(pool):
    with pool.get_managed_buffer(0, 100, Precision.Fp16) as buf:
        assert buf.nbytes == 200
        assert buf.size == 100
        assert len(buf) == 100
        assert buf.precision == Precision.Fp16
        assert buf.device == 0
        assert buf.kind == pool.kind
        assert buf.stream == 0
        assert buf.exports == 0
        assert isinstance(buf.ptr, int) and buf.ptr != 0
        assert pool.owns(0, buf.ptr)
        text = repr(buf)
        assert "100 x fp16" in text and "200 bytes" in text and hex(buf.ptr) in text
    assert repr(buf) == "<ManagedBuffer released>"
    # Size facts stay readable after release; the memory does not.
    assert buf.nbytes == 200 and buf.size == 100


def test_copy_from_host_and_to_bytes(any_pool):
    data = bytes(range(256)) * 4
    with any_pool.get_managed_buffer(0, 256, Precision.Fp32) as buf:
        buf.copy_from_host(data)
        assert buf.to_bytes() == data
        buf.copy_from_host(b"\xff" * 8)  # a shorter copy writes the start only
        assert buf.to_bytes() == b"\xff" * 8 + data[8:]
        arr = np.arange(256, dtype=np.float32)
        buf.copy_from_host(arr)
        assert np.frombuffer(buf.to_bytes(), dtype=np.float32).tolist() == arr.tolist()
        buf.copy_from_host(arr.reshape(16, 16))  # any contiguous shape
        buf.copy_from_host(bytearray(16))
        buf.copy_from_host(memoryview(data)[:4])
        assert buf.to_bytes()[:4] == data[:4]


def test_copy_from_host_size_checks(any_pool, balanced):
    with any_pool.get_managed_buffer(0, 4, Precision.Fp32) as buf:
        buf.copy_from_host(bytes(16))  # exactly full
        with pytest.raises(InvalidInputError, match="17 bytes do not fit"):
            buf.copy_from_host(bytes(17))
        with pytest.raises(InvalidInputError):
            buf.copy_from_host(np.zeros(5, dtype=np.float32))
        with pytest.raises(InvalidInputError, match="contiguous"):
            buf.copy_from_host(np.zeros((4, 4), dtype=np.float32)[:, 0])
        with pytest.raises((TypeError, InvalidInputError)):
            buf.copy_from_host("not bytes")
        buf.copy_from_host(b"")  # nothing to do
        balanced(any_pool, 256)


# ------------------------------------------------------------------ use after release


def test_use_after_release_raises(any_pool):
    buf = any_pool.get_managed_buffer(0, 64, Precision.Fp32)
    buf.release()
    assert buf.released
    with pytest.raises(InvalidInputError, match="released"):
        buf.ptr
    with pytest.raises(InvalidInputError, match="released"):
        buf.to_bytes()
    with pytest.raises(InvalidInputError, match="released"):
        buf.copy_from_host(bytes(4))
    with pytest.raises(InvalidInputError, match="released"):
        buf.__dlpack__()
    with pytest.raises(RELEASED):
        memoryview(buf)


def test_use_after_release_never_sees_new_owner(host_pool):
    old = host_pool.get_managed_buffer(0, 64, Precision.Uint8)
    old.copy_from_host(b"A" * 64)
    old.release()
    new = host_pool.get_managed_buffer(0, 64, Precision.Uint8)  # same block
    new.copy_from_host(b"B" * 64)
    with pytest.raises(RELEASED):
        old.to_bytes()
    with pytest.raises(RELEASED):
        old.copy_from_host(b"C" * 64)
    assert new.to_bytes() == b"B" * 64
    new.release()


def test_numpy_asarray_of_released_buffer_raises(host_pool):
    # BUG (reported to the lead): numpy swallows the BufferError from the buffer protocol
    # and falls back to a 0-d object array holding the buffer, so np.asarray() of a
    # released buffer "succeeds" silently. A ManagedBuffer.__array__ (or
    # __array_interface__) that raises InvalidInputError once released would fix it.
    buf = host_pool.get_managed_buffer(0, 64, Precision.Fp32)
    buf.release()
    with pytest.raises(RELEASED):
        np.asarray(buf)


def test_released_host_buffer_never_gives_a_view(host_pool):
    buf = host_pool.get_managed_buffer(0, 64, Precision.Fp32)
    buf.release()
    with pytest.raises(RELEASED):
        np.frombuffer(buf, dtype=np.float32)
    with pytest.raises(RELEASED):
        bytes(buf)


# ------------------------------------------------------------------ views keep memory alive


def test_numpy_view_keeps_memory_after_release(host_pool, balanced):
    buf = host_pool.get_managed_buffer(0, 256, Precision.Fp32)
    arr = np.asarray(buf)
    assert arr.dtype == np.float32 and arr.shape == (256,)
    assert arr.ctypes.data == buf.ptr
    assert buf.exports == 1
    arr[:] = 7.0
    assert np.frombuffer(buf.to_bytes(), dtype=np.float32).tolist() == [7.0] * 256
    buf.release()
    assert buf.released
    # The block stays with the view: not reusable, still counted.
    assert host_pool.stats(0).allocated_bytes == 1024
    other = host_pool.get_managed_buffer(0, 256, Precision.Fp32)
    assert other.ptr != arr.ctypes.data
    other.release()
    arr[:] = 1.0  # still our memory
    assert arr.sum() == 256.0
    with pytest.raises(InvalidInputError):
        buf.ptr  # the buffer object itself is released
    del arr
    gc.collect()
    assert buf.exports == 0
    balanced(host_pool)


def test_memoryview_counts_as_export(host_pool, balanced):
    with host_pool.get_managed_buffer(0, 16, Precision.Int32) as buf:
        view = memoryview(buf)
        assert buf.exports == 1
        assert (view.format, view.itemsize, view.shape, view.nbytes) == ("i", 4, (16,), 64)
        assert not view.readonly
        view2 = memoryview(buf)
        assert buf.exports == 2
        view.release()
        view2.release()
        assert buf.exports == 0
    balanced(host_pool)


def test_release_with_view_then_view_ends(host_pool, balanced):
    buf = host_pool.get_managed_buffer(0, 16, Precision.Int32)
    view = memoryview(buf)
    buf.release()
    balanced(host_pool, 256)
    view.release()
    balanced(host_pool)


def test_raw_byte_view_without_format(host_pool):
    # A consumer that asks for no format reads bytes: the shape must count bytes.
    with host_pool.get_managed_buffer(0, 16, Precision.Fp64) as buf:
        raw = bytes(buf)
        assert len(raw) == 128
        arr = np.frombuffer(buf, dtype=np.uint8)
        assert arr.shape == (128,)
        del arr


# ------------------------------------------------------------------ BufferBatch


def test_batch_holds_many_buffers(pool, balanced):
    batch = pool.create_buffer_batch(0)
    assert isinstance(batch, BufferBatch)
    assert batch.device == 0
    a = batch.add_buffer(bytes(range(256)), 64, Precision.Fp32)
    b = batch.add_buffer(bytes(128), 64, Precision.Fp16)
    c = batch.add_buffer(100, Precision.Int8)
    assert len(batch) == 3
    assert list(batch) == [a, b, c] and batch[1] is b
    assert (a.size, a.precision, a.nbytes) == (64, Precision.Fp32, 256)
    assert (b.size, b.precision) == (64, Precision.Fp16)
    assert (c.size, c.precision) == (100, Precision.Int8)
    assert a.to_bytes() == bytes(range(256))  # host data was copied in
    assert batch.total_bytes == 256 + 128 + 100
    assert pool.stats(0).allocated_count == 3
    assert "buffers=3" in repr(batch)
    batch.release()
    assert len(batch) == 0
    assert a.released and b.released and c.released
    balanced(pool)


def test_batch_as_context_manager(pool, balanced):
    with pool.create_buffer_batch(0) as batch:
        for n in (10, 20, 30):
            batch.add_buffer(n, Precision.Fp64)
        assert pool.stats(0).allocated_count == 3
    balanced(pool)


def test_batch_released_when_dropped(pool, balanced):
    batch = pool.create_buffer_batch(0)
    batch.add_buffer(bytes(256), 64, Precision.Fp32)
    batch.add_buffer(bytes(128), 64, Precision.Fp16)
    assert pool.stats(0).allocated_count == 2
    del batch
    gc.collect()
    balanced(pool)


def test_batch_infers_count_and_accepts_numpy(pool):
    with pool.create_buffer_batch(0) as batch:
        arr = np.arange(12, dtype=np.float32).reshape(3, 4)
        buf = batch.add_buffer(arr, Precision.Fp32)
        assert buf.size == 12
        assert np.frombuffer(buf.to_bytes(), dtype=np.float32).tolist() == list(range(12))
        assert batch.add_buffer(bytes(8), "fp16").size == 4
        assert batch.add_buffer(bytes(8)).precision == Precision.Fp32  # default
        assert batch.add_buffer(16, 16, Precision.Uint8).size == 16


def test_batch_bad_input_leaves_it_unchanged(pool, balanced, pool_books):
    with pool.create_buffer_batch(0) as batch:
        batch.add_buffer(4, Precision.Fp32)
        before = pool_books(pool)
        bad = [
            ((b"abc", Precision.Fp32), "not a whole number"),
            ((bytes(256), 63, Precision.Fp32), "need"),
            ((4, 5, Precision.Fp32), "count given twice"),
            ((object(), Precision.Fp32), "buffer protocol"),
            ((True, Precision.Fp32), None),
            ((0, Precision.Fp32), None),
            ((-3, Precision.Fp32), None),
            ((b"", Precision.Fp32), None),
            ((8, "fp13"), "unknown precision"),
        ]
        for args, match in bad:
            with pytest.raises(InvalidInputError, match=match):
                batch.add_buffer(*args)
            assert len(batch) == 1, args
            assert pool_books(pool) == before, args
        balanced(pool, 256)


def test_batch_with_non_contiguous_data_is_an_input_error(pool, balanced, pool_books):
    # BUG (reported to the lead): BufferBatch.add_buffer casts the data with
    # memoryview.cast('B'), which raises TypeError ("casts are restricted to C-contiguous
    # views") for a strided or Fortran-ordered array; ManagedBuffer.copy_from_host gives
    # InvalidInputError for the same data. The block is returned either way.
    with pool.create_buffer_batch(0) as batch:
        for data in (
            np.zeros((4, 4), dtype=np.float32)[:, 0],
            np.asfortranarray(np.zeros((4, 4), dtype=np.float32)),
        ):
            try:
                with pytest.raises(InvalidInputError):
                    batch.add_buffer(data, Precision.Fp32)
            finally:
                assert len(batch) == 0
                balanced(pool)


def test_batch_for_unknown_device(pool, balanced):
    for device in (99, -1, None, 1.5):
        with pytest.raises(InvalidInputError):
            pool.create_buffer_batch(device)
    balanced(pool)


def test_batch_for_non_int_device_is_an_input_error(pool):
    # BUG (reported to the lead): BufferBatch.__init__ compares the device id with ints
    # before validating it, so a str gives TypeError ("'>=' not supported") instead of
    # InvalidInputError, and 0.5 passes (0 <= 0.5 < device_count) and only fails later,
    # in add_buffer.
    with pytest.raises(InvalidInputError):
        pool.create_buffer_batch("a")
    with pytest.raises(InvalidInputError):
        pool.create_buffer_batch(0.5)
