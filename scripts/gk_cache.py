"""The per-user cache folder the build scripts keep what they fetch in (torch headers, CUDA
runtimes): ${GPUKEEPER_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/gpukeeper}/<kind>."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(kind: str) -> Path:
    """The cache folder for ``kind`` ("torch-headers", "cuda-runtime")."""
    base = os.environ.get("GPUKEEPER_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "gpukeeper")
    return Path(base) / kind
