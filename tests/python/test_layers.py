"""The package's layering rules, read from its source: no import circles between modules,
no module outside ``frameworks/`` and ``integrations/`` imports PyTorch, CuPy or JAX,
reads them from ``sys.modules`` or names them in a string (a framework's name is its
adapter's), and only ``base/process_life.py`` hooks into the process (atexit, fork,
signals, profile and monitoring hooks, threads)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "gpukeeper"
FRAMEWORKS = {"torch", "cupy", "jax", "jaxlib"}
ADAPTER_PACKAGES = {"frameworks", "integrations"}


def _modules() -> Dict[str, Path]:
    """Every module of the package by dotted name."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _framework_uses(path: Path) -> List[Tuple[int, str]]:
    """(line, what) for each import of a framework and each ``sys.modules`` read of one."""
    uses = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            uses += [(node.lineno, f"import {a.name}") for a in node.names
                     if a.name.split(".")[0] in FRAMEWORKS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in FRAMEWORKS:
                uses.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            if (node.func.attr == "get" and isinstance(target, ast.Attribute) and target.attr == "modules"
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).split(".")[0] in FRAMEWORKS):
                uses.append((node.lineno, f"sys.modules.get({node.args[0].value!r})"))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            if node.value.attr == "modules" and isinstance(node.slice, ast.Constant) \
                    and str(node.slice.value).split(".")[0] in FRAMEWORKS:
                uses.append((node.lineno, f"sys.modules[{node.slice.value!r}]"))
    return uses


def test_frameworks_are_read_only_through_the_adapters():
    outside = []
    for name, path in sorted(_modules().items()):
        if len(name.split(".")) > 1 and name.split(".")[1] in ADAPTER_PACKAGES:
            continue
        outside += [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}" for line, what in _framework_uses(path)]
    assert not outside, "framework access outside frameworks/ and integrations/:\n" + "\n".join(outside)


def _framework_names(path: Path) -> List[Tuple[int, str]]:
    """(line, literal) for each string in the code (docstrings left out) that is a
    framework's name or starts with one's module path (``"torch"``, ``"jax.numpy"``)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value in FRAMEWORKS or node.value.split(".")[0] in FRAMEWORKS and "." in node.value:
                found.append((node.lineno, node.value))
    return found


def test_frameworks_are_named_only_by_their_adapters():
    """Outside ``frameworks/`` and ``integrations/`` the code asks the registry: a new
    framework is one adapter module and its line in the registry, not a string compare in
    timing, cleanup or the account."""
    outside = []
    for name, path in sorted(_modules().items()):
        if len(name.split(".")) > 1 and name.split(".")[1] in ADAPTER_PACKAGES:
            continue
        outside += [f"{path.relative_to(PACKAGE.parent)}:{line}: {value!r}" for line, value in _framework_names(path)]
    assert not outside, "framework names outside frameworks/ and integrations/:\n" + "\n".join(outside)


def test_the_name_rule_sees_literals_not_docstrings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Times torch and jax."""\n'
        'def f(kind):\n    """A "jax" plan."""\n    # "cupy" in a comment\n'
        '    return kind == "jax" or kind.startswith("torch.") or f"{kind}" == "cupy.ndarray"\n'
        'NAMES = ("torchvision", "jaxtyping", "engine")\n'
    )
    assert [value for _, value in _framework_names(sample)] == ["jax", "torch.", "cupy.ndarray"]


def _imports(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The package modules ``name`` imports, wherever in the file (a lazy import is an arrow too)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: List[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def test_no_import_circles():
    mods = _modules()
    graph = {name: _imports(name, path, set(mods)) for name, path in mods.items()}
    # A package's __init__ re-exporting its modules is not a circle of layers: arrows
    # into a package's own __init__ from inside it are left out.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    circles: List[List[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


# The calls that hook into the process, as ``module.attribute`` (sys.monitoring: any use).
PROCESS_HOOKS = {
    ("atexit", "register"),
    ("atexit", "unregister"),
    ("os", "register_at_fork"),
    ("signal", "signal"),
    ("signal", "set_wakeup_fd"),
    ("threading", "Thread"),
    ("sys", "setprofile"),
    ("threading", "setprofile"),
    ("sys", "settrace"),
    ("threading", "settrace"),
    ("sys", "monitoring"),
}
LIFE_MODULE = "gpukeeper.base.process_life"


def _process_hooks(path: Path) -> List[Tuple[int, str]]:
    """(line, what) for each process hook ``path`` makes, however it imported the module
    (a name in a type annotation makes none)."""
    hooks = []
    tree = ast.parse(path.read_text(), str(path))
    in_annotations = set()
    for node in ast.walk(tree):
        notes = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            notes = [a.annotation for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs]
            notes.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            notes = [node.annotation]
        for note in notes:
            if note is not None:
                in_annotations.update(id(n) for n in ast.walk(note))
    imported = {}  # local name -> (module, attribute) for ``from m import a``
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                if (node.module, a.name) in PROCESS_HOOKS:
                    imported[a.asname or a.name] = (node.module, a.name)
    for node in ast.walk(tree):
        if id(node) in in_annotations:
            continue
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in PROCESS_HOOKS:
                hooks.append((node.lineno, f"{node.value.id}.{node.attr}"))
        elif isinstance(node, ast.Attribute) and node.attr == "PyEval_SetProfile":
            hooks.append((node.lineno, "PyEval_SetProfile"))
        elif isinstance(node, ast.Name) and node.id in imported:
            hooks.append((node.lineno, ".".join(imported[node.id])))
    return hooks


def test_only_process_life_hooks_into_the_process():
    mods = _modules()
    assert LIFE_MODULE in mods
    outside = []
    for name, path in sorted(mods.items()):
        if name == LIFE_MODULE:
            continue
        outside += [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}" for line, what in _process_hooks(path)]
    assert not outside, "process hooks outside base/process_life.py:\n" + "\n".join(outside)


def test_the_hook_rule_sees_each_form(tmp_path):
    """The reader above finds a hook made through a module or a name imported from it."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import atexit, threading\nfrom os import register_at_fork as raf\n"
        "atexit.register(print)\nthreading.Thread(target=print)\nraf(after_in_child=print)\n"
        "worker: threading.Thread\ndef f(t: threading.Thread) -> threading.Thread: ...\n"
    )
    found = {what for _, what in _process_hooks(sample)}
    assert found == {"atexit.register", "threading.Thread", "os.register_at_fork"}
