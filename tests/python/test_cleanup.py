"""GPUContext, cleanup_models and cleanup_cuda (gpukeeper.cleanup), and the helpers of
gpukeeper.frameworks they use.

On a machine without a GPU the context watches gpukeeper's host pools, which is real
memory that real reference cycles can keep alive; the leak-naming path is exercised by
standing a "torch" reader on device 0 that counts live CPU tensors (the frameworks' code
paths are the same). The tests marked gpu check the promise itself: after the context,
PyTorch's (and gpukeeper's) allocated and reserved bytes are back at their entry values.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
import warnings
import weakref
from typing import Any, List

import pytest

import gpukeeper
from gpukeeper import GpuError, InvalidInputError, MemoryPool, Precision, frameworks
from gpukeeper.base import device_names as devices
from gpukeeper.cleanup import (
    CleanupReport,
    EmptiedObjectError,
    GPUContext,
    LeakWarning,
    MemoryLeakError,
    cleanup_cuda,
    cleanup_models,
)

torch = pytest.importorskip("torch")
from torch_cuda import torch_cuda_usable  # noqa: E402

CUDA = bool(gpukeeper.cuda_available())
TORCH_CUDA = CUDA and torch_cuda_usable()
needs_torch_cuda = pytest.mark.skipif(not TORCH_CUDA, reason="needs PyTorch with a usable CUDA device")
MiB = 1 << 20


@pytest.fixture
def no_auto_gc():
    """Keeps the collector from breaking a test's reference cycle before the context does."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


@pytest.fixture
def host():
    """A host pool, emptied and checked at the end."""
    pool = MemoryPool("host")
    yield pool
    gc.collect()
    assert pool.validate(0) == ""
    assert pool.stats(0).allocated_bytes == 0
    pool.emergency_cleanup_all()


def _cycle_holding(obj: Any) -> weakref.ref:
    """Puts obj in a reference cycle nobody refers to; returns a weakref to the cycle."""

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other, a.payload = b, a, obj
    return weakref.ref(a)


# ============================================================================ GPUContext


def test_empty_block_is_fast_and_collects_nothing(monkeypatch):
    calls: List[Any] = []
    real_collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or real_collect(*a))
    with GPUContext() as ctx:
        pass
    report = ctx.report
    assert isinstance(report, CleanupReport)
    assert report.source == "GPUContext"
    assert report.gc_runs == 0 and calls == []
    assert report.held == {} and report.held_bytes == 0 and not report.leaked
    assert report.exc_type is None
    assert report.synchronized
    json.dumps(report.to_dict())
    assert "nothing held" in str(report)


@pytest.mark.quiet_machine
def test_exit_with_nothing_held_costs_under_a_millisecond():
    ctx = GPUContext()
    for _ in range(20):  # warm-up
        with ctx:
            pass
    times = []
    for _ in range(300):
        t0 = time.perf_counter()
        with ctx:
            pass
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 1e-3, f"median {statistics.median(times) * 1e6:.0f} us"


def test_cycle_holding_host_memory_is_collected_only_when_needed(host, no_auto_gc):
    with GPUContext() as ctx:
        ref = _cycle_holding(host.get_managed_buffer(0, 256 * 1024, Precision.Fp32))
        assert ref() is not None
        assert host.stats(0).allocated_bytes == MiB  # the cycle keeps the buffer alive
    assert ref() is None
    assert host.stats(0).allocated_bytes == 0
    assert host.stats(0).reserved_bytes == 0  # released after the collection, too
    report = ctx.report
    assert report.gc_runs >= 1 and report.gc_objects > 0
    assert not report.leaked
    assert report.after["host"]["gpukeeper"].allocated == report.before["host"]["gpukeeper"].allocated
    assert report.released.get("gpukeeper", 0) >= MiB


