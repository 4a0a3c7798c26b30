"""``benchmark_function``, ``compare_implementations`` and ``print_comparison_table``.

How one call is measured (GPU; see ``benchmark_function`` for the CPU):

1. close a gate on the timed stream (see below);
2. optionally flush the L2 cache: fill a buffer of exactly the L2 size on the timed
   stream, so that every call starts cold (nvbench's ``l2flush``) instead of finding
   its inputs in L2 from the previous call;
3. host clock; start event on the current stream; ``fn(*args, **kwargs)``; stop event;
   open the gate;
4. wait for the stop event; host clock.

GPU time = stop - start (events); host time = the two host clock readings, i.e. launch
plus wait: the latency a caller of ``fn`` sees. Waiting after every call is what makes
per-call times (and the noise-based stop) possible. It also means the device is idle
when each start event is recorded: without a gate, the GPU time of a short call would
include the launch latency of its first kernel (a 10 us kernel reads ~14 us). The gate
(``_core.StreamGate``, nvbench's blocking kernel) holds the stream while the host
launches, so the device runs start event, ``fn``'s kernels and stop event back to back:
the GPU time is the device's work alone, less the device's own cost of the bracket (the
launch floor: the same gated events around an empty kernel, measured once per device,
``result.gpu_floor_ms``). A function that waits for the GPU inside
(``.item()``, a synchronize, a copy from pageable memory) cannot run behind a closed
gate; the last warm-up call finds that out (its gate times out) and such functions are
timed without a gate, with a warning.
"""

from __future__ import annotations

import io
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TextIO, Tuple, Union

from gpukeeper import frameworks, host
from gpukeeper import nvml as _nvml
from gpukeeper.errors import GpuError, InvalidInputError
from gpukeeper.timing.result import BenchmarkResult
from gpukeeper.timing.stats import NoiseCriterion
from gpukeeper.devices import DeviceSpec
from gpukeeper.timing.timer import (
    TimerBackend,
    _gates,
    check_gate_timeout,
    timing_device,
    select_backend,
)

__all__ = [
    "benchmark_function",
    "compare_implementations",
    "print_comparison_table",
    "format_comparison_table",
    "L2Flusher",
    "l2_cache_size",
    "NOISY_THRESHOLD",
]

#: Relative noise (std/mean) above which a result is flagged ``noisy`` when no
#: ``max_noise`` was asked for.
NOISY_THRESHOLD = 0.10

# Safety stop for min_time_s: the loop never runs longer than this many times
# min_time_s of wall time (plus one second), even if the measured time adds up slowly
# (e.g. GPU time of tiny kernels between long host gaps).
_MIN_TIME_WALL_FACTOR = 10.0


# --------------------------------------------------------------------- L2 flush


def l2_cache_size(device: Any = None) -> int:
    """The L2 cache size in bytes of a CUDA device (torch or CuPy); 0 on the CPU."""
    spec = device if isinstance(device, DeviceSpec) else timing_device(device)
    if not spec.is_cuda:
        return 0
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return int(torch.cuda.get_device_properties(spec.index).L2_cache_size)
        except Exception:
            pass  # fall through to CuPy
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        props = cupy.cuda.runtime.getDeviceProperties(spec.index or 0)
        return int(props["l2CacheSize"])
    return 0


