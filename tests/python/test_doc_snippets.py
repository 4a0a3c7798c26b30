"""Every Python snippet in README.md and docs/ runs as pasted on a machine without a GPU,
or is marked as an excerpt: an HTML comment ``<!-- excerpt -->`` on the line before its
fence (a fragment of a larger program: a training loop's body, names the reader brings).
Each runs in a fresh process, from an empty folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- excerpt -->"


def snippets() -> List[Tuple[str, int, str]]:
    found = []
    for doc in [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")):
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() == "```python":
                start = i + 1
                end = start
                while end < len(lines) and lines[end].strip() != "```":
                    end += 1
                before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
                if before != MARK:
                    found.append((f"{doc.relative_to(ROOT)}:{start}", start, "\n".join(lines[start:end])))
                i = end
            i += 1
    return found


SNIPPETS = snippets()


def test_the_snippets_are_found():
    assert len(SNIPPETS) >= 10


@pytest.mark.parametrize("where, line, code", SNIPPETS, ids=[s[0] for s in SNIPPETS])
def test_snippet_runs_as_pasted(where: str, line: int, code: str, tmp_path: Path) -> None:
    for module in re.findall(r"^\s*(?:import|from)\s+(torch|cupy|jax|faiss|openmm)\b", code, re.M):
        pytest.importorskip(module)
    script = tmp_path / "snippet.py"
    script.write_text(code + "\n")
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, f"{where} fails as pasted:\n{code}\n--- stderr:\n{done.stderr[-3000:]}"