def test_memory_kept_alive_by_a_name_is_reported_and_warned(host):
    with pytest.warns(LeakWarning, match=r"4\.0 MiB still held") as record:
        with GPUContext() as ctx:
            kept = host.get_managed_buffer(0, MiB, Precision.Fp32)
    assert "gpukeeper 4.0 MiB on host" in str(record[0].message)
    assert record[0].filename == __file__  # points at the with statement
    report = ctx.report
    assert report.held == {"host": {"gpukeeper": 4 * MiB}}
    assert report.held_bytes == 4 * MiB and report.leaked
    assert report.gc_runs == 2  # young generations, then a full collection, in vain
    assert "still held" in report.table()
    kept.release()


def test_tolerance_and_no_warning(host):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with GPUContext(tolerance_bytes=MiB) as ctx:
            kept = host.get_managed_buffer(0, 1024, Precision.Fp32)  # 4 KiB <= tolerance
        with GPUContext(warn_on_leak=False, tolerance_bytes=0):
            kept2 = host.get_managed_buffer(0, 1024, Precision.Fp32)
    assert ctx.report.held_bytes == 4096
    kept.release()
    kept2.release()


def test_raise_on_leak(host):
    with pytest.raises(MemoryLeakError, match="still held") as info:
        with GPUContext(raise_on_leak=True, tolerance_bytes=0):
            kept = host.get_managed_buffer(0, 64, Precision.Fp32)
    assert isinstance(info.value, GpuError)
    assert info.value.report.held_bytes == 256
    kept.release()


def test_raise_on_leak_never_replaces_the_blocks_exception(host):
    with pytest.warns(LeakWarning):
        with pytest.raises(ValueError, match="the block's own"):
            with GPUContext(raise_on_leak=True, tolerance_bytes=0):
                kept = host.get_managed_buffer(0, 64, Precision.Fp32)
                raise ValueError("the block's own")
    kept.release()


@pytest.mark.parametrize("exc", [ValueError, KeyboardInterrupt])
def test_cleanup_runs_when_the_block_raises(host, no_auto_gc, exc):
    ctx = GPUContext()
    with pytest.raises(exc):
        with ctx:
            ref = _cycle_holding(host.get_managed_buffer(0, 1024, Precision.Fp32))
            raise exc()
    assert ref() is None
    assert host.stats(0).allocated_bytes == 0
    assert ctx.report.exc_type == exc.__name__
    assert ctx.report.gc_runs >= 1


def test_collect_option(host, no_auto_gc):
    with GPUContext(collect=False, warn_on_leak=False) as ctx:
        ref = _cycle_holding(host.get_managed_buffer(0, 1024, Precision.Fp32))
    assert ref() is not None and ctx.report.gc_runs == 0 and ctx.report.held_bytes == 4096
    gc.collect()
    with GPUContext(collect=True) as ctx:
        pass
    assert ctx.report.gc_runs == 1  # a full collection, though nothing was held


def test_nested_contexts_keep_their_own_baselines(host):
    with pytest.warns(LeakWarning):
        with GPUContext(tolerance_bytes=0) as outer:
            a = host.get_managed_buffer(0, 1024, Precision.Fp32)  # held by the outer block
            with GPUContext() as inner:
                b = host.get_managed_buffer(0, 2048, Precision.Fp32)
                del b
            assert not inner.report.leaked
    # The inner exit released the caches; the outer baseline is untouched.
    inner_entry = inner.report.before["host"]["gpukeeper"].allocated
    outer_entry = outer.report.before["host"]["gpukeeper"].allocated
    assert inner_entry - outer_entry == 4096
    assert outer.report.held == {"host": {"gpukeeper": 4096}}
    a.release()


def test_one_instance_reentered_and_as_decorator(host):
    ctx = GPUContext(tolerance_bytes=0)
    depth = []

    @ctx
    def recurse(n: int) -> int:
        buf = host.get_managed_buffer(0, 16, Precision.Fp32)
        depth.append(n)
        result = recurse(n - 1) if n else 0
        buf.release()
        return result

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recurse(3)
    assert depth == [3, 2, 1, 0]
    assert not ctx.report.leaked


