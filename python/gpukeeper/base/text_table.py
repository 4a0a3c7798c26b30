"""Plain-text tables (aligned columns, a rule under the header) for results printed to a
terminal or a log, where rich's boxes would not survive being gathered from many ranks
or pasted into an issue. HTML tables are in :mod:`gpukeeper.base.html_table`."""

from __future__ import annotations

from typing import List, Sequence

__all__ = ["text_table"]


def text_table(header: Sequence[str], body: Sequence[Sequence[str]], left: int = 1) -> str:
    """``header`` and ``body`` rows as aligned text, one line each, ending in a newline.
    The first ``left`` columns are left-aligned (labels), the others right-aligned
    (figures); trailing blanks are dropped."""
    widths: List[int] = [len(h) for h in header]
    for row in body:
        for c, cell in enumerate(row):
            widths[c] = max(widths[c], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(widths[c]) if c < left else cell.rjust(widths[c])
            for c, cell in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    lines = [line(header), "  ".join("-" * w for w in widths)]
    lines.extend(line(row) for row in body)
    return "\n".join(lines) + "\n"