class L2Flusher:
    """A device buffer of exactly the L2 size; ``flush()`` overwrites all of it.

    Filling the whole buffer evicts everything else from L2 (nvbench does the same
    with a memset of the L2 size). The fill is queued on ``stream`` (the timed one),
    so it is ordered before the next start event and never inside a measurement.
    """

    def __init__(self, backend: TimerBackend) -> None:
        # The buffer comes from the framework whose streams are timed: CuPy for the cupy
        # backend, else PyTorch when loaded, else CuPy when loaded (gpukeeper's own
        # backend without either cannot read the L2 size: nothing is flushed).
        if backend.name == "cupy" or ("torch" not in sys.modules and "cupy" in sys.modules):
            self.backend = "cupy"
        elif "torch" in sys.modules:
            self.backend = "torch"
        else:
            self.backend = ""
        self.nbytes = l2_cache_size(backend.device) if self.backend else 0
        self._buffer: Any = None
        if self.nbytes <= 0:
            return
        index = backend.device.index or 0
        if self.backend == "cupy":
            import cupy  # loaded: the cupy backend was chosen

            with cupy.cuda.Device(index):
                self._buffer = cupy.empty(self.nbytes, dtype=cupy.uint8)
        else:
            torch = sys.modules["torch"]
            self._buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=f"cuda:{index}")

    def flush(self, stream: Any = None) -> None:
        """Overwrites the buffer on ``stream`` (the current one when None)."""
        if self._buffer is None:
            return
        if self.backend == "cupy":
            if stream is not None:
                with stream:
                    self._buffer.fill(0)
            else:
                self._buffer.fill(0)
            return
        torch = sys.modules["torch"]
        if stream is not None:
            with torch.cuda.stream(stream):
                self._buffer.fill_(0)
        else:
            self._buffer.fill_(0)

    def release(self) -> None:
        self._buffer = None


# --------------------------------------------------------------------- memory


@dataclass
class _HostSync:
    """GPU work gpukeeper cannot put events around (JAX's streams, an engine's own CUDA
    context): each call is timed on the host clock up to ``wait(result)``."""

    name: str  # the result's backend: "jax" or "engine"
    index: int
    how: str
    wait: Callable[[Any], None]
    synchronized: Optional[bool]


def _jax_plan(index: int) -> _HostSync:
    return _HostSync("jax", index, "host clock around jax.block_until_ready on the result",
                     lambda result: frameworks.jax_block_until_ready(result), True)


def _engine_plan(index: int, synchronize: Optional[Callable[[], Any]], why: str) -> _HostSync:
    def wait(result: Any) -> None:
        frameworks.synchronize_all(index)
        if synchronize is not None:
            synchronize()

    if synchronize is not None:
        how = f"{why}: host clock around each call and the caller's synchronize()"
    else:
        how = (f"{why}: host clock around each call, without a synchronization (none given): "
               "work still queued when a call returns is not in its time")
    return _HostSync("engine", index, how, wait, True if synchronize is not None else False)


class _Memory:
    """Reads memory before/after/peak from the framework that owns the device."""

    def __init__(self, backend: TimerBackend, host_sync: Optional[_HostSync] = None) -> None:
        self.backend = backend
        self.host_sync = host_sync
        self.source: Optional[str] = None
        self.before: Optional[int] = None
        self.after: Optional[int] = None
        self.peak: Optional[int] = None
        self.why = ""
        self._read: Optional[Callable[[], Optional[int]]] = None
        self._peak_before: Optional[int] = None

    def start(self) -> None:
        b = self.backend
        plan = self.host_sync
        if plan is not None and plan.name == "jax":
            stats = frameworks.jax_memory_stats(plan.index)
            if stats is not None and "bytes_in_use" in stats:
                self.source = "jax"
                self.before = int(stats["bytes_in_use"])
                self._peak_before = stats.get("peak_bytes_in_use")
                return
            self.why = "JAX gives no memory statistics on this device"
        if plan is not None:
            read, why = _nvml.process_memory_reader(plan.index)
            if read is None:
                self.why = f"device memory not read: NVML {why}"
                return
            self.source = "nvml_process"
            self._read = read
            self.before = read()
            return
        if b.name == "torch":
            torch = sys.modules["torch"]
            self.source = "torch"
            self.before = int(torch.cuda.memory_allocated(b.device.index))
            # The peak counter is process-wide; resetting it is the only way to get the
            # peak of this run (documented in benchmark_function).
            torch.cuda.reset_peak_memory_stats(b.device.index)
        elif b.name == "cupy":
            import cupy

            self.source = "cupy"
            self.before = int(cupy.get_default_memory_pool().used_bytes())
        elif not b.is_gpu:
            self.before = host.current_rss_bytes()
            self.source = "host_rss" if self.before is not None else None

    def stop(self) -> None:
        b = self.backend
        if self.source == "jax":
            stats = frameworks.jax_memory_stats(self.host_sync.index) or {}  # type: ignore[union-attr]
            self.after = int(stats.get("bytes_in_use", 0))
            peak = stats.get("peak_bytes_in_use")
            # JAX's peak cannot be reset: it is this run's only when the run raised it.
            if peak is not None and self._peak_before is not None and peak > self._peak_before:
                self.peak = int(peak)
        elif self.source == "nvml_process":
            self.after = self._read()  # type: ignore[misc]
        elif self.source == "torch":
            torch = sys.modules["torch"]
            self.after = int(torch.cuda.memory_allocated(b.device.index))
            self.peak = int(torch.cuda.max_memory_allocated(b.device.index))
        elif self.source == "cupy":
            import cupy

            self.after = int(cupy.get_default_memory_pool().used_bytes())
        elif self.source == "host_rss":
            self.after = host.current_rss_bytes()


