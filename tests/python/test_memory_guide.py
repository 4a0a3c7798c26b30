"""The memory management guide's examples (written in Rust there), in Python with the same names.

Each test follows one example of the guide as closely as Python allows and then
checks that it did what the guide promises.
"""

from __future__ import annotations

import gc
import warnings

import pytest

import gpukeeper
from gpukeeper import (
    AllocationError,
    BufferBatch,
    GpuError,
    InvalidInputError,
    ManagedBuffer,
    MemoryPool,
    Precision,
)

device_id = 0


# use annie::gpu::memory::GpuMemoryPool; let pool = GpuMemoryPool::new();
# { let buffer = pool.get_managed_buffer(0, 1024, Precision::Fp32); }  // returned here
def test_raii_managed_buffer(pool, balanced):
    with pool.get_managed_buffer(0, 1024, Precision.Fp32) as buffer:
        assert isinstance(buffer, ManagedBuffer)
        assert buffer.nbytes == 1024 * 4
        assert pool.memory_usage(0)[0] == 4096
    # Buffer automatically returned to pool here
    assert pool.memory_usage(0) == (0, 4096)
    balanced(pool)


def test_raii_scope_without_with(pool, balanced):
    def scope():
        buffer = pool.get_managed_buffer(0, 1024, Precision.Fp32)  # noqa: F841
        assert pool.memory_usage(0)[0] == 4096

    scope()  # dropped at the end of the scope, like Rust's Drop
    balanced(pool)


# let pressure = pool.memory_pressure(device_id);
# if let Some(p) = pressure { if p > 0.8 { println!(...) } }
# if pressure.unwrap_or(0.0) > 0.9 { pool.emergency_cleanup(device_id); }
def test_memory_pressure_handling(pool, capsys):
    # Sizes in whole 2 MiB pages, so that fixed segments and expandable ranges (the
    # default on a device) hold the same bytes.
    pool.set_max_pool_size(device_id, 10 << 20)
    held = pool.get_managed_buffer(device_id, 8 << 20, Precision.Uint8)  # 0.8 of the limit
    spare = pool.get_managed_buffer(device_id, 1000, Precision.Uint8)
    spare.release()  # cached: reserved stays at 8 MiB + a 2 MiB small segment

    pressure = pool.memory_pressure(device_id)
    if pressure is not None:
        if pressure > 0.8:
            print(f"High memory pressure: {pressure * 100.0:.1f}%")
    if (pressure if pressure is not None else 0.0) > 0.9:
        pool.emergency_cleanup(device_id)

    assert "High memory pressure: " in capsys.readouterr().out
    assert pressure > 0.9
    # The cleanup dropped the cached segment; the live 8 MiB stays.
    assert pool.stats(device_id).reserved_bytes == 8 << 20
    assert pool.memory_pressure(device_id) == pytest.approx(0.8)
    held.release()


def test_memory_pressure_of_unknown_device_is_none(pool):
    pressure = pool.memory_pressure(42)
    assert pressure is None
    assert (pressure if pressure is not None else 0.0) == 0.0


# let mut batch = pool.create_buffer_batch(device_id);
# batch.add_buffer(vec![0u8; 256], 64, Precision::Fp32);
# batch.add_buffer(vec![0u8; 128], 64, Precision::Fp16);
# // All buffers automatically cleaned up when batch is dropped
def test_batch_operations(pool, balanced):
    batch = pool.create_buffer_batch(device_id)
    assert isinstance(batch, BufferBatch)
    batch.add_buffer(bytes(256), 64, Precision.Fp32)
    batch.add_buffer(bytes(128), 64, Precision.Fp16)
    assert len(batch) == 2
    assert pool.stats(device_id).allocated_count == 2
    assert batch[0].to_bytes() == bytes(256)
    del batch
    gc.collect()
    balanced(pool)


# let mut batch = pool.create_buffer_batch(device_id);
# for data_chunk in data_chunks { batch.add_buffer(process_chunk(data_chunk), size, precision); }
def test_batch_related_operations(pool, balanced):
    size, precision = 64, Precision.Fp32

    def process_chunk(chunk):
        return bytes([chunk]) * (size * precision.itemsize)

    data_chunks = range(5)
    with pool.create_buffer_batch(device_id) as batch:
        for data_chunk in data_chunks:
            batch.add_buffer(process_chunk(data_chunk), size, precision)
        assert [b.to_bytes()[0] for b in batch] == list(data_chunks)
    # All buffers cleaned up together
    balanced(pool)


