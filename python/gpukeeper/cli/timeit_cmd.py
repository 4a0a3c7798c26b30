"""``gpukeeper timeit``: ``python -m timeit`` for GPU work, with ``benchmark_function``'s
defaults (warm-up, events around each call on a GPU, the launch floor subtracted)."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any, Callable, Dict, Tuple

from gpukeeper.base.statements import Statement, compile_statement, describe_exception
from gpukeeper.cli.output import (
    OK,
    UserError,
    add_command,
    add_json_option,
    check_json_target,
    console,
    count_arg,
    device_arg,
    plain,
    write_json,
)

__all__ = ["add_parser", "prepare"]

EXAMPLES = """examples:
  gpukeeper timeit -s "import torch; a = torch.randn(4096, 4096, device='cuda')" "a @ a"
  gpukeeper timeit -n 1000 -s "import cupy; x = cupy.ones(1 << 20)" "x.sum()"
  gpukeeper timeit -d cpu "sum(range(1000))"
Several STMT arguments (and several -s) are lines of one statement, as with python -m timeit."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "timeit",
        help="time a statement on the GPU (python -m timeit for GPU work)",
        description=plain(__doc__),
        epilog=EXAMPLES,
    )
    p.add_argument("statement", nargs="+", metavar="STMT", help="the statement to time")
    p.add_argument(
        "-s",
        "--setup",
        action="append",
        default=[],
        metavar="SETUP",
        help="run once before timing (repeatable)",
    )
    p.add_argument(
        "-n", "--number", type=count_arg(1), default=100, metavar="N", help="measured calls (100)"
    )
    p.add_argument(
        "-w",
        "--warmup",
        type=count_arg(0),
        default=10,
        metavar="W",
        help="calls before measuring (10)",
    )
    p.add_argument(
        "-d",
        "--device",
        default=None,
        type=device_arg(allow_all=False),
        help="cuda:N, N or cpu (default: CUDA when the setup "
        "made a framework use it, else the CPU)",
    )
    p.add_argument(
        "--no-flush", action="store_true", help="do not flush the L2 cache between calls"
    )
    p.add_argument(
        "--device-time",
        action="store_true",
        help="lead with the device time (the GPU work alone, launch hidden) instead of the "
        "loop time (calls back to back, as a loop sees them)",
    )
    add_json_option(p, "write the BenchmarkResult")
    p.set_defaults(func=run)


def prepare(statement: str, setup: str) -> Tuple[Statement, Callable[[], Any]]:
    """Runs ``setup`` in a fresh namespace and returns the compiled ``statement`` with
    a function of no arguments that runs it in that same namespace, as module-level
    code: it reads and rebinds the names the setup made (``-s "x = 0" "x += 1"``), and
    returns its final expression's value, so that the benchmark sees a JAX array or a
    tensor as the call's result. ``UserError`` for code that is not Python, a statement
    with nothing to run, or a setup that raises."""
    namespace: Dict[str, Any] = {"__name__": "__gpukeeper_timeit__"}
    setup_code = _compiled("setup", setup, "<setup>")
    timed = _compiled("statement", statement, "<stmt>")
    if timed.empty:
        raise UserError("no statement to time")
    try:
        setup_code.function(namespace)()
    except Exception as e:
        raise UserError(f"the setup raised {describe_exception(e)}") from None
    return timed, timed.function(namespace)


def _compiled(what: str, source: str, filename: str) -> Statement:
    try:
        return compile_statement(textwrap.dedent(source), filename)
    except SyntaxError as e:
        where = f"line {e.lineno}: {e.text.strip()}" if e.text else f"line {e.lineno}"
        raise UserError(f"the {what} is not Python: {e.msg} ({where})") from None


def run(args: argparse.Namespace) -> int:
    from gpukeeper.base.errors import InvalidInputError
    from gpukeeper.timing import benchmark_function, timing_device

    check_json_target(args.json)
    timed, fn = prepare("\n".join(args.statement), "\n".join(args.setup))
    try:
        device = (
            args.device if args.device is None or not args.device.isdigit() else int(args.device)
        )
        on_gpu = timing_device(device).is_cuda
        result = benchmark_function(
            fn,
            n_calls=args.number,
            warmup=args.warmup,
            device=device,
            l2_flush=on_gpu and not args.no_flush,
            name=" ; ".join(args.statement),
            measure="device" if args.device_time else "loop",
        )
    except Exception as e:
        # The statement's own exception is the user's mistake, whatever its type; an
        # InvalidInputError from outside it is a bad option. Anything else is ours.
        if timed.raised(e):
            raise UserError(f"the statement raised {describe_exception(e)}") from None
        if isinstance(e, InvalidInputError):
            raise UserError(str(e)) from None
        raise
    if args.json != "-":
        console().print(result.summary(), markup=False, highlight=False)
    if args.json is not None:
        write_json(args.json, result.to_dict())
    return OK
