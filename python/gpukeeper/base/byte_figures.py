"""Byte figures that may be unknown: their sum, their text and the text table of them.

A report's figure is ``None`` when it could not be measured (NVML missing, a framework
without a reserved counter). A sum over such figures must stay unknown rather than turn
a gap into a smaller number, and a table must say "unknown" rather than print 0. The
single-device report (:mod:`gpukeeper.account.account_reader`) and the whole-process one
(:mod:`gpukeeper.account.process_account`) both total and print figures this way, so the rule
lives here, below both.

>>> sum_known([1, 2, 3])
6
>>> sum_known([1, None]) is None
True
>>> fmt_bytes(3 << 20)
'3.0 MiB'
>>> fmt_bytes(None), fmt_bytes(None, unknown="unknown")
('?', 'unknown')

:func:`fmt_bytes` is the one place Python turns a byte count into text (the compiled
core's messages have their own, in C++).
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

__all__ = ["figure_table", "fmt_bytes", "sum_known"]


def sum_known(values: Iterable[Optional[int]]) -> Optional[int]:
    """The sum of ``values``; None as soon as one of them is None (unknown). An empty
    iterable sums to 0."""
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def fmt_bytes(n: Optional[int], *, unknown: str = "?") -> str:
    """``n`` bytes as short text in B, KiB, MiB or GiB with one decimal (``"1.5 GiB"``;
    bytes below 1 KiB as a whole number, ``"512 B"``), and ``unknown`` for None (``"?"``
    in one-line messages and compact tables; the memory reports pass ``"unknown"``).
    Negative figures keep their sign: a difference of two readings can be below zero."""
    if n is None:
        return unknown
    sign = "-" if n < 0 else ""
    size = abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{sign}{size / scale:.1f} {unit}"
    return f"{sign}{size} B"


def figure_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    lines: Iterable[str] = (),
) -> str:
    """A plain-text table: ``title``, a header of ``columns`` over the figure columns,
    one line per row (its label left-aligned, its figures right-aligned 12 wide), then
    ``lines`` as they are (notes under the table)."""
    width = max((len(r[0]) for r in rows), default=0) + 2
    out: List[str] = [title, f"{'':<{width}}" + "".join(f"{c:>12}" for c in columns)]
    out += [f"{r[0]:<{width}}" + "".join(f"{c:>12}" for c in r[1:]) for r in rows]
    return "\n".join(out + list(lines))