# --------------------------------------------------------------------- throttling

# NVML clock-event ("throttle") reason bits that mean the clocks were pulled down.
# GpuIdle (0x1), ApplicationsClocksSetting (0x2) and DisplayClockSetting (0x100) are
# not throttling.
_THROTTLE_BITS = {
    0x4: "sw power cap",
    0x8: "hw slowdown",
    0x10: "sync boost",
    0x20: "sw thermal slowdown",
    0x40: "hw thermal slowdown",
    0x80: "hw power brake",
}
# SM clock after the run below this fraction of the clock before it counts as throttled.
_CLOCK_DROP = 0.90


def _nvml_sample(index: int) -> Tuple[Optional[Dict[str, Any]], str]:
    """(clocks and reasons, "") or (None, why not)."""
    nvml, reason = _nvml.NVML.get()
    if nvml is None:
        return None, reason
    try:
        handle, _ = _nvml.device_handle(nvml, index)
        sample: Dict[str, Any] = {
            "sm_clock_mhz": int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            "mem_clock_mhz": int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
        }
        try:
            sample["max_sm_clock_mhz"] = int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        except Exception:
            pass  # optional decoration
        get_reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        sample["reasons"] = int(get_reasons(handle))
        try:
            sample["temperature_c"] = int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        except Exception:
            pass
        return sample, ""
    except Exception as exc:
        return None, f"unavailable: NVML query failed: {exc}"


def _throttle_verdict(before: Dict[str, Any], after: Dict[str, Any]) -> Tuple[bool, List[str]]:
    why: List[str] = []
    for sample, when in ((before, "before"), (after, "after")):
        bits = [text for bit, text in _THROTTLE_BITS.items() if sample.get("reasons", 0) & bit]
        if bits:
            why.append(f"{when}: " + ", ".join(bits))
    if before.get("sm_clock_mhz") and after.get("sm_clock_mhz", 0) < _CLOCK_DROP * before["sm_clock_mhz"]:
        why.append(f"SM clock fell from {before['sm_clock_mhz']} to {after['sm_clock_mhz']} MHz")
    return bool(why), why


# --------------------------------------------------------------------- recompiles


