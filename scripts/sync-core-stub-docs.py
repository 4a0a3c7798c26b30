#!/usr/bin/env python3
"""Copies the docstrings of the compiled core (csrc/bindings, the one place they are
written) into its type stub, python/gpukeeper/_core.pyi, where the docs site's API
reference reads them: griffe reads the stub statically and never imports the core.

  python3 scripts/sync-core-stub-docs.py           rewrite the stub from the installed core
  python3 scripts/sync-core-stub-docs.py --check   exit 1 (with a diff) when it is stale

Only docstrings change: a def or class whose stub body is ``...`` gets the docstring as
its body, one that has a docstring gets it replaced. pybind11's generated signature line
("name(self: ..., x: int) -> int") is dropped: the stub's own signature is the typed one.
Objects the running core lacks (a CPU-only build) keep what the stub has.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, List, Optional, Tuple

STUB = Path(__file__).resolve().parents[1] / "python" / "gpukeeper" / "_core.pyi"
WIDTH = 96
_SIGNATURE = re.compile(r"^\s*[\w.]+\(.*\)(\s*->\s*.+)?\s*$")


def runtime_doc(owner: Any, name: str) -> Optional[str]:
    """The docstring of ``owner.name`` as the stub should carry it, or None."""
    obj = inspect.getattr_static(owner, name, None) if inspect.isclass(owner) else getattr(owner, name, None)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__  # the wrapper's own __doc__ is Python's text about staticmethod
    if obj is None:
        return None
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    inherited = getattr(object, name, None) if inspect.isclass(owner) else None
    if inherited is not None and doc == getattr(inherited, "__doc__", None):
        return None  # object's own text ("Initialize self..."), not the core's
    lines = doc.strip("\n").split("\n")
    if _SIGNATURE.match(lines[0]) and (len(lines) == 1 or not lines[1].strip()):
        lines = lines[2:]
    text = inspect.cleandoc("\n".join(lines))
    # pybind11 appends an enum's "Members:" list; the stub lists the members itself.
    text = text.split("\nMembers:", 1)[0].strip()
    return text or None


def render_doc(text: str, indent: int) -> List[str]:
    """``text`` as docstring lines at ``indent``, its paragraphs wrapped to the width."""
    pad = " " * indent
    text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    one = f'{pad}"""{text}"""'
    if "\n" not in text and len(one) <= WIDTH:
        return [one]
    body: List[str] = []
    for para in text.split("\n\n"):
        if body:
            body.append("")
        if para.lstrip() != para or "\n  " in para:  # an indented block: keep its lines
            body += [pad + line if line else "" for line in para.split("\n")]
        else:
            body += textwrap.wrap(" ".join(para.split()), WIDTH - indent, initial_indent=pad,
                                  subsequent_indent=pad, break_on_hyphens=False)
    body[0] = pad + '"""' + body[0][indent:]
    return body + [pad + '"""']


def _edits(tree: ast.Module, core: Any) -> List[Tuple[int, int, List[str], int]]:
    """(first line, last line, replacement lines, column of a trailing '...') per node,
    1-based lines; column -1 when whole lines are replaced or inserted (last = first - 1)."""
    edits = []

    def visit(nodes: List[ast.stmt], owner: Any) -> None:
        for node in nodes:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            doc = runtime_doc(owner, node.name) if owner is not None else None
            if isinstance(node, ast.ClassDef):
                visit(node.body, getattr(owner, node.name, None) if owner is not None else None)
            if doc is None:
                continue
            first = node.body[0]
            indent = node.col_offset + 4
            lines = render_doc(doc, indent)
            is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str)
            is_dots = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and first.value.value is Ellipsis and len(node.body) == 1
            if is_doc:
                edits.append((first.lineno, first.end_lineno, lines, -1))
            elif is_dots:  # "def f() -> int: ..." (the docstring becomes the body)
                edits.append((first.lineno, first.lineno, lines, first.col_offset))
            else:
                edits.append((first.lineno, first.lineno - 1, lines, -1))

    visit(tree.body, core)
    return edits


def synced(source: str, core: Any) -> str:
    """``source`` (the stub's text) with the core's docstrings in place."""
    tree = ast.parse(source)
    lines = source.split("\n")
    for first, last, new, dots_col in sorted(_edits(tree, core), key=lambda e: e[0], reverse=True):
        if dots_col >= 0:
            head = lines[first - 1][:dots_col].rstrip()
            lines[first - 1:first] = ([head] if head.strip() else []) + new
        elif last < first:
            lines[first - 1:first - 1] = new
        else:
            lines[first - 1:last] = new
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the stub is stale; write nothing")
    args = ap.parse_args(argv)
    from gpukeeper import _core

    old = STUB.read_text()
    new = synced(old, _core)
    if args.check:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(True), new.splitlines(True), str(STUB), "synced"))
            print(f"\n{STUB} is stale: run python3 scripts/sync-core-stub-docs.py")
            return 1
        return 0
    if new != old:
        STUB.write_text(new)
        print(f"updated {STUB}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
