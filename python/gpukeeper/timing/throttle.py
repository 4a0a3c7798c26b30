"""Clock throttling during a benchmark: NVML clock samples, their verdict, ``ClockWatch``.

``nvml_sample`` reads the clocks and clock-event reasons, ``throttle_verdict`` compares a
sample before a run with one after it, and ``ClockWatch`` takes the two.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from gpukeeper.base import nvml as _nvml

__all__ = ["CLOCK_DROP", "THROTTLE_BITS", "ClockWatch", "nvml_sample", "throttle_verdict"]

#: NVML clock-event ("throttle") reason bits that mean the clocks were pulled down.
#: GpuIdle (0x1), ApplicationsClocksSetting (0x2) and DisplayClockSetting (0x100) are
#: not throttling.
THROTTLE_BITS = {
    0x4: "sw power cap",
    0x8: "hw slowdown",
    0x10: "sync boost",
    0x20: "sw thermal slowdown",
    0x40: "hw thermal slowdown",
    0x80: "hw power brake",
}
#: SM clock after the run below this fraction of the clock before it counts as throttled.
CLOCK_DROP = 0.90


def nvml_sample(index: int) -> Tuple[Optional[Dict[str, Any]], str]:
    """(clocks and reasons of CUDA device ``index``, "") or (None, why not)."""
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
            sample["max_sm_clock_mhz"] = int(
                nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)
            )
        except Exception:
            pass  # optional decoration
        get_reasons = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        sample["reasons"] = int(get_reasons(handle))
        try:
            sample["temperature_c"] = int(
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            )
        except Exception:
            pass
        return sample, ""
    except Exception as exc:
        return None, f"unavailable: NVML query failed: {exc}"


def throttle_verdict(before: Dict[str, Any], after: Dict[str, Any]) -> Tuple[bool, List[str]]:
    """(throttled, why) from samples taken before and after a run: a throttling reason
    bit in either, or an SM clock that fell below ``CLOCK_DROP`` of the one before."""
    why: List[str] = []
    for sample, when in ((before, "before"), (after, "after")):
        bits = [text for bit, text in THROTTLE_BITS.items() if sample.get("reasons", 0) & bit]
        if bits:
            why.append(f"{when}: " + ", ".join(bits))
    if (
        before.get("sm_clock_mhz")
        and after.get("sm_clock_mhz", 0) < CLOCK_DROP * before["sm_clock_mhz"]
    ):
        why.append(f"SM clock fell from {before['sm_clock_mhz']} to {after['sm_clock_mhz']} MHz")
    return bool(why), why


class ClockWatch:
    """Samples device ``index`` at ``start()`` and ``stop()``; ``throttled`` is the verdict
    (None when NVML could not be read), ``clocks`` the samples and NVML's status for the
    result, and what went wrong or was seen is appended to ``warnings``."""

    def __init__(self, index: int, warnings: List[str]) -> None:
        self.index = index
        self.warnings = warnings
        self.clocks: Dict[str, Any] = {}
        self.before: Optional[Dict[str, Any]] = None
        self.throttled: Optional[bool] = None

    def start(self) -> None:
        self.before, why = nvml_sample(self.index)
        self.clocks["nvml"] = why or "ok"
        if self.before is not None:
            self.clocks["before"] = self.before
        else:
            self.warnings.append(f"throttle detection {why}")

    def stop(self) -> None:
        if self.before is None:
            return
        after, why = nvml_sample(self.index)
        if after is None:
            self.warnings.append(f"throttle detection {why}")
            return
        self.clocks["after"] = after
        self.throttled, reasons = throttle_verdict(self.before, after)
        if self.throttled:
            self.warnings.append("throttled: " + "; ".join(reasons))
