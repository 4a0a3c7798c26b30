"""The one rule that names the rank standing out in a column of per-rank figures.

>>> pick_outlier({0: 0.3, 1: 2.3, 2: 4.3, 3: 6.3}).rank     # memory: the high one
3
>>> pick_outlier({0: 304.0, 1: 2355.0}).how                  # two ranks: the maximum
'max of 2 ranks'

Memory and time are both bad when high (more bytes held, a slower rank that every
collective waits for), so the rule looks in one direction only: a rank far *below* the
others is not what a reader hunts for, and naming it (the old rule took whichever rank
was furthest from the median either way) sent readers to the wrong rank. ``"low"`` is
there for figures where low is bad (throughput).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from gpukeeper.base.arg_checks import check_choice, check_int
from gpukeeper.base.errors import InvalidInputError

__all__ = [
    "ABOVE_MEDIAN",
    "BELOW_MEDIAN",
    "MAX_OF_TWO",
    "MIN_OF_TWO",
    "TWO_RANKS_NOTE",
    "OutlierPick",
    "pick_outlier",
    "pick_to_dict",
]

#: ``OutlierPick.how`` when a median was compared against.
ABOVE_MEDIAN = "above the median"
BELOW_MEDIAN = "below the median"
#: ``OutlierPick.how`` with two ranks: their median lies halfway, so both are equally far
#: from it and it cannot tell which one stands out; the worse one is named instead.
MAX_OF_TWO = "max of 2 ranks"
MIN_OF_TWO = "min of 2 ranks"

#: The words under a table whose outlier is the worse of two ranks.
TWO_RANKS_NOTE = "max of 2 ranks: a median cannot tell which one stands out"


@dataclass(frozen=True)
class OutlierPick:
    """The rank that stands out of a column, and how it was found.

    ``rank``: its key in the values given; ``value``: its figure; ``median``: the median of
    the known figures (of both, with two ranks); ``how``: :data:`ABOVE_MEDIAN` (or
    :data:`BELOW_MEDIAN` for ``direction="low"``) with three ranks or more,
    :data:`MAX_OF_TWO` (:data:`MIN_OF_TWO`) with two.
    """

    rank: int
    value: float
    median: float
    how: str

    @property
    def of_two(self) -> bool:
        """Whether the pick is the worse of two ranks rather than a comparison with a median."""
        return self.how in (MAX_OF_TWO, MIN_OF_TWO)


def _known(values: Mapping[int, Optional[float]]) -> List[Tuple[int, float]]:
    if not isinstance(values, Mapping):
        raise InvalidInputError(
            f"pick_outlier: values must be a mapping of rank to figure, got {type(values).__name__}"
        )
    known = []
    for rank, value in values.items():
        check_int(rank, "pick_outlier: a rank", 0)
        if value is None:
            continue  # unknown on that rank: it can neither stand out nor move the median
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise InvalidInputError(
                f"pick_outlier: rank {rank}'s figure must be a number or None, got {value!r}"
            )
        known.append((rank, float(value)))
    return known


def pick_outlier(
    values: Mapping[int, Optional[float]],
    *,
    direction: str = "high",
    min_gap: float = 0.0,
    min_fraction: float = 0.0,
) -> Optional[OutlierPick]:
    """The rank that stands out of ``values`` (rank -> figure; None: unknown, left out) in
    the bad ``direction`` (``"high"``: memory, time; ``"low"``: throughput), or None.

    With three known figures or more: among the ranks beyond the median in that direction,
    the furthest from it; of equal figures the lowest rank. None when no rank is beyond
    the median: all figures equal, or more than half the ranks share the worst one.

    With two: their median lies halfway and cannot tell, so the worse one is named
    (``how`` is :data:`MAX_OF_TWO`, which a table should say); None when they are equal.

    Either way the pick must also be ``min_gap`` and ``min_fraction`` of the median away
    from the median (with two ranks: from the other rank), else None: a column's noise is
    not an outlier. Fewer than two known figures: None.

    Raises ``InvalidInputError`` for a values argument that is not a mapping of int ranks
    to numbers or None, an unknown direction, or a negative threshold.
    """
    check_choice(direction, "pick_outlier: direction", ("high", "low"))
    for name, threshold in (("min_gap", min_gap), ("min_fraction", min_fraction)):
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, (int, float))
            or not 0 <= threshold < math.inf
        ):
            raise InvalidInputError(
                f"pick_outlier: {name} must be a finite number >= 0, got {threshold!r}"
            )
    known = _known(values)
    if len(known) < 2:
        return None
    sign = 1.0 if direction == "high" else -1.0
    # Worst first; of equal figures the lowest rank, so the answer never depends on order.
    worst_rank, worst = min(known, key=lambda kv: (-sign * kv[1], kv[0]))
    if len(known) == 2:
        (_, a), (_, b) = known
        other = b if worst == a else a
        if worst == other:
            return None
        gap, base = abs(worst - other), abs(other)
        how = MAX_OF_TWO if direction == "high" else MIN_OF_TWO
        mid = (a + b) / 2
    else:
        mid = statistics.median(v for _, v in known)
        gap, base = sign * (worst - mid), abs(mid)
        if gap <= 0:
            return None
        how = ABOVE_MEDIAN if direction == "high" else BELOW_MEDIAN
    if gap < min_gap or gap < min_fraction * base:
        return None
    return OutlierPick(worst_rank, worst, mid, how)


def pick_to_dict(pick: Optional[OutlierPick]) -> Optional[Dict[str, Any]]:
    """``pick`` as JSON-ready builtins (None stays None)."""
    if pick is None:
        return None
    return {"rank": pick.rank, "value": pick.value, "median": pick.median, "how": pick.how}
