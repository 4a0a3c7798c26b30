"""``gpukeeper watch``: a live view of each device, refreshed every few seconds.

Per device: used and total memory, and who holds it: every process NVML lists (PID,
name, bytes), this process's frameworks and pools (when the view runs inside a Python
process that uses them, through :func:`watch`), the CUDA contexts, and what no process
accounts for (other containers, the driver's reserve), which nvitop does not show.
On a terminal it redraws in place; piped, it prints one snapshot per refresh. Ctrl-C
ends it cleanly (exit code 0).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, List, Optional

from gpukeeper.cli.output import (
    OK,
    UserError,
    add_command,
    add_devices_option,
    console,
    count_arg,
    plain,
)

__all__ = ["add_parser", "snapshot", "watch"]

EXAMPLES = """examples:
  gpukeeper watch                  every device, every 2 s, until Ctrl-C
  gpukeeper watch --interval 0.5   faster
  gpukeeper watch --count 3 | cat  three snapshots as plain text, then exit"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "watch",
        help="a live view of each device's memory, by process, framework and context",
        description=plain(__doc__.split("\n\n", 1)[1]),
        epilog=EXAMPLES,
    )
    p.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="seconds between refreshes (2)"
    )
    add_devices_option(p, "a CUDA ordinal, cuda:N")
    p.add_argument(
        "--count", type=count_arg(1), default=None, metavar="K", help="stop after K refreshes"
    )
    p.set_defaults(func=run)


def _bytes(n: Optional[int]) -> str:
    from gpukeeper.base.byte_figures import fmt_bytes

    return fmt_bytes(n)


def _device_table(report: Any) -> Any:
    from rich.markup import escape
    from rich.table import Table

    where = "host (CPU mode)" if report.device is None else f"cuda:{report.device}"
    share = report.used_bytes / report.total_bytes if report.total_bytes else 0.0
    table = Table(
        title=escape(
            f"{where}  {report.name}  {_bytes(report.used_bytes)} / "
            f"{_bytes(report.total_bytes)} used ({share:.0%})"
        ),
        title_justify="left",
        show_edge=False,
        expand=False,
    )
    table.add_column("holder", justify="left")
    table.add_column("what", justify="left")
    table.add_column("bytes", justify="right")
    for name, mem in report.frameworks.items():
        table.add_row(
            "this process",
            escape(f"{name} (allocated / reserved)"),
            f"{_bytes(mem.allocated)} / {_bytes(mem.reserved)}",
        )
    if report.device is None:
        # CPU mode: device memory cannot be watched; what this process holds on the host can.
        from gpukeeper.base.host_memory import current_rss_bytes
        from gpukeeper.base.runtime import cuda_available

        table.add_row("this process", "resident memory (RSS)", _bytes(current_rss_bytes()))
        table.caption = escape(f"no CUDA device to watch: {cuda_available().reason.rstrip('.')}")
        table.caption_justify = "left"
        return table
    for proc in sorted(report.other_processes, key=lambda p: -(p.used_bytes or 0)):
        table.add_row(
            f"pid {proc.pid}",
            escape(proc.name or "(not visible from here)"),
            _bytes(proc.used_bytes),
        )
    table.add_row(
        "contexts",
        "CUDA contexts and libraries of this process",
        _bytes(report.context_and_libraries_bytes),
    )
    table.add_row(
        "unaccounted",
        "no listed process (other containers, driver reserve)",
        _bytes(report.unaccounted_bytes),
    )
    return table


def snapshot(device: str = "all") -> List[Any]:
    """One rich renderable per device: the tables of one refresh."""
    from gpukeeper.cli.report_cmd import reports_for

    return [_device_table(r) for r in reports_for(device)]


def watch(
    interval: float = 2.0, device: str = "all", count: Optional[int] = None, out: Any = None
) -> int:
    """Shows the view until Ctrl-C (or ``count`` refreshes); returns the exit code.
    Called inside a Python process, its frameworks and pools appear in the view."""
    from rich.console import Group
    from rich.live import Live

    if not (interval > 0):
        raise UserError(f"--interval must be a number of seconds > 0, got {interval}")
    if count is not None and count < 1:
        raise UserError(f"--count must be >= 1, got {count}")
    out = out or console()
    done = 0
    try:
        if out.is_terminal:
            with Live(
                Group(*snapshot(device)), console=out, auto_refresh=False, transient=False
            ) as live:
                while True:
                    done += 1
                    if count is not None and done >= count:
                        break
                    time.sleep(interval)
                    live.update(Group(*snapshot(device)), refresh=True)
        else:
            while count is None or done < count:
                if done:
                    time.sleep(interval)
                out.print(time.strftime("%H:%M:%S"), *snapshot(device))
                done += 1
    except KeyboardInterrupt:
        pass  # the way to stop a watch: not an error
    return OK


def run(args: argparse.Namespace) -> int:
    return watch(args.interval, args.device, args.count)
