"""Argument checks shared by the public entry points: one wording for one kind of mistake,
always as ``InvalidInputError``."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from gpukeeper.base.errors import InvalidInputError

__all__ = [
    "check_bool",
    "check_callable",
    "check_fraction",
    "check_int",
    "check_optional_int",
    "check_positive",
]


def check_int(value: Any, what: str, minimum: int) -> int:
    """``value`` when it is an int (not a bool) >= ``minimum``; ``InvalidInputError`` naming
    ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInputError(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def check_optional_int(value: Any, what: str, minimum: int) -> Optional[int]:
    """``check_int`` that also lets None through (for settings where None means "not
    given"); the message says that None is allowed."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or value < minimum
    ):
        raise InvalidInputError(f"{what} must be None or an int >= {minimum}, got {value!r}")
    return value


def check_positive(value: Any, what: str) -> Optional[float]:
    """``value`` as a float when it is a positive finite number, None for None;
    ``InvalidInputError`` naming ``what`` otherwise (NaN and infinity included)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise InvalidInputError(f"{what} must be a positive finite number or None, got {value!r}")
    return float(value)


def check_fraction(value: Any, what: str) -> float:
    """``value`` as a float when it is a number in [0, 1) (0.05: 5%); ``InvalidInputError``
    naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < 1):
        raise InvalidInputError(f"{what} must be a fraction in [0, 1) (0.05: 5%), got {value!r}")
    return float(value)


def check_choice(value: Any, what: str, choices: Sequence[str]) -> str:
    """``value`` when it is one of the strings ``choices``; ``InvalidInputError`` naming
    ``what`` and every choice otherwise."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidInputError(
            f"{what} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}"
        )
    return value


def check_bool(value: Any, what: str) -> bool:
    """``value`` when it is True or False; ``InvalidInputError`` naming ``what`` otherwise."""
    if not isinstance(value, bool):
        raise InvalidInputError(f"{what} must be True or False, got {value!r}")
    return value


def check_callable(value: Any, what: str, *, optional: bool = False) -> Any:
    """``value`` when it is callable (or None, with ``optional``); ``InvalidInputError``
    naming ``what`` and the type given otherwise."""
    if optional and value is None:
        return None
    if not callable(value):
        allowed = "callable or None" if optional else "callable"
        raise InvalidInputError(f"{what} must be {allowed}, got {type(value).__name__}")
    return value
