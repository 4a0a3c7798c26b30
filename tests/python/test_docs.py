"""The documentation site (mkdocs.yml, docs/): its pages and references point at things
that exist, and, where the doc tools are installed, it builds in strict mode.

The first checks read files only, so they run everywhere. The build runs when MkDocs,
Material and mkdocstrings are importable (``bash scripts/docs-build.sh`` installs them)
and is skipped otherwise.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Set

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SOURCE = ROOT / "python"
CONFIG = ROOT / "mkdocs.yml"

_DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.MULTILINE)
_AUTOREF = re.compile(r"\]\[(gpukeeper(?:\.\w+)*)\]")


def _nav_pages() -> List[str]:
    """The .md files named in mkdocs.yml's nav (everything after ``nav:`` that ends in .md)."""
    text = CONFIG.read_text()
    nav = text[text.index("\nnav:"):]
    return re.findall(r"([\w./-]+\.md)\s*$", nav, re.MULTILINE)


def _module_file(dotted: str) -> Optional[Path]:
    """The source file of module ``dotted`` under python/, or None."""
    base = SOURCE.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py", base.with_suffix(".pyi")):
        if candidate.is_file():
            return candidate
    return None


def _top_level_names(path: Path) -> Set[str]:
    """Names a module defines or imports at its top level."""
    names: Set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module under python/, or a name defined in one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_file(".".join(parts[:cut]))
        if path is not None:
            rest = parts[cut:]
            return not rest or rest[0] in _top_level_names(path)
    return False


def _reference_pages() -> List[Path]:
    return sorted((DOCS / "reference").glob("*.md"))


def test_reference_directives_name_existing_modules() -> None:
    directives = {page.name: _DIRECTIVE.findall(page.read_text()) for page in _reference_pages()}
    assert directives, "docs/reference has no ::: directives"
    missing = [f"{page}: ::: {target}" for page, targets in directives.items()
               for target in targets if not _resolves(target)]
    assert not missing, "reference pages name modules or objects that do not exist:\n" + "\n".join(missing)
    for page, targets in directives.items():
        assert targets, f"docs/reference/{page} has no ::: directive"


def test_cross_references_name_existing_modules() -> None:
    """``[text][gpukeeper.x.Y]`` in the pages: the module part exists (mkdocs checks the
    rest when it builds)."""
    bad = []
    for page in sorted(DOCS.rglob("*.md")):
        for target in _AUTOREF.findall(page.read_text()):
            if not _resolves(target) and not _resolves(target.rsplit(".", 1)[0]):
                bad.append(f"{page.relative_to(ROOT)}: {target}")
    assert not bad, "cross-references to modules that do not exist:\n" + "\n".join(bad)


def test_top_level_page_lists_every_exported_name() -> None:
    tree = ast.parse((SOURCE / "gpukeeper" / "__init__.py").read_text())
    exported = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
    page = (DOCS / "reference" / "gpukeeper.md").read_text()
    missing = [name for name in exported if f"`{name}`" not in page]
    assert not missing, f"docs/reference/gpukeeper.md does not list {missing}"


def test_nav_pages_exist_and_every_page_is_in_the_nav() -> None:
    pages = _nav_pages()
    assert "index.md" in pages and "performance.md" in pages and "architecture.md" in pages
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert not on_disk - set(pages), f"pages not in mkdocs.yml's nav: {sorted(on_disk - set(pages))}"
    assert len(pages) == len(set(pages)), "a page appears twice in the nav"


_TOOLS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _missing_tools() -> List[str]:
    missing = []
    for name in _TOOLS:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


def test_cli_page_documents_every_subcommand_and_option() -> None:
    """docs/cli.md has a section per subcommand, and every option each one accepts."""
    import argparse

    from gpukeeper.cli import parser

    page = (DOCS / "cli.md").read_text()
    top = parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, sub in subs.choices.items():
        if f"## `gpukeeper {name}`" not in page:
            missing.append(f"section gpukeeper {name}")
        for action in sub._actions:
            if action.help == argparse.SUPPRESS:
                continue  # hidden aliases kept for old scripts
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and f"`{flag}" not in page and f" {flag}" not in page:
                    missing.append(f"gpukeeper {name} {flag}")
    assert "--version" in page
    assert not missing, f"docs/cli.md lacks: {missing}"


@pytest.mark.skipif(bool(_missing_tools()),
                    reason=f"doc tools not installed ({', '.join(_missing_tools())}): "
                           "bash scripts/docs-build.sh installs them")
def test_site_builds_in_strict_mode(tmp_path: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(CONFIG),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "memory" / "index.html").is_file()
