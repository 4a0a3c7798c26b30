"""The ``gpukeeper`` command: ``check`` (the main job) and ``info``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

__all__ = ["main"]


def _cmd_check(args: argparse.Namespace) -> int:
    from gpukeeper.check import run_checks

    results = []
    for result in run_checks(require_gpu=args.require_gpu):
        results.append(result)
        mark = "ok  " if result.ok else "FAIL"
        print(f"[{mark}] {result.name:<14} {result.detail}  ({result.seconds * 1e3:.1f} ms)")
    failed = [r for r in results if not r.ok]
    verdict = "FAIL" if failed else "PASS"
    print(f"gpukeeper check: {verdict} ({len(results) - len(failed)}/{len(results)} checks passed)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"verdict": verdict, "checks": [r.to_dict() for r in results]}, fh, indent=2)
    return 1 if failed else 0


def _cmd_info(args: argparse.Namespace) -> int:
    from gpukeeper import _core
    from gpukeeper.runtime import build_info, cuda_available

    status = cuda_available()
    info = {"build": build_info(), "cuda": {
        "available": status.available, "device_count": status.device_count,
        "driver_version": status.driver_version, "runtime_version": status.runtime_version,
        "reason": status.reason}, "devices": []}
    for device in range(status.device_count):
        free, total = _core.device_memory_info(device)
        info["devices"].append({"id": device, "free_bytes": free, "total_bytes": total})
    host_free, host_total = _core.host_memory_info()
    info["host"] = {"available_bytes": host_free, "total_bytes": host_total}
    if args.export_json:
        with open(args.export_json, "w") as fh:
            json.dump(info, fh, indent=2)
    print(json.dumps(info, indent=2))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``gpukeeper`` console script; returns the exit code."""
    parser = argparse.ArgumentParser(prog="gpukeeper", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="build, device and pool sanity, with a verdict")
    check.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    check.add_argument("--require-gpu", action="store_true",
                       help="fail when CUDA is unavailable instead of checking CPU mode")
    check.set_defaults(func=_cmd_check)
    info = sub.add_parser("info", help="build and device information")
    info.add_argument("--export-json", metavar="FILE", help="write the information as JSON")
    info.set_defaults(func=_cmd_info)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
