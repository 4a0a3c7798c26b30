"""``CUDATimer`` and the small backend layer under it.

A timer is two marks on a stream and the time between them. Where the marks come from
is a *backend*:

================ ========================================================== =========
name             marks                                                      GPU time
================ ========================================================== =========
``"torch"``      ``torch.cuda.Event(enable_timing=True)`` on a torch stream  yes
``"cupy"``       ``cupy.cuda.Event()`` on a CuPy stream                      yes
``"gpukeeper"``  gpukeeper's pooled events (``_core.Event``) on the current  yes
                 stream of a loaded framework, else the legacy default one
``"cpu"``        ``time.perf_counter_ns()`` (a steady clock)                 no
================ ========================================================== =========

The frameworks' backends come from their adapters (``timer_backend``, ``timer_priority``
in ``gpukeeper.frameworks``). ``select_backend()`` picks torch when PyTorch is loaded and
CUDA is usable, else CuPy when only CuPy is, else gpukeeper's own events when CUDA was
asked for explicitly, else the CPU clock. Nothing is imported to find out: a framework
not in ``sys.modules`` is not in use, and importing one costs seconds and a CUDA context.
``register_backend()`` adds another implementation under its own name and priority
without changing any caller.

``device=None`` with no framework loaded means the CPU, even on a GPU machine: then
nothing in the process can have queued GPU work except through gpukeeper, and timing
host code with GPU events would read a number that looks like GPU time and is not.

Why the *current* stream: PyTorch runs work on its current stream (``torch.cuda.stream``
context); events recorded on the legacy default stream would either wait for unrelated
work or miss the work entirely. The stream is read at ``start()`` and ``stop()`` records
on that same stream.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections import deque
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from gpukeeper.base.device_names import DeviceSpec, resolve_device
from gpukeeper.base.errors import GpuError, InvalidInputError, TimingWarning
from gpukeeper.frameworks import registry
from gpukeeper.frameworks.adapter import CpuBackend, FrameworkAdapter, TimerBackend
from gpukeeper.frameworks.cuda_context_adapter import CoreBackend, core_cuda
from gpukeeper.frameworks.cupy_adapter import CupyBackend
from gpukeeper.frameworks.torch_adapter import TorchBackend

__all__ = [
    "CUDATimer",
    "TimerBackend",
    "CpuBackend",
    "TorchBackend",
    "CupyBackend",
    "CoreBackend",
    "timing_device",
    "select_backend",
    "register_backend",
    "available_backends",
    "CallTiming",
    "can_hide_launch_latency",
    "check_gate_timeout",
    "gates",
]


# --------------------------------------------------------------------- devices


def timing_device(device: Any = None) -> DeviceSpec:
    """The device to time on: :func:`gpukeeper.base.device_names.resolve_device`, except that None
    means CUDA only when a loaded framework (PyTorch, CuPy) uses it; GPU events around
    host-only work would read zero."""
    auto_cuda = any(
        fw.timer_backend is not None and fw.cuda_usable() for fw in registry.ADAPTERS.values()
    )
    return resolve_device(device, auto_cuda=auto_cuda)


# --------------------------------------------------------------------- backends


def _usable_through(fw: FrameworkAdapter) -> Callable[[DeviceSpec], bool]:
    return lambda d: d.is_cuda and fw.cuda_usable()


# name -> (priority, factory, usable). Highest usable priority wins in select_backend().
# The frameworks' backends are their adapters', under the adapters' names.
_BACKENDS: Dict[
    str, Tuple[int, Callable[[DeviceSpec], TimerBackend], Callable[[DeviceSpec], bool]]
] = {
    name: (fw.timer_priority, fw.timer_backend, _usable_through(fw))
    for name, fw in registry.ADAPTERS.items()
    if fw.timer_backend is not None
}
_BACKENDS["gpukeeper"] = (5, CoreBackend, lambda d: d.is_cuda and core_cuda())
_BACKENDS["cpu"] = (0, CpuBackend, lambda d: True)


def register_backend(
    name: str,
    factory: Callable[[DeviceSpec], TimerBackend],
    usable: Callable[[DeviceSpec], bool],
    priority: int = 30,
) -> None:
    """Adds (or replaces) a backend. ``usable(device)`` says whether it can time work on
    ``device``; among the usable ones the highest ``priority`` is chosen by default
    (torch is 20, cupy 10, gpukeeper 5, cpu 0)."""
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"backend name must be a non-empty string, got {name!r}")
    if not callable(factory) or not callable(usable):
        raise InvalidInputError("register_backend needs callable factory and usable")
    _BACKENDS[name] = (int(priority), factory, usable)


def available_backends(device: Any = None) -> List[str]:
    """Names of the backends usable for ``device`` now, best first."""
    spec = device if isinstance(device, DeviceSpec) else timing_device(device)
    usable = [(p, n) for n, (p, _, ok) in _BACKENDS.items() if ok(spec)]
    return [n for _, n in sorted(usable, reverse=True)]


def select_backend(device: Any = None, backend: Optional[str] = None) -> TimerBackend:
    """The backend for ``device``: ``backend`` by name, else the best usable one.

    A CPU device always gets the CPU clock: events on a GPU stream would not see work
    done by the host.
    """
    spec = device if isinstance(device, DeviceSpec) else timing_device(device)
    if backend is not None:
        entry = _BACKENDS.get(backend)
        if entry is None:
            raise InvalidInputError(
                f"unknown timer backend {backend!r}; known: {sorted(_BACKENDS)}"
            )
        if not entry[2](spec):
            raise InvalidInputError(f"timer backend {backend!r} cannot time work on {spec}")
        return entry[1](spec)
    return _BACKENDS[available_backends(spec)[0]][1](spec)


# --------------------------------------------------------------------- the timer


def gates() -> Any:
    """gpukeeper's stream-gate API (``_core``: ``StreamGate``, ``launch_floor_ms``) when
    stream gates work here, else None.

    The one place the timing code asks: ``CUDATimer`` (and through it
    ``benchmark_function`` and ``gpukeeper check``) calls it when a timer is made, so a
    test can put a stand-in gate module here.
    """
    import gpukeeper._core as _core

    return _core if _core.stream_gates_available() else None


def can_hide_launch_latency(backend: TimerBackend) -> bool:
    """Whether a ``CUDATimer`` on ``backend`` can hide the launch latency: the marks are
    the device's (a GPU backend) and this build has gpukeeper's gate kernel."""
    return bool(backend.is_gpu) and gates() is not None


def check_gate_timeout(value: Any) -> float:
    """``gate_timeout_ms`` validated: a positive finite number of milliseconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= 3.6e6):
        raise InvalidInputError(
            f"gate_timeout_ms must be a number of milliseconds in (0, 3600000], got {value!r}"
        )
    return float(value)


