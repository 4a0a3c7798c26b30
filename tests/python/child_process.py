"""Running a test's child script in a fresh interpreter and reading back its JSON result;
and a check run in a forked child, its answer read back through a pipe.

Several GPU tests run their CUDA work in a child process: a fresh CUDA context, allocator
hooks installed before torch allocates, and a crash that fails one test rather than the
suite. The child prints its result as one JSON line, last (or after ``prefix``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional


def run_json_child(script: Path, *args: str, timeout: float = 300,
                   env: Optional[Mapping[str, str]] = None, prefix: str = "") -> Dict[str, Any]:
    """Runs ``script`` with ``args`` and returns the JSON of its last output line that starts
    with ``prefix``; fails the test, with the child's output, when it exits non-zero."""
    child_env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=child_env)
    assert done.returncode == 0, (
        f"child {script.name} {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    lines = [line for line in done.stdout.splitlines() if line.strip() and line.startswith(prefix)]
    assert lines, f"child {script.name} printed no result line:\n{done.stdout[-3000:]}"
    return json.loads(lines[-1][len(prefix):])


def answer_from_fork(check: Callable[[], bytes]) -> bytes:
    """Forks; the child writes ``check()`` to a pipe and leaves at once (``os._exit``: no
    exit hooks, no test teardown), and the parent returns what it wrote. A check that
    raises gives b"", so the test's assertion on the answer fails."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, check())
        finally:
            os._exit(0)
    os.close(write)
    try:
        return os.read(read, 4096)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
