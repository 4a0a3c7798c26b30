"""``gpukeeper watch`` in a real terminal: a tmux pane runs it, the screen is captured and
read, and Ctrl-C (sent as keys) ends it cleanly with exit code 0."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True, timeout=30).stdout


def _wait_for(session: str, needle: str, timeout: float = 60.0) -> str:
    end = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < end:
        screen = _tmux("capture-pane", "-p", "-t", session)
        if needle in screen:
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} never appeared on the screen:\n{screen}")


def test_watch_redraws_in_place_and_ends_on_ctrl_c(tmp_path: Path) -> None:
    session = f"gk-{uuid.uuid4().hex[:8]}"
    status = tmp_path / "status"
    command = f"{sys.executable} -m gpukeeper watch --interval 0.2; echo exit=$? > {status}; sleep 30"
    _tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "40", command)
    try:
        # A row every view has: "unaccounted" with a device, this process's RSS without.
        first = _wait_for(session, "holder")
        row = "unaccounted" if "unaccounted" in first else "resident memory (RSS)"
        assert "used" in first and row in first
        time.sleep(1.0)  # several refreshes: drawn in place, not scrolled
        screen = _tmux("capture-pane", "-p", "-t", session)
        assert screen.count(row) == 1, screen
        _tmux("send-keys", "-t", session, "C-c")
        end = time.monotonic() + 30
        while not status.exists() and time.monotonic() < end:
            time.sleep(0.1)
        assert status.read_text().strip() == "exit=0"
        assert "Traceback" not in _tmux("capture-pane", "-p", "-t", session)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
