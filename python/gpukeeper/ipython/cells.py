"""Turning the text of a magic's line or cell into code that runs in the user's namespace.

The text goes through IPython's own steps first (``transform_cell`` for ``%magics`` and
``!commands`` inside it, the shell's AST transformers), and is compiled under a name
IPython's compiler has cached, so that a traceback shows the user's lines with the cell's
line numbers.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from types import CodeType
from typing import Any, Optional

__all__ = ["CellCode", "compile_cell"]


def _source(shell: Any, text: str) -> str:
    """``text`` as Python: IPython's syntax (``%magic``, ``!cmd``) rewritten."""
    out = shell.transform_cell(text)
    return out if out.endswith("\n") else out + "\n"


def _parse(shell: Any, source: str, raw: str) -> "tuple[ast.Module, str]":
    """(the module, the file name it is cached under for tracebacks)."""
    filename = shell.compile.cache(source, shell.execution_count, raw_code=raw)
    tree = shell.compile.ast_parse(source, filename=filename)
    tree = shell.transform_ast(tree)
    return tree, filename


@dataclass
class CellCode:
    """A cell compiled for ``exec``, with its last expression (if any) apart, whose value
    is the cell's value as IPython would display it."""

    body: CodeType
    last: Optional[CodeType]

    def run(self, namespace: dict) -> Any:
        """Runs the cell in ``namespace``; the value of its last expression, else None."""
        __tracebackhide__ = True  # a traceback starts at the user's lines
        exec(self.body, namespace)
        return eval(self.last, namespace) if self.last is not None else None


def compile_cell(shell: Any, cell: str, first_line: int = 2) -> CellCode:
    """Compiles a cell magic's body; ``first_line`` is the number of its first line in
    the notebook cell (2: below the ``%%magic`` line), so that tracebacks match.
    ``SyntaxError`` for a body that is not Python."""
    source = "\n" * (first_line - 1) + _source(shell, cell)
    tree, filename = _parse(shell, source, raw=source)
    last: Optional[CodeType] = None
    final = tree.body[-1] if tree.body else None
    if isinstance(final, ast.Expr):
        tree.body.pop()
        last = shell.compile(ast.Expression(final.value), filename, "eval")
    body = shell.compile(ast.Module(tree.body, []), filename, "exec")
    return CellCode(body, last)
