"""The ``gpukeeper`` command: ``check`` (the main job), ``info``, ``report``, ``watch``,
``timeit`` and ``compare``.

Every subcommand has a description and examples (``gpukeeper SUBCOMMAND --help``). A
user error (a bad option, device, file or path) is one line on stderr and exit code 2,
never a traceback; a closed pipe (``| head -1``) ends quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, NoReturn, Optional

from gpukeeper.cli import check_cmd, compare_cmd, info_cmd, report_cmd, timeit_cmd, watch_cmd
from gpukeeper.cli.output import EXIT_CODES, INTERRUPTED, PIPE_CLOSED, USAGE, UserError

__all__ = ["main", "parser"]

DESCRIPTION = """Keeps GPU memory and GPU time honest: checks the installation, shows who holds
each device, times GPU work and compares saved timings."""

EXAMPLES = """examples:
  gpukeeper check                   is this installation sound here? (exit 1 if not)
  gpukeeper info                    build, devices, driver, frameworks, NVML
  gpukeeper report --device 0       who holds device 0's memory
  gpukeeper watch                   a live view of every device (Ctrl-C ends it)
  gpukeeper timeit -s "import torch; a = torch.ones(1 << 20, device='cuda')" "a.sum()"
  gpukeeper compare base.json new.json --fail median:5%
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors as one line and exit code 2 (as argparse does),
    plus a hint to --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    """The whole command line."""
    from gpukeeper import __version__

    p = _Parser(
        prog="gpukeeper",
        description=DESCRIPTION,
        epilog=EXAMPLES + "\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"gpukeeper {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in (check_cmd, info_cmd, report_cmd, watch_cmd, timeit_cmd, compare_cmd):
        module.add_parser(sub)
    return p


def _quiet_stdout() -> None:
    # The reader left: later writes (and the interpreter's final flush) must not raise again.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``gpukeeper`` console script; returns the exit code."""
    from gpukeeper.base.errors import InvalidInputError

    args = parser().parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    except (UserError, InvalidInputError) as e:
        print(f"gpukeeper {args.command}: error: {e}", file=sys.stderr)
        return USAGE
    except BrokenPipeError:
        _quiet_stdout()
        return PIPE_CLOSED
    except KeyboardInterrupt:
        print(f"gpukeeper {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
