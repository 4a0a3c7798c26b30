"""The package's layout: no two modules share a file name, and the former helper module
paths still import, as names for the modules that hold their code now."""

from __future__ import annotations

import collections
import importlib
import subprocess
import sys
from pathlib import Path

import gpukeeper

PACKAGE = Path(gpukeeper.__file__).resolve().parent

# The paths the helper code gpukeeper grew from imports (docs/getting-started.md's table).
FORMER = {
    "gpukeeper.device": "gpukeeper.account.device_utils",
    "gpukeeper.faiss_helpers": "gpukeeper.account.faiss_helpers",
    "gpukeeper.manager": "gpukeeper.account.memory_manager",
    "gpukeeper.memory": "gpukeeper.pool.memory_pool",
    "gpukeeper.oom": "gpukeeper.pool.oom_retry",
}


def test_no_two_modules_share_a_file_name() -> None:
    names = collections.Counter(p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert [n for n, count in names.items() if count > 1] == []


def test_every_module_opens_with_a_docstring() -> None:
    bare = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
            if not p.read_text().lstrip().startswith('"""')]
    assert bare == []


def test_former_paths_name_the_moved_modules() -> None:
    for old, new in FORMER.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
        assert getattr(gpukeeper, old.rsplit(".", 1)[1]) is importlib.import_module(new), old


def test_former_paths_import_in_a_fresh_interpreter() -> None:
    code = "; ".join(f"import {old}" for old in FORMER) + "; from gpukeeper.memory import MemoryPool"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
