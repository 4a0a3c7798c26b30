"""``gpukeeper timeit``: ``python -m timeit`` for GPU work, with ``benchmark_function``'s
defaults (warm-up, events around each call on a GPU, the launch floor subtracted)."""

from __future__ import annotations

import argparse
import ast
import textwrap
from typing import Any, Callable, Dict, List

from gpukeeper.cli.output import (
    OK, UserError, add_command, add_json_option, check_json_target, console, plain, write_json,
)

__all__ = ["add_parser", "compile_statement"]

EXAMPLES = """examples:
  gpukeeper timeit -s "import torch; a = torch.randn(4096, 4096, device='cuda')" "a @ a"
  gpukeeper timeit -n 1000 -s "import cupy; x = cupy.ones(1 << 20)" "x.sum()"
  gpukeeper timeit -d cpu "sum(range(1000))"
Several STMT arguments (and several -s) are lines of one statement, as with python -m timeit."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "timeit", help="time a statement on the GPU (python -m timeit for GPU work)",
        description=plain(__doc__),
        epilog=EXAMPLES)
    p.add_argument("statement", nargs="+", metavar="STMT", help="the statement to time")
    p.add_argument("-s", "--setup", action="append", default=[], metavar="SETUP",
                   help="run once before timing (repeatable)")
    p.add_argument("-n", "--number", type=int, default=100, metavar="N", help="measured calls (100)")
    p.add_argument("-w", "--warmup", type=int, default=10, metavar="W", help="calls before measuring (10)")
    p.add_argument("-d", "--device", default=None, help="cuda:N, N or cpu (default: CUDA when the setup "
                                                        "made a framework use it, else the CPU)")
    p.add_argument("--no-flush", action="store_true", help="do not flush the L2 cache between calls")
    add_json_option(p, "write the BenchmarkResult")
    p.set_defaults(func=run)


def compile_statement(statement: str, setup: str) -> Callable[[], Any]:
    """Runs ``setup`` in a fresh namespace and returns a function of no arguments that
    runs ``statement`` there (returning its last expression's value, so that the
    benchmark sees a JAX array or a tensor as the call's result). ``UserError`` for
    code that is not Python or a setup that raises."""
    namespace: Dict[str, Any] = {"__name__": "__gpukeeper_timeit__"}
    try:
        body: List[ast.stmt] = ast.parse(textwrap.dedent(statement)).body
        setup_code = compile(textwrap.dedent(setup), "<setup>", "exec")
    except SyntaxError as e:
        raise UserError(f"not Python: {e.msg} ({e.text.strip() if e.text else ''})") from None
    if not body:
        raise UserError("no statement to time")
    if isinstance(body[-1], ast.Expr):
        body[-1] = ast.copy_location(ast.Return(value=body[-1].value), body[-1])
    module = ast.parse("def __timed():\n    pass\n")  # a template: FunctionDef's fields vary by version
    module.body[0].body = body  # type: ignore[attr-defined]
    module = ast.fix_missing_locations(module)
    try:
        exec(setup_code, namespace)
    except Exception as e:
        raise UserError(f"the setup raised {type(e).__name__}: {e}") from None
    exec(compile(module, "<stmt>", "exec"), namespace)
    return namespace["__timed"]


def run(args: argparse.Namespace) -> int:
    from gpukeeper.errors import InvalidInputError
    from gpukeeper.timing import benchmark_function, timing_device

    check_json_target(args.json)
    fn = compile_statement("\n".join(args.statement), "\n".join(args.setup))
    try:
        device = args.device if args.device is None or not args.device.isdigit() else int(args.device)
        on_gpu = timing_device(device).is_cuda
        result = benchmark_function(fn, n_calls=args.number, warmup=args.warmup, device=device,
                                    l2_flush=on_gpu and not args.no_flush,
                                    name=" ; ".join(args.statement))
    except InvalidInputError as e:
        raise UserError(str(e)) from None
    if args.json != "-":
        console().print(result.summary(), markup=False, highlight=False)
    if args.json is not None:
        write_json(args.json, result.to_dict())
    return OK