# pool.set_max_pool_size(device_id, 1024 * 1024 * 1024);
# let (total_allocated, total_peak) = pool.total_memory_usage();
def test_pool_limits_and_total_usage(pool, capsys):
    pool.set_max_pool_size(device_id, 1024 * 1024 * 1024)
    assert pool.max_pool_size(device_id) == 1 << 30
    with pool.get_managed_buffer(device_id, 1000, Precision.Fp64):
        total_allocated, total_peak = pool.total_memory_usage()
        print(f"Total allocated: {total_allocated} bytes, Peak: {total_peak} bytes")
    assert total_allocated == 8192  # 8000 rounded to 256
    assert total_peak == 8192
    assert "Total allocated: 8192 bytes, Peak: 8192 bytes" in capsys.readouterr().out
    assert pool.total_memory_usage() == (0, 8192)


# if let Some((allocated, peak)) = pool.memory_usage(device_id) { println!(...) }
def test_memory_usage_monitoring(pool, capsys):
    with pool.get_managed_buffer(device_id, 256, Precision.Uint8):
        usage = pool.memory_usage(device_id)
        if usage is not None:
            allocated, peak = usage
            print(f"Device {device_id}: {allocated} bytes allocated, {peak} bytes peak")
    assert "Device 0: 256 bytes allocated, 256 bytes peak" in capsys.readouterr().out
    assert pool.memory_usage(99) is None


# match gpu_operation() {
#     Err(GpuError::InvalidInput(msg)) => ...,
#     Err(GpuError::Allocation(msg)) => { pool.emergency_cleanup_all(); }
#     Err(e) => ..., Ok(_) => {} }
def test_enhanced_error_types(pool):
    def handle(operation):
        try:
            operation()
        except InvalidInputError as e:
            return ("invalid", str(e))
        except AllocationError as e:
            pool.emergency_cleanup_all()
            return ("allocation", str(e))
        except GpuError as e:
            return ("other", str(e))
        return ("ok", "")

    pool.get_managed_buffer(device_id, 1000, Precision.Fp32).release()
    assert pool.stats(device_id).reserved_bytes > 0
    assert handle(lambda: pool.get_managed_buffer(device_id, 10, "fp13"))[0] == "invalid"
    assert handle(lambda: pool.get_managed_buffer(device_id, -1, Precision.Fp32))[0] == "invalid"
    kind, msg = handle(lambda: pool.get_managed_buffer(device_id, 2**45, Precision.Uint8))
    assert kind == "allocation" and "out of memory" in msg
    assert pool.stats(device_id).reserved_bytes == 0  # emergency_cleanup_all ran
    assert handle(lambda: pool.get_managed_buffer(device_id, 10, Precision.Fp32).release()) == (
        "ok",
        "",
    )


# fn robust_gpu_operation(pool, data) { match gpu_operation(data) {
#     Err(GpuError::Allocation(_)) => { pool.emergency_cleanup_all(); gpu_operation(data) } ... } }
def test_error_recovery(pool, balanced):
    pool.set_max_pool_size(device_id, 4 << 20)
    attempts = []

    def gpu_operation(data):
        attempts.append(len(data))
        with pool.get_managed_buffer(device_id, len(data), Precision.Uint8) as buf:
            buf.copy_from_host(data)
            return buf.to_bytes()

    def robust_gpu_operation(data):
        try:
            return gpu_operation(data)
        except AllocationError:
            # Try cleanup and retry once
            pool.emergency_cleanup_all()
            return gpu_operation(data)

    data = b"x" * (1 << 20)
    assert robust_gpu_operation(data) == data
    assert attempts == [len(data)]
    attempts.clear()
    too_big = b"y" * (5 << 20)  # more than the pool may ever hold
    with pytest.raises(AllocationError):
        robust_gpu_operation(too_big)
    assert attempts == [len(too_big)] * 2  # tried, cleaned up, retried once
    assert pool.stats(device_id).reserved_bytes == 0
    balanced(pool)


