"""Fresh-process rounds for ``--gpu-benchmark-rounds``: the same pytest invocation run again
in child processes, one after another, each running only the tests that measured a
benchmark and handing its results back through a file.

A child is the invocation as the user typed it (same directory, options and pytest-xdist
workers), so its benchmarks are measured as the first round's were; the environment
tells it to keep only the benchmark tests, not to save or compare, and where to write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

import pytest

from gpukeeper.timing.benchmark_result import BenchmarkResult

__all__ = ["OUT_ENV", "is_round_child", "keep_benchmark_items", "run_rounds", "write_round"]

#: Where a child writes its results (set only in a child).
OUT_ENV = "GPUKEEPER_BENCHMARK_ROUND_OUT"
#: A JSON file listing the test ids a child runs (set only in a child).
KEYS_ENV = "GPUKEEPER_BENCHMARK_ROUND_KEYS"


def is_round_child() -> bool:
    """Whether this pytest process is a round's child (it measures and hands back, nothing else)."""
    return bool(os.environ.get(OUT_ENV))


def keep_benchmark_items(config: pytest.Config, items: List[pytest.Item]) -> None:
    """In a child: deselects every test that measured no benchmark in the first round."""
    keys_file = os.environ.get(KEYS_ENV)
    if not keys_file:
        return
    keys = set(json.loads(Path(keys_file).read_text()))
    kept = [item for item in items if item.nodeid in keys]
    dropped = [item for item in items if item.nodeid not in keys]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def write_round(exported: Dict[str, Any]) -> None:
    """In a child: writes what it measured (``BenchmarkSession.export()``) for the parent."""
    Path(os.environ[OUT_ENV]).write_text(json.dumps(exported))


def run_rounds(
    config: pytest.Config,
    keys: Iterable[str],
    extra: int,
    say: Callable[[str], None],
    number: Optional[int] = None,
) -> List[Dict[str, BenchmarkResult]]:
    """Runs ``extra`` children one after another (never side by side: they would slow
    each other down); each one's ``{key: result}``. ``number``: the round the first
    child is, when the rounds are run one call at a time (the messages count from it). A
    child that hands back nothing is reported through ``say`` with the end of its output,
    and skipped."""
    args = [sys.executable, "-m", "pytest", *config.invocation_params.args]
    if config.pluginmanager.hasplugin("xdist"):
        # A child runs a few tests one after another: workers of its own would only start
        # and wait (pytest takes the last -n given).
        args += ["-n", "0"]
    rounds: List[Dict[str, BenchmarkResult]] = []
    with tempfile.TemporaryDirectory(prefix="gpukeeper-rounds-") as tmp:
        keys_file = Path(tmp) / "keys.json"
        keys_file.write_text(json.dumps(sorted(keys)))
        for i in range(extra):
            n = (number if number is not None else 2) + i
            out, log = Path(tmp) / f"round{n}.json", Path(tmp) / f"round{n}.log"
            env = dict(os.environ, **{OUT_ENV: str(out), KEYS_ENV: str(keys_file)})
            if number is None:
                say(f"gpukeeper: benchmark round {n} of {extra + 1} in a fresh process")
            else:
                say(f"gpukeeper: benchmark round {n} in a fresh process")
            with open(log, "wb") as sink:
                done = subprocess.run(
                    args,
                    cwd=str(config.invocation_params.dir),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
            results = _read_round(out)
            if results is None:
                tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                say(
                    f"gpukeeper: round {n} handed back no results (exit status "
                    f"{done.returncode}); its output ended with:\n  " + "\n  ".join(tail)
                )
                continue
            rounds.append(results)
    return rounds


def _read_round(path: Path) -> Optional[Dict[str, BenchmarkResult]]:
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {key: BenchmarkResult.from_dict(d) for key, d in data.get("results", {}).items()}