@pytest.mark.parametrize(
    "device, expected",
    [(None, None), (0, [0]), (2, [2]), ("cuda:1", [1]), ("CPU", []), ("cpu", [])],
)
def test_device_argument(device, expected, monkeypatch):
    monkeypatch.setattr(devices, "cuda_status", lambda: (4, ""))  # a machine with 4 GPUs
    assert GPUContext(device)._fixed == expected


def test_torch_devices_accepted(monkeypatch):
    monkeypatch.setattr(devices, "cuda_status", lambda: (4, ""))
    assert GPUContext(torch.device("cpu"))._fixed == []
    assert GPUContext(torch.device("cuda", 3))._fixed == [3]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"device": -1},
        {"device": True},
        {"device": 1.5},
        {"device": "tpu:0"},
        {"device": "cuda:x"},
        {"tolerance_bytes": -1},
        {"tolerance_bytes": 1.0},
        {"collect": "yes"},
        {"max_listed": -2},
    ],
)
def test_bad_arguments(kwargs):
    with pytest.raises(InvalidInputError):
        GPUContext(**kwargs)


def test_cpu_context_does_not_touch_devices(host, monkeypatch):
    # A CPU context must neither synchronize nor release device caches.
    called: List[Any] = []
    monkeypatch.setattr(frameworks, "synchronize_all", lambda d=None: called.append(("sync", d)))
    monkeypatch.setattr(frameworks, "release_all_caches", lambda d=None: called.append(("release", d)) or {})
    with GPUContext("cpu") as ctx:
        buf = host.get_managed_buffer(0, 1024, Precision.Fp32)
        buf.release()
    assert called == []
    assert ctx.report.devices == []
    assert ctx.report.released.get("gpukeeper", 0) >= 4096  # the host pool still let go


