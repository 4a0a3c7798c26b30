"""The package's layering rules, read from its source: no import circles between modules,
and no module outside ``frameworks/`` and ``integrations/`` imports PyTorch, CuPy or JAX
or reads them from ``sys.modules``."""

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
