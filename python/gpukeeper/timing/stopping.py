"""When a benchmark's measured loop stops: ``StopRule`` (n_calls, min_time_s, max_noise).

``n_calls`` calls are measured; ``min_time_s`` keeps measuring past them until the
measured time adds up to it (with a safety stop on the wall time); ``max_noise`` may stop
earlier, by nvbench's criterion (``stats.NoiseCriterion``).
"""

from __future__ import annotations

import math
import time
from typing import List, Optional

from gpukeeper.timing.stats import NoiseCriterion

__all__ = ["MIN_TIME_WALL_FACTOR", "StopRule"]

#: Safety stop for min_time_s: the loop never runs longer than this many times
#: min_time_s of wall time (plus one second), even if the measured time adds up slowly
#: (e.g. GPU time of tiny kernels between long host gaps).
MIN_TIME_WALL_FACTOR = 10.0


class StopRule:
    """The stopping rule of one loop, whose wall clock starts when the rule is made.

    ``add(t)`` counts a call of ``t`` ms and returns why to stop now, or None:
    ``"n_calls"``, ``"min_time_s"``, ``"noise_converged"`` / ``"max_noise"`` (noise met
    before ``n_calls``, never before ``min_time_s`` and 10 calls) or ``"timeout"`` (the
    safety stop, with a line in ``warnings``).
    """

    def __init__(
        self,
        n_calls: int,
        min_time_s: Optional[float],
        max_noise: Optional[float],
        warnings: List[str],
    ) -> None:
        self.n_calls = n_calls
        self.min_time_s = min_time_s
        self.warnings = warnings
        self.criterion: Optional[NoiseCriterion] = None
        if max_noise is not None:
            self.criterion = NoiseCriterion(
                max_noise, min_samples=max(2, min(10, n_calls)), min_time=(min_time_s or 0.0) * 1e3
            )
        self.count = 0
        self.measured_ms = 0.0
        self.wall_start = time.perf_counter_ns()
        self.wall_limit_ns = (
            (min_time_s * MIN_TIME_WALL_FACTOR + 1.0) * 1e9 if min_time_s else math.inf
        )

    def add(self, t: float) -> Optional[str]:
        """Counts a call of ``t`` ms; the stop reason when the loop should stop now."""
        self.measured_ms += t
        self.count += 1
        if self.criterion is not None:
            self.criterion.add(t)
            if self.count < self.n_calls and self.criterion.is_finished():
                return "noise_converged" if self.criterion.converged else "max_noise"
        if self.count < self.n_calls:
            return None
        if self.min_time_s is None:
            return "n_calls"
        if self.measured_ms >= self.min_time_s * 1e3:
            return "min_time_s" if self.count > self.n_calls else "n_calls"
        wall_ns = time.perf_counter_ns() - self.wall_start
        if wall_ns > self.wall_limit_ns:
            self.warnings.append(
                f"min_time_s={self.min_time_s} not reached: measured "
                f"{self.measured_ms / 1e3:.3f} s in {wall_ns / 1e9:.1f} s of wall time "
                "(safety stop)"
            )
            return "timeout"
        return None

    def wall_s(self) -> float:
        """Seconds of wall time since the rule was made."""
        return (time.perf_counter_ns() - self.wall_start) / 1e9