def test_failed_synchronize_is_raised_after_cleanup(monkeypatch):
    def broken(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(frameworks, "synchronize_all", broken)
    ctx = GPUContext()
    with pytest.raises(RuntimeError, match="illegal memory access"):
        with ctx:
            pass
    assert "synchronize failed" in ctx.report.notes[0]
    # ...but never over the block's own exception: then it is a warning.
    with pytest.warns(RuntimeWarning, match="cleanup after the block's KeyError failed"):
        with pytest.raises(KeyError):
            with GPUContext():
                raise KeyError("mine")


# ------------------------------------------------------ naming leaked tensors


class FakeTorchDevice:
    """Stands in for device 0's PyTorch counters: allocated = bytes of the CPU tensors made
    through make() that are still alive (so cycles and names behave as on a GPU)."""

    def __init__(self) -> None:
        self.live: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def make(self, *shape: int, dtype: Any = None) -> Any:
        t = torch.ones(*shape, dtype=dtype or torch.float32)
        self.live.add(t)
        return t

    def read(self, device: int):
        if device != 0:
            return None
        n = sum(t.untyped_storage().nbytes() for t in list(self.live))
        return frameworks.FrameworkMemory("torch", n, n)


@pytest.fixture
def fake_device(monkeypatch):
    fake = FakeTorchDevice()
    real_live_arrays = frameworks.live_arrays
    monkeypatch.setattr(frameworks.ADAPTERS["torch"], "memory", fake.read)
    monkeypatch.setattr(frameworks, "active_devices", lambda: [0])
    monkeypatch.setattr(frameworks, "synchronize_all", lambda device=None: None)
    monkeypatch.setattr(frameworks, "release_all_caches", lambda device=None: {})
    def arrays(device=None):
        # The device holds the tensors made through make(); they live on the CPU.
        ptrs = {t.untyped_storage().data_ptr() for t in list(fake.live)}
        return [a for a in real_live_arrays("cpu") if a.data_ptr in ptrs]

    monkeypatch.setattr(frameworks, "live_arrays", arrays)
    return fake


def test_leaked_tensor_is_named_with_its_creation_site(fake_device, no_auto_gc):
    with pytest.warns(LeakWarning, match=r"Tensor \(123, 7\) float64") as record:
        with GPUContext(track_allocations=True, tolerance_bytes=0) as ctx:
            kept = fake_device.make(123, 7, dtype=torch.float64)  # LINE-KEPT
            ref = _cycle_holding(fake_device.make(1000))
            del ref
    report = ctx.report
    assert report.held == {"cuda:0": {"torch": 123 * 7 * 8}}
    assert report.gc_runs >= 1  # the cycle had to be collected
    assert report.leaks_found == 1
    leak = report.leaks[0]
    assert (leak.framework, leak.kind, leak.shape, leak.dtype, leak.nbytes) == (
        "torch", "Tensor", (123, 7), "float64", 123 * 7 * 8)
    assert leak.inside is True
    line = next(i for i, text in enumerate(open(__file__), 1) if "LINE-KEPT" in text and "make(" in text)
    # Innermost first: the helper that called torch.ones, then the test's line.
    assert leak.created_at[0].endswith(" in make")
    assert leak.created_at[1] == f"{__file__}:{line} in test_leaked_tensor_is_named_with_its_creation_site"
    assert "created at" in str(record[0].message)
    assert "created at" in report.table()
    json.dumps(report.to_dict())
    del kept


def test_without_tracking_leaks_are_named_without_sites(fake_device):
    with pytest.warns(LeakWarning, match="track_allocations=True"):
        with GPUContext(tolerance_bytes=0) as ctx:
            kept = fake_device.make(321, 5)
    leak = ctx.report.leaks[0]
    assert leak.shape == (321, 5) and leak.created_at == ()
    assert leak.inside is True  # the framework held nothing on entry
    del kept


def test_tracking_leaves_out_tensors_made_before_the_context(fake_device):
    before = fake_device.make(77, 3)
    with pytest.warns(LeakWarning):
        with GPUContext(track_allocations=True, tolerance_bytes=0) as ctx:
            kept = fake_device.make(55, 2)
            view = before[1:]  # a view makes no new storage: still "before"
    shapes = [leak.shape for leak in ctx.report.leaks]
    assert shapes == [(55, 2)]
    del kept, view, before


def test_max_listed(fake_device):
    with pytest.warns(LeakWarning, match="and 2 more"):
        with GPUContext(max_listed=3, tolerance_bytes=0) as ctx:
            kept = [fake_device.make(10 + i, 3) for i in range(5)]
    assert len(ctx.report.leaks) == 3 and ctx.report.leaks_found == 5
    assert [leak.shape[0] for leak in ctx.report.leaks] == [14, 13, 12]  # largest first
    del kept


# ============================================================================ cleanup_cuda


def test_cleanup_cuda_collects_and_reports(host, no_auto_gc):
    ref = _cycle_holding(host.get_managed_buffer(0, 1024, Precision.Fp32))
    report = cleanup_cuda()
    assert ref() is None
    assert report.source == "cleanup_cuda" and report.gc_runs == 1
    before = report.before["host"]["gpukeeper"].allocated
    after = report.after["host"]["gpukeeper"].allocated
    assert before - after == 4096
    assert host.stats(0).reserved_bytes == 0
    json.dumps(report.to_dict())


# ============================================================================ cleanup_models


def _trained(batchnorm: bool = False):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)]
    if batchnorm:
        layers.insert(1, torch.nn.BatchNorm1d(64))
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 32), torch.randn(16, 4)
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return model, opt


def _nbytes(ts) -> int:
    return sum(t.untyped_storage().nbytes() for t in ts)


