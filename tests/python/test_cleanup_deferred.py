"""GPUContext's deferred release: memory still held by names at exit goes back to the
driver as soon as those names are deleted, without a second call; ``release_names``;
what IPython keeps after a cell.

Without a GPU the context watches gpukeeper's host pools, whose cache is real memory
that ``emergency_cleanup`` gives back: a pool's ``reserved_bytes`` plays the part of
``torch.cuda.memory_reserved()``. One test stands a fake "torch" device on CPU tensors
whose memory, as on a GPU, is freed only after their finalizers ran.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from typing import Any, List

import pytest

from gpukeeper import InvalidInputError, MemoryPool, Precision, frameworks
from gpukeeper.base import device_names as devices
from gpukeeper.cleanup import (
    EmptiedObjectError,
    GPUContext,
    LeakWarning,
    cleanup_models,
    deferred,
    release_ipython_references,
)

MiB = 1 << 20
SETTLE_S = deferred._MAX_WAIT_S + 0.3  # the timer has fired by then


@pytest.fixture(autouse=True)
def clean_armings():
    """Each test starts and ends with nothing armed."""
    deferred.disarm_all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeakWarning)
        yield
    deferred.disarm_all()


@pytest.fixture
def host():
    pool = MemoryPool("host")
    yield pool
    gc.collect()
    assert pool.validate(0) == ""
    pool.emergency_cleanup_all()


@pytest.fixture
def releases(monkeypatch):
    """Counts the releases of every framework's caches (the real ones still run)."""
    calls: List[Any] = []
    real = frameworks.release_all_caches

    def counting(device=None):
        calls.append(device)
        return real(device)

    monkeypatch.setattr(frameworks, "release_all_caches", counting)
    return calls