#: How many in-place floor brackets the subtracted floor is the median of: enough that
#: one bracket's noise (a few tens of ns) averages out, few enough that the floor follows
#: its drift within a fraction of a second of measurements.
FLOOR_WINDOW = 21


class CallTiming(NamedTuple):
    """One call timed by ``CUDATimer.time_call``."""

    #: The timer's reading (``CUDATimer.elapsed_ms``): the launch floor subtracted when
    #: the gate opened in time.
    elapsed_ms: float
    #: Host milliseconds from just before the start mark to the end of the wait for the
    #: stop mark: launch plus wait, the latency a caller of the function sees.
    host_ms: float
    #: True when the gate opened in time, False when it timed out (the reading then holds
    #: the host's wait), None for a timer that does not hide the launch latency.
    launch_hidden: Optional[bool]
    #: What the function returned.
    result: Any


class CUDATimer:
    """Times the work between ``start()`` and ``stop()`` on a stream.

    >>> with CUDATimer() as t:
    ...     y = model(x)
    >>> t.elapsed_ms          # waits for the stop mark, then reads the time
    0.412

    On a GPU the marks are events on the *current* stream (PyTorch's when it is loaded;
    else ``stream``, else CuPy's current one), so the time is the device's: the work
    queued between the marks, not the host's launch time. ``stop()`` does not wait;
    reading ``elapsed_ms`` does. On the CPU (no usable GPU, or ``device="cpu"``) the
    marks are a steady host clock, and the same code runs unchanged.

    What the interval holds: everything the stream did from the start mark to the stop
    mark, *including the time it sat idle waiting for launches*. When the stream is idle
    at ``start()``, that is the launch latency of the first kernel (a 10 us kernel reads
    ~14 us), and for launch-bound work the gaps between kernels: the time the region
    really takes. ``hide_launch_latency=True`` measures the device's work alone: a gate
    kernel holds the stream from ``start()`` to ``stop()``, so the launches only fill the
    queue and the device then runs start mark, work and stop mark back to back (nvbench's
    blocking kernel); and the device's own cost of that bracket (``floor_ms``, ~3 us) is
    subtracted, so a kernel reads what a profiler reports as its duration
    (``raw_elapsed_ms`` keeps the reading as taken). The floor is taken in place: behind
    the same gate, just before the start mark, one more mark and an empty kernel read
    what a bracket costs on this stream at this moment, and the median of the last
    ``FLOOR_WINDOW`` such brackets is subtracted. A floor measured once per process
    (``_core.launch_floor_ms``, used only until the first bracket) drifts by 0.3 us over
    seconds and differs between streams. Use it to time
    kernels, not regions: work that makes the host wait
    for the stream inside the region (``.item()``, ``.cpu()``, a synchronize, a copy from
    pageable memory, more launches than the queue holds) stalls until the gate times out
    (``gate_timeout_ms``); the reading then includes that wait, ``launch_hidden`` is
    False and a ``TimingWarning`` says so.

    ``host_ms`` is the host time between the ``start()`` and ``stop()`` calls (no
    synchronisation): on a GPU, how long it took to *issue* the work.

    ``time_call(fn, args, kwargs)`` is the same measurement around one call, waited for,
    in one method: the per-call engine of ``benchmark_function``.

    The two events are created once and reused by every measurement. ``backend`` is a
    backend's name, or a ``TimerBackend`` made by ``select_backend`` (then ``device`` is
    the backend's and must be left out).
    """

    def __init__(
        self,
        name: str = "",
        *,
        device: Any = None,
        stream: Any = None,
        backend: Any = None,
        hide_launch_latency: bool = False,
        gate_timeout_ms: float = 1000.0,
    ) -> None:
        if not isinstance(name, str):
            raise InvalidInputError(f"CUDATimer name must be a string, got {type(name).__name__}")
        if not isinstance(hide_launch_latency, bool):
            raise InvalidInputError(
                f"hide_launch_latency must be a bool, got {hide_launch_latency!r}"
            )
        self._gate_timeout_ms = check_gate_timeout(gate_timeout_ms)
        self.name = name
        if isinstance(backend, TimerBackend):
            if device is not None:
                raise InvalidInputError(
                    "CUDATimer: pass device= or a TimerBackend instance, not both"
                )
            self._backend = backend
        else:
            self._backend = select_backend(device, backend)
        self._index = self._backend.device.index or 0
        self._stream_arg = stream
        self._stream: Any = None
        self._start = self._backend.new_event()
        self._end = self._backend.new_event()
        self._gates: Any = None
        self._gate: Any = None
        self._floor_ms = 0.0
        # The in-place floor brackets of the last measurements (ms), and the mark that
        # opens the next one.
        self._floors: "deque[float]" = deque(maxlen=FLOOR_WINDOW)
        self._floor_mark = self._backend.new_event()
        self._floor_queued = False
        self._set_hiding(hide_launch_latency)
        self._raw: Optional[float] = None
        self._state = "idle"  # idle -> running -> stopped -> running ...
        self._host_start = 0
        self._host_ns = 0
        self._elapsed: Optional[float] = None

    def _set_hiding(self, hide: bool) -> None:
        """Takes the gate API and the launch floor (hide) or drops them; unchanged when
        that raises."""
        if not hide or not self._backend.is_gpu:
            # On the host clock there is no launch latency to hide: the flag is moot there.
            self._gates, self._floor_ms = None, 0.0
            self._floors.clear()
            return
        found = gates()
        if found is None:
            raise GpuError(
                "hide_launch_latency needs gpukeeper's gate kernel, and this build has none "
                "(it was built without CUDA); time without it, or rebuild with the CUDA runtime"
            )
        self._floor_ms = float(found.launch_floor_ms(self._index))
        self._floors.clear()
        self._gates = found

    @property
    def backend(self) -> str:
        """Name of the backend taking the marks (``"torch"``, ``"cupy"``, ``"cpu"``...)."""
        return self._backend.name

    @property
    def is_gpu(self) -> bool:
        """True when the time is the device's (events), False for the host clock."""
        return self._backend.is_gpu

    @property
    def hides_launch_latency(self) -> bool:
        """True when ``start()`` holds the stream with a gate (see the class docs).

        Settable between measurements: False stops gating (for code found to wait for the
        GPU inside, as ``benchmark_function`` does after a gate timed out); True starts,
        with the same ``GpuError`` as the constructor where there is no gate kernel.
        """
        return self._gates is not None

    @hides_launch_latency.setter
    def hides_launch_latency(self, hide: bool) -> None:
        if not isinstance(hide, bool):
            raise InvalidInputError(f"hides_launch_latency must be a bool, got {hide!r}")
        if self._state == "running":
            raise InvalidInputError(
                f"CUDATimer {self.name!r} is running; "
                "change hides_launch_latency between measurements"
            )
        self._set_hiding(hide)

    @property
    def gate_timeout_ms(self) -> float:
        """How long a gate holds the stream at most (ms)."""
        return self._gate_timeout_ms

    @property
    def device(self) -> DeviceSpec:
        return self._backend.device

    @property
    def stream(self) -> Any:
        """The stream of the last ``start()`` (None on the CPU)."""
        return self._stream

    @property
    def running(self) -> bool:
        return self._state == "running"

    def _open_stream(self) -> Any:
        """The measurement's stream, and its gate closed on it when hiding (else no gate):
        the first step of ``start()`` and ``time_call()``."""
        stream = (
            self._stream_arg if self._stream_arg is not None else self._backend.current_stream()
        )
        self._stream = stream
        self._elapsed = None
        self._floor_queued = False
        gates_ = self._gates
        self._gate = (
            None
            if gates_ is None
            else gates_.StreamGate(stream, self._index, self._gate_timeout_ms)
        )
        return stream

    def _queue_floor(self, stream: Any) -> None:
        """Behind the closed gate, the in-place floor bracket's first mark and its empty
        kernel; the measurement's start mark, recorded next, closes the bracket. A
        stand-in gate without the empty kernel leaves the process's floor in use."""
        gate = self._gate
        queue = getattr(gate, "queue_floor_kernel", None)
        if queue is None:
            return
        self._backend.record(self._floor_mark, stream)
        queue()
        self._floor_queued = True

    def start(self) -> "CUDATimer":
        """Records the start mark on the current stream (or the given one); with
        ``hide_launch_latency``, closes the gate on that stream first."""
        if self._state == "running":
            raise InvalidInputError(
                f"CUDATimer {self.name!r} is already running; call stop() first"
            )
        stream = self._open_stream()
        try:
            if self._gate is not None:
                self._queue_floor(stream)
            # After the gate and the floor's bracket, as time_call does: host_ms is the
            # time to issue the work between the marks.
            self._host_start = time.perf_counter_ns()
            self._backend.record(self._start, stream)
        except BaseException:
            if self._gate is not None:
                self._gate.open()  # never leave the stream held
            raise
        self._state = "running"
        return self

    def stop(self) -> "CUDATimer":
        """Records the stop mark on the start's stream (and opens the gate); does not
        wait for the device."""
        if self._state != "running":
            raise InvalidInputError(f"CUDATimer {self.name!r} was not started; call start() first")
        try:
            self._backend.record(self._end, self._stream)
        finally:
            if self._gate is not None:
                self._gate.open()
        self._host_ns = time.perf_counter_ns() - self._host_start
        self._state = "stopped"
        return self

    def time_call(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None,
        prepare: Optional[Callable[[Any], Any]] = None,
    ) -> CallTiming:
        """Times one call ``fn(*args, **kwargs)`` and waits for it.

        The same measurement as ``start()``, the call, ``stop()`` and ``elapsed_ms``, in
        one method and without a ``TimingWarning``: a gate that timed out is reported in
        the returned ``CallTiming`` (``launch_hidden`` False), for the caller to act on.
        ``prepare(stream)``, when given, runs after the gate is closed and before the
        start mark (an L2 flush queued there is ordered before the measurement, never
        inside it). Afterwards the timer reads as after ``stop()`` (``elapsed_ms``,
        ``raw_elapsed_ms``, ``launch_hidden``), except that ``host_ms`` is the call's
        launch plus wait, as in the ``CallTiming``. Exceptions from ``fn`` or ``prepare``
        propagate, with the gate opened and no measurement.
        """
        if self._state == "running":
            raise InvalidInputError(
                f"CUDATimer {self.name!r} is already running; call stop() first"
            )
        self._state = "idle"
        stream = self._open_stream()
        gate = self._gate
        # Bound before the first clock reading: nothing but the call itself between the marks.
        clock = time.perf_counter_ns
        record = self._backend.record
        start, end = self._start, self._end
        try:
            if prepare is not None:
                prepare(stream)
            if gate is not None:
                self._queue_floor(stream)
            h0 = clock()
            record(start, stream)
            result = fn(*args, **kwargs) if kwargs else fn(*args)
            record(end, stream)
        finally:
            if gate is not None:
                gate.open()
        raw = self._backend.elapsed_ms(start, end)
        h1 = clock()
        self._host_ns = h1 - h0
        self._state = "stopped"
        return CallTiming(
            self._reading(raw),
            (h1 - h0) / 1e6,
            None if gate is None else gate.outcome == "opened",
            result,
        )

    def _reading(self, raw: float) -> float:
        """Keeps the event pair's reading ``raw`` and returns the measurement: the floor
        subtracted when the gate opened in time (never below zero)."""
        self._raw = raw
        gate = self._gate
        if gate is None or gate.outcome != "opened":
            self._elapsed = raw
            return raw
        if self._floor_queued:
            floors = self._floors
            floors.append(self._backend.elapsed_ms(self._floor_mark, self._start))
            self._floor_ms = statistics.median(floors)
        self._elapsed = max(0.0, raw - self._floor_ms)
        return self._elapsed

    @property
    def elapsed_ms(self) -> float:
        """Milliseconds from the start mark to the stop mark (waits for the stop mark)."""
        if self._state != "stopped":
            raise InvalidInputError(
                f"CUDATimer {self.name!r} has no measurement yet: "
                + ("it is still running" if self._state == "running" else "it was never started")
            )
        if self._elapsed is None:
            self._reading(
                self._backend.elapsed_ms(self._start, self._end)
            )  # waits for the stop mark
            if self._gate is not None and self._gate.outcome == "timed_out":
                warnings.warn(
                    f"CUDATimer {self.name!r}: the launch latency was not hidden: the gate "
                    f"timed out after {self._gate_timeout_ms:g} ms because the work between "
                    "start() and stop() waited for the GPU (a synchronize, .item()/.cpu(), a "
                    "copy from pageable memory, or a full launch queue); the reading includes "
                    "that wait. Time such regions without hide_launch_latency.",
                    TimingWarning,
                    stacklevel=2,
                )
        assert self._elapsed is not None
        return self._elapsed

    @property
    def raw_elapsed_ms(self) -> float:
        """The event pair's reading as taken (``elapsed_ms`` before the floor is
        subtracted; the same value for timers without ``hide_launch_latency``)."""
        self.elapsed_ms  # noqa: B018 - resolves the measurement
        assert self._raw is not None
        return self._raw

    @property
    def floor_ms(self) -> float:
        """The launch floor subtracted from the last hidden-latency reading (0.0 for
        other timers): the median of the in-place floor brackets of the last
        ``FLOOR_WINDOW`` measurements; before the first, the process's floor for the
        device (``_core.launch_floor_ms``). After ``stop()`` it waits for the stop mark,
        as ``elapsed_ms`` does."""
        if self._state == "stopped" and self._gate is not None:
            self.elapsed_ms  # noqa: B018 - resolves the measurement and its floor
        return self._floor_ms

    @property
    def launch_hidden(self) -> Optional[bool]:
        """For a timer with ``hide_launch_latency``: whether the last measurement's gate
        opened in time (waits for the stop mark). None for other timers."""
        if self._gate is None:
            return None
        self.elapsed_ms  # noqa: B018 - waits for the stop mark, warns on a timeout
        return self._gate.outcome == "opened"

    @property
    def elapsed_s(self) -> float:
        """``elapsed_ms`` in seconds."""
        return self.elapsed_ms / 1e3

    @property
    def host_ms(self) -> float:
        """Host milliseconds between the ``start()`` and ``stop()`` calls (after
        ``time_call``: the call's launch plus wait)."""
        if self._state != "stopped":
            raise InvalidInputError(f"CUDATimer {self.name!r} has no measurement yet")
        return self._host_ns / 1e6

    def ready(self) -> bool:
        """True when the stop mark has been passed (reading ``elapsed_ms`` won't block)."""
        return self._state == "stopped" and self._backend.query(self._end)

    def __enter__(self) -> "CUDATimer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        # Stop also when the body raised: a timer left running would make the next
        # start() fail with a confusing message (and a gate would hold the stream).
        if self._state == "running":
            self.stop()

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        if self._state == "stopped" and (self._elapsed is not None or self.ready()):
            value = f"{self.elapsed_ms:.4f} ms"
        else:
            value = {"idle": "not started", "running": "running", "stopped": "pending"}[self._state]
        hidden = ", launch latency hidden" if self._gates is not None else ""
        return f"<CUDATimer{label} {value} ({self.backend} on {self.device}{hidden})>"