def test_cleanup_models_frees_model_and_optimizer_while_names_are_held():
    model, opt = _trained()
    params = list(model.parameters())
    expected = (
        _nbytes(params)
        + _nbytes(p.grad for p in params)
        + _nbytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    )
    freed = cleanup_models(model, opt)
    assert isinstance(freed, int) and freed == expected
    assert all(p.numel() == 0 and p.grad is None for p in model.parameters())
    assert all(v.numel() == 0 for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    with pytest.raises(EmptiedObjectError, match="emptied by cleanup_models") as info:
        model(torch.randn(2, 32))
    assert isinstance(info.value, GpuError)
    with pytest.raises(EmptiedObjectError, match="Linear \\(0\\) was emptied"):
        model[0](torch.randn(2, 32))
    with pytest.raises(EmptiedObjectError, match="Adam was emptied"):
        opt.step()
    assert cleanup_models(model, opt) == 0  # twice is harmless


def test_cleanup_models_buffers_and_tensor_attributes():
    model, _ = _trained(batchnorm=True)
    model.cache = torch.zeros(100)  # a plain tensor attribute holds memory too
    bn = model[1]
    assert bn.running_mean.numel() == 64
    freed = cleanup_models(model)
    assert bn.running_mean.numel() == 0 and bn.running_var.numel() == 0
    assert model.cache.numel() == 0
    assert freed >= 400 + 2 * 64 * 4


def test_cleanup_models_counts_only_memory_that_died():
    model, _ = _trained()
    view = model[0].weight.detach()[0]  # another reference to the weight's storage
    expected = view.clone()
    total = _nbytes(model.parameters()) + _nbytes(p.grad for p in model.parameters())
    freed = cleanup_models(model)
    assert freed == total - 64 * 32 * 4
    assert model[0].weight.numel() == 0
    assert torch.equal(view, expected)  # the view still works: its memory was not pulled away


def test_cleanup_models_tensors_and_containers():
    a, b, c = torch.ones(1000), torch.ones(10, 10), torch.ones(3)
    freed = cleanup_models([a, {"b": b, "none": None}], (c,), None)
    assert freed == 4000 + 400 + 12
    assert a.numel() == b.numel() == c.numel() == 0
    assert cleanup_models() == 0
    assert cleanup_models(None, [], {}) == 0


def test_cleanup_models_rejects_other_objects_and_empties_nothing():
    model, _ = _trained()
    with pytest.raises(InvalidInputError, match=r"argument 1\[0\] \(a str\)"):
        cleanup_models(model, ["not a model"])
    assert model(torch.randn(2, 32)).shape == (2, 4)  # untouched
    with pytest.raises(InvalidInputError):
        cleanup_models(object())


@pytest.mark.parametrize(
    "bad, where, kind",
    [
        ("a string", "argument 1", "str"),
        (object(), "argument 1", "object"),
        ((t for t in ()), "argument 1", "generator"),
        ([torch.ones(2), 3.5], r"argument 1\[1\]", "float"),
        ({"opt": None, "lr": 1e-3}, r"argument 1\['lr'\]", "float"),
    ],
)
def test_cleanup_models_bad_argument_names_its_place_and_type_and_frees_nothing(bad, where, kind):
    good = torch.ones(100)
    with pytest.raises(InvalidInputError, match=rf"{where} \(a {kind}\).*nothing was emptied"):
        cleanup_models(good, bad)
    assert good.sum().item() == 100  # the valid argument before it was not touched


def _emptied_tensor_ops(t):
    return {
        "sum": lambda: t.sum(),
        "mean": lambda: t.mean(),
        "index": lambda: t[0],
        "add": lambda: t + 1,
        "radd": lambda: torch.ones(1) + t,
        "matmul": lambda: t @ torch.ones(t.shape[-1] if t.dim() else 1),
        "cpu": lambda: t.cpu(),
        "to": lambda: t.to(torch.float64),
        "numpy": lambda: t.numpy(),
        "float": lambda: float(t),
        "bool": lambda: bool(t),
        "len": lambda: len(t),
        "iter": lambda: list(t),
        "tolist": lambda: t.tolist(),
        "stack": lambda: torch.stack([t, t]),
        "inplace": lambda: t.mul_(2),
        "data": lambda: t.data.sum(),
        "deepcopy": lambda: __import__("copy").deepcopy(t),
    }


def test_an_emptied_tensor_fails_loudly_instead_of_summing_to_zero():
    t = torch.randn(4, 5)
    assert cleanup_models(t) == 80
    for name, op in _emptied_tensor_ops(t).items():
        with pytest.raises(EmptiedObjectError, match=r"shape \(4, 5\), float32, on cpu\) was emptied") as info:
            op()
        assert isinstance(info.value, RuntimeError), name  # existing except clauses still catch it
    # What remains answers, and says what happened.
    assert t.shape == (0,) and t.numel() == 0 and t.dtype == torch.float32 and t.device.type == "cpu"
    assert "emptied by gpukeeper.cleanup_models()" in repr(t) and "shape (4, 5)" in f"{t}"
    assert isinstance(t, torch.Tensor)
    assert cleanup_models(t) == 0  # twice is harmless


def test_a_view_taken_before_the_cleanup_keeps_working_and_its_memory():
    t = torch.arange(20.0).reshape(4, 5)
    view, detached = t[1], t.detach()
    assert cleanup_models(t) == 0  # the storage lives on in the view: nothing freed
    assert view.sum().item() == sum(range(5, 10))
    assert detached.sum().item() == sum(range(20))
    with pytest.raises(EmptiedObjectError):
        t.sum()


def test_emptied_parameters_buffers_and_optimizer_state_fail_loudly():
    model, opt = _trained(batchnorm=True)
    cleanup_models(model, opt)
    weight, running_mean = model[0].weight, model[1].running_mean
    assert isinstance(weight, torch.nn.Parameter)
    with pytest.raises(EmptiedObjectError, match=r"shape \(64, 32\)"):
        weight.sum()
    with pytest.raises(EmptiedObjectError, match=r"shape \(64,\)"):
        running_mean + 1
    moments = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    assert moments
    for v in moments:
        with pytest.raises(EmptiedObjectError):
            v.sum()
    with pytest.raises(EmptiedObjectError):
        model.state_dict()["0.weight"].clone()
    # Inspecting the model still works: names, printing, zero_grad.
    model.zero_grad()
    opt.zero_grad()
    assert [n for n, _ in model.named_parameters()][:2] == ["0.weight", "0.bias"]
    assert "Linear" in repr(model)


def test_cleanup_models_skips_none_as_the_finally_pattern_needs():
    model = None
    try:
        raise RuntimeError("building the model failed")
    except RuntimeError:
        pass
    finally:
        assert cleanup_models(model) == 0
    model, opt = _trained()
    assert cleanup_models(model, None) > 0  # an optional optimizer left out


# ================================================================ the production notes


def test_production_notes_patterns():
    """The three patterns of the production notes, with the import path changed to gpukeeper (and the
    model on the CPU where there is no GPU)."""
    from gpukeeper.cleanup import GPUContext, cleanup_cuda, cleanup_models

    device = "cuda" if TORCH_CUDA else "cpu"

    class MyModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            return self.fc(x)

    # Pattern 2: context manager (the model is built and used inside a function here: a
    # with block is not a scope).
    def train_model():
        model = MyModel().to(device)
        model(torch.randn(4, 16, device=device)).sum().backward()
        return float(model.fc.weight.grad.abs().sum())

    with GPUContext(tolerance_bytes=0) as ctx:
        result = train_model()
    assert result > 0 and not ctx.report.leaked

    # Pattern 3: explicit cleanup function.
    model = MyModel().to(device)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 16, device=device)).sum().backward()
    optimizer.step()
    assert cleanup_models(model, optimizer) > 0

    # Handle errors properly: cleanup in finally.
    model = None
    try:
        model = MyModel().to(device)
        raise RuntimeError("training failed")
    except Exception as e:
        assert "failed" in str(e)
    finally:
        cleanup_models(model)
    assert model.fc.weight.numel() == 0

    assert isinstance(cleanup_cuda(), CleanupReport)


