"""The cause a leak verdict names: what Python can see holding the memory that grew.

Before the run the live tensors and arrays of the run's device are noted (their
allocations); after a run whose memory grew, those made during the run and still alive
are grouped. Two causes are named, each only when it accounts for about a step's worth or
more of survivors (so a clean loop, whose results die each step, never gets one):

- an autograd graph kept across steps: results that still carry a ``grad_fn`` (an energy
  appended to a list without ``.detach()``). Their graphs hold the tensors saved for
  backward, which Python cannot see: the leak's slope is what they cost a step.
- arrays kept alive: many tensors of one shape made during the run (a cache).

The walk is :func:`gpukeeper.frameworks.live_arrays.live_arrays`: tens of milliseconds,
twice a run, outside the measured loop.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, FrozenSet, Optional, Tuple

from gpukeeper.frameworks.live_arrays import LiveArray, live_arrays

__all__ = ["ArraysBefore", "arrays_before", "leak_cause", "SURVIVOR_SHARE"]

MiB = float(1 << 20)

#: Survivors of the run are a cause when there are at least this many per step.
SURVIVOR_SHARE = 0.5

ArraysBefore = FrozenSet[Tuple[str, str, int]]
#: Where each allocation was made: (framework, address) -> its Python lines, innermost first.
Sites = Dict[Tuple[str, int], Tuple[str, ...]]


def _key(a: LiveArray) -> Tuple[str, str, int]:
    return (a.framework, a.device, a.data_ptr)


def arrays_before(device: Any) -> Optional[ArraysBefore]:
    """The allocations of the live tensors and arrays on ``device`` (a CUDA ordinal or
    "cpu") before a run; None when no framework with arrays is loaded."""
    try:
        return frozenset(_key(a) for a in live_arrays(device))
    except Exception:  # a framework in a state its tensors cannot be asked about
        return None


def leak_cause(
    before: Optional[ArraysBefore],
    device: Any,
    n_steps: int,
    slope_bytes: float,
    sites: Optional[Sites] = None,
) -> str:
    """The cause of a leak that grew ``slope_bytes`` a step over an ``n_steps`` run, from
    what is alive now that was not before the run; "" when none accounts for it.
    ``sites``: where each allocation was made (an allocation tracker's, keyed by
    (framework, address)): the cause then names the line that made most of the group."""
    if before is None or n_steps <= 0:
        return ""
    try:
        survivors = [a for a in live_arrays(device) if _key(a) not in before]
    except Exception:
        return ""
    need = max(2, int(SURVIVOR_SHARE * n_steps))
    graphs = [a for a in survivors if a.grad_fn]
    if len(graphs) >= need:
        shape, count = _commonest(graphs)
        return (
            f"an autograd graph survives each step: about {slope_bytes / MiB:.3g} MiB/step in "
            f"tensors saved for backward; {len(graphs)} results made during the run still carry "
            f"a grad_fn ({count} of shape {shape[0]}){_made_at(graphs, sites)}; a result kept "
            "without .detach() is the usual cause"
        )
    if len(survivors) < need:
        return ""
    shape, count = _commonest(survivors)
    if count < need:
        return ""
    group = [a for a in survivors if (a.shape, a.dtype) == shape]
    held = sum(a.nbytes for a in group)
    return (
        f"{count} tensors of shape {shape[0]} ({shape[1]}) made during the run are still "
        f"alive, about {count / n_steps:.2g} per step and {held / MiB:.3g} MiB in all"
        f"{_made_at(group, sites)}"
    )


def _made_at(arrays: Any, sites: Optional[Sites]) -> str:
    """The words naming the line that made most of ``arrays`` (", N of them made at
    FILE:LINE in FUNC"), or "" when no site is known."""
    if not sites:
        return ""
    lines = Counter(
        site[0] for a in arrays for site in (sites.get((a.framework, a.data_ptr)),) if site
    )
    if not lines:
        return ""
    line, count = lines.most_common(1)[0]
    return f", {count} of them made at {line}"


def _commonest(arrays: Any) -> Tuple[Any, int]:
    shape, count = Counter((a.shape, a.dtype) for a in arrays).most_common(1)[0]
    return shape, count
