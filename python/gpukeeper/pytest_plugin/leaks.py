"""The leak check of the pytest plugin: which tests are checked, with what tolerance,
and the failure text when one leaks."""

from __future__ import annotations

import math
import os
from typing import Any, Optional, Tuple

import pytest

from gpukeeper.base.arg_checks import check_bool
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.cleanup.cleanup_report import CleanupReport, leak_message
from gpukeeper.cleanup.leak_check import LeakCheck

__all__ = ["check_leaks_option", "leak_check_for", "leak_failure", "parse_tolerance_mb"]

_MiB = 1 << 20


def parse_tolerance_mb(value: Any, what: str) -> float:
    """``value`` as a tolerance in MiB (a finite number >= 0); ``InvalidInputError``
    naming ``what`` otherwise. Strings are read as numbers (the command-line form)."""
    if isinstance(value, bool):
        raise InvalidInputError(f"{what} must be a number of MiB >= 0, got {value!r}")
    try:
        mb = float(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{what} must be a number of MiB >= 0, got {value!r}") from None
    if not math.isfinite(mb) or mb < 0:
        raise InvalidInputError(f"{what} must be a number of MiB >= 0, got {value!r}")
    return mb


def check_leaks_option(option: Optional[str]) -> None:
    """Validates ``--gpu-leaks`` once, at configure time."""
    if option is None:
        return
    try:
        parse_tolerance_mb(option, "--gpu-leaks")
    except InvalidInputError as e:
        if os.path.exists(str(option)):  # argparse took the path for the optional value
            raise InvalidInputError(
                f"{e} (a path: write --gpu-leaks=0, or put --gpu-leaks after the paths)"
            ) from None
        raise


def leak_policy(
    item: pytest.Item, option: Optional[str], track_option: bool
) -> Optional[Tuple[float, bool]]:
    """(tolerance in MiB, track allocations) for ``item``, or None when it is not checked.
    A marker's own arguments win over the command line's."""
    if item.get_closest_marker("allow_gpu_leak") is not None:
        return None
    marker = item.get_closest_marker("no_gpu_leak")
    if marker is not None:
        if marker.args:
            raise InvalidInputError(
                "no_gpu_leak takes keyword arguments only: no_gpu_leak(tolerance_mb=..., "
                f"track_allocations=...), got {marker.args!r}"
            )
        unknown = set(marker.kwargs) - {"tolerance_mb", "track_allocations"}
        if unknown:
            raise InvalidInputError(f"no_gpu_leak: unknown argument(s) {sorted(unknown)}")
        tolerance = parse_tolerance_mb(
            marker.kwargs.get("tolerance_mb", 0.0), "no_gpu_leak tolerance_mb"
        )
        track = check_bool(
            marker.kwargs.get("track_allocations", False), "no_gpu_leak: track_allocations"
        )
        return tolerance, track
    if option is None:
        return None
    return parse_tolerance_mb(option, "--gpu-leaks"), track_option


def leak_check_for(
    item: pytest.Item, option: Optional[str], track_option: bool
) -> Optional[LeakCheck]:
    """The started check for ``item``, or None when it is not checked."""
    policy = leak_policy(item, option, track_option)
    if policy is None:
        return None
    tolerance_mb, track = policy
    check = LeakCheck(int(tolerance_mb * _MiB), track_allocations=track)
    check.start()
    return check


def leak_failure(item: pytest.Item, check: LeakCheck, report: CleanupReport) -> Optional[str]:
    """The failure text when ``report`` (of ``check`` around ``item``) holds more than the
    tolerance, else None."""
    if report.held_bytes <= check.tolerance_bytes:
        return None
    tolerance_mb = check.tolerance_bytes / _MiB
    limit = f"{tolerance_mb:g} MiB tolerated" if check.tolerance_bytes else "none tolerated"
    hint = (
        None
        if check.track_allocations
        else (
            "del what the test keeps, or mark it @pytest.mark.allow_gpu_leak; "
            "no_gpu_leak(track_allocations=True) or --gpu-leaks-track names the creating lines"
        )
    )
    return f"GPU memory leak in {item.nodeid} ({limit}):\n" + leak_message(
        report, check.track_allocations, hint
    )
