"""Durations as text, each figure in the unit that suits it (ns, µs, ms or s).

>>> duration_text(0.00021)
'210 ns'
>>> duration_text(0.0123)
'12.3 µs'
>>> duration_text(4.5)
'4.50 ms'
>>> duration_text(2500.0)
'2.50 s'
"""

from __future__ import annotations

import math

__all__ = ["duration_text"]


def duration_text(ms: float) -> str:
    """``ms`` milliseconds with three significant figures in ns, µs, ms or s."""
    if ms is None or not math.isfinite(ms):
        return "n/a"
    magnitude = abs(ms)
    for limit, scale, unit in ((1e-3, 1e6, "ns"), (1.0, 1e3, "µs"), (1e3, 1.0, "ms")):
        if magnitude < limit:
            return _three(ms * scale, unit)
    return _three(ms / 1e3, "s")


def _three(value: float, unit: str) -> str:
    magnitude = abs(value)
    if magnitude >= 100 or magnitude == 0:
        return f"{value:.0f} {unit}"
    if magnitude >= 10:
        return f"{value:.1f} {unit}"
    return f"{value:.2f} {unit}"
