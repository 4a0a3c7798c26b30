"""PyTorch's memory API on gpukeeper's pool (gpukeeper.integrations.torch_memory_api).

The formats are checked here against PyTorch's own consumers (memory_summary, the
memory_viz tools) with host pools; the GPU tests run real scripts under
use_torch_allocator() in a child process (the allocator must be chosen before PyTorch's
first CUDA allocation), see torch_memory_api_child.py.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
from child_process import run_child

import gpukeeper
from gpukeeper import _core
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.integrations import torch_memory_api

torch = pytest.importorskip("torch")

CHILD = Path(__file__).with_name("torch_memory_api_child.py")
MiB = 1 << 20


def _flatten(nested: dict) -> "collections.OrderedDict[str, int]":
    """What torch.cuda.memory_stats() makes of the nested dict (its own flattening)."""
    out = []

    def walk(prefix: str, obj: object) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out.append((prefix, obj))

    walk("", nested)
    return collections.OrderedDict(sorted(out))


@pytest.fixture
def busy_pool():
    """A host pool with live small and large blocks and a freed one."""
    pool = gpukeeper.MemoryPool("host")
    keep = [pool.get_managed_buffer(0, n, gpukeeper.Precision.Uint8) for n in (1000, 5000, 3 * MiB)]
    freed = pool.get_managed_buffer(0, 12 * MiB, gpukeeper.Precision.Uint8)
    freed.release()
    yield pool, keep
    for b in keep:
        b.release()
    pool.emergency_cleanup_all()


def test_stats_dict_has_torch_keys_and_the_pools_figures(busy_pool):
    pool, _ = busy_pool
    stats = _flatten(torch_memory_api.memory_stats_dict(pool.history(0)))
    s = pool.stats(0)
    assert stats["allocated_bytes.all.current"] == s.allocated_bytes
    assert stats["allocated_bytes.all.peak"] == s.peak_allocated_bytes
    assert stats["reserved_bytes.all.current"] == s.reserved_bytes
    assert stats["reserved_bytes.all.peak"] == s.peak_reserved_bytes
    assert stats["requested_bytes.all.current"] == s.requested_bytes
    assert stats["active_bytes.all.current"] == s.allocated_bytes
    assert stats["allocation.all.current"] == 3
    assert stats["allocation.all.allocated"] == 4
    assert stats["allocation.all.freed"] == 1
    assert stats["allocated_bytes.all.freed"] == 12 * MiB
    assert stats["segment.all.current"] == s.segment_count
    assert stats["num_device_alloc"] == s.upstream_allocations
    small = stats["allocated_bytes.small_pool.current"]
    large = stats["allocated_bytes.large_pool.current"]
    assert (small, large) == (1024 + 5120, 3 * MiB)
    for key in ("num_alloc_retries", "num_ooms", "num_device_free", "num_sync_all_streams"):
        assert stats[key] == 0
    assert all(isinstance(v, int) for v in stats.values())


def test_the_flat_stats_are_torchs_flattening_of_the_nested_ones(busy_pool):
    pool, _ = busy_pool
    h = pool.history(0)
    flat = torch_memory_api.memory_stats_flat(h)
    assert flat == _flatten(torch_memory_api.memory_stats_dict(h))
    assert list(flat) == sorted(flat)


def test_torchs_memory_summary_reads_every_key_it_needs(busy_pool, monkeypatch):
    pool, _ = busy_pool
    flat = _flatten(torch_memory_api.memory_stats_dict(pool.history(0)))
    # memory_summary() formats what memory_stats() returns: feed it ours.
    monkeypatch.setattr(torch.cuda.memory, "memory_stats", lambda device=None: flat)
    text = torch.cuda.memory.memory_summary(0)
    assert "PyTorch CUDA memory summary, device ID 0" in text
    assert "Allocated memory" in text and "from small pool" in text
    assert "CUDA OOMs: 0" in text


def test_peak_and_accumulated_resets_follow_torchs_meaning(busy_pool):
    pool, keep = busy_pool
    pool.reset_peaks(0)
    h = pool.history(0)
    assert h.allocated_bytes.all.peak == h.allocated_bytes.all.current
    assert h.allocated_bytes.all.allocated > 0
    pool.reset_accumulated(0)
    h = pool.history(0)
    assert (h.allocated_bytes.all.allocated, h.allocated_bytes.all.freed) == (0, 0)
    assert h.allocated_bytes.all.current == pool.stats(0).allocated_bytes


def test_snapshot_dict_is_read_by_torchs_memory_viz(busy_pool):
    pool, keep = busy_pool
    snap = torch_memory_api.snapshot_dict({0: pool.snapshot(0)})
    segments = snap["segments"]
    assert snap["device_traces"] == [[]]
    assert sum(seg["total_size"] for seg in segments) == pool.stats(0).reserved_bytes
    assert sum(seg["allocated_size"] for seg in segments) == pool.stats(0).allocated_bytes
    live = sorted(b["address"] for seg in segments for b in seg["blocks"]
                  if b["state"] == "active_allocated")
    assert live == sorted(b.ptr for b in keep)
    for seg in segments:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    from torch.cuda import _memory_viz

    summary = _memory_viz.segsum(snap)
    assert "Summary of segments" in summary or "segment" in summary.lower()
    html = _memory_viz.segment_plot(snap)
    assert "<html" in html.lower() or "<script" in html.lower()
    html = _memory_viz.trace_plot(snap)
    assert len(html) > 100


def test_an_empty_snapshot_is_valid():
    snap = torch_memory_api.snapshot_dict({})
    assert snap["segments"] == [] and snap["device_traces"] == []


def test_install_and_restore_swap_torchs_functions_back_and_forth():
    before = {name: getattr(torch._C, name, None) for name in torch_memory_api._PRIMITIVES}
    fast_before = torch.cuda.memory_allocated
    try:
        torch_memory_api.install(torch)
        torch_memory_api.install(torch)  # idempotent
        assert torch_memory_api.is_installed()
        assert torch.cuda.memory_allocated is not fast_before
        assert torch.cuda.memory.memory_allocated is torch.cuda.memory_allocated
        for name, original in before.items():
            if original is not None:
                assert getattr(torch._C, name) is not original
    finally:
        torch_memory_api.restore()
    assert not torch_memory_api.is_installed()
    assert torch.cuda.memory_allocated is fast_before
    for name, original in before.items():
        assert getattr(torch._C, name, None) is original


def test_bad_devices_get_a_typed_error(monkeypatch):
    funcs = torch_memory_api._replacements(torch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    with pytest.raises(InvalidInputError, match="does not exist"):
        funcs["memory_allocated"](9)
    with pytest.raises(InvalidInputError, match="does not exist"):
        funcs["_cuda_memoryStats"](-1)
    with pytest.raises(ValueError):
        funcs["memory_reserved"]("cpu")
    # A device that exists but where PyTorch never allocated holds nothing.
    assert funcs["max_memory_allocated"](7) == 0
    assert funcs["_cuda_memoryStats"](7)["allocated_bytes"]["all"]["current"] == 0
    assert funcs["_cuda_getMemoryFraction"](7) == 1.0


def test_the_oom_error_is_pytorchs_own_type():
    from gpukeeper.integrations import torch_allocator

    paths = torch_allocator._torch_library_paths(torch)
    assert any(os.path.basename(p) == "libc10.so" for p in paths)
    assert _core._link_torch_oom(paths) == ""
    type_name, text = _core._torch_oom_probe("CUDA out of memory. Tried to allocate 1 B.")
    assert type_name == "N3c1016OutOfMemoryErrorE"
    assert text.startswith("CUDA out of memory. Tried to allocate 1 B.")
    assert "is loaded" in _core._link_torch_oom(["/no/such/libc10.so"])
    # A failed link keeps the working one.
    assert _core._torch_oom_probe("x")[0] == "N3c1016OutOfMemoryErrorE"


# --------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["auto", "pluggable"])
def test_gpu_torchs_memory_api_answers_from_the_pool(route):
    out = run_child(CHILD, "api", route=route)
    assert out["allocated"] == out["pool_allocated"] > 0
    assert out["reserved"] == out["pool_reserved"] >= out["allocated"]
    assert out["stats_allocated"] == out["allocated"]
    assert out["max_after_reset"] == out["allocated"]
    assert out["peak_before_reset"] >= out["allocated"] + 64 * MiB
    assert out["accumulated_after_reset"] == 0
    assert out["summary_ok"] and out["snapshot_ok"] and out["viz_ok"]
    assert out["empty_cache_released"] > 0
    assert out["fraction"] == pytest.approx(0.5, abs=1e-6)
    assert out["fraction_oom"] == "OutOfMemoryError"
    if out["route"] == "component":
        assert not out["restored_raises"] and out["restored_allocated"] == out["pool_allocated"]
    else:
        assert out["restored_raises"]
    assert out["early_import_ok"]


@pytest.mark.gpu
def test_gpu_oom_under_the_hook_is_torchs_oom():
    out = run_child(CHILD, "oom")
    assert out["plain_except"] == "OutOfMemoryError"
    assert "CUDA out of memory" in out["message"] and "gpukeeper" in out["message"]
    assert out["retry_on_oom"] == "fallback"
    assert out["oom_status"] == ""
    if out["accelerate_batch_size"] is not None:  # accelerate is installed
        assert 0 < out["accelerate_batch_size"] < out["total"]
    assert out["num_ooms"] >= 1
    assert out["usable_after"]
    assert out["validate"] == ""


@pytest.mark.gpu
def test_gpu_a_real_training_loop_logs_peak_memory_every_step():
    out = run_child(CHILD, "train", timeout=600)
    assert out["steps"] >= 5
    assert all(p > 0 for p in out["peaks"])
    assert out["peaks_match_pool"]
    assert out["loss_finite"]
    assert "trainer_error" not in out, out.get("trainer_error")
    assert any("gpu" in k for k in out["trainer_memory_metrics"]), out["trainer_memory_metrics"]
    assert "lightning_error" not in out, out.get("lightning_error")
    assert out["lightning_memory_columns"] >= 1
