"""``gpukeeper check``: build, device and pool sanity, with a verdict and an exit code."""

from __future__ import annotations

import argparse
import sys

from gpukeeper.cli.output import (
    FAILED,
    OK,
    add_command,
    add_json_option,
    check_json_target,
    console,
    write_json,
)

__all__ = ["add_parser"]

EXAMPLES = """examples:
  gpukeeper check                      every check; exit code 1 when one fails
  gpukeeper check --require-gpu        fail on a machine where CUDA is unusable
  gpukeeper check --json result.json   also write the results as JSON
  gpukeeper check --json - | jq .      JSON on stdout (the lines go to stderr)"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "check",
        help="is this installation sound on this machine? (the main job)",
        description="Runs real work through the installation: allocations, copies, a round "
        "trip of data, the pool's books, typed errors on bad input, and on a GPU the "
        "timer's accuracy against calibration kernels. Without CUDA the host pool is "
        "checked and the verdict says the machine is in CPU mode.",
        epilog=EXAMPLES,
    )
    add_json_option(p, "also write the results")
    p.add_argument(
        "--require-gpu",
        action="store_true",
        help="fail when CUDA is unusable instead of checking CPU mode",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from gpukeeper.cli.install_check import run_checks

    check_json_target(args.json)
    # With JSON on stdout, the human lines go to stderr so that stdout stays parseable.
    out = console(sys.stderr if args.json == "-" else sys.stdout)
    results = []
    for result in run_checks(require_gpu=args.require_gpu):
        results.append(result)
        mark = "[green]ok  [/]" if result.ok else "[bold red]FAIL[/]"
        text = escape(f"{result.name:<14} {result.detail}")
        out.print(f"\\[{mark}] {text}  ({result.seconds * 1e3:.1f} ms)", markup=True)
    from gpukeeper.base.runtime import cuda_available

    failed = [r for r in results if not r.ok]
    verdict = "FAIL" if failed else "PASS"
    style = "bold red" if failed else "bold green"
    cuda = cuda_available()
    # The mode is part of the verdict: a PASS without CUDA checked the host pool only.
    mode = "gpu" if cuda else "cpu"
    where = "" if cuda else escape(f" in CPU mode: {cuda.reason.rstrip('.')}")
    out.print(
        f"gpukeeper check: [{style}]{verdict}[/]{where} ({len(results) - len(failed)}/"
        f"{len(results)} checks passed)",
        markup=True,
    )
    if args.json is not None:
        write_json(
            args.json,
            {
                "verdict": verdict,
                "mode": mode,
                "cuda": "" if cuda else cuda.reason,
                "checks": [r.to_dict() for r in results],
            },
        )
    return FAILED if failed else OK
