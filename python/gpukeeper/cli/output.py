"""Where the command line writes: the terminal (rich, colour only on a tty and never
with ``NO_COLOR``), JSON to a file or to stdout (``-``), and the one-line user errors.

Exit codes, the same for every subcommand (also in ``gpukeeper --help``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

__all__ = [
    "EXIT_CODES",
    "plain",
    "FAILED",
    "INTERRUPTED",
    "OK",
    "PIPE_CLOSED",
    "USAGE",
    "UserError",
    "check_json_target",
    "console",
    "write_json",
]

OK = 0
#: A check failed, or ``compare`` found a regression past ``--fail``.
FAILED = 1
#: A user error: bad option, device, file or path (one line on stderr, no traceback).
USAGE = 2
INTERRUPTED = 130
#: The reader of the output went away (``gpukeeper check | head -1``): 128 + SIGPIPE.
PIPE_CLOSED = 141

EXIT_CODES = f"""exit codes:
  {OK}    success
  {FAILED}    a check failed, or compare found a regression past --fail
  {USAGE}    usage error: a bad option, device, file or path (a one-line message)
  {INTERRUPTED}  interrupted (Ctrl-C)
  {PIPE_CLOSED}  the output was closed early (e.g. | head); nothing is printed about it"""


def plain(docstring: str) -> str:
    """A docstring's paragraphs as --help text: RST roles and literals become plain words."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", docstring)
    return text.replace("``", "").strip()


class UserError(Exception):
    """A mistake in what the user asked for: printed as one line, exit code 2."""


def console(stream: Optional[TextIO] = None) -> Any:
    """A rich Console on ``stream`` (stdout): colour and styles only on a terminal, none
    with ``NO_COLOR`` set (rich reads it). Off a terminal (CI logs, pipes, files) nothing
    is wrapped or cut: tables are as wide as their content, so test names stay whole; the
    80 columns rich assumes there would cut them."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich would exit 1 here; main() turns this into the documented quiet 141.
            self.quiet = True
            raise BrokenPipeError

    stream = stream or sys.stdout
    tty = stream.isatty()
    extra: dict = {} if tty or os.environ.get("COLUMNS") else {"width": _UNBOUNDED}
    if os.environ.get("NO_COLOR"):  # no-color.org: and no bold either, whatever FORCE_COLOR says
        extra.update(color_system=None, no_color=True)
    return _Console(file=stream, highlight=False, soft_wrap=not tty, **extra)


# The width of a console off a terminal: wider than any line the commands print, so that a
# table takes its content's width.
_UNBOUNDED = 10_000


def add_command(
    sub: Any, name: str, *, help: str, description: str, epilog: str
) -> argparse.ArgumentParser:
    """A subcommand's parser: its one-line help, its description, and its examples kept
    as written (the epilog)."""
    return sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def count_arg(minimum: int) -> Callable[[str], int]:
    """An argparse type for a whole number of at least ``minimum`` (argparse names the flag
    in front of its errors)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def device_arg(allow_all: bool) -> Callable[[str], str]:
    """An argparse type for a device as the command line spells it: ``N``, ``cuda:N``,
    ``cuda``, ``cpu`` (and ``all`` where every device is meant)."""
    words = "N, cuda:N, cuda, cpu or all" if allow_all else "N, cuda:N, cuda or cpu"

    def parse(text: str) -> str:
        t = text.strip().lower()
        if (
            t in ("cpu", "cuda")
            or (allow_all and t == "all")
            or t.isdigit()
            or (t.startswith("cuda:") and t[5:].isdigit())
        ):
            return t
        raise argparse.ArgumentTypeError(f"takes {words}, got {text!r}")

    return parse


def add_devices_option(parser: argparse.ArgumentParser, spellings: str) -> None:
    """Adds ``--device N|all``: one device, or every one (the default); ``spellings``
    starts its help with the spellings the command takes ("a CUDA ordinal, cuda:N")."""
    parser.add_argument(
        "--device",
        default="all",
        metavar="N|all",
        type=device_arg(allow_all=True),
        help=f"{spellings}, or all (the default)",
    )


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    """Adds ``--json [FILE|-]`` (``-``, stdout, when no FILE is given); ``what`` starts
    its help, e.g. "write the reports"."""
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE|-",
        help=f"{what} as JSON to FILE, or to stdout with - (the default)",
    )


def check_json_target(target: Optional[str]) -> None:
    """Fails early (``UserError``) when ``--json FILE`` could not be written, before any
    work is done; ``-`` (stdout) and None always pass."""
    if target is None or target == "-":
        return
    path = Path(target)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UserError(f"--json {target}: is a directory")
    if not parent.is_dir():
        raise UserError(f"--json {target}: no such directory {str(parent)!r}")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"--json {target}: not writable")


def write_json(target: str, data: Any) -> None:
    """``data`` as indented JSON to ``target`` (a path, or ``-`` for stdout)."""
    text = json.dumps(data, indent=2, default=str) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(target).write_text(text)
    except OSError as e:
        raise UserError(f"--json {target}: {e.strerror or e}") from None
