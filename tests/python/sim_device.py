"""Simulated GPUs for the timing tests, two kinds.

``SimDevice``: one stream on the host's clock, whose kernels take a
set device time after a set host launch cost, with gates and events that behave as CUDA's.

It makes the three regimes a loop can be in reproducible without a GPU: the device sets
the pace (long kernels), the host's launches do (many short kernels), or the call waits
for the device inside (a synchronize behind a closed gate).

``ClockSimDevice``: a device clock of its own (ns) that marks, gates and spin kernels
advance as a GPU would, with no host time spent: what ``gpukeeper check``'s timing check
reads is then known exactly (``ClockSimBackend``, ``ClockSimGates``).
"""

from __future__ import annotations

import ctypes
import time
import types
from typing import Any, List, Optional, Tuple

from gpukeeper.base.device_names import DeviceSpec
from gpukeeper.timing.timer import TimerBackend


def now_ms() -> float:
    return time.perf_counter_ns() / 1e6


def spin_until(t_ms: float) -> None:
    while now_ms() < t_ms:
        pass


class SimGate:
    """A closed gate on the simulated stream: work queued behind it waits for ``open()``."""

    def __init__(self, device: "SimDevice", timeout_ms: float) -> None:
        self.device = device
        self.timeout_ms = timeout_ms
        self.outcome = "pending"

    def open(self) -> None:
        if self.outcome == "pending":
            self.outcome = "opened"
            self.device.release(now_ms())


class SimDevice:
    """The stream: ``busy_until`` is when its queued work ends (host clock, ms)."""

    def __init__(self) -> None:
        self.busy_until = 0.0
        self.gate: Optional[SimGate] = None
        self.pending: List[Tuple[str, Any]] = []
        self.kernels = 0

    # what a user's function does
    def kernel(self, device_ms: float, launch_ms: float) -> None:
        """Launch a kernel: the host is busy ``launch_ms``, the device ``device_ms``."""
        spin_until(now_ms() + launch_ms)
        self.kernels += 1
        if self.gate is not None:
            self.pending.append(("k", device_ms))
        else:
            start = max(now_ms(), self.busy_until)
            self.busy_until = start + device_ms

    def sync(self) -> None:
        """A synchronize inside the user's function: a closed gate times out first."""
        gate = self.gate
        if gate is not None:
            spin_until(now_ms() + min(gate.timeout_ms, 1.0))
            gate.outcome = "timed_out"
            self.release(now_ms())
        spin_until(self.busy_until)

    # what the timer does
    def record(self, event: List[float]) -> None:
        if self.gate is not None:
            self.pending.append(("e", event))
        else:
            event[0] = max(now_ms(), self.busy_until)

    def close(self, timeout_ms: float) -> SimGate:
        self.gate = SimGate(self, timeout_ms)
        return self.gate

    def release(self, at_ms: float) -> None:
        self.gate = None
        t = max(at_ms, self.busy_until)
        for kind, value in self.pending:
            if kind == "k":
                t += value
            else:
                value[0] = t
        self.pending = []
        self.busy_until = t


class SimGates:
    """Stands in for ``_core``'s gate API (``timer.gates()``) on the simulated stream."""

    def __init__(self, device: SimDevice) -> None:
        self.device = device

    def launch_floor_ms(self, device: int = 0, refresh: bool = False) -> float:
        return 0.0

    def StreamGate(self, stream: Any, device: int, timeout_ms: float) -> SimGate:  # noqa: N802
        return self.device.close(timeout_ms)


class SimBackend(TimerBackend):
    """Events on the simulated stream."""

    name = "simgpu"
    is_gpu = True

    def __init__(self, spec: DeviceSpec, device: SimDevice) -> None:
        super().__init__(spec)
        self.sim = device

    def current_stream(self) -> Any:
        return "sim-stream"

    def new_event(self) -> List[float]:
        return [0.0]

    def record(self, event: List[float], stream: Any) -> None:
        self.sim.record(event)

    def elapsed_ms(self, start: List[float], end: List[float]) -> float:
        spin_until(end[0])
        return end[0] - start[0]

    def query(self, event: Any) -> bool:
        return now_ms() >= event[0]

    def synchronize(self) -> None:
        spin_until(self.sim.busy_until)


# --------------------------------------------------------------------- a clock of its own


class ClockSimDevice:
    """A device clock (ns) that marks, gates and spin kernels advance as a GPU would."""

    LAUNCH_NS = 4_000  # an ungated kernel on an idle stream starts this long after its mark

    def __init__(self, bracket_ns: int, empty_bracket_ns: Optional[int] = None) -> None:
        self.now = 1_000_000_000
        self.bracket_ns = bracket_ns  # what a gated event pair costs the device itself
        # what the pair costs around the empty kernel alone (a device whose in-place floor
        # reads other than the measured bracket's cost, when it differs)
        self.empty_bracket_ns = bracket_ns if empty_bracket_ns is None else empty_bracket_ns
        self.closed = False
        self.marks_behind_gate = 0
        self.since_mark: List[int] = []  # kernels run since the last mark behind the gate
        self.time_out = False
        self.kernels: List[int] = []

    def spin(self, duration_ns: int, stream: Any = 0, out: Any = None) -> None:
        if not self.closed:
            self.now += self.LAUNCH_NS
        first = self.now
        self.now += int(duration_ns)
        self.kernels.append(int(duration_ns))
        self.since_mark.append(int(duration_ns))
        if out is not None:
            (ctypes.c_uint64 * 2).from_address(out)[:] = [first, self.now]


class ClockSimBackend(TimerBackend):
    """Events on the clocked device: a mark reads its clock; behind a closed gate, every
    mark after the first closes a bracket, and the device's own cost of that bracket
    (around the empty kernel alone, or around work) comes before it."""

    name = "gpukeeper"
    is_gpu = True

    def __init__(self, device: Any, sim: ClockSimDevice) -> None:
        super().__init__(device)
        self.sim = sim

    def current_stream(self) -> Any:
        return 0

    def new_event(self) -> List[int]:
        return [0]

    def record(self, event: List[int], stream: Any) -> None:
        sim = self.sim
        if sim.closed:
            sim.marks_behind_gate += 1
            if sim.marks_behind_gate > 1:
                sim.now += sim.bracket_ns if any(sim.since_mark) else sim.empty_bracket_ns
        sim.since_mark = []
        event[0] = sim.now

    def elapsed_ms(self, start: List[int], end: List[int]) -> float:
        return (end[0] - start[0]) / 1e6


class ClockSimGates:
    """``_core``'s gate API on the clocked device, with a launch floor of ``floor_ns``."""

    def __init__(self, sim: ClockSimDevice, floor_ns: int) -> None:
        self.sim = sim
        self.floor_ns = floor_ns

    def launch_floor_ms(self, device: int = 0, refresh: bool = False) -> float:
        return self.floor_ns / 1e6

    def StreamGate(self, stream: Any, device: int, timeout_ms: float) -> Any:  # noqa: N802
        sim = self.sim
        sim.closed, sim.marks_behind_gate = True, 0
        gate = types.SimpleNamespace(outcome="pending")

        def open_() -> None:
            sim.closed = False
            gate.outcome = "timed_out" if sim.time_out else "opened"

        gate.open = open_
        gate.queue_floor_kernel = lambda: sim.spin(0)
        return gate