def _buffer(pool: MemoryPool, nbytes: int = MiB):
    return pool.get_managed_buffer(0, nbytes // 4, Precision.Fp32)


# ============================================================================ names that outlive the block


def test_memory_held_by_a_name_goes_back_right_after_del(host):
    with GPUContext() as ctx:
        buf = _buffer(host, 4 * MiB)
    report = ctx.report
    assert report.held_bytes == 4 * MiB
    assert report.deferred >= 1 and deferred.armed_objects() == report.deferred
    assert any("released as soon as they die" in n for n in report.notes)
    assert report.to_dict()["deferred"] == report.deferred
    assert host.stats(0).reserved_bytes >= 4 * MiB  # nothing could be released at exit
    del buf
    # No other call: the next statement already sees the cache given back.
    assert host.stats(0).allocated_bytes == 0
    assert host.stats(0).reserved_bytes == 0
    assert deferred.armed_objects() == 0


def test_the_exception_path(host):
    try:
        with GPUContext() as ctx:
            x = _buffer(host, 2 * MiB)
            raise RuntimeError("training failed")
    except RuntimeError as e:
        assert "failed" in str(e)
    assert ctx.report.exc_type == "RuntimeError" and ctx.report.deferred >= 1
    assert host.stats(0).reserved_bytes > 0
    del x
    assert host.stats(0).allocated_bytes == 0 and host.stats(0).reserved_bytes == 0


def test_nothing_is_armed_when_nothing_is_held(host, monkeypatch):
    called: List[Any] = []
    monkeypatch.setattr(deferred, "arm", lambda **kw: called.append(kw) or (0, ""))
    with GPUContext() as ctx:
        buf = _buffer(host)
        buf.release()
    with GPUContext() as ctx2:
        pass
    assert called == []
    assert ctx.report.deferred == 0 and ctx2.report.deferred == 0
    assert deferred.armed_objects() == 0


def test_deferred_release_false_arms_nothing(host):
    with GPUContext(deferred_release=False) as ctx:
        buf = _buffer(host)
    assert ctx.report.deferred == 0 and deferred.armed_objects() == 0
    del buf
    assert host.stats(0).allocated_bytes == 0
    assert host.stats(0).reserved_bytes > 0  # the old behaviour: the cache keeps it


def test_a_loop_of_deletes_costs_one_release(host, releases):
    with GPUContext():
        bufs = [_buffer(host, 64 * 1024) for _ in range(100)]
    releases.clear()  # the exit's own release
    while bufs:
        bufs.pop()
    assert len(releases) == 1
    assert host.stats(0).reserved_bytes == 0
    time.sleep(SETTLE_S)
    assert len(releases) == 1  # the timer found nothing more to do


def test_partial_deaths_are_released_once_after_a_quiet_time(host, releases):
    with GPUContext():
        bufs = [_buffer(host, 64 * 1024) for _ in range(100)]
    releases.clear()
    del bufs[:50]
    assert len(releases) == 0  # half still held: no release at once
    deadline = time.monotonic() + 5
    while not releases and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(SETTLE_S)
    assert len(releases) == 1
    assert deferred.armed_objects() == 50  # still waiting for the rest
    bufs.clear()
    assert len(releases) == 2
    assert host.stats(0).reserved_bytes == 0 and deferred.armed_objects() == 0


def test_a_reference_cycle_collected_later_releases_too(host):
    class Node:
        pass

    gc.disable()
    try:
        with GPUContext(collect=False) as ctx:
            a, b = Node(), Node()
            a.other, b.other, a.buf = b, a, _buffer(host)
        assert ctx.report.deferred >= 1
        del a, b
        assert host.stats(0).allocated_bytes == MiB  # the cycle still holds it
        gc.collect()
        assert host.stats(0).reserved_bytes == 0
    finally:
        gc.enable()


def test_finalizers_keep_nothing_alive(host):
    import weakref

    with GPUContext():
        buf = _buffer(host)
    ref = weakref.ref(buf)
    assert deferred.armed_ids() == {id(buf)}
    del buf
    assert ref() is None


def test_a_failing_release_warns_and_never_raises(host, monkeypatch):
    with GPUContext():
        buf = _buffer(host)

    def broken(device=None):
        raise RuntimeError("driver fell over")

    monkeypatch.setattr(frameworks, "release_all_caches", broken)
    with pytest.warns(RuntimeWarning, match="deferred cache release: releasing the caches failed.*driver fell over"):
        del buf
        len([])  # the first call after the statement runs the release
    assert deferred.armed_objects() == 0


def test_a_later_context_takes_over(host, releases):
    with GPUContext():
        first = _buffer(host)
    with GPUContext() as ctx:
        second = _buffer(host, 2 * MiB)
    # One arming now, against the first context's (lower) baseline: both are armed.
    assert len(deferred._S.armings) == 1
    assert ctx.report.deferred >= 2 and deferred.armed_ids() >= {id(first), id(second)}
    releases.clear()
    del second
    assert len(releases) == 0  # `first` still holds memory above the older baseline
    del first
    assert len(releases) == 1
    assert host.stats(0).reserved_bytes == 0


def test_deaths_in_many_threads(host, releases):
    with GPUContext():
        bufs = [_buffer(host, 16 * 1024) for _ in range(200)]
    releases.clear()
    barrier = threading.Barrier(8)
    shares = [bufs[i::8] for i in range(8)]
    bufs.clear()

    def drop(share: List[Any]) -> None:
        barrier.wait()
        while share:
            share.pop()

    threads = [threading.Thread(target=drop, args=(share,)) for share in shares]
    del shares
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 5
    while host.stats(0).reserved_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert host.stats(0).allocated_bytes == 0 and host.stats(0).reserved_bytes == 0
    assert deferred.armed_objects() == 0
    assert 1 <= len(releases) <= 8


def test_disarmed_at_interpreter_exit_and_in_a_forked_child(tmp_path):
    script = tmp_path / "exit.py"
    script.write_text(textwrap.dedent(
        """
        import os, warnings
        warnings.simplefilter("ignore")
        from gpukeeper import MemoryPool, Precision, frameworks
        from gpukeeper.cleanup import GPUContext, deferred
        pool = MemoryPool("host")
        with GPUContext():
            kept = pool.get_managed_buffer(0, 1 << 18, Precision.Fp32)
        assert deferred.armed_objects() >= 1
        pid = os.fork()
        if pid == 0:
            os._exit(0 if deferred.armed_objects() == 0 else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        real = frameworks.release_all_caches
        frameworks.release_all_caches = lambda d=None: print("RELEASED AT EXIT") or real(d)
        """
    ))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "child 0" in done.stdout
    assert "RELEASED AT EXIT" not in done.stdout
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


# ============================================================================ torch's order: freed after the finalizer


torch = pytest.importorskip("torch")


class FakeDevice:
    """Device 0's "torch" memory is the CPU tensors made through make(), counted until
    their storage is really freed, which, as on a GPU, happens after the tensor's
    finalizers ran."""

    def __init__(self) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        self._weak = StorageWeakRef
        self._holders = frameworks.live_array_holders  # the real walk, before it is patched
        self.storages: List[Any] = []
        self.tensors: Any = __import__("weakref").WeakSet()

    def make(self, n: int) -> Any:
        t = torch.ones(n)
        self.storages.append((self._weak(t.untyped_storage()), t.untyped_storage().nbytes()))
        self.tensors.add(t)
        return t

    def allocated(self) -> int:
        return sum(n for ref, n in self.storages if not ref.expired())

    def releases(self) -> List[int]:
        """The allocated bytes at each release (a call, as any measurement is)."""
        return list(self.released_with)

    def read(self, device: int):
        if device != 0:
            return None
        n = self.allocated()
        return frameworks.FrameworkMemory("torch", n, n)

    def holders(self, device=None):
        ptrs = {t.untyped_storage().data_ptr() for t in list(self.tensors)}
        return [(e, objs) for e, objs in self._holders("cpu") if e.data_ptr in ptrs]


@pytest.fixture
def fake(monkeypatch):
    dev = FakeDevice()
    monkeypatch.setattr(devices, "cuda_status", lambda: (1, ""))
    monkeypatch.setattr(frameworks.ADAPTERS["torch"], "memory", dev.read)
    monkeypatch.setattr(frameworks, "active_devices", lambda: [0])
    monkeypatch.setattr(frameworks, "synchronize_all", lambda device=None: None)
    monkeypatch.setattr(frameworks, "live_array_holders", lambda device=None: [
        (e.__class__(e.framework, "cuda:0", e.kind, e.shape, e.dtype, e.nbytes, e.data_ptr), objs)
        for e, objs in dev.holders(device)
    ])
    seen: List[int] = []
    monkeypatch.setattr(frameworks, "release_all_caches", lambda device=None: seen.append(dev.allocated()) or {})
    dev.released_with = seen
    return dev


def test_a_tensor_freed_after_its_finalizer_is_released_after_it_is_freed(fake):
    with GPUContext(0) as ctx:
        t = fake.make(250_000)
        view = t[10:]
    assert ctx.report.held == {"cuda:0": {"torch": 1_000_000}}
    assert ctx.report.deferred == 2  # the tensor and its view, one allocation
    fake.released_with.clear()
    del t
    assert fake.releases() == []  # the view still holds the storage
    del view
    # Released once, and only when the storage was gone (not in the finalizer, where
    # the storage is still allocated); at the first call after the statement.
    assert fake.releases() == [0]
    assert deferred.armed_objects() == 0


def test_memory_back_at_the_baseline_releases_even_with_other_armed_objects(fake):
    before = fake.make(1000)  # made before the context: armed too (nothing tells it apart)
    with GPUContext(0) as ctx:
        made = fake.make(100_000)
    assert ctx.report.deferred == 2
    fake.released_with.clear()
    del made
    assert fake.releases() == [4000]  # back at the baseline: released, `before` alive
    assert deferred.armed_objects() == 0
    del before


# ============================================================================ release_names


def _trained():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return model, opt


def test_release_names_empties_what_the_block_bound(host):
    existing, _ = _trained()
    alias_source = existing
    keep = [1, 2, 3]
    with GPUContext(release_names=True) as ctx:
        model, opt = _trained()
        buf = _buffer(host, 2 * MiB)
        tensors = [torch.ones(10), torch.zeros(5)]
        alias = alias_source  # bound on entry under another name: left alone
        keep = "rebound, but not something cleanup_models empties"
    assert host.stats(0).allocated_bytes == 0 and host.stats(0).reserved_bytes == 0
    assert not ctx.report.leaked and ctx.report.deferred == 0
    assert buf.released
    assert all(p.numel() == 0 for p in model.parameters())
    assert all(t.numel() == 0 for t in tensors)
    with pytest.raises(EmptiedObjectError):
        model(torch.randn(1, 8))
    with pytest.raises(EmptiedObjectError):
        opt.step()
    with pytest.raises(InvalidInputError, match="released"):
        buf.to_bytes()
    assert alias(torch.randn(1, 8)).shape == (1, 2)  # untouched
    assert keep.startswith("rebound")
    note = next(n for n in ctx.report.notes if n.startswith("release_names"))
    for name in ("model", "opt", "buf", "tensors"):
        assert name in note
    assert "alias" not in note and "keep" not in note and "existing" not in note


def test_release_names_in_a_module_namespace(host):
    ns = {"GPUContext": GPUContext, "host": host, "Precision": Precision}
    exec(
        "kept = host.get_managed_buffer(0, 1024, Precision.Fp32)\n"
        "with GPUContext(release_names=True) as ctx:\n"
        "    made = host.get_managed_buffer(0, 1024, Precision.Fp32)\n",
        ns,
    )
    assert ns["made"].released and not ns["kept"].released
    ns["kept"].release()


def test_release_names_off_by_default(host):
    with GPUContext() as ctx:
        buf = _buffer(host)
    assert not buf.released and ctx.report.deferred >= 1
    del buf


@pytest.mark.parametrize("bad", [1, "yes", None, 0.0])
def test_release_names_and_deferred_release_must_be_bools(bad):
    with pytest.raises(InvalidInputError, match="release_names must be True or False"):
        GPUContext(release_names=bad)
    with pytest.raises(InvalidInputError, match="deferred_release must be True or False"):
        GPUContext(deferred_release=bad)


def test_cleanup_models_releases_managed_buffers(host):
    buf = _buffer(host, 2 * MiB)
    assert cleanup_models(buf, [None]) == 2 * MiB
    assert buf.released and host.stats(0).reserved_bytes == 0
    assert cleanup_models(buf) == 0  # twice is harmless


# ============================================================================ IPython


@pytest.fixture
def shell(host):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.user_ns.update(GPUContext=GPUContext, pool=host, Precision=Precision)
    yield ip
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    ip.run_cell("%reset -f out", silent=True)
    for name in ("buf", "kept", "step", "pool", "held"):
        ip.user_ns.pop(name, None)
    gc.collect()


def test_ipython_failed_cell_keeps_no_memory(shell, host):
    result = shell.run_cell(store_history=True, raw_cell=
        "def step():\n"
        "    held = pool.get_managed_buffer(0, 1 << 18, Precision.Fp32)\n"
        "    with GPUContext():\n"
        "        inner = pool.get_managed_buffer(0, 1 << 19, Precision.Fp32)\n"
        "        raise RuntimeError('failed on purpose')\n"
        "step()\n"
    )
    assert isinstance(result.error_in_exec, RuntimeError)
    assert sys.last_traceback is not None  # IPython keeps it...
    # ...but its frames no longer hold the buffers, and the caches were released.
    assert host.stats(0).allocated_bytes == 0
    assert host.stats(0).reserved_bytes == 0


def test_ipython_failed_cell_keeps_its_locals_with_keep_traceback_locals(shell, host):
    shell.run_cell(store_history=True, raw_cell=
        "def step():\n"
        "    with GPUContext(keep_traceback_locals=True):\n"
        "        inner = pool.get_managed_buffer(0, 1 << 18, Precision.Fp32)\n"
        "        raise RuntimeError('failed on purpose')\n"
        "step()\n"
    )
    assert host.stats(0).allocated_bytes == MiB  # for post-mortem debugging
    release_ipython_references()  # the explicit helper clears any traceback
    assert host.stats(0).allocated_bytes == 0 and host.stats(0).reserved_bytes == 0


def test_ipython_output_history_does_not_keep_memory(shell, host):
    shell.run_cell(store_history=True, raw_cell=
        "with GPUContext():\n"
        "    buf = pool.get_managed_buffer(0, 1 << 20, Precision.Fp32)\n"
        "buf\n"
    )
    out = shell.user_ns["Out"]
    assert any(v is shell.user_ns["buf"] for v in out.values())  # displayed and kept
    shell.run_cell(store_history=True, raw_cell="_ ; 1")  # the history and the name hold it: nothing dropped
    assert host.stats(0).allocated_bytes == 4 * MiB
    shell.run_cell(store_history=True, raw_cell="del buf")
    # Only the history held it: dropped after the cell, and the memory went back.
    assert host.stats(0).allocated_bytes == 0 and host.stats(0).reserved_bytes == 0
    assert not any(type(v).__name__ == "ManagedBuffer" for v in out.values())
    assert all(type(shell.user_ns.get(n)).__name__ != "ManagedBuffer" for n in ("_", "__", "___"))


def test_release_ipython_references_drops_results_holding_memory(shell, host):
    shell.run_cell(store_history=True, raw_cell=
        "kept = pool.get_managed_buffer(0, 1 << 18, Precision.Fp32)\n"
        "(kept, 42)\n"
    )
    out = shell.user_ns["Out"]
    assert any(isinstance(v, tuple) and v[1] == 42 for v in out.values())
    assert release_ipython_references(shell) == 1  # the tuple holds a buffer
    assert not any(isinstance(v, tuple) and v[1] == 42 for v in out.values())
    assert all(not (isinstance(shell.user_ns.get(n), tuple)) for n in ("_", "__", "___"))
    shell.run_cell(store_history=True, raw_cell="del kept")
    assert host.stats(0).allocated_bytes == 0


def test_release_ipython_references_bad_shell_and_outside_ipython():
    with pytest.raises(InvalidInputError, match="InteractiveShell"):
        release_ipython_references(object())

