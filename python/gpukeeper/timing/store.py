"""Saved benchmark runs, per machine: ``<root>/<machine>/<name>.json``.

A machine is named by what decides its timings: the GPU (name and driver) or the CPU
model, and the Python version, e.g. ``NVIDIA-H100-80GB-HBM3-drv580.159.04-py3.12``. Runs
saved on one machine are compared only with runs of that machine.

A run holds one or more **rounds** of each benchmark, each the result of one fresh
process (:mod:`gpukeeper.timing.regression` measures the spread between them). A file
holds ``{"machine": {...}, "saved_at": ISO time, "name": ..., "benchmarks": {key:
BenchmarkResult.to_dict()}, "later_rounds": {key: [BenchmarkResult.to_dict(), ...]}}``:
``benchmarks`` has the first round, so readers that know one result per benchmark read
it as before; ``later_rounds`` has the others (absent in files saved with one round, and
in files saved before rounds existed: those load as one round).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from gpukeeper.account.device_utils import get_gpu_info
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.timing.benchmark_result import BenchmarkResult

__all__ = [
    "DEFAULT_ROOT",
    "RunStore",
    "machine_info",
    "machine_key",
    "rounds_from_doc",
    "rounds_to_doc",
]

#: Where runs are saved, relative to the directory pytest runs in.
DEFAULT_ROOT = Path(".gpukeeper") / "benchmarks"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

#: One benchmark's results: one result (one round) or a list, one per fresh process.
Results = Mapping[str, Union[BenchmarkResult, Sequence[BenchmarkResult]]]


def rounds_from_doc(doc: Any) -> Dict[str, List[BenchmarkResult]]:
    """``{key: [round, ...]}`` from a saved run's JSON document (module docstring); a file
    without ``later_rounds`` gives one round each. ``KeyError``, ``TypeError`` or
    ``ValueError`` (``InvalidInputError`` among them) for anything else."""
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), dict):
        raise KeyError("benchmarks")
    later = doc.get("later_rounds") or {}
    if not isinstance(later, dict):
        raise TypeError(f"later_rounds is a {type(later).__name__}, not an object")
    rounds = {key: [BenchmarkResult.from_dict(d)] for key, d in doc["benchmarks"].items()}
    for key, items in later.items():
        if key not in rounds or not isinstance(items, list):
            raise ValueError(f"later_rounds of {key!r} without a first round, or not a list")
        rounds[key] += [BenchmarkResult.from_dict(d) for d in items]
    return rounds


def rounds_to_doc(results: Results) -> Dict[str, Any]:
    """The ``benchmarks`` and ``later_rounds`` entries of a saved run for ``results``."""
    benchmarks: Dict[str, Any] = {}
    later: Dict[str, Any] = {}
    for key, value in results.items():
        items = [value] if isinstance(value, BenchmarkResult) else list(value)
        if not items or not all(isinstance(r, BenchmarkResult) for r in items):
            raise InvalidInputError(
                f"saving {key!r}: a BenchmarkResult or a non-empty list of them"
            )
        benchmarks[key] = items[0].to_dict()
        if len(items) > 1:
            later[key] = [r.to_dict() for r in items[1:]]
    doc: Dict[str, Any] = {"benchmarks": benchmarks}
    if later:
        doc["later_rounds"] = later
    return doc


def machine_info(device: Any = None) -> Dict[str, Any]:
    """What names this machine for timings: GPU name and driver (CPU model without a
    GPU), Python version and platform."""
    info = get_gpu_info(device)
    return {
        "mode": info.get("mode"),
        "name": info.get("name"),
        "driver": info.get("driver_version"),
        "python": platform.python_version(),
        "platform": platform.system(),
    }


def machine_key(info: Dict[str, Any]) -> str:
    """A folder name for ``info`` (see :func:`machine_info`)."""
    parts = [str(info.get("name") or info.get("mode") or "unknown")]
    if info.get("driver"):
        parts.append(f"drv{info['driver']}")
    parts.append("py" + ".".join(str(info.get("python", "")).split(".")[:2]))
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(parts)).strip("-")


class RunStore:
    """The saved runs of one machine under ``root``."""

    def __init__(self, root: Path, machine: Dict[str, Any]) -> None:
        self.root = Path(root)
        self.machine = machine
        self.folder = self.root / machine_key(machine)

    @staticmethod
    def check_name(name: str) -> str:
        """``name`` when it is a usable run name (letters, digits, ``._-``), else
        ``InvalidInputError``."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidInputError(
                "a saved run's name is letters, digits, '.', '_' and '-' (at most 100), "
                f"got {name!r}"
            )
        return name

    def save(self, name: str, results: Results, append: bool = False) -> Path:
        """Writes ``results`` (a result or a list of rounds per key) as run ``name``; the
        path. ``append``: add them as more rounds of a saved run of that name (a new key
        starts with these rounds; no saved run: a new one), else replace it. Written to a
        temporary file first, so an interrupted save loses no older run."""
        path = self.folder / f"{self.check_name(name)}.json"
        merged: Dict[str, List[BenchmarkResult]] = {}
        if append and path.is_file():
            merged = self.load_rounds(name)
        for key, value in results.items():
            merged.setdefault(key, []).extend(
                [value] if isinstance(value, BenchmarkResult) else value
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        doc = {
            "machine": self.machine,
            "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "name": name,
            **rounds_to_doc(merged),
        }
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".json", dir=self.folder)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
        return path

    def latest(self) -> Optional[str]:
        """The name of the run saved last on this machine, or None."""
        runs = (
            sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
            if self.folder.is_dir()
            else []
        )
        return runs[-1].stem if runs else None

    def load(self, name: Optional[str] = None) -> Dict[str, BenchmarkResult]:
        """Run ``name`` (None: the latest) as ``{key: BenchmarkResult}``, the first round
        of each. ``InvalidInputError`` when there is none, naming what there is."""
        return {key: rounds[0] for key, rounds in self.load_rounds(name).items()}

    def load_rounds(self, name: Optional[str] = None) -> Dict[str, List[BenchmarkResult]]:
        """Run ``name`` (None: the latest) as ``{key: [round, ...]}``, every round of each.
        ``InvalidInputError`` when there is none, naming what there is."""
        name = self.latest() if name is None else self.check_name(name)
        path = self.folder / f"{name}.json" if name else None
        if path is None or not path.is_file():
            have = (
                sorted(p.stem for p in self.folder.glob("*.json")) if self.folder.is_dir() else []
            )
            which = f"benchmark run {name!r}" if name else "benchmark run"
            raise InvalidInputError(
                f"no saved {which} for this machine in {self.folder} "
                f"(saved here: {', '.join(have) or 'none'}; "
                "save one with --gpu-benchmark-save=NAME)"
            )
        try:
            return rounds_from_doc(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidInputError(f"{path} is not a saved benchmark run: {e}") from None