def _dynamo_frames() -> Optional[int]:
    """Frames torch.compile has compiled so far (None when dynamo was never loaded:
    importing it just to count would cost seconds)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    try:
        return int(utils.counters["frames"]["total"])
    except Exception:
        return None


# --------------------------------------------------------------------- validation


def _check_count(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInputError(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def _check_positive(value: Any, what: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise InvalidInputError(f"{what} must be a positive finite number or None, got {value!r}")
    return float(value)


# --------------------------------------------------------------------- gates

# A gate must stay closed while the host issues one call; it times out after this many
# times the slowest warm-up call's host time, within these bounds (ms). A function that
# waits for the GPU inside stalls for that long once, in the probing warm-up call.
_GATE_TIMEOUT_FACTOR = 20.0
_GATE_TIMEOUT_MIN_MS = 50.0
_GATE_TIMEOUT_MAX_MS = 2000.0


def _gate_timeout_ms(host_ms: Optional[float]) -> float:
    if host_ms is None:
        return _GATE_TIMEOUT_MAX_MS
    return min(_GATE_TIMEOUT_MAX_MS, max(_GATE_TIMEOUT_MIN_MS, _GATE_TIMEOUT_FACTOR * host_ms))


def _gate_timed_out_warning(timeout_ms: float, when: str) -> str:
    return (
        f"launch latency included: {when} the gate timed out after {timeout_ms:.0f} ms "
        "because the function waited for the GPU while the stream was held (a synchronize, "
        ".item()/.cpu(), a copy from pageable memory, or more launches than the queue "
        "holds); its GPU times include the launch latency of its first kernel"
    )


# --------------------------------------------------------------------- GPU work without events


def _host_sync_plan(device: Any, spec: DeviceSpec, synchronize: Optional[Callable[[], Any]]) -> Optional[_HostSync]:
    """The host-clock plan for GPU work that events cannot see, decided before the
    warm-up (JAX found from the warm-up's result is decided after it)."""
    if synchronize is not None and spec.is_cuda:
        return _engine_plan(spec.index or 0, synchronize, f"GPU work on cuda:{spec.index or 0}")
    if device is not None or spec.is_cuda:
        return None
    jax_devices = frameworks.jax_gpu_devices()
    if jax_devices and synchronize is None:
        return _jax_plan(int(getattr(jax_devices[0], "id", 0)))
    if frameworks.gpu_frameworks_loaded():
        return None
    devices = frameworks.context_devices()
    if devices:
        return _engine_plan(devices[0], synchronize,
                            f"a CUDA context with no framework on cuda:{devices[0]}")
    return None


def _timing_method(plan: Optional[_HostSync], on_gpu: bool, backend: str, hidden: bool) -> str:
    if plan is not None:
        return plan.how
    if on_gpu:
        return (f"CUDA events ({backend}) on the current stream around each call"
                + (", launch latency hidden behind a gate" if hidden else "")
                + "; each call waited for")
    return "host clock around each call (CPU work)"


# --------------------------------------------------------------------- benchmark


def benchmark_function(
    fn: Callable[..., Any],
    *args: Any,
    n_calls: int = 100,
    warmup: int = 10,
    device: Any = None,
    name: Optional[str] = None,
    l2_flush: bool = False,
    min_time_s: Optional[float] = None,
    max_noise: Optional[float] = None,
    hide_launch_latency: Optional[bool] = None,
    gate_timeout_ms: Optional[float] = None,
    synchronize: Optional[Callable[[], Any]] = None,
    **kwargs: Any,
) -> BenchmarkResult:
    """Times ``fn(*args, **kwargs)`` call by call and returns a ``BenchmarkResult``.

    - ``warmup`` calls first (not measured), then a synchronisation: first calls pay for
      lazy initialisation, kernel compilation and allocator growth.
    - On a CUDA device (``device`` None picks CUDA when a loaded PyTorch or CuPy can use
      it) each call is bracketed by events on the current stream and waited for; the
      statistics are of GPU time, host latencies are kept too. On the CPU they are of
      the host time (``time.perf_counter_ns``).
    - ``l2_flush``: overwrite a buffer of exactly the L2 size before each call (GPU only;
      ignored with a warning on the CPU).
    - ``hide_launch_latency``: take each call's GPU time behind a gate, so that it is the
      device's work without the launch latency in front of it (see the module docs).
      None (default): hide where gpukeeper's gate kernel exists, and fall back to
      including it, with a warning, for a function that waits for the GPU inside (found
      by the last warm-up call, or by a measured call, which is then measured again).
      True: the same, but a build without the gate kernel raises ``GpuError``. False:
      never. The result's ``launch_latency`` says which it was. ``gate_timeout_ms``
      overrides the gate timeout (default: 20 x the slowest warm-up call's host time,
      within 50 ms .. 2 s).
    - Stopping: ``n_calls`` calls are measured. ``min_time_s`` keeps measuring past them
      until the measured time adds up to ``min_time_s`` (with a safety stop at
      10 x ``min_time_s`` + 1 s of wall time). ``max_noise`` (a fraction: 0.005 = 0.5 %)
      may stop *earlier* than ``n_calls``, never before ``min_time_s`` and 10 calls:
      nvbench's criterion (``NoiseCriterion``) — the relative std is at most
      ``max_noise``, or it has converged above it (then the result is flagged noisy).
    - Clock throttling: NVML clocks and clock-event reasons are read before and after
      the measured calls (nvidia-ml-py); ``throttled`` is None with a warning when NVML
      is unavailable.
    - Memory: PyTorch's allocated bytes before and after and its peak during the run
      (this resets PyTorch's peak counter), CuPy's pool bytes, or the host RSS on CPU.
    - torch.compile: frames compiled during the measured calls are counted in
      ``recompiles`` (only when ``torch._dynamo`` is already loaded).
    - GPU work without events: a function that returns JAX arrays runs on JAX's own
      streams; it is GPU work timed on the host clock around ``jax.block_until_ready``
      on its result, with JAX's memory statistics (``device`` None picks it when JAX has
      a GPU and PyTorch/CuPy are not usable, or when the warm-up's result holds JAX
      arrays). With ``device`` None and no framework loaded, a CUDA context in the
      process (an engine's own, such as OpenMM's) makes it GPU work too, timed on the
      host clock, its memory NVML's figure for this process. ``synchronize``: a callable
      that waits for such an engine's work (``lambda: context.getState()``); given, each
      call is timed up to its return (host clock) and memory comes from NVML. Without
      it an engine's queued work may be missing from the times (``synchronized`` False,
      with a warning). ``work``, ``timing_method`` and ``synchronized`` in the result say
      what was timed and how.

    Exceptions raised by ``fn`` propagate unchanged. Bad arguments raise
    ``InvalidInputError``.
    """
    if not callable(fn):
        raise InvalidInputError(f"fn must be callable, got {type(fn).__name__}")
    _check_count(n_calls, "n_calls", 1)
    _check_count(warmup, "warmup", 0)
    min_time = _check_positive(min_time_s, "min_time_s")
    noise_limit = _check_positive(max_noise, "max_noise")
    if name is not None and not isinstance(name, str):
        raise InvalidInputError(f"name must be a string or None, got {type(name).__name__}")
    if not isinstance(l2_flush, bool):
        raise InvalidInputError(f"l2_flush must be a bool, got {l2_flush!r}")
    if hide_launch_latency is not None and not isinstance(hide_launch_latency, bool):
        raise InvalidInputError(f"hide_launch_latency must be a bool or None, got {hide_launch_latency!r}")
    fixed_timeout = None if gate_timeout_ms is None else check_gate_timeout(gate_timeout_ms)
    if synchronize is not None and not callable(synchronize):
        raise InvalidInputError(f"synchronize must be callable or None, got {type(synchronize).__name__}")
    label = name if name is not None else getattr(fn, "__qualname__", None) or repr(fn)

    spec = timing_device(device)
    backend = select_backend(spec)
    warnings: List[str] = []
    plan = _host_sync_plan(device, spec, synchronize)
    if plan is not None:
        spec = DeviceSpec("cuda", plan.index)

    flusher: Optional[L2Flusher] = None
    if l2_flush:
        if plan is not None:
            warnings.append(f"l2_flush ignored: {plan.name} work runs where gpukeeper cannot flush before it")
        elif backend.is_gpu:
            flusher = L2Flusher(backend)
            if flusher.nbytes == 0:
                warnings.append("l2_flush: the L2 size could not be read; nothing flushed")
        else:
            warnings.append("l2_flush ignored: only a GPU's L2 cache is flushed")

    gates: Any = None
    if backend.is_gpu and plan is None and hide_launch_latency is not False:
        gates = _gates()
        if gates is None and hide_launch_latency:
            raise GpuError(
                "hide_launch_latency=True needs gpukeeper's gate kernel, and this build has "
                "none (built without nvcc); pass hide_launch_latency=None or False"
            )
    gate_index = spec.index or 0

    # Warm-up. The last call is the gate probe: it runs behind a gate, so a function that
    # waits for the GPU inside is found here rather than in every measured call.
    slowest_ms: Optional[float] = None
    for i in range(warmup):
        probe = gates is not None and i == warmup - 1
        gate = None
        h0 = time.perf_counter_ns()
        if probe:
            timeout = fixed_timeout or _gate_timeout_ms(slowest_ms)
            gate = gates.StreamGate(backend.current_stream(), gate_index, timeout)
        try:
            last = fn(*args, **kwargs)
            if plan is not None:
                plan.wait(last)
            elif synchronize is not None:
                synchronize()
        finally:
            if gate is not None:
                gate.open()
        call_ms = (time.perf_counter_ns() - h0) / 1e6
        if not probe:
            slowest_ms = call_ms if slowest_ms is None else max(slowest_ms, call_ms)
        if gate is not None:
            backend.synchronize()
            if gate.outcome == "timed_out":
                gates = None
                warnings.append(_gate_timed_out_warning(timeout, "in the last warm-up call"))
    if plan is None and warmup > 0 and spec.is_cuda and frameworks.holds_jax_arrays(last):
        # Events on PyTorch's or CuPy's stream never see JAX's streams.
        jax_index = frameworks.jax_device_index(last)
        plan = _jax_plan(jax_index if jax_index is not None else (spec.index or 0))
        spec = DeviceSpec("cuda", plan.index)
        gates = None
        if flusher is not None:
            flusher.release()
            flusher = None
            warnings.append("l2_flush ignored: jax work runs where gpukeeper cannot flush before it")
    last = None
    backend.synchronize()
    if plan is not None and plan.synchronized is False:
        warnings.append(
            "no synchronize callable: gpukeeper cannot wait for an engine's own CUDA context, so "
            "each call's time may end before its work does (pass synchronize=, e.g. "
            "lambda: simulation.context.getState())")
    timed_on_gpu = backend.is_gpu and plan is None

    stream = backend.current_stream()
    gate_timeout = fixed_timeout or _gate_timeout_ms(slowest_ms)
    frames_before = _dynamo_frames()
    clocks: Dict[str, Any] = {}
    nvml_before: Optional[Dict[str, Any]] = None
    if backend.is_gpu or plan is not None:
        nvml_before, why = _nvml_sample(spec.index or 0)
        clocks["nvml"] = why or "ok"
        if nvml_before is not None:
            clocks["before"] = nvml_before
        else:
            warnings.append(f"throttle detection {why}")
    memory = _Memory(backend, plan)
    memory.start()
    if memory.why:
        warnings.append(memory.why)

    criterion: Optional[NoiseCriterion] = None
    if noise_limit is not None:
        criterion = NoiseCriterion(
            noise_limit, min_samples=max(2, min(10, n_calls)), min_time=(min_time or 0.0) * 1e3
        )
    gpu_times: List[float] = []
    host_times: List[float] = []
    measured_ms = 0.0
    stop_reason = "n_calls"
    # Events are made before the loop and reused, so that creating them is never inside
    # a measurement (CUDA event creation can cost microseconds and allocate).
    start_evt = backend.new_event()
    end_evt = backend.new_event()
    record = backend.record
    elapsed = backend.elapsed_ms
    clock = time.perf_counter_ns
    wall_start = clock()
    wall_limit_ns = (min_time * _MIN_TIME_WALL_FACTOR + 1.0) * 1e9 if min_time else math.inf
    count = 0
    launch_hidden = gates is not None
    floor_ms = float(gates.launch_floor_ms(gate_index)) if gates is not None else 0.0
    while True:
        gate = gates.StreamGate(stream, gate_index, gate_timeout) if gates is not None else None
        if flusher is not None:
            flusher.flush(stream)
        if plan is not None:
            wait = plan.wait
            h0 = clock()
            result = fn(*args, **kwargs)
            wait(result)
            h1 = clock()
            result = None
            t = (h1 - h0) / 1e6
        elif timed_on_gpu:
            h0 = clock()
            try:
                record(start_evt, stream)
                fn(*args, **kwargs)
                record(end_evt, stream)
            finally:
                if gate is not None:
                    gate.open()
            g = elapsed(start_evt, end_evt)
            h1 = clock()
            if gate is not None and gate.outcome == "timed_out":
                # This call's time holds the host's wait: measure it again, ungated.
                gates = None
                launch_hidden = False
                warnings.append(_gate_timed_out_warning(gate_timeout, "in a measured call"))
                continue
            if gate is not None:
                g = max(0.0, g - floor_ms)
            gpu_times.append(g)
            t = g
        else:
            h0 = clock()
            fn(*args, **kwargs)
            if synchronize is not None:
                synchronize()
            h1 = clock()
            t = (h1 - h0) / 1e6
        host_times.append((h1 - h0) / 1e6)
        measured_ms += t
        count += 1
        if criterion is not None:
            criterion.add(t)
            if count < n_calls and criterion.is_finished():
                stop_reason = "noise_converged" if criterion.converged else "max_noise"
                break
        if count >= n_calls:
            if min_time is None:
                break  # stop_reason stays "n_calls"
            if measured_ms >= min_time * 1e3:
                stop_reason = "min_time_s" if count > n_calls else "n_calls"
                break
            if clock() - wall_start > wall_limit_ns:
                stop_reason = "timeout"
                warnings.append(
                    f"min_time_s={min_time} not reached: measured {measured_ms / 1e3:.3f} s "
                    f"in {(clock() - wall_start) / 1e9:.1f} s of wall time (safety stop)"
                )
                break
    total_s = (clock() - wall_start) / 1e9
    backend.synchronize()
    memory.stop()
    if flusher is not None:
        flusher.release()

    throttled: Optional[bool] = None
    if nvml_before is not None:
        nvml_after, why = _nvml_sample(spec.index or 0)
        if nvml_after is not None:
            clocks["after"] = nvml_after
            throttled, reasons = _throttle_verdict(nvml_before, nvml_after)
            if throttled:
                warnings.append("throttled: " + "; ".join(reasons))
        else:
            warnings.append(f"throttle detection {why}")

    recompiles = 0
    frames_after = _dynamo_frames()
    if frames_after is not None:
        recompiles = frames_after - (frames_before or 0)
        if recompiles > 0:
            warnings.append(
                f"recompiles seen: torch.compile compiled {recompiles} frame(s) while measuring; "
                "the times include compilation (warm up with every input shape)"
            )

    result = BenchmarkResult(
        name=label,
        times_ms=gpu_times if timed_on_gpu else host_times,
        host_times_ms=host_times,
        gpu_times_ms=gpu_times if timed_on_gpu else None,
        timing="gpu" if timed_on_gpu else "host",
        device=str(spec),
        backend=plan.name if plan is not None else backend.name,
        warmup=warmup,
        l2_flush=flusher is not None and flusher.nbytes > 0,
        launch_latency=("hidden" if launch_hidden else "included") if timed_on_gpu else "n/a",
        gpu_floor_ms=floor_ms if launch_hidden else None,
        stop_reason=stop_reason,
        total_time_s=total_s,
        memory_before_bytes=memory.before,
        memory_after_bytes=memory.after,
        memory_peak_bytes=memory.peak,
        memory_source=memory.source,
        throttled=throttled,
        recompiles=recompiles,
        warnings=warnings,
        clocks=clocks,
        work="gpu" if (timed_on_gpu or plan is not None) else "cpu",
        timing_method=_timing_method(plan, timed_on_gpu, backend.name, launch_hidden),
        synchronized=plan.synchronized if plan is not None else True,
    )
    limit = noise_limit if noise_limit is not None else NOISY_THRESHOLD
    noise = result.relative_noise
    if not math.isnan(noise) and noise > limit:
        result.noisy = True
        result.warnings.append(
            f"noisy: relative std {noise * 100:.1f} % > {limit * 100:.1f} % "
            f"(IQR/median {result.relative_iqr * 100:.1f} %)"
        )
    return result


# --------------------------------------------------------------------- comparison


def compare_implementations(
    impls: Mapping[str, Callable[..., Any]], *args: Any, **kwargs: Any
) -> Dict[str, BenchmarkResult]:
    """Benchmarks each implementation with the same arguments, in order.

    ``kwargs`` are those of ``benchmark_function`` (``n_calls``, ``warmup``, ``device``,
    ``l2_flush``, ``min_time_s``, ``max_noise``) plus keyword arguments for the
    implementations. Returns ``{name: BenchmarkResult}`` in the order given, each with
    ``speedup`` = baseline median / its median (the first implementation is the
    baseline; medians, because one slow outlier call should not decide a speedup).
    """
    if not isinstance(impls, Mapping) or not impls:
        raise InvalidInputError("impls must be a non-empty dict of name -> callable")
    if "name" in kwargs:
        raise InvalidInputError("compare_implementations names results by the keys of impls; do not pass name=")
    for key, fn in impls.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"implementation names must be strings, got {key!r}")
        if not callable(fn):
            raise InvalidInputError(f"implementation {key!r} is not callable ({type(fn).__name__})")
    results: Dict[str, BenchmarkResult] = {}
    for key, fn in impls.items():
        results[key] = benchmark_function(fn, *args, name=key, **kwargs)
    baseline = next(iter(results.values())).median_ms
    for result in results.values():
        result.speedup = baseline / result.median_ms if result.median_ms > 0 else math.inf
    return results


