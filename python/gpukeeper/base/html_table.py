"""The one place that writes HTML for rich display (Jupyter's ``_repr_html_``).

Every result, report and comparison that shows itself in a notebook builds plain rows of
text and hands them to :func:`html_table` (a table with a header row) or
:func:`html_fields` (label / value pairs). Each cell is escaped with ``html.escape``, so a
benchmark named ``"<b>x</b>"`` shows those characters and injects nothing. The styling is
inline and minimal (no ``<style>`` block that would leak into the notebook's page), so
the output stays compact and reads the same in Jupyter, VS Code and exported HTML.

>>> html_table("Two runs", ["name", "median ms"], [["a", "1.0"], ["b", "2.0"]],
...            warnings=["b is noisy"])  # doctest: +ELLIPSIS
'<div ...'
"""

from __future__ import annotations

import html
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from gpukeeper.base.errors import InvalidInputError

__all__ = ["html_fields", "html_table"]

# Short inline styles: a notebook's own table CSS differs between front ends, and these
# few properties are what keeps the figures aligned and the table dense everywhere.
_TABLE = "border-collapse:collapse;font-size:12px;margin:2px 0"
_LEFT = "padding:1px 6px;text-align:left"
_RIGHT = "padding:1px 6px;text-align:right"
_TITLE = "font-weight:bold;text-align:left;padding:2px 0"
_NOTE = "font-size:11px;color:#555;margin:1px 0"
_WARNING = "font-size:11px;color:#b00020;margin:1px 0"


def _text(cell: Any) -> str:
    """A cell as escaped text: None reads as empty, anything else as ``str(cell)``."""
    return "" if cell is None else html.escape(str(cell))


def _row(cells: Sequence[Any], tag: str) -> str:
    out = []
    for i, cell in enumerate(cells):
        # The first column names the row; the others hold figures, which line up only
        # when right-aligned in a fixed-width font.
        style = _LEFT if i == 0 else _RIGHT
        out.append(f'<{tag} style="{style}">{_text(cell)}</{tag}>')
    return "<tr>" + "".join(out) + "</tr>"


def _lines(lines: Iterable[Any], style: str, prefix: str) -> List[str]:
    return [f'<div style="{style}">{prefix}{_text(line)}</div>' for line in lines]


def html_table(
    title: Optional[str],
    header: Optional[Sequence[Any]],
    rows: Iterable[Sequence[Any]],
    *,
    notes: Iterable[Any] = (),
    warnings: Iterable[Any] = (),
) -> str:
    """A compact HTML table: ``title`` above it (None: no title), ``header`` as its
    first row (None: no header row), one ``<tr>`` per row of ``rows``, then one line per
    warning (in red, marked "warning:") and per note (in grey).

    Cells may be anything; each is shown as ``str(cell)`` (None as empty), escaped with
    ``html.escape``. The first column is left-aligned, the others right-aligned.

    Raises ``InvalidInputError`` when a row has a different number of cells than the
    header (or than the first row, without a header), or when ``rows`` is not iterable.
    """
    try:
        body = [list(r) for r in rows]
    except TypeError as exc:
        raise InvalidInputError(f"html_table rows must be sequences of cells: {exc}") from None
    width = len(header) if header is not None else (len(body[0]) if body else 0)
    for i, r in enumerate(body):
        if len(r) != width:
            raise InvalidInputError(f"html_table row {i} has {len(r)} cells, expected {width}")
    parts = ['<div class="gpukeeper">']
    if title is not None:
        parts.append(f'<div style="{_TITLE}">{_text(title)}</div>')
    parts.append(f'<table style="{_TABLE}">')
    if header is not None:
        parts.append("<thead>" + _row(header, "th") + "</thead>")
    parts.append("<tbody>" + "".join(_row(r, "td") for r in body) + "</tbody></table>")
    parts += _lines(warnings, _WARNING, "warning: ")
    parts += _lines(notes, _NOTE, "")
    parts.append("</div>")
    return "".join(parts)


def html_fields(
    title: Optional[str],
    fields: Iterable[Tuple[str, Any]],
    *,
    notes: Iterable[Any] = (),
    warnings: Iterable[Any] = (),
) -> str:
    """A two-column table of ``(label, value)`` pairs without a header row: the usual
    shape of one result's headline figures. Same escaping, notes and warnings as
    :func:`html_table`."""
    rows = [tuple(pair) for pair in fields]
    for pair in rows:
        if len(pair) != 2:
            raise InvalidInputError(f"html_fields takes (label, value) pairs, got {pair!r}")
    return html_table(title, None, rows, notes=notes, warnings=warnings)
