"""The production notes' patterns 2 and 3 on a GPU with the notes' own verification lines, each in a
fresh process (production_notes_cases.py holds them): the check "memory_reserved() is minimal"
needs a process whose other tests hold no CUDA memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("production_notes_cases.py")
NAMES = ['test_pattern_2_context_manager_names_deleted_after_the_block', 'test_pattern_2_exception_path_names_deleted_after_the_block', 'test_pattern_2_release_names_without_del', 'test_pattern_3_cleanup_models']


@pytest.mark.gpu
@pytest.mark.parametrize("case", NAMES)
def test_production_notes_pattern_in_a_fresh_process(case: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", f"{CASES}::{case}", "-q", "-s", "-p", "no:cacheprovider",
         "-W", "error::pytest.PytestUnraisableExceptionWarning"],
        capture_output=True, text=True, timeout=300, cwd=str(CASES.parent))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1]
