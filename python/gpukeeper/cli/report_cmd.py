"""``gpukeeper report``: who holds each device's memory (``memory_report``)."""

from __future__ import annotations

import argparse

from gpukeeper.cli.output import (
    OK, UserError, add_command, add_json_option, check_json_target, console, write_json,
)

__all__ = ["add_parser", "reports_for"]

EXAMPLES = """examples:
  gpukeeper report                  every visible device
  gpukeeper report --device 1       one device
  gpukeeper report --json -         the reports as JSON on stdout"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "report", help="who holds each device's memory",
        description="memory_report() for each device: used and free memory, the CUDA contexts, "
                    "this process's frameworks and pools, and the other processes (NVML). Run "
                    "from the command line it is a separate process, so its own frameworks hold "
                    "nothing: the other processes' figures are the news.",
        epilog=EXAMPLES)
    p.add_argument("--device", default="all", metavar="N|all",
                   help="a CUDA ordinal, cuda:N, cpu, or all (the default)")
    add_json_option(p, "write the reports")
    p.add_argument("--no-nvml", action="store_true", help="skip NVML (faster; no per-process split)")
    p.set_defaults(func=run)


def reports_for(device: str, use_nvml: bool = True) -> list:
    """The reports ``--device`` asks for; ``UserError`` for a device that does not exist."""
    from gpukeeper.errors import InvalidInputError
    from gpukeeper.report import memory_report, memory_reports

    if device == "all":
        return memory_reports(use_nvml=use_nvml)
    try:
        return [memory_report(int(device) if device.isdigit() else device, use_nvml=use_nvml)]
    except InvalidInputError as e:
        raise UserError(f"--device {device}: {e}") from None


def run(args: argparse.Namespace) -> int:
    check_json_target(args.json)
    reports = reports_for(args.device, use_nvml=not args.no_nvml)
    if args.json != "-":
        out = console()
        for i, report in enumerate(reports):
            if i:
                out.print()
            out.print(report.table(), markup=False, highlight=False)
    if args.json is not None:
        write_json(args.json, [r.to_dict() for r in reports])
    return OK
