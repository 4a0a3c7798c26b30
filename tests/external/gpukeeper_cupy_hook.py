"""pytest plugin: runs a foreign test suite with CuPy allocating through gpukeeper.

    GPUKEEPER_CUPY_HOOK=1 python -m pytest -p gpukeeper_cupy_hook <cupy's tests>

(with this folder on PYTHONPATH). Without the variable it only records that the suite
ran on CuPy's own pool, so that both runs of scripts/cupy-suite.sh load the same plugins.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("GPUKEEPER_CUPY_HOOK") != "1":
        return
    import gpukeeper

    pool = gpukeeper.use_cupy_allocator()
    config._gpukeeper_pool = pool  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> str:
    on = os.environ.get("GPUKEEPER_CUPY_HOOK") == "1"
    return "cupy allocator: " + ("gpukeeper pool (use_cupy_allocator)" if on else "CuPy's own pool")


def pytest_unconfigure(config: pytest.Config) -> None:
    pool = getattr(config, "_gpukeeper_pool", None)
    if pool is None:
        return
    problems = {d: pool.validate(d) for d in pool.devices()}
    bad = {d: p for d, p in problems.items() if p}
    if bad:
        print(f"\ngpukeeper pool books inconsistent after the suite: {bad}")
