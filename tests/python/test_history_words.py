"""No words about the project's history in the tracked files.

Code, comments, docs, benchmarks and tests say what the product does, not which ticket
or requirement document asked for it: a reference to a numbered issue or to a numbered
requirement document means nothing to a reader of the package. CHANGELOG.md is the one
place for history and is not checked.

The files are the ones git tracks (``git ls-files``); binary files are skipped, and so is
the whole test outside a git checkout (an unpacked sdist has no history to leak).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]

_WORDS = re.compile(
    r"\b(?:issues?\s*#?\d+|seeds?\s*#?0\d\d)",
    re.IGNORECASE,
)
# The changelog is history; this file holds examples of what the pattern catches.
_EXEMPT = {"CHANGELOG.md", Path(__file__).resolve().relative_to(ROOT).as_posix()}


def _tracked_files() -> List[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60
    )
    if done.returncode != 0:
        pytest.skip(f"git ls-files failed: {done.stderr.decode(errors='replace').strip()}")
    return [p for p in done.stdout.decode().split("\0") if p]


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary, unreadable or absent file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_pattern_matches_history_words() -> None:
    for text in ("issue 13", "(Issue 2)", "issues #4", "seed 003's", "Seeds 001"):
        assert _WORDS.search(text), text
    for text in ("an issue with 3 devices", "seed=3", "the same seed refuses", "tissue 5"):
        assert not _WORDS.search(text), text


def test_no_history_words_in_tracked_files() -> None:
    hits = []
    for rel in _tracked_files():
        if rel in _EXEMPT:
            continue
        text = _text(ROOT / rel)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if _WORDS.search(line):
                hits.append(f"{rel}:{number}: {line.strip()}")
    assert not hits, (
        "words about the project's history (say what the product does instead):\n"
        + "\n".join(hits)
    )
