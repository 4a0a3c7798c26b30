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
>>> bytes_text(3 << 20)
'3.00 MiB'
>>> bytes_text(None)
'unknown'
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

__all__ = ["bytes_text", "figure_table", "fmt_bytes", "sum_known"]


def sum_known(values: Iterable[Optional[int]]) -> Optional[int]:
    """The sum of ``values``; None as soon as one of them is None (unknown). An empty
    iterable sums to 0."""
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def fmt_bytes(n: Optional[int]) -> str:
    """``n`` bytes as short text with one decimal (``"1.5 GiB"``, ``"512 B"``), ``"?"``
    for None: the compact form of tables and one-line messages (cleanup reports, the
    rank table); :func:`bytes_text` is the reports' form."""
    if n is None:
        return "?"
    sign = "-" if n < 0 else ""
    size: float = abs(n)  # an int until divided: bytes print without a decimal
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{sign}{size} {unit}" if unit == "B" else f"{sign}{size:.1f} {unit}"
        size /= 1024
    return f"{sign}{size} B"  # unreachable


def bytes_text(n: Optional[int]) -> str:
    """``n`` bytes as text with two decimals in B, KiB, MiB or GiB (``"1.50 GiB"``);
    ``"unknown"`` for None. Negative figures keep their sign: a difference of two
    readings can be below zero."""
    if n is None:
        return "unknown"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{n} B"


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
