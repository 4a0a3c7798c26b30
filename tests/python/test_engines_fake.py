"""GPU work that no framework owns (an engine's own CUDA context: OpenMM) and JAX work,
decided on a machine without a GPU: NVML, the driver and JAX are fakes
(``engine_fakes``). The same paths on a real device: ``test_engines.py``."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Dict

import pytest

import gpukeeper
from engine_fakes import (
    proc,
    MD_STEPS,
    fresh_nvml,  # noqa: F401  (a fixture)
    md_step,
    GiB,
    MiB,
    FakeDriver,
    FakeNvml,
    FakeTorch,
    Growing,
    counter,
    fake_jax,
    hide_frameworks,
    install_driver,
    install_engine,
    install_nvml,
)
from gpukeeper import _core, frameworks
from gpukeeper.base import device_names as devices
from gpukeeper.base import nvml
from gpukeeper.account import account_reader as report
from gpukeeper.frameworks import contexts as fw_contexts
from gpukeeper.frameworks import driver as cuda_driver
from gpukeeper.cleanup import GPUContext
from gpukeeper.base.errors import InvalidInputError, LeakWarning
from gpukeeper.frameworks import FrameworkMemory
from gpukeeper.md import benchmark_md_trajectory
from gpukeeper.md.trajectory import throughput
from gpukeeper.account.account_reader import memory_report
from gpukeeper.account.device_account import MemoryReport
from gpukeeper.timing import benchmark_function

pytestmark = [
    pytest.mark.skipif(bool(gpukeeper.cuda_available()),
                       reason="fakes a GPU-less process's CUDA state; run on a CPU machine"),
    pytest.mark.usefixtures("fresh_nvml"),  # every test here fakes NVML
]


# --------------------------------------------------------------------- nvml.py


def test_nvml_reading_of_this_process(monkeypatch):
    fake = install_nvml(monkeypatch, FakeNvml(used=700 * MiB))
    reading = nvml.this_process_memory(0)
    assert (reading.listed, reading.used_bytes, reading.reason) == (True, 700 * MiB, "")
    read, why = nvml.process_memory_reader(0)
    assert why == "" and read() == 700 * MiB
    fake.used = None  # no longer listed; every listed PID (none) visible: not listed
    assert nvml.this_process_memory(0) == nvml.ProcessReading(False, 0)
    assert read() == 0


def test_nvml_hidden_pid_namespace_is_unknown(monkeypatch):

    install_nvml(monkeypatch, FakeNvml([proc(4_000_001, GiB)]))
    reading = nvml.this_process_memory(0)
    assert reading.listed is None and "PID namespace" in reading.reason
    read, why = nvml.process_memory_reader(0)
    assert read is None and "PID namespace" in why


def test_nvml_missing_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    reading = nvml.this_process_memory(0)
    assert reading.listed is None and "nvidia-ml-py" in reading.reason
    assert nvml.process_memory_reader(0)[0] is None


# --------------------------------------------------------------------- frameworks: contexts


def test_census_counts_an_engine_context_without_primary(monkeypatch):
    install_driver(monkeypatch, FakeDriver({0: False, 1: False}))
    install_nvml(monkeypatch, FakeNvml(used=900 * MiB))
    census = frameworks.context_census(0)
    assert (census.primary, census.other, census.count) == (False, 1, 1)
    assert census.process_bytes == 900 * MiB and "primary context does not exist" in census.how


def test_census_sees_a_foreign_context_beside_the_primary(monkeypatch):
    install_driver(monkeypatch, FakeDriver({0: True}, foreign=0))
    install_nvml(monkeypatch, FakeNvml(used=GiB))
    census = frameworks.context_census(0)
    assert (census.primary, census.other, census.count) == (True, 1, 2)
    assert "current on this thread" in census.how


def test_census_primary_only(monkeypatch):
    install_driver(monkeypatch, FakeDriver({0: True}))
    install_nvml(monkeypatch, FakeNvml(used=GiB))
    census = frameworks.context_census(0)
    assert (census.primary, census.other, census.count) == (True, 0, 1)


def test_no_libcuda_means_no_context_and_no_question(monkeypatch):
    monkeypatch.setattr(cuda_driver, "libcuda_loaded", lambda: False)

    class Boom:
        def __getattr__(self, name: str) -> None:
            raise AssertionError("the driver must not be asked when libcuda is not mapped")

    monkeypatch.setattr(cuda_driver, "backend", Boom())
    assert frameworks.context_devices() == []
    assert frameworks.primary_context_active(0) is False
    assert frameworks.context_census(0).count == 0


def test_context_devices_and_engine_memory(monkeypatch):
    install_engine(monkeypatch, used=512 * MiB)
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    assert frameworks.context_devices() == [0]
    assert frameworks.engine_memory(0) == FrameworkMemory("engine", 512 * MiB, 512 * MiB)
    # A GPU framework loaded: NVML's figure is no longer the engine's alone.
    monkeypatch.setattr(fw_contexts, "gpu_frameworks_loaded", lambda: ["torch"])
    assert frameworks.engine_memory(0) is None


def test_nothing_here_imports_a_framework():
    import subprocess

    code = (
        "import sys, gpukeeper\n"
        "from gpukeeper import frameworks, md\n"
        "from gpukeeper.account import account_reader\n"
        "from gpukeeper.base import host_memory as host, nvml\n"
        "frameworks.context_devices(); frameworks.gpu_frameworks_loaded()\n"
        "frameworks.holds_jax_arrays(1.0); host.malloc_in_use_bytes()\n"
        "bad = [m for m in ('torch', 'cupy', 'jax') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(gpukeeper.__file__)))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------- memory_report


@pytest.fixture
def one_device(monkeypatch):
    monkeypatch.setattr(devices, "cuda_status", lambda: (1, ""))
    monkeypatch.setattr(devices, "current_cuda_index", lambda: 0)
    monkeypatch.setattr(report, "_holds_context", lambda device: False)
    monkeypatch.setattr(_core, "device_memory_info", lambda d: (50 * GiB, 79 * GiB), raising=False)


def test_report_attributes_an_engine_context_to_other_contexts(monkeypatch, one_device):
    install_engine(monkeypatch, used=1200 * MiB)
    monkeypatch.setattr(frameworks, "memory_by_framework", lambda device=0: {})
    r = memory_report(0)
    assert r.process_bytes == 1200 * MiB
    assert (r.primary_context, r.other_contexts, r.cuda_contexts) == (False, 1, 1)
    assert r.other_contexts_bytes == 1200 * MiB
    assert r.context_and_libraries_bytes == 0
    table = str(r)
    assert "other contexts in this process" in table and "1.2 GiB" in table
    assert "CUDA contexts of this process on the device: 1" in table
    back = MemoryReport.from_dict(r.to_dict())
    assert back == r and back.other_contexts_bytes == 1200 * MiB


def test_report_cannot_split_primary_and_engine(monkeypatch, one_device):
    install_driver(monkeypatch, FakeDriver({0: True}, foreign=0))
    install_nvml(monkeypatch, FakeNvml(used=2 * GiB))
    monkeypatch.setattr(frameworks, "memory_by_framework",
                        lambda device=0: {"torch": FrameworkMemory("torch", 100 * MiB, 512 * MiB)})
    r = memory_report(0)
    assert r.cuda_contexts == 2
    assert r.other_contexts_bytes is None and r.context_and_libraries_bytes is None
    assert r.unaccounted_bytes == 2 * GiB - 512 * MiB
    assert "CUDA contexts + libraries + engines" in str(r)
    assert any("not told apart" in n for n in r.notes)


def test_report_primary_only_keeps_its_context_figure(monkeypatch, one_device):
    install_driver(monkeypatch, FakeDriver({0: True}))
    install_nvml(monkeypatch, FakeNvml(used=GiB))
    monkeypatch.setattr(frameworks, "memory_by_framework",
                        lambda device=0: {"torch": FrameworkMemory("torch", 0, 256 * MiB)})
    r = memory_report(0)
    assert (r.cuda_contexts, r.other_contexts_bytes) == (1, 0)
    assert r.context_and_libraries_bytes == GiB - 256 * MiB
    assert "other contexts" not in str(r)


def test_old_report_dicts_still_read(monkeypatch, one_device):
    install_driver(monkeypatch, FakeDriver({0: True}))
    install_nvml(monkeypatch, FakeNvml(used=GiB))
    monkeypatch.setattr(frameworks, "memory_by_framework", lambda device=0: {})
    data = memory_report(0).to_dict()
    for key in ("primary_context", "other_contexts", "contexts_how"):
        del data[key]
    back = MemoryReport.from_dict(data)
    assert back.cuda_contexts is None and back.other_contexts_bytes is None


# --------------------------------------------------------------------- benchmark_md_trajectory


def test_md_engine_alone_is_gpu_work_with_nvml_memory(monkeypatch):
    install_engine(monkeypatch, used=800 * MiB)
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    sync = counter()
    r = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=64, warmup_steps=3, synchronize=sync,
                                timestep_fs=2.0)
    assert r.work == "gpu" and r.device == "cuda:0" and r.timing_source == "host"
    assert "no framework" in r.timing_method and "synchronize" in r.timing_method
    assert r.memory_source == "nvml_process" and r.memory_leak is False
    assert r.memory_initial_bytes == 800 * MiB
    assert r.synchronized is True and r.throughput_source.startswith("wall clock")
    assert r.ns_per_day == pytest.approx(64 / r.total_time_s * 2e-6 * 86400)
    assert sync.calls == 2  # after the warm-up, and before the wall clock stops
    assert "GPU work" in r.summary()


def test_md_engine_with_sync_every_calls_the_callers_synchronize(monkeypatch):
    install_engine(monkeypatch, used=800 * MiB)
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    sync = counter()
    benchmark_md_trajectory(md_step, MD_STEPS, n_steps=40, warmup_steps=0, synchronize=sync,
                            sync_every=10, check_memory_leak=False)
    assert sync.calls == 2 + 4


def test_md_engine_without_synchronize_says_its_work_may_be_missing(monkeypatch):
    install_engine(monkeypatch, used=800 * MiB)
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    r = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=32, warmup_steps=1)
    assert r.work == "gpu" and r.synchronized is False
    assert "without a final synchronization" in r.throughput_source
    assert any("no synchronize callable" in w for w in r.warnings)


def test_md_engine_leak_is_seen_in_nvml(monkeypatch):
    install_engine(monkeypatch, used=Growing(800 * MiB, 2 * MiB))
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    r = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=200, warmup_steps=1, memory_sample_every=1,
                                synchronize=lambda: None)
    assert r.memory_source == "nvml_process" and r.memory_leak_source == "nvml_process"
    assert r.memory_leak is True
    assert r.memory_slope_bytes_per_step == pytest.approx(2 * MiB, rel=0.05)


def test_md_without_a_context_stays_cpu(monkeypatch):
    hide_frameworks(monkeypatch)
    install_driver(monkeypatch, FakeDriver({0: False}))
    install_nvml(monkeypatch, FakeNvml(used=None))  # this process is not on the device
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    r = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=16, warmup_steps=1)
    assert r.work == "cpu" and r.device == "cpu" and r.memory_source == "process_rss"


def test_md_engine_without_nvml_watches_the_host_and_says_why(monkeypatch):
    hide_frameworks(monkeypatch)
    install_driver(monkeypatch, FakeDriver({0: True}))  # found through the driver instead
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    r = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=16, warmup_steps=1, synchronize=lambda: None)
    assert r.work == "gpu" and r.memory_source == "process_rss"
    assert any("device memory of this process cannot be read" in w and "nvidia-ml-py" in w
               for w in r.warnings)


def test_md_torch_loaded_but_the_engine_allocates_is_a_leak_outside_frameworks(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", FakeTorch(4 * MiB, 20 * MiB))
    install_driver(monkeypatch, FakeDriver({0: True}))
    calls = {"n": 0}
    install_nvml(monkeypatch, FakeNvml(used=lambda: GiB + calls["n"] * 100_000))

    def engine_step(x: Any) -> float:
        calls["n"] += 1  # the engine keeps 100 kB of device memory per step
        return md_step(x)

    r = benchmark_md_trajectory(engine_step, MD_STEPS, n_steps=100, warmup_steps=1, timing="host",
                                memory_sample_every=5)
    # torch's counters stay flat, but NVML's figure grows 10 MB that no framework
    # explains: a leak outside every framework, said as the verdict and as a warning.
    assert r.work == "gpu" and r.memory_source == "torch" and r.memory_leak is True
    assert r.memory_leak_where == "outside frameworks" and r.memory_leak_cause == ""
    assert "outside every framework" in r.memory_leak_reason
    assert any("an engine or an extension in this process" in w for w in r.warnings)
    # Saying where the work is (synchronize=) makes NVML the memory source.
    r = benchmark_md_trajectory(engine_step, MD_STEPS, n_steps=100, warmup_steps=1, timing="host",
                                memory_sample_every=5, synchronize=lambda: None)
    assert r.memory_source == "nvml_process" and r.memory_leak is True


def test_md_torch_loaded_and_counters_explain_the_memory_no_warning(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", FakeTorch(4 * MiB, 20 * MiB))
    install_driver(monkeypatch, FakeDriver({0: True}))
    install_nvml(monkeypatch, FakeNvml(used=GiB))
    r = benchmark_md_trajectory(md_step, MD_STEPS, n_steps=50, warmup_steps=1, timing="host")
    assert r.memory_source == "torch"
    assert not any("no framework counter explains" in w for w in r.warnings)


def test_throughput_source_events_only_when_they_cover_the_loop():
    gpu_ms = [1.0] * 100  # 0.1 s of GPU time
    rate, source, cover = throughput(100, 0.1004, gpu_ms, True, busy=0.9)
    assert source.startswith("events") and rate == pytest.approx(1000.0) and cover > 0.99
    rate, source, cover = throughput(100, 0.5, gpu_ms, True, busy=0.9)  # work elsewhere too
    assert source.startswith("wall clock") and "only 20.0%" in source and rate == pytest.approx(200.0)
    # An idle stream's laps add up to the wall time as well: coverage alone proves nothing.
    rate, source, cover = throughput(100, 0.1004, gpu_ms, True, busy=0.0)
    assert source.startswith("wall clock") and "not shown busy" in source
    assert rate == pytest.approx(100 / 0.1004)
    rate, source, cover = throughput(100, 0.1004, gpu_ms, True)  # never probed
    assert source.startswith("wall clock")
    rate, source, cover = throughput(100, 0.5, None, False)
    assert cover is None and "without a final synchronization" in source


# --------------------------------------------------------------------- JAX


def test_benchmark_function_on_jax_is_gpu_work_with_jax_memory(monkeypatch):
    stats = {"bytes_in_use": GiB, "peak_bytes_in_use": GiB, "pool_bytes": 59 * GiB}
    jax = fake_jax(stats)
    monkeypatch.setitem(sys.modules, "jax", jax)
    r = benchmark_function(lambda: jax.Array(1.0), n_calls=50, warmup=3)
    assert r.work == "gpu" and r.timing == "host" and r.backend == "jax" and r.device == "cuda:0"
    assert "block_until_ready" in r.timing_method and r.synchronized is True
    assert r.memory_source == "jax" and r.memory_before_bytes == GiB == r.memory_after_bytes
    # 3 warm-up and 50 measured calls, each waited for; then the loop's pilot batch and
    # its batches, each waited for at its start and its end
    assert jax.blocked == 53 + 2 * (1 + len(r.loop_times_ms))
    assert r.measure == "loop" and r.bound is None  # no device time on JAX's streams
    text = r.summary()
    assert f"batches of {r.loop_calls} calls on cuda:0 (GPU work, host time, jax)" in text


def test_benchmark_function_cpu_result_is_not_jax_work(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", fake_jax(None))
    # JAX has a GPU, but the function is plain Python: the device decides before the
    # call (None picks JAX); an explicit 'cpu' keeps it on the host clock as CPU work.
    r = benchmark_function(lambda: 1.0, n_calls=5, warmup=1, device="cpu")
    assert r.work == "cpu" and r.backend == "cpu"


def test_md_jax_steps_are_gpu_work(monkeypatch):
    jax = fake_jax({"bytes_in_use": 10 * MiB, "pool_bytes": 59 * GiB})
    monkeypatch.setitem(sys.modules, "jax", jax)
    r = benchmark_md_trajectory(lambda x: jax.Array(x), [1.0, 2.0], n_steps=20, warmup_steps=2)
    assert r.work == "gpu" and r.device == "cuda:0" and r.timing_source == "host"
    assert r.memory_source == "jax" and r.memory_leak is False
    assert jax.blocked >= 20 and "block_until_ready" in r.timing_method


def test_gpu_context_names_the_jax_remedy(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", fake_jax({"bytes_in_use": GiB, "pool_bytes": 59 * GiB}))
    monkeypatch.setattr(frameworks, "active_devices", lambda: [0])
    monkeypatch.setattr(devices, "cuda_status", lambda: (1, ""))
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LeakWarning)
        with GPUContext(device=0) as ctx:
            pass
    rep = ctx.report
    assert rep.held_bytes == 0 and rep.unreturnable == {"cuda:0": {"jax": 58 * GiB}}
    text = str(rep)
    assert "nothing held above the baseline" in text
    assert "58.0 GiB" in text and "XLA_PYTHON_CLIENT_PREALLOCATE=false" in text
    assert "XLA_PYTHON_CLIENT_ALLOCATOR=platform" in text
    assert rep.to_dict()["release_hints"]["jax"] == frameworks.jax_release_hint()


@pytest.mark.parametrize(
    "env, wanted, unwanted",
    [
        ({}, ["PREALLOCATE=false", "ALLOCATOR=platform"], []),
        ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, ["ALLOCATOR=platform"], ["PREALLOCATE=false"]),
        ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, ["live arrays"], ["PREALLOCATE=false"]),
    ],
)
def test_jax_release_hint_follows_the_settings(monkeypatch, env, wanted, unwanted):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    hint = frameworks.jax_release_hint()
    assert all(w in hint for w in wanted) and not any(u in hint for u in unwanted)


# --------------------------------------------------------------------- benchmark_function, engines


def test_benchmark_function_engine_alone(monkeypatch):
    install_engine(monkeypatch, used=600 * MiB)
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    sync = counter()
    r = benchmark_function(lambda: None, n_calls=20, warmup=2, synchronize=sync)
    assert r.work == "gpu" and r.backend == "engine" and r.timing == "host" and r.device == "cuda:0"
    assert r.memory_source == "nvml_process" and r.memory_before_bytes == 600 * MiB
    assert r.synchronized is True and sync.calls == 22 + 2 * (1 + len(r.loop_times_ms))
    assert "no framework" in r.timing_method


def test_benchmark_function_engine_without_synchronize(monkeypatch):
    install_engine(monkeypatch, used=600 * MiB)
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    r = benchmark_function(lambda: None, n_calls=5, warmup=1)
    assert r.work == "gpu" and r.synchronized is False
    assert any("no synchronize callable" in w for w in r.warnings)


def test_benchmark_function_bad_synchronize():
    with pytest.raises(InvalidInputError, match="synchronize"):
        benchmark_function(lambda: None, n_calls=2, synchronize=3)
    with pytest.raises(InvalidInputError, match="synchronize"):
        benchmark_md_trajectory(md_step, MD_STEPS, synchronize="no")


def test_old_benchmark_results_read_back():
    from gpukeeper.timing.benchmark_result import BenchmarkResult

    data = BenchmarkResult("f", [1.0, 2.0], timing="gpu").to_dict()
    for key in ("work", "timing_method", "synchronized"):
        del data[key]
    assert BenchmarkResult.from_dict(data).work == "gpu"
    with pytest.raises(InvalidInputError):
        BenchmarkResult("f", [1.0], work="tpu")


# --------------------------------------------------------------------- GPUContext, engines


def test_gpu_context_watches_an_engine_context(monkeypatch):
    used: Dict[str, int] = {"v": 700 * MiB}
    install_engine(monkeypatch, used=lambda: used["v"])
    monkeypatch.setattr(cuda_driver, "cuda_device_count", lambda: 1)
    with pytest.warns(LeakWarning, match="engine"):
        with GPUContext() as ctx:
            used["v"] += 64 * MiB  # the engine allocates inside the block and keeps it
    rep = ctx.report
    assert rep.devices == [0]
    assert rep.held == {"cuda:0": {"engine": 64 * MiB}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", LeakWarning)
        with GPUContext() as ctx:
            pass
    assert ctx.report.held_bytes == 0 and "engine" in ctx.report.after["cuda:0"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="loaded objects are Linux's here")
def test_core_sees_libcuda_once_loaded(tmp_path) -> None:
    # A library loaded under the driver's name (any library will do: only the name is
    # looked at), in a child process, as the answer sticks once it is yes.
    import shutil
    import subprocess

    import _ctypes

    if _core.cuda_driver_loaded():
        pytest.skip("the CUDA driver is already loaded here")
    fake = tmp_path / "libcuda.so.1"
    shutil.copy(_ctypes.__file__, fake)
    code = (
        "import ctypes, sys, gpukeeper._core as c\n"
        "before = c.cuda_driver_loaded()\n"
        f"ctypes.CDLL({str(fake)!r})\n"
        "print(before, c.cuda_driver_loaded())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
