"""The options of gpukeeper's magics: a leading run of ``-x VALUE`` / ``--long[=VALUE]``
tokens, the rest of the line kept verbatim.

IPython's own ``parse_options`` splits the whole line like a shell and joins the rest
back with single spaces, which changes a timed statement such as ``s.split("  ")``.
Here only the options are tokenised; the statement after them is left as typed. A
statement that itself starts with ``-`` follows a lone ``--``.

Every mistake is an IPython ``UsageError``: the shell prints its one-line message
without a traceback.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from IPython.core.error import UsageError

from gpukeeper.base.device_names import parse_device
from gpukeeper.base.errors import InvalidInputError

__all__ = ["OptionSpec", "device_option", "parse_line", "positive_int", "non_negative_float"]

_TOKEN = re.compile(r"\s*(\S+)")

Value = Union[str, bool]


@dataclass(frozen=True)
class OptionSpec:
    """One option: its spellings (``"-n"``, ``"--no-flush"``), the key it is stored
    under and whether it takes a value."""

    key: str
    spellings: Tuple[str, ...]
    takes_value: bool
    metavar: str = ""

    def usage(self) -> str:
        """``-n N`` or ``--no-flush``: how the option is written."""
        name = self.spellings[0]
        return f"{name} {self.metavar}" if self.takes_value else name


def _lookup(token: str, specs: Mapping[str, OptionSpec]) -> Tuple[OptionSpec, Optional[str]]:
    """The option a token names and the value written into it (``-n5``,
    ``--tolerance-mb=2``), or ``None`` when the value is the next token."""
    if token.startswith("--"):
        name, eq, inline = token.partition("=")
        spec = specs.get(name)
        if spec is not None:
            if eq and not spec.takes_value:
                raise UsageError(f"option {name} takes no value, got {token!r}")
            return spec, inline if eq else None
    else:
        spec = specs.get(token[:2])
        if spec is not None and (len(token) == 2 or spec.takes_value):
            return spec, token[2:] or None
    raise UsageError(f"unknown option {token!r}")


def parse_line(
    magic: str, line: str, options: Tuple[OptionSpec, ...]
) -> Tuple[Dict[str, Value], str]:
    """Splits ``line`` into its leading options and the verbatim rest.

    ``magic`` is the magic as written (``"%gpu_timeit"``, ``"%%gpu_memory"``), for the
    messages. Returns ``({key: value or True}, rest)``; options not given are absent. An
    unknown option, a missing value or an option given twice raises ``UsageError``
    naming the magic and its options.
    """
    specs = {s: spec for spec in options for s in spec.spellings}
    found: Dict[str, Value] = {}
    pos = 0
    try:
        while True:
            match = _TOKEN.match(line, pos)
            if match is None or not match.group(1).startswith("-"):
                break
            token = match.group(1)
            pos = match.end()
            if token == "--":
                break
            spec, value = _lookup(token, specs)
            if spec.takes_value and value is None:
                match = _TOKEN.match(line, pos)
                if match is None:
                    raise UsageError(f"option {token} needs a value ({spec.usage()})")
                value, pos = match.group(1), match.end()
            if spec.key in found:
                raise UsageError(f"option {token} given twice")
            found[spec.key] = value if spec.takes_value else True  # type: ignore[assignment]
    except UsageError as exc:
        allowed = " ".join(f"[{o.usage()}]" for o in options)
        raise UsageError(f"{magic}: {exc} (options: {allowed})") from None
    return found, line[pos:].strip()


def positive_int(magic: str, option: str, text: Value, minimum: int = 1) -> int:
    """``text`` as an int >= ``minimum`` (1 unless given), or a ``UsageError`` naming the
    option."""
    try:
        value = int(str(text))
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise UsageError(f"{magic}: {option} needs a whole number >= {minimum}, got {text!r}")
    return value


def non_negative_float(magic: str, option: str, text: Value) -> float:
    """``text`` as a finite float >= 0, or a ``UsageError`` naming the option."""
    try:
        value = float(str(text))
    except ValueError:
        value = -1.0
    if not (0 <= value < math.inf):
        raise UsageError(f"{magic}: {option} needs a number >= 0, got {text!r}")
    return value


def device_option(magic: str, text: Optional[Value]) -> Any:
    """The ``-d`` value as a device spelling gpukeeper's entry points take: an index
    (``0``), ``"cuda:N"``, ``"cuda"``, ``"cpu"`` or ``"auto"``; None when not given.

    Only the spelling is checked here; whether the device exists is for the entry point
    (the magic resolves it before running anything).
    """
    if text is None:
        return None
    spelling: Any = int(text) if isinstance(text, str) and text.isdigit() else text
    try:
        parse_device(spelling, "-d")
    except InvalidInputError as exc:
        raise UsageError(f"{magic}: {exc}") from None
    return spelling
