"""A simulated GPU for the timing tests: one stream on the host's clock, whose kernels take a
set device time after a set host launch cost, with gates and events that behave as CUDA's.

It makes the three regimes a loop can be in reproducible without a GPU: the device sets
the pace (long kernels), the host's launches do (many short kernels), or the call waits
for the device inside (a synchronize behind a closed gate).
"""

from __future__ import annotations

import time
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
