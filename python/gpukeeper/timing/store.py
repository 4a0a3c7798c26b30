"""Saved benchmark runs, per machine: ``<root>/<machine>/<name>.json``.

A machine is named by what decides its timings: the GPU (name and driver) or the CPU
model, and the Python version, e.g. ``NVIDIA-H100-80GB-HBM3-drv580.159.04-py3.12``. Runs
saved on one machine are compared only with runs of that machine. A file holds
``{"machine": {...}, "saved_at": ISO time, "name": ..., "benchmarks": {key:
BenchmarkResult.to_dict()}}``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

from gpukeeper.device import get_gpu_info
from gpukeeper.errors import InvalidInputError
from gpukeeper.timing.result import BenchmarkResult

__all__ = ["DEFAULT_ROOT", "RunStore", "machine_info", "machine_key"]

#: Where runs are saved, relative to the directory pytest runs in.
DEFAULT_ROOT = Path(".gpukeeper") / "benchmarks"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


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
                f"a saved run's name is letters, digits, '.', '_' and '-' (at most 100), got {name!r}")
        return name

    def save(self, name: str, results: Dict[str, BenchmarkResult]) -> Path:
        """Writes ``results`` as run ``name`` (replacing one of that name); the path.
        Written to a temporary file first, so an interrupted save loses no older run."""
        path = self.folder / f"{self.check_name(name)}.json"
        self.folder.mkdir(parents=True, exist_ok=True)
        doc = {
            "machine": self.machine,
            "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "name": name,
            "benchmarks": {key: r.to_dict() for key, r in results.items()},
        }
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".json", dir=self.folder)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
        return path

    def latest(self) -> Optional[str]:
        """The name of the run saved last on this machine, or None."""
        runs = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if self.folder.is_dir() else []
        return runs[-1].stem if runs else None

    def load(self, name: Optional[str] = None) -> Dict[str, BenchmarkResult]:
        """Run ``name`` (None: the latest) as ``{key: BenchmarkResult}``.
        ``InvalidInputError`` when there is none, naming what there is."""
        name = self.latest() if name is None else self.check_name(name)
        path = self.folder / f"{name}.json" if name else None
        if path is None or not path.is_file():
            have = sorted(p.stem for p in self.folder.glob("*.json")) if self.folder.is_dir() else []
            raise InvalidInputError(
                f"no saved benchmark run {name!r} for this machine in {self.folder} "
                f"(saved here: {', '.join(have) or 'none'}; save one with --gpu-benchmark-save=NAME)")
        try:
            doc = json.loads(path.read_text())
            return {key: BenchmarkResult.from_dict(d) for key, d in doc["benchmarks"].items()}
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidInputError(f"{path} is not a saved benchmark run: {e}") from None
