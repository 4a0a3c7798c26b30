"""Statements compiled once and run many times in a namespace: what the timeit commands time.

The commands: ``gpukeeper timeit`` and ``%gpu_timeit``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from types import CodeType, FunctionType
from typing import Any, Callable, Dict, FrozenSet, Optional, Union

__all__ = ["Statement", "compile_statement", "describe_exception"]

#: ``compile``'s signature: IPython's caching compiler takes its place in a notebook.
Compiler = Callable[[Any, str, str], CodeType]

_FUNCTION = "__gpukeeper_statement"

# Builtins that see a frame's own locals: in a function they would see the function's
# (empty) locals where module-level code sees the namespace, so a statement naming one
# keeps the exec form.
_FRAME_LOCALS = frozenset({"dir", "eval", "exec", "locals", "vars"})


@dataclass(frozen=True)
class Statement:
    """A compiled statement.

    ``body`` is the statement compiled as module code for ``exec`` and ``last`` its
    final expression, if any, compiled apart for ``eval`` (either None when there is
    none). ``as_function`` is the same statement as the body of a function that
    declares every name it binds ``global`` and returns the final expression's value;
    None where that would not behave as module code does.
    """

    body: Optional[CodeType]
    last: Optional[CodeType]
    as_function: Optional[CodeType] = None

    @property
    def empty(self) -> bool:
        """True when there is nothing to run (blank lines or comments only)."""
        return self.body is None and self.last is None

    def function(self, namespace: Dict[str, Any]) -> Callable[[], Any]:
        """A function of no arguments that runs the statement with ``namespace`` as its
        globals, as module-level code, and returns the value of its final expression
        (None without one).

        Module-level semantics is what ``python -m timeit`` users expect of a statement
        and its setup: the statement reads and rebinds the names the setup (or the
        notebook) made. A plain function body would make every name it assigns local,
        so ``x += 1`` could not rebind ``x`` (``UnboundLocalError``). The final
        expression's value reaches the caller, so that the benchmark sees a JAX array or
        a tensor as the call's result.

        Each call's overhead enters the host-clock times on the CPU, so both forms are
        compiled once, and the cheaper one is used: a function whose bindings are
        declared ``global`` (a plain call, as cheap as timing a function), else ``exec``
        of the module code and ``eval`` of the final expression (some 150-300 ns more a
        call), which is exactly module code whatever the statement does.
        """
        if self.as_function is not None:
            return FunctionType(self.as_function, namespace)
        body, last = self.body, self.last
        if body is None:
            if last is None:
                return lambda: None
            return lambda: eval(last, namespace)
        if last is None:

            def run_body() -> None:
                exec(body, namespace)

            return run_body

        def run_both() -> Any:
            exec(body, namespace)
            return eval(last, namespace)

        return run_both

    def raised(self, exc: BaseException) -> bool:
        """True when ``exc`` came out of the statement's own code (its traceback runs
        through it), rather than from the code that called the statement."""
        codes = {code for code in (self.body, self.last, self.as_function) if code is not None}
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in codes:
                return True
            tb = tb.tb_next
        return False


def compile_statement(
    code: Union[str, ast.Module], filename: str = "<stmt>", compiler: Compiler = compile
) -> Statement:
    """Compiles ``code`` (source text, or a module already parsed) into a ``Statement``.

    ``filename`` names it in tracebacks; ``compiler`` compiles the parts (IPython's
    shell passes its own, so that the notebook's future flags and line cache apply).
    ``SyntaxError`` for text that is not Python as module code (``return`` outside a
    function is one).
    """
    tree = ast.parse(code, filename) if isinstance(code, str) else code
    nodes = list(tree.body)
    last: Optional[CodeType] = None
    final = nodes[-1] if nodes else None
    if isinstance(final, ast.Expr):
        nodes.pop()
        last = compiler(ast.Expression(final.value), filename, "eval")
    body = compiler(ast.Module(nodes, type_ignores=[]), filename, "exec") if nodes else None
    return Statement(body, last, _as_function(tree, filename, compiler))


def _as_function(tree: ast.Module, filename: str, compiler: Compiler) -> Optional[CodeType]:
    """The statement as a function body that declares the names it binds ``global``, or
    None where a function cannot run it as module code: a name of ``_FRAME_LOCALS``, a
    star import, an annotated name (which cannot be declared global)."""
    if not tree.body or any(
        isinstance(n, ast.Name) and n.id in _FRAME_LOCALS for n in ast.walk(tree)
    ):
        return None
    nodes = list(tree.body)
    if isinstance(nodes[-1], ast.Expr):
        nodes[-1] = ast.copy_location(ast.Return(value=nodes[-1].value), nodes[-1])
    try:
        local = _names_local_to(_function_code(nodes, filename, compiler))
        if not local:
            return _function_code(nodes, filename, compiler)
        declared = ast.copy_location(ast.Global(names=sorted(local)), nodes[0])
        code = _function_code([declared] + nodes, filename, compiler)
    except SyntaxError:
        return None
    # Whatever the compiler still keeps local would not reach the namespace.
    return code if not _names_local_to(code) else None


def _function_code(nodes: list, filename: str, compiler: Compiler) -> CodeType:
    """The code of ``def __gpukeeper_statement(): <nodes>``."""
    # A parsed template: FunctionDef's fields vary by Python version.
    module = ast.parse(f"def {_FUNCTION}():\n    pass\n")
    for node in ast.walk(module):
        if hasattr(node, "lineno"):
            # The wrapper takes the statement's first line, so that no traceback line
            # points at a line the user did not write.
            ast.copy_location(node, nodes[0])
    function = module.body[0]
    assert isinstance(function, ast.FunctionDef)
    function.body = nodes
    outer = compiler(ast.fix_missing_locations(module), filename, "exec")
    return next(c for c in outer.co_consts if isinstance(c, CodeType) and c.co_name == _FUNCTION)


def _names_local_to(code: CodeType) -> FrozenSet[str]:
    return frozenset(code.co_varnames) | frozenset(code.co_cellvars)


def describe_exception(exc: BaseException) -> str:
    """``exc`` in one line: its type's name and the first line of its message."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    more = " ..." if len(lines) > 1 else ""
    return f"{type(exc).__name__}: {lines[0].strip()}{more}"
