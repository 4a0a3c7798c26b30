"""``gpukeeper report``: who holds each device's memory (``memory_report``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, List, Union

from gpukeeper.cli.output import (
    OK,
    UserError,
    add_command,
    add_devices_option,
    add_json_option,
    check_json_target,
    console,
    write_json,
)

if TYPE_CHECKING:  # the CLI imports the report only when the command runs
    from gpukeeper.account.device_account import MemoryReport
    from gpukeeper.account.process_account import DevicesReport

__all__ = ["add_parser", "report_for", "reports_for"]

EXAMPLES = """examples:
  gpukeeper report                  every visible device, then their total
  gpukeeper report --device 1       one device
  gpukeeper report --json -         the report as JSON on stdout"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "report",
        help="who holds each device's memory",
        description="memory_report() for each device, then their total: used and free memory, the "
        "CUDA contexts, this process's frameworks and pools, and the other processes (NVML). Run "
        "from the command line it is a separate process, so its own frameworks hold "
        "nothing: what matters there is what the other processes hold.",
        epilog=EXAMPLES,
    )
    add_devices_option(p, "a CUDA ordinal, cuda:N, cpu")
    add_json_option(p, "write the report")
    p.add_argument(
        "--no-nvml", action="store_true", help="skip NVML (faster; no per-process split)"
    )
    p.set_defaults(func=run)


def report_for(device: str, use_nvml: bool = True) -> Union["DevicesReport", "MemoryReport"]:
    """What ``--device`` asks for: with ``all``, ``memory_report()`` (every device and
    their total, a ``DevicesReport``); else that device's ``MemoryReport``.
    ``UserError`` for a device that does not exist."""
    from gpukeeper.account.account_reader import memory_report

    if device == "all":
        return memory_report(use_nvml=use_nvml)
    return _one_device(device, use_nvml)


def reports_for(device: str, use_nvml: bool = True) -> List["MemoryReport"]:
    """The per-device reports ``--device`` asks for (one per device with ``all``), as
    ``gpukeeper watch`` shows them; ``UserError`` for a device that does not exist."""
    from gpukeeper.account.account_reader import memory_report

    if device == "all":
        return list(memory_report(use_nvml=use_nvml))
    return [_one_device(device, use_nvml)]


def _one_device(device: str, use_nvml: bool) -> "MemoryReport":
    from gpukeeper.account.account_reader import memory_report
    from gpukeeper.base.errors import InvalidInputError

    try:
        return memory_report(int(device) if device.isdigit() else device, use_nvml=use_nvml)
    except InvalidInputError as e:
        raise UserError(f"--device {device}: {e}") from None


def run(args: argparse.Namespace) -> int:
    check_json_target(args.json)
    report = report_for(args.device, use_nvml=not args.no_nvml)
    if args.json != "-":
        console().print(report.table(), markup=False, highlight=False)
    if args.json is not None:
        write_json(args.json, report.to_dict())
    return OK