# Preferred: let buffer = pool.get_managed_buffer(device_id, size, precision);
# Avoid:     let raw_buffer = pool.get_buffer(device_id, size, precision);
#            pool.return_buffer(device_id, raw_buffer, size, precision); // Easy to forget!
def test_legacy_raw_api(pool, balanced):
    size, precision = 1024, Precision.Fp32
    with pytest.warns(DeprecationWarning, match="get_managed_buffer"):
        raw_buffer = pool.get_buffer(device_id, size, precision)
    assert isinstance(raw_buffer, int)
    assert raw_buffer % 256 == 0
    assert pool.owns(device_id, raw_buffer)
    balanced(pool, 4096)
    pool.return_buffer(device_id, raw_buffer, size, precision)
    balanced(pool)
    with pytest.raises(InvalidInputError):
        pool.return_buffer(device_id, raw_buffer, size, precision)  # twice
    balanced(pool)


def test_legacy_warning_points_at_the_caller(pool):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ptr = pool.get_buffer(device_id, 16, Precision.Fp16)
    assert caught and caught[0].category is DeprecationWarning
    assert caught[0].filename == __file__
    pool.return_buffer(device_id, ptr, 16, Precision.Fp16)


@pytest.mark.live_buffers
def test_forgotten_raw_buffer(pool):
    # "Easy to forget!": a raw buffer never returned stays allocated (the pool's books
    # still validate); its memory goes back only when the pool itself goes.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ptr = pool.get_buffer(0, 1024, Precision.Fp32)
    pool.get_managed_buffer(0, 1024, Precision.Fp32).release()
    assert pool.stats(0).allocated_bytes == 4096
    assert pool.owns(0, ptr)
    pool.emergency_cleanup(0)
    assert pool.stats(0).reserved_bytes > 0  # the segment holding it cannot go


# fn check_memory_health(pool, device_id) {
#     if pressure > 0.7 { warn } if pressure > 0.9 { error; pool.emergency_cleanup(device_id) } }
def test_check_memory_health(pool):
    log = []

    def check_memory_health(pool, device_id):
        pressure = pool.memory_pressure(device_id)
        if pressure is not None:
            if pressure > 0.7:
                log.append(f"warn: high memory pressure on device {device_id}: {pressure * 100:.1f}%")
            if pressure > 0.9:
                log.append("error: critical memory pressure, performing emergency cleanup")
                pool.emergency_cleanup(device_id)

    # Whole 2 MiB pages: the same bytes in fixed segments and in expandable ranges.
    pool.set_max_pool_size(device_id, 10 << 20)
    check_memory_health(pool, device_id)
    assert log == []
    big = pool.get_managed_buffer(device_id, 8 << 20, Precision.Uint8)
    check_memory_health(pool, device_id)
    assert log == ["warn: high memory pressure on device 0: 80.0%"]
    small = pool.get_managed_buffer(device_id, 384 << 10, Precision.Uint8)  # a 2 MiB segment
    big.release()
    small.release()
    log.clear()
    check_memory_health(pool, device_id)
    assert log == [
        "warn: high memory pressure on device 0: 100.0%",
        "error: critical memory pressure, performing emergency cleanup",
    ]
    assert pool.stats(device_id).reserved_bytes == 0


# fn configure_gpu_memory(pool) { let max_pool = stats.total * 70 / 100; pool.set_max_pool_size(0, max_pool); }
def test_configure_pool_from_memory_info(pool):
    if pool.kind == "host":
        _, total = gpukeeper._core.host_memory_info()
    else:
        _, total = gpukeeper._core.device_memory_info(0)
    max_pool = total * 70 // 100
    pool.set_max_pool_size(0, max_pool)
    assert pool.max_pool_size(0) == max_pool
    assert pool.memory_pressure(0) == 0.0


def test_the_guide_names_exist():
    for name in (
        "get_managed_buffer",
        "get_buffer",
        "return_buffer",
        "memory_pressure",
        "emergency_cleanup",
        "emergency_cleanup_all",
        "create_buffer_batch",
        "set_max_pool_size",
        "memory_usage",
        "total_memory_usage",
    ):
        assert callable(getattr(MemoryPool, name)), name
    assert callable(BufferBatch.add_buffer)
    for name in ("Fp32", "Fp16"):
        assert isinstance(getattr(Precision, name), Precision)