# ============================================================================ frameworks helpers


def test_live_arrays_on_the_cpu():
    base = torch.zeros(333, 3)
    view = base[1:]
    param = torch.nn.Parameter(torch.ones(17))
    found = [a for a in frameworks.live_arrays("cpu") if a.data_ptr in
             (base.untyped_storage().data_ptr(), param.untyped_storage().data_ptr())]
    by_ptr = {a.data_ptr: a for a in found}
    a = by_ptr[base.untyped_storage().data_ptr()]
    assert (a.framework, a.device, a.kind, a.shape, a.dtype, a.nbytes) == (
        "torch", "cpu", "Tensor", (333, 3), "float32", 333 * 3 * 4)  # the base, not the view
    p = by_ptr[param.untyped_storage().data_ptr()]
    assert (p.kind, p.shape) == ("Parameter", (17,))
    assert len(found) == 2
    del view


def test_live_arrays_bad_device():
    with pytest.raises(InvalidInputError):
        frameworks.live_arrays(-1)
    with pytest.raises(InvalidInputError):
        frameworks.live_arrays("tpu")


def test_host_pool_memory(host):
    buf = host.get_managed_buffer(0, 1000, Precision.Fp32)
    mem = frameworks.host_pool_memory()
    assert mem is not None and mem.name == "gpukeeper"
    assert mem.allocated >= 4000 and mem.reserved >= mem.allocated
    buf.release()


