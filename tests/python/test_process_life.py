"""The process-wide hooks in ``gpukeeper.base.process_life``: exit, fork, signals, threads,
the statement hook and the stuck probe, each recorded in the one state object."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from child_process import answer_from_fork

import gpukeeper
from gpukeeper.base import process_life
from gpukeeper.base.process_life import LIFE

# The gpukeeper this test imported, built core included (an installed one on a GPU machine).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(gpukeeper.__file__))


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_exit_hooks_run_at_exit_unless_cancelled():
    out = _run(
        """
        from gpukeeper.base import process_life
        def kept(): print("kept ran")
        def dropped(): print("dropped ran")
        process_life.at_exit(kept)
        process_life.at_exit(dropped)
        process_life.cancel_at_exit(dropped)
        print("hooks", [h.__name__ for h in process_life.LIFE.exit_hooks])
        """
    )
    assert out.returncode == 0, out.stderr
    assert "hooks ['kept']" in out.stdout
    assert "kept ran" in out.stdout
    assert "dropped ran" not in out.stdout


def test_cancel_of_an_unknown_hook_is_harmless():
    before = list(LIFE.exit_hooks)
    process_life.cancel_at_exit(lambda: None)
    assert LIFE.exit_hooks == before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_resets_the_state_and_runs_the_fork_hooks():
    seen = []
    stop = threading.Event()
    thread = process_life.start_thread("gpukeeper-test-idle", stop.wait)
    process_life.after_fork_in_child(lambda: seen.append("hook"))

    def in_child() -> bytes:  # what the child sees
        ok = (
            seen == ["hook"]
            and LIFE.threads == []
            and LIFE.owner_pid == os.getpid()
            and LIFE.lock.acquire(timeout=1)
        )
        return b"ok" if ok else repr((seen, LIFE.threads)).encode()

    try:
        assert answer_from_fork(in_child) == b"ok"
        assert seen == []  # the parent runs no fork hook
        assert thread in LIFE.live_threads()
        assert LIFE.owner_pid == os.getpid()
    finally:
        LIFE.fork_hooks.pop()
        stop.set()
        thread.join(5)


def test_threads_are_daemons_and_recorded_while_alive():
    stop = threading.Event()
    thread = process_life.start_thread("gpukeeper-test-thread", stop.wait)
    assert thread.daemon and thread.name == "gpukeeper-test-thread"
    assert thread in LIFE.live_threads()
    stop.set()
    thread.join(5)
    assert thread not in LIFE.live_threads()


def test_a_signal_handler_is_restored_only_while_it_is_ours():
    def ours(signum, frame):
        pass

    def theirs(signum, frame):
        pass

    original = signal.getsignal(signal.SIGUSR1)
    try:
        previous = process_life.set_signal_handler(signal.SIGUSR1, ours)
        assert previous is original
        assert LIFE.signal_handlers[int(signal.SIGUSR1)] is original
        assert process_life.restore_signal_handler(signal.SIGUSR1, ours, previous)
        assert signal.getsignal(signal.SIGUSR1) is original
        assert int(signal.SIGUSR1) not in LIFE.signal_handlers

        previous = process_life.set_signal_handler(signal.SIGUSR1, ours)
        signal.signal(signal.SIGUSR1, theirs)  # someone replaced ours since
        assert not process_life.restore_signal_handler(signal.SIGUSR1, ours, previous)
        assert signal.getsignal(signal.SIGUSR1) is theirs
    finally:
        signal.signal(signal.SIGUSR1, original)


def test_the_stuck_probe_answers_for_the_guard():
    saved = LIFE.stuck_probe
    try:
        process_life.set_stuck_probe(None)
        assert not process_life.device_stuck()
        process_life.set_stuck_probe(lambda: True)
        assert process_life.device_stuck()
    finally:
        process_life.set_stuck_probe(saved)


def test_the_statement_hook_fires_after_the_statement_and_stops_when_off():
    # A process of its own: the hook takes a process-wide monitoring tool id on 3.12+.
    out = _run(
        """
        from gpukeeper.base import process_life
        fired = []
        hook = process_life.statement_hook(lambda: fired.append(1))
        assert process_life.statement_hook(print) is hook  # one hook per process
        print("mode", hook.mode)
        if hook.available:
            hook.on()
            assert hook.on_here()
            len("a call")
            hook.off()
            n = len(fired)
            assert n > 0, "no event after on()"
            len("another call")
            assert len(fired) == n, "events after off()"
            assert not hook.on_here()
        print("ok")
        """
    )
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout
    mode = "monitoring" if sys.version_info >= (3, 12) else "profile"
    if sys.implementation.name == "cpython":
        assert f"mode {mode}" in out.stdout
