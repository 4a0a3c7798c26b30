"""Where an MD run's steps do their work and how they are timed: ``Plan`` and ``make_plan``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from gpukeeper import frameworks

__all__ = ["Plan", "make_plan", "events_how"]


@dataclass
class Plan:
    """Where the steps' work runs and how it is timed and synchronized.

    ``kind``: "cpu"; "events" (CUDA events on a framework's stream); "framework" (a
    framework's work on the host clock); "jax"; "engine" (a CUDA context no framework
    owns). ``index``: the CUDA device (None for "cpu"). ``how``: the timing method in
    words (``TrajectoryResult.timing_method``).
    """

    kind: str
    index: Optional[int]
    how: str


def events_how(event_every: int, synchronize: Optional[Callable[[], Any]] = None) -> str:
    """The timing method of steps timed by CUDA events, one mark every ``event_every`` steps."""
    marks = ("one per step" if event_every == 1 else
             f"one after every {event_every} steps (a step's GPU time is its interval's, "
             "divided over the interval's steps)")
    return (f"CUDA events on the framework's current stream, {marks}"
            + ("; the wall clock ends at the caller's synchronize()" if synchronize is not None else ""))


def make_plan(index: Optional[int], detect: bool, use_events: bool, framework: bool, last: Any,
              synchronize: Optional[Callable[[], Any]], event_every: int = 1) -> Plan:
    """Decides, after the warm-up, what the steps are (their last result is ``last``).

    ``detect``: no device was given and none was found, so a JAX result or a CUDA
    context no framework owns may still make it GPU work. ``event_every``: the steps
    per event interval, when events time the steps.
    """
    user = "the caller's synchronize()" if synchronize is not None else "no synchronization"
    if (index is not None or detect) and frameworks.holds_jax_arrays(last):
        jax_index = frameworks.jax_device_index(last)
        return Plan("jax", jax_index if jax_index is not None else (index or 0),
                    "JAX work: host clock around jax.block_until_ready on each step's result")
    if use_events:
        return Plan("events", index, events_how(event_every, synchronize))
    if index is not None and framework:
        return Plan("framework", index, "host clock (timing='host'), ended by a device synchronization"
                    + (f" and {user}" if synchronize is not None else ""))
    if index is not None and synchronize is not None:
        return Plan("engine", index, "GPU work the caller synchronizes (synchronize=): host "
                    "clock, ended by it")
    if index is not None:
        return Plan("engine", index, f"GPU work no framework owns: host clock, ended by {user}")
    if detect and not frameworks.gpu_frameworks_loaded():
        devices = frameworks.context_devices()
        if devices:
            return Plan("engine", devices[0],
                        f"a CUDA context with no framework on cuda:{devices[0]}: host clock, "
                        f"ended by {user}")
    return Plan("cpu", None, "host clock (CPU work)")