@pytest.mark.skipif(CUDA, reason="checks the CPU-only answer")
def test_active_devices_without_cuda():
    assert frameworks.active_devices() == []


# ============================================================================ on a GPU


def _torch_counts(device: int = 0):
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)


def _train_on_gpu(steps: int = 5, fail: bool = False) -> float:
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(512, 256, device="cuda")
    loss = None
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
    if fail:
        raise RuntimeError("training failed on purpose")
    return float(loss)


@pytest.fixture
def gpu_baseline():
    """Entry values with nothing cached: reserved then only covers live blocks, so that the
    values after a context can be compared for equality."""
    cleanup_cuda()
    return _torch_counts()


@needs_torch_cuda
def test_gpu_training_inside_context_returns_to_entry_values(gpu_baseline):
    pool = MemoryPool("device")
    with GPUContext(0, tolerance_bytes=0) as ctx:
        _train_on_gpu()
        with pool.get_managed_buffer(0, 4 * MiB, Precision.Fp32):
            pass
        assert _torch_counts()[1] > gpu_baseline[1]  # the cache did grow
    assert _torch_counts() == gpu_baseline
    assert pool.stats(0).reserved_bytes == 0 and pool.stats(0).allocated_bytes == 0
    assert not ctx.report.leaked
    assert ctx.report.released.get("torch", 0) > 0
    t = ctx.report.after["cuda:0"]["torch"]
    assert (t.allocated, t.reserved) == gpu_baseline


@needs_torch_cuda
def test_gpu_context_returns_memory_when_the_block_raises(gpu_baseline):
    with pytest.raises(RuntimeError, match="on purpose"):
        with GPUContext(0, tolerance_bytes=0) as ctx:
            _train_on_gpu(fail=True)
    assert _torch_counts() == gpu_baseline
    assert ctx.report.exc_type == "RuntimeError"


@needs_torch_cuda
def test_gpu_tensors_in_a_reference_cycle_are_released(gpu_baseline, no_auto_gc):
    def make_cycle() -> weakref.ref:
        model = torch.nn.Linear(2048, 2048).cuda()
        model.me = [model]  # module -> list -> module
        model(torch.randn(64, 2048, device="cuda")).sum().backward()
        return weakref.ref(model)

    with GPUContext(0, tolerance_bytes=0) as ctx:
        ref = make_cycle()
        assert ref() is not None and torch.cuda.memory_allocated() > gpu_baseline[0]
    assert ref() is None
    assert ctx.report.gc_runs >= 1
    assert _torch_counts() == gpu_baseline


