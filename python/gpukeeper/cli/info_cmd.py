"""``gpukeeper info``: build, devices, driver, frameworks and NVML, as a table or as the
environment export (``--json``: devices, driver and library versions)."""

from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata
from typing import Any, Dict, List

from gpukeeper import frameworks
from gpukeeper.cli.output import (
    OK,
    add_command,
    add_json_option,
    check_json_target,
    console,
    write_json,
)

__all__ = ["add_parser", "environment"]

EXAMPLES = """examples:
  gpukeeper info                           a table
  gpukeeper info --json gpu_specs.json     the environment export (devices, driver, versions)
  gpukeeper info --json -                  the same on stdout"""

#: Distributions whose versions the export lists: read from their metadata, never imported
#: (importing torch takes seconds, and CuPy's import may touch the driver). The
#: frameworks' come from their adapters.
FRAMEWORKS = frameworks.distributions() + (
    "nvidia-ml-py",
    "numpy",
    "triton",
    "openmm",
    "rmm-cu13",
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "info",
        help="build, devices, driver, frameworks and NVML",
        description="What gpukeeper sees on this machine, without creating a CUDA context: how "
        "the core was built, whether CUDA is usable (and why not), each device's "
        "specifications, the installed frameworks and whether NVML answers.",
        epilog=EXAMPLES,
    )
    add_json_option(p, "write the environment export")
    p.add_argument("--export-json", metavar="FILE", help=argparse.SUPPRESS)  # the older spelling
    p.set_defaults(func=run)


def _versions() -> Dict[str, str]:
    found = {}
    for name in FRAMEWORKS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def environment() -> Dict[str, Any]:
    """The environment export: build, CUDA status, devices, host, frameworks, NVML."""
    import gpukeeper._core as _core
    from gpukeeper.account.device_utils import get_gpu_info
    from gpukeeper.base.nvml import nvml_status
    from gpukeeper.base.runtime import build_info, cuda_available

    status = cuda_available()
    devices: List[Dict[str, Any]] = [get_gpu_info(d) for d in range(status.device_count)]
    host_free, host_total = _core.host_memory_info()
    return {
        "build": build_info(),
        "cuda": {
            "available": bool(status.available),
            "device_count": status.device_count,
            "driver_version": status.driver_version,
            "runtime_version": status.runtime_version,
            "reason": status.reason or None,
        },
        "devices": devices,
        "host": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "available_bytes": host_free,
            "total_bytes": host_total,
        },
        "frameworks": _versions(),
        "nvml": nvml_status(),
    }


def _table(info: Dict[str, Any]) -> Any:
    from rich.table import Table

    from gpukeeper.base.byte_figures import fmt_bytes

    table = Table(title="gpukeeper info", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    build = info["build"]
    table.add_row(
        "gpukeeper",
        f"{build.get('version')} ({build.get('build_type')}, "
        f"{'CUDA ' + str(build.get('cuda_version')) if build.get('cuda') else 'CPU-only build'})",
    )
    cuda = info["cuda"]
    table.add_row(
        "CUDA",
        f"{cuda['device_count']} device(s)" if cuda["available"] else f"unusable: {cuda['reason']}",
    )
    for d in info["devices"]:
        table.add_row(
            f"cuda:{d.get('device')}",
            f"{d.get('name')}, {fmt_bytes(d.get('total_memory_bytes'))}, "
            f"compute {d.get('compute_capability')}, driver {d.get('driver_version')}",
        )
    host = info["host"]
    table.add_row(
        "host",
        f"{host['platform']}, Python {host['python']}, {fmt_bytes(host['total_bytes'])} memory",
    )
    table.add_row(
        "frameworks", ", ".join(f"{k} {v}" for k, v in info["frameworks"].items()) or "none"
    )
    table.add_row("NVML", info["nvml"])
    return table


def run(args: argparse.Namespace) -> int:
    target = args.json if args.json is not None else args.export_json
    check_json_target(target)
    info = environment()
    if target != "-":
        console().print(_table(info))
    if target is not None:
        write_json(target, info)
        if target != "-":
            print(f"environment written to {target}", file=sys.stderr)
    return OK
