"""Several GPUs in one process: the report, pools, GPUContext, timing and
device info on the second device. Runs on a machine with at least two GPUs; skips
elsewhere (CI has none)."""

import pytest

torch = pytest.importorskip("torch")

import gpukeeper  # noqa: E402

MiB = 1 << 20


def _gpus() -> int:
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


pytestmark = pytest.mark.skipif(_gpus() < 2, reason="needs two CUDA devices")


def _torch_allocated(report, device):
    fw = report.for_device(device).frameworks.get("torch")
    return None if fw is None else fw.allocated


def test_memory_report_covers_both_devices_and_places_a_tensor():
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda:1")
    torch.cuda.synchronize(1)
    report = gpukeeper.memory_report()
    assert [d.device for d in report.devices][:2] == [0, 1]
    assert _torch_allocated(report, 1) >= 64 * MiB
    assert (_torch_allocated(report, 0) or 0) < 64 * MiB
    assert report.total_bytes == sum(d.total_bytes for d in report.devices)
    text = report.table()
    assert "CUDA device 0" in text and "CUDA device 1" in text
    del x


def test_gpu_context_returns_memory_on_device_1():
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(1)
    with gpukeeper.GPUContext("cuda:1") as ctx:
        y = torch.ones(32 * MiB, device="cuda:1")
        del y
    assert torch.cuda.memory_reserved(1) == before
    assert ctx.report is not None and 1 in ctx.report.devices


def test_pool_on_device_1():
    pool = gpukeeper.MemoryPool("device")
    buf = pool.get_managed_buffer(1, 1 << 20, gpukeeper.Precision.Fp32)
    allocated, peak = pool.memory_usage(1)  # (allocated, peak allocated)
    assert allocated >= 4 * MiB and peak >= allocated
    assert pool.memory_usage(0) == (0, 0)
    report = gpukeeper.memory_report(1)
    assert report.device == 1
    buf.release()
    # Cleaning device 0 leaves device 1's cached segment; cleaning device 1 frees it.
    pool.emergency_cleanup(0)
    assert pool.stats(1).reserved_bytes >= 4 * MiB
    assert pool.emergency_cleanup(1) >= 4 * MiB
    assert pool.stats(1).reserved_bytes == 0 and pool.memory_usage(1)[0] == 0


def test_benchmark_and_info_on_device_1():
    a = torch.randn(1024, 1024, device="cuda:1")
    result = gpukeeper.benchmark_function(lambda: a @ a, n_calls=20, warmup=3, device="cuda:1")
    assert result.device == "cuda:1" and result.timing == "gpu"
    info = gpukeeper.get_gpu_info(1)
    assert info["device"] == 1