@needs_torch_cuda
def test_gpu_leak_is_named_with_its_creation_site(gpu_baseline):
    with pytest.warns(LeakWarning, match=r"Tensor \(1000, 250\) float32"):
        with GPUContext(0, track_allocations=True, tolerance_bytes=0) as ctx:
            kept = torch.ones(1000, 250, device="cuda")  # GPU-LEAK-LINE
    leak = ctx.report.leaks[0]
    assert leak.device == "cuda:0" and leak.nbytes >= 1000 * 250 * 4 and leak.inside
    assert leak.created_at and leak.created_at[0].startswith(f"{__file__}:")
    assert "test_gpu_leak_is_named_with_its_creation_site" in leak.created_at[0]
    assert ctx.report.held == {"cuda:0": {"torch": ctx.report.held_bytes}}
    del kept
    cleanup_cuda()
    assert _torch_counts() == gpu_baseline


@needs_torch_cuda
def test_gpu_cleanup_models_with_names_held(gpu_baseline):
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(128, 512, device="cuda")
    for _ in range(3):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    del x
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    freed = cleanup_models(model, opt)
    assert freed >= 4 * param_bytes  # weights, gradients, two Adam moments
    assert _torch_counts() == gpu_baseline  # the caller still holds model and opt
    with pytest.raises(EmptiedObjectError):
        model(torch.zeros(1, 512, device="cuda"))
    with pytest.raises(EmptiedObjectError):
        opt.step()


@needs_torch_cuda
@pytest.mark.quiet_machine
def test_gpu_context_fast_exit_with_cuda_initialised():
    torch.ones(1, device="cuda")
    ctx = GPUContext(0)
    for _ in range(20):
        with ctx:
            pass
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        with ctx:
            pass
        times.append(time.perf_counter() - t0)
    assert ctx.report.gc_runs == 0
    assert statistics.median(times) < 1e-3, f"median {statistics.median(times) * 1e6:.0f} us"


@pytest.mark.skipif(not CUDA, reason="needs a usable CUDA device")
def test_gpu_cupy_arrays_in_a_cycle_and_kept(no_auto_gc):
    cupy = pytest.importorskip("cupy")
    cupy.ones(1)  # context and pool exist before the baseline
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    used, total = pool.used_bytes(), pool.total_bytes()
    with GPUContext(0, tolerance_bytes=0) as ctx:
        ref = _cycle_holding(cupy.zeros((512, 1024), dtype=cupy.float32))
        assert pool.used_bytes() >= used + 2 * MiB
    assert ref() is None
    assert ctx.report.gc_runs >= 1 and not ctx.report.leaked
    assert pool.used_bytes() == used and pool.total_bytes() <= total
    # A separate context: memory freed inside a context offsets what it leaks.
    with pytest.warns(LeakWarning, match=r"cupy ndarray \(3000,\) float64"):
        with GPUContext(0, tolerance_bytes=0, track_allocations=True) as ctx:
            kept = cupy.arange(3000, dtype=cupy.float64)
    leak = ctx.report.leaks[0]
    assert (leak.framework, leak.device, leak.shape, leak.dtype) == ("cupy", "cuda:0", (3000,), "float64")
    assert leak.inside and leak.created_at
    assert "test_gpu_cupy_arrays_in_a_cycle_and_kept" in leak.created_at[0]
    del kept
    pool.free_all_blocks()


def test_block_that_raises_frees_what_the_failed_calls_held():
    # The traceback keeps the locals of the function that raised; unless GPUContext
    # clears them, their memory outlives its cleanup and stays cached.
    from gpukeeper import MemoryPool, Precision

    pool = MemoryPool("host")

    def failing_step():
        held = pool.get_managed_buffer(0, 1 << 20, Precision.Fp32)  # noqa: F841
        raise RuntimeError("on purpose")

    with pytest.raises(RuntimeError, match="on purpose"):
        with GPUContext(warn_on_leak=False):
            failing_step()
    assert pool.stats(0).allocated_bytes == 0
    assert pool.stats(0).reserved_bytes == 0

    with pytest.raises(RuntimeError, match="on purpose") as info:
        with GPUContext(warn_on_leak=False, keep_traceback_locals=True):
            failing_step()
    assert pool.stats(0).reserved_bytes > 0  # the locals were kept, so was the memory
    del info
    pool.emergency_cleanup(0)
