"""``gpukeeper.base.statements``: a statement runs as module code in its namespace (it rebinds
the names there and returns its final expression's value), the same in its cheap
function form as in its exec form, and an exception is told apart by where it came from."""

from __future__ import annotations

import dataclasses
import sys
from types import ModuleType
from typing import Any, Dict, List, Tuple

import pytest

from gpukeeper.base.statements import Statement, compile_statement, describe_exception

SETUP = "import math\nx = 0\nitems = []\n"

# Statements and whether the function form can run them (True) or exec must (False).
STATEMENTS = [
    ("x += 1", True),
    ("x += 1\nx * 2", True),
    ("items.append(x); x = len(items)", True),
    ("y = x + 1\ndel y", True),
    ("for i in range(3): x += i", True),
    ("def f(): return x + 1\nx = f()", True),  # a nested function reads the rebound global
    ("class C: v = x\nx = C.v + 1", True),
    ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    x += 1", True),
    ("import math as m\nx = m.floor(x + 1.5)", True),
    # A walrus in a comprehension binds here. From Python 3.12 comprehensions are inlined
    # and their loop variable is a hidden local of the function, so the statement runs by
    # exec instead: module code either way.
    ("[z := x + 1 for _ in range(2)]\nx = z", sys.version_info < (3, 12)),
    ("x = sum(j for j in range(x + 2))", True),
    ("from math import *\nx = floor(x + 1.5)", False),
    ("n: int = x + 1\nx = n", False),
    ("exec('x = x + 1')", False),
    ("x = len(locals()) and x + 1", False),
]


def _run(statement: Statement, calls: int = 3) -> Tuple[List[Any], Dict[str, Any]]:
    namespace: Dict[str, Any] = {}
    compile_statement(SETUP, "<setup>").function(namespace)()
    fn = statement.function(namespace)
    values = [fn() for _ in range(calls)]
    # Functions, classes and modules differ by identity from run to run: left out.
    kept = {k: v for k, v in namespace.items()
            if not k.startswith("__") and not callable(v) and not isinstance(v, ModuleType)}
    return values, kept


@pytest.mark.parametrize("source, as_function", STATEMENTS, ids=[s for s, _ in STATEMENTS])
def test_both_forms_run_the_statement_as_module_code(source: str, as_function: bool) -> None:
    statement = compile_statement(source)
    assert (statement.as_function is not None) == as_function
    exec_form = dataclasses.replace(statement, as_function=None)
    module: Dict[str, Any] = {}
    exec(SETUP, module)
    expected = []
    for _ in range(3):
        exec(compile(source, "<module>", "exec"), module)
        expected.append(module["x"])
    for form in (statement, exec_form):
        values, names = _run(form)
        assert names["x"] == expected[-1], (form, names)
    assert _run(statement) == _run(exec_form)


def test_rebinding_and_the_final_value() -> None:
    namespace = {"x": 0}
    fn = compile_statement("x += 1\nx").function(namespace)
    assert [fn(), fn(), fn()] == [1, 2, 3] and namespace["x"] == 3
    assert compile_statement("x = 5").function(namespace)() is None and namespace["x"] == 5


def test_empty_statement_and_syntax_errors() -> None:
    assert compile_statement("# nothing\n").empty
    with pytest.raises(SyntaxError):
        compile_statement("1 +")
    with pytest.raises(SyntaxError):  # module code: no return outside a function
        compile_statement("return 1")


@pytest.mark.parametrize("source", ["1 / 0", "x = 1\n1 / 0", "from math import *\n1 / 0"])
def test_raised_tells_the_statement_from_its_caller(source: str) -> None:
    statement = compile_statement(source)
    fn = statement.function({})
    with pytest.raises(ZeroDivisionError) as info:
        fn()
    assert statement.raised(info.value)
    assert not statement.raised(ValueError("raised elsewhere"))


def test_describe_exception_is_one_line() -> None:
    assert describe_exception(ValueError("bad\nmore detail")) == "ValueError: bad ..."
    assert describe_exception(KeyError("k")) == "KeyError: 'k'"
    assert describe_exception(StopIteration()) == "StopIteration"
