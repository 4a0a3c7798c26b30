"""Running a test's child script in a fresh interpreter and reading back its JSON result
(``run_json_child``; ``run_child`` for the PyTorch children, with the allocator route they
take); a child that is sent a signal once it is ready (``signal_child``); and a check run
in a forked child, its answer read back through a pipe (``answer_from_fork``).

Several GPU tests run their CUDA work in a child process: a fresh CUDA context, allocator
hooks installed before torch allocates, and a crash that fails one test rather than the
suite. The child prints its result as one JSON line, last (or after ``prefix``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple


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


def run_child(script: Path, mode: str, *, timeout: float = 300,
              route: str = "auto") -> Dict[str, Any]:
    """Runs a PyTorch child ``script`` in ``mode`` and returns its JSON result.
    ``route`` is the allocator route the child asks for (``GPUKEEPER_TORCH_ROUTE``:
    ``auto`` or ``pluggable``; children that take one route only ignore it)."""
    env = dict(os.environ, GPUKEEPER_TORCH_ROUTE=route)
    return run_json_child(script, mode, timeout=timeout, env=env)


def signal_child(script: Path, mode: str, send: Optional[int] = None,
                 timeout: float = 30.0) -> Tuple[int, str, str, float]:
    """Runs ``script`` in ``mode``; with ``send``, waits for its ``READY`` line and sends
    that signal. Returns (status, stdout, stderr, seconds from the signal (or the start)
    to the exit)."""
    proc = subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A suite started in the background by a shell inherits SIGINT ignored, and Python
        # then installs no KeyboardInterrupt handler: the child gets the default back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        start = time.monotonic()
        if send is not None:
            assert proc.stdout is not None and proc.stderr is not None
            line = proc.stdout.readline()
            said = proc.stderr.read() if proc.poll() is not None else ""
            assert line.strip() == "READY", (line, said)
            time.sleep(0.1)  # let the child get into its loop or its hang
            start = time.monotonic()
            proc.send_signal(send)
            out, err = proc.communicate(timeout=timeout)
            out = line + out
        else:
            out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
