"""Whether the device is stuck: the exit guard's answer, for the cleanup steps below it.

A hung kernel makes every synchronising call block for good. The exit guard watches for
that (its sync worker gives up after a timeout) and registers its probe here; the
cleanup run, ``cleanup_models``, the deferred release and the IPython cleanup ask before
they synchronise. This module sits below them all, so none has to import the exit guard.
"""

from __future__ import annotations

from typing import Callable, Optional

__all__ = ["device_stuck", "set_probe"]

_probe: Optional[Callable[[], bool]] = None


def set_probe(probe: Optional[Callable[[], bool]]) -> None:
    """Registers the exit guard's probe (None: no guard, never stuck)."""
    global _probe
    _probe = probe


def device_stuck() -> bool:
    """True when the exit guard found the device stuck."""
    probe = _probe
    return bool(probe is not None and probe())
