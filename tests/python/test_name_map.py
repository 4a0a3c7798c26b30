"""The table in docs/getting-started.md that says where each name of the former helper
modules lives: every name is in the module the table gives, and in ``gpukeeper``."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import gpukeeper

DOC = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"


def rows():
    text = DOC.read_text().split("## Where each name lives", 1)[1]
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        module = re.match(r"`(gpukeeper[\w.]*)`", cells[2]) if len(cells) == 3 else None
        if module:
            yield module.group(1), re.findall(r"`([A-Za-z_]+)`", cells[1])


def test_every_name_is_where_the_table_says():
    found = list(rows())
    assert len(found) >= 8
    for module, names in found:
        mod = importlib.import_module(module)
        assert names, module
        for name in names:
            assert hasattr(mod, name), f"{module} has no {name}"
            assert getattr(gpukeeper, name) is getattr(mod, name), name
