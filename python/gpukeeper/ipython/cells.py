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
from typing import Any, Callable, List, Optional

__all__ = ["CellCode", "NothingToTime", "compile_cell", "compile_timed"]

_SETUP = "__gpukeeper_setup"
_TIMED = "__gpukeeper_timed"

# setup's statements replace the first ``pass``, the timed statement the second one.
_TEMPLATE = f"def {_SETUP}():\n    pass\n    def {_TIMED}():\n        pass\n    return {_TIMED}\n"


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
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        expr = ast.Expression(tree.body.pop().value)
        last = shell.compile(expr, filename, "eval")
    body = shell.compile(ast.Module(tree.body, []), filename, "exec")
    return CellCode(body, last)


def _returning_last(nodes: List[ast.stmt]) -> List[ast.stmt]:
    """``nodes`` with a last expression turned into ``return`` it: the timed function
    returns what the statement computes (a JAX array tells the benchmark it is JAX work,
    and a tensor is freed by the next call rather than at once)."""
    if nodes and isinstance(nodes[-1], ast.Expr):
        ret = ast.Return(value=nodes[-1].value)
        nodes = nodes[:-1] + [ast.copy_location(ret, nodes[-1])]
    return nodes


class NothingToTime(ValueError):
    """The text to time holds no statement (empty, or comments only)."""


def compile_timed(shell: Any, statement: str, setup: str = "") -> Callable[[], Callable[[], Any]]:
    """Compiles ``statement`` into a function of no arguments that runs it in the user's
    namespace, and returns the maker of that function: calling the maker runs ``setup``
    (one line: the rest of a ``%%gpu_timeit`` line) once and returns the timed function.

    The names ``setup`` binds are visible to the statement (as a closure's: a statement
    that assigns to one makes its own local instead). Names the statement binds stay
    local to each call, as with ``%timeit``. ``SyntaxError`` for text that is not Python,
    ``NothingToTime`` for a statement with nothing to run; an exception of ``setup``
    propagates from the maker.
    """
    setup_src = _source(shell, setup) if setup.strip() else ""
    raw = setup_src + _source(shell, statement)
    tree, filename = _parse(shell, raw, raw)
    setup_lines = setup_src.count("\n")
    setup_nodes = [n for n in tree.body if n.lineno <= setup_lines]
    timed_nodes = [n for n in tree.body if n.lineno > setup_lines]
    if not timed_nodes:
        raise NothingToTime("no statement to time (only comments or blank lines)")
    wrapper = ast.parse(_TEMPLATE)
    outer = wrapper.body[0]
    inner = outer.body[1]  # type: ignore[attr-defined]
    first = timed_nodes[0]
    # The wrapper's own lines take the statement's line number: no traceback line of the
    # cell points at a line that is not the user's.
    for node in ast.walk(wrapper):
        if hasattr(node, "lineno"):
            ast.copy_location(node, first)
    outer.body[0:1] = setup_nodes or [ast.copy_location(ast.Pass(), first)]  # type: ignore[attr-defined]
    inner.body = _returning_last(timed_nodes)
    code = shell.compile(wrapper, filename, "exec")
    scratch: dict = {}
    # Globals are the user's namespace; only the wrapper's own name lands in ``scratch``.
    exec(code, shell.user_ns, scratch)
    return scratch[_SETUP]
