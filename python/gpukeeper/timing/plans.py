"""Where measured work runs and how it is waited for: ``Plan``, and the one rule that decides it.

Both ``benchmark_function`` and ``benchmark_md_trajectory`` decide with
:func:`choose_plan` before their warm-up (and ``benchmark_md_trajectory`` confirms with
:func:`confirm_plan` from the warm-up's result):

- ``device`` None means CUDA only when a loaded framework can use it (PyTorch or CuPy
  with usable CUDA: :func:`gpukeeper.timing.timer.timing_device`); GPU events around
  host-only work would read zero.
- On CUDA: work the caller waits for with ``synchronize=`` is an engine's ("engine":
  host clock, ended by that wait); otherwise a loaded GPU framework's work is timed by
  CUDA events on its stream ("events"; "framework" under ``timing="host"``); GPU work
  with no such framework loaded is an engine's.
- Without CUDA picked: the work of a framework that waits on its results when it has a
  GPU (JAX's; the plan's kind is the framework's name, "jax": host clock around
  ``jax.block_until_ready``), else an engine's when the process holds a CUDA context
  that no framework made (OpenMM's), else CPU work ("cpu").

What is particular to a framework (whether it waits on results, how, its GPU devices,
whether a result holds its arrays) is its adapter's: this module asks
``gpukeeper.frameworks``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from gpukeeper import frameworks
from gpukeeper.base.device_names import DeviceSpec
from gpukeeper.frameworks import FrameworkAdapter
from gpukeeper.timing.timer import TimerBackend

__all__ = [
    "Plan",
    "HostSync",
    "PLAN_KINDS",
    "choose_plan",
    "confirm_plan",
    "cpu_plan",
    "engine_plan",
    "events_framework_loaded",
    "host_sync_plan",
    "result_plan",
    "timer_plan",
    "unsynchronized_warning",
]

#: Where a plan's work runs: the host; a framework's stream, timed by CUDA events; a
#: framework's work on the host clock; the streams of a framework that waits on its
#: results (under its name: JAX's); an engine's own CUDA context.
PLAN_KINDS = (
    ("cpu", "events", "framework")
    + tuple(name for name, fw in frameworks.ADAPTERS.items() if fw.waits_on_result)
    + ("engine",)
)


def unsynchronized_warning(per_call: bool) -> str:
    """The warning for an engine's work timed without the caller's ``synchronize``:
    what may be missing from a call's time (``per_call``) or from a loop's wall clock."""
    missing = (
        "each call's time may end before its work does"
        if per_call
        else "the work it still had queued after the last step may be missing from the wall clock"
    )
    return (
        "no synchronize callable: gpukeeper cannot wait for an engine's own CUDA context, "
        f"so {missing} (pass synchronize=, e.g. lambda: simulation.context.getState())"
    )


@dataclass
class Plan:
    """Where the work runs and how it is waited for.

    ``kind``: one of :data:`PLAN_KINDS`. ``index``: the CUDA device (None for "cpu").
    ``how``: the timing method in words (a result's ``timing_method``). ``synchronize``:
    the caller's wait for work gpukeeper cannot see. ``per_call``: each call is waited
    for (``benchmark_function``), rather than a loop of them at its end.
    """

    kind: str
    index: Optional[int]
    how: str
    synchronize: Optional[Callable[[], Any]] = None
    per_call: bool = True

    @property
    def name(self) -> str:
        """The backend a benchmark result names for work on the host clock: the kind."""
        return self.kind

    @property
    def waits_on(self) -> Optional[FrameworkAdapter]:
        """The framework whose results this plan's work is waited on (its kind is the
        framework's name), or None."""
        return frameworks.waiting_on_result(self.kind)

    @property
    def synchronized(self) -> bool:
        """False for an engine's work without the caller's wait: gpukeeper cannot wait for it."""
        return not (self.kind == "engine" and self.synchronize is None)

    def sync(self) -> None:
        """Waits for the work: the frameworks' on the device, then the caller's."""
        if self.index is not None:
            frameworks.synchronize_all(self.index)
        if self.synchronize is not None:
            self.synchronize()

    def wait(self, result: Any) -> None:
        """Waits for the work behind ``result``: blocking on it for a framework that waits
        on results (JAX's arrays), else as :meth:`sync`."""
        fw = self.waits_on
        if fw is not None:
            fw.block_until_ready(result)
        else:
            self.sync()

    def warning(self) -> Optional[str]:
        """The warning this plan's results carry (:func:`unsynchronized_warning`), or None."""
        return None if self.synchronized else unsynchronized_warning(self.per_call)


#: The plans of GPU work timed on the host clock (JAX's, an engine's): the name
#: ``benchmark_function`` has always given them.
HostSync = Plan


def cpu_plan(synchronize: Optional[Callable[[], Any]] = None, per_call: bool = True) -> Plan:
    """CPU work, on the host clock."""
    return Plan("cpu", None, "host clock (CPU work)", synchronize, per_call)


def result_plan(
    fw: FrameworkAdapter,
    index: int,
    per_call: bool = True,
    synchronize: Optional[Callable[[], Any]] = None,
) -> Plan:
    """The work of ``fw``, a framework that waits on its results (JAX), on CUDA device
    ``index``: waited for by its ``block_until_ready`` (and a loop's end by the caller's
    ``synchronize`` too). The plan's kind is the framework's name."""
    on = "the result" if per_call else "each step's result"
    return Plan(
        fw.name,
        index,
        f"{fw.display_name} work: host clock around {fw.result_wait} on {on}",
        synchronize,
        per_call,
    )


def engine_plan(
    index: int, synchronize: Optional[Callable[[], Any]], where: str, per_call: bool = True
) -> Plan:
    """An engine's work on CUDA device ``index`` (``where``: it in words): waited for by
    the frameworks' synchronize and the caller's ``synchronize`` (without one, queued
    work is missed)."""
    if per_call and synchronize is not None:
        how = f"{where}: host clock around each call and the caller's synchronize()"
    elif per_call:
        how = (
            f"{where}: host clock around each call, without a synchronization (none given): "
            "work still queued when a call returns is not in its time"
        )
    else:
        how = f"{where}: host clock, ended by " + (
            "the caller's synchronize()" if synchronize is not None else "no synchronization"
        )
    return Plan("engine", index, how, synchronize, per_call)


def timer_plan(backend: TimerBackend) -> Plan:
    """The plan of work a timer backend times: events on its device, or the CPU."""
    if backend.is_gpu:
        return Plan("events", backend.device.index or 0, "CUDA events on the current stream")
    return cpu_plan()


def events_framework_loaded() -> bool:
    """Whether a loaded framework runs GPU work that gpukeeper can put events beside
    (PyTorch or CuPy with usable CUDA, gpukeeper's device pools). A framework that waits
    on its results (JAX) runs on streams of its own; an engine in its own context is no
    framework."""
    return any(
        frameworks.waiting_on_result(name) is None for name in frameworks.gpu_frameworks_loaded()
    )


def choose_plan(
    device: Any,
    spec: DeviceSpec,
    synchronize: Optional[Callable[[], Any]] = None,
    timing: str = "auto",
    per_call: bool = True,
) -> Plan:
    """The plan for work asked to run on ``device`` (``spec``: it resolved by
    :func:`~gpukeeper.timing.timer.timing_device`), decided before the warm-up (the
    module doc gives the rule). ``timing``: "auto", "gpu" (events even with
    ``synchronize``) or "host" (no events)."""
    if spec.is_cuda:
        index = spec.index or 0
        if synchronize is not None and timing != "gpu":
            return engine_plan(
                index,
                synchronize,
                f"GPU work the caller synchronizes (synchronize=) on cuda:{index}",
                per_call,
            )
        if events_framework_loaded():
            if timing == "host":
                return Plan(
                    "framework",
                    index,
                    "host clock (timing='host'), ended by a device synchronization",
                    synchronize,
                    per_call,
                )
            return Plan(
                "events",
                index,
                "CUDA events on the framework's current stream",
                synchronize,
                per_call,
            )
        return engine_plan(
            index, synchronize, f"GPU work no framework owns on cuda:{index}", per_call
        )
    if device is not None:
        return cpu_plan(synchronize, per_call)
    waiting = frameworks.result_gpu_device()
    if waiting is not None and synchronize is None:
        return result_plan(waiting[0], waiting[1], per_call)
    if not frameworks.gpu_frameworks_loaded():
        contexts = frameworks.context_devices()
        if contexts:
            return engine_plan(
                contexts[0],
                synchronize,
                f"a CUDA context with no framework on cuda:{contexts[0]}",
                per_call,
            )
    return cpu_plan(synchronize, per_call)


def confirm_plan(plan: Plan, device: Any, last: Any) -> Plan:
    """The plan once the warm-up returned ``last``: the arrays of a framework that waits
    on its results (JAX's) make it that framework's work (on their device) wherever GPU
    work was possible; such a guess whose result holds none of its arrays was CPU work."""
    fw = frameworks.result_framework(last)
    if fw is not None and plan.kind != fw.name and (plan.index is not None or device is None):
        index = fw.result_device(last)
        return result_plan(
            fw, index if index is not None else (plan.index or 0), plan.per_call, plan.synchronize
        )
    if fw is None and plan.waits_on is not None:
        return cpu_plan(plan.synchronize, plan.per_call)
    return plan


def host_sync_plan(
    device: Any, spec: DeviceSpec, synchronize: Optional[Callable[[], Any]]
) -> Optional[Plan]:
    """``benchmark_function``'s plan when its GPU work is timed on the host clock (JAX,
    an engine), decided before the warm-up by :func:`choose_plan`; None when events (or
    the CPU clock) time the work."""
    plan = choose_plan(device, spec, synchronize, per_call=True)
    return plan if plan.kind == "engine" or plan.waits_on is not None else None