def _within_noise(a: BenchmarkResult, b: BenchmarkResult) -> bool:
    """True when the interquartile ranges [p25, p75] of ``a`` and ``b`` overlap."""
    return a.p25_ms <= b.p75_ms and b.p25_ms <= a.p75_ms


def format_comparison_table(
    results: Union[Mapping[str, BenchmarkResult], Sequence[BenchmarkResult]]
) -> str:
    """The table ``print_comparison_table`` prints, as a string."""
    if isinstance(results, Mapping):
        rows = list(results.items())
    elif isinstance(results, (list, tuple)):
        rows = [(r.name, r) for r in results]
    else:
        raise InvalidInputError(f"results must be a dict or list of BenchmarkResult, got {type(results).__name__}")
    if not rows:
        raise InvalidInputError("no results to compare")
    for key, r in rows:
        if not isinstance(r, BenchmarkResult):
            raise InvalidInputError(f"result {key!r} is not a BenchmarkResult ({type(r).__name__})")
    baseline = rows[0][1]
    header = ["Implementation", "Median ms", "Mean ms", "Std ms", "P95 ms", "P99 ms", "Calls/s", "Speedup"]
    body: List[List[str]] = []
    any_close = False
    for i, (key, r) in enumerate(rows):
        speedup = r.speedup if r.speedup is not None else (
            baseline.median_ms / r.median_ms if r.median_ms > 0 else math.inf
        )
        mark = ""
        if i > 0 and _within_noise(baseline, r):
            mark = "~"
            any_close = True
        flags = "".join([" (noisy)" if r.noisy else "", " (throttled)" if r.throttled else ""])
        body.append([
            f"{key}{flags}",
            f"{r.median_ms:.4f}",
            f"{r.mean_ms:.4f}",
            f"{r.std_ms:.4f}" if not math.isnan(r.std_ms) else "n/a",
            f"{r.p95_ms:.4f}",
            f"{r.p99_ms:.4f}",
            f"{r.calls_per_s:,.1f}",
            f"{mark}{speedup:.2f}x" if i > 0 else "1.00x (baseline)",
        ])
    widths = [max(len(h), *(len(row[c]) for row in body)) for c, h in enumerate(header)]

    def line(cells: Iterable[str]) -> str:
        out = []
        for c, cell in enumerate(cells):
            out.append(cell.ljust(widths[c]) if c == 0 else cell.rjust(widths[c]))
        return "  ".join(out).rstrip()

    out = io.StringIO()
    out.write(line(header) + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for row in body:
        out.write(line(row) + "\n")
    if any_close:
        out.write("~ : within the noise (interquartile ranges overlap with the baseline's)\n")
    return out.getvalue()


def print_comparison_table(
    results: Union[Mapping[str, BenchmarkResult], Sequence[BenchmarkResult]],
    file: Optional[TextIO] = None,
) -> str:
    """Prints one row per result (median, mean, std, p95, p99, calls/s, speedup against
    the first) to ``file`` (stdout by default) and returns the text. A speedup marked
    ``~`` is within the noise: the IQRs of that result and the baseline overlap."""
    text = format_comparison_table(results)
    print(text, end="", file=file if file is not None else sys.stdout)
    return text
