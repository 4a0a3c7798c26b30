"""``gpukeeper compare OLD.json NEW.json``: verdicts on saved benchmark results that
know the spread between processes, with an exit code for CI gates.

Each file is a run saved by the pytest plugin (``--gpu-benchmark-save``), with one or
more rounds (fresh processes) of each benchmark, or one ``BenchmarkResult.to_json()``
(one round). Results are matched by name; each pair gets a verdict (faster, slower,
same, undecided) from the change and the spread between the rounds
(:func:`gpukeeper.timing.compare_runs`, the function the pytest gate calls), so a change
within that spread fails nothing. With one round on each side the spread is unmeasured
and only a change beyond 2x is called.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

from gpukeeper.cli.output import (
    FAILED,
    OK,
    UserError,
    add_command,
    add_json_option,
    check_json_target,
    console,
    plain,
    write_json,
)

if TYPE_CHECKING:  # imported when the command runs: the CLI starts without the timing code
    from gpukeeper.timing.benchmark_result import BenchmarkResult

__all__ = ["add_parser", "load_results"]

EXAMPLES = """examples:
  gpukeeper compare base.json new.json                   verdicts on the medians
  gpukeeper compare base.json new.json --fail median:5%  exit 1 on a real slowdown > 5%
  gpukeeper compare a.json b.json --stat p95 --json -    the comparisons as JSON"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "compare",
        help="noise-aware verdicts on two saved benchmark runs",
        description=plain(__doc__.split("\n\n", 1)[1]),
        epilog=EXAMPLES,
    )
    p.add_argument("old", metavar="OLD.json")
    p.add_argument("new", metavar="NEW.json")
    p.add_argument(
        "--fail",
        metavar="STAT:PERCENT",
        help="exit 1 when a result is slower beyond the spread between processes and "
        "by more than this (median:5%%)",
    )
    p.add_argument(
        "--stat", default=None, help="the statistic compared (median by default, or --fail's)"
    )
    add_json_option(p, "write the comparisons")
    p.set_defaults(func=run)


def load_results(path: str) -> Dict[str, List[BenchmarkResult]]:
    """``{name: [round, ...]}`` (``BenchmarkResult`` objects) from a saved run or a single
    result (one round); ``UserError`` naming the file for anything else."""
    from gpukeeper.timing.benchmark_result import BenchmarkResult
    from gpukeeper.timing.store import rounds_from_doc

    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise UserError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UserError(f"{path}: not JSON ({e})") from None
    try:
        if isinstance(doc, dict) and isinstance(doc.get("benchmarks"), dict):
            return rounds_from_doc(doc)
        if isinstance(doc, dict) and "times_ms" in doc:
            result = BenchmarkResult.from_dict(doc)
            return {result.name or Path(path).stem: [result]}
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path}: not a saved benchmark result ({type(e).__name__}: {e})") from None
    raise UserError(
        f"{path}: not a saved benchmark run (--gpu-benchmark-save) nor a BenchmarkResult.to_json()"
    )


def run(args: argparse.Namespace) -> int:
    from gpukeeper.base.errors import InvalidInputError
    from gpukeeper.timing.regression import compare_runs, parse_fail_threshold, regression

    check_json_target(args.json)
    try:
        threshold = parse_fail_threshold(args.fail) if args.fail else None
    except InvalidInputError as e:
        raise UserError(f"--fail: {e}") from None
    stat = args.stat or (threshold.stat if threshold else "median")
    old, new = load_results(args.old), load_results(args.new)
    common = [k for k in new if k in old]
    if not common:
        raise UserError(f"{args.old} and {args.new} share no benchmark name")
    try:
        comparisons = [compare_runs(old[k], new[k], stat, threshold=threshold) for k in common]
    except InvalidInputError as e:
        raise UserError(str(e)) from None
    regressions = [c for c in comparisons if regression(c, threshold)]
    if args.json != "-":
        _print(
            comparisons,
            regressions,
            [k for k in old if k not in new],
            [k for k in new if k not in old],
        )
    if args.json is not None:
        write_json(
            args.json,
            {
                "stat": stat,
                "fail": args.fail,
                "comparisons": [
                    {**dataclasses.asdict(c), "detectable": c.detectable} for c in comparisons
                ],
                "regressions": [c.name for c in regressions],
            },
        )
    return FAILED if regressions else OK


#: Below this many columns the comparisons print as blocks, not as a table.
_TABLE_WIDTH = 120


def _print(comparisons: List, regressions: List, only_old: List[str], only_new: List[str]) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = console()
    colours = {"slower": "red", "faster": "green"}
    ordered = sorted(comparisons, key=lambda c: -c.ratio)

    def verdict_of(c: Any) -> str:
        return f"[{colours[c.verdict]}]{c.verdict}[/]" if c.verdict in colours else c.verdict

    if out.width < _TABLE_WIDTH:
        # A table of eight columns cut every name and interval short in 80 columns: one
        # block per benchmark instead, its name whole on a line of its own.
        for c in ordered:
            out.print(c.name, soft_wrap=True, markup=False, highlight=False)
            out.print(
                f"  {verdict_of(c)}  {c.baseline_ms:.4g} -> {c.current_ms:.4g} ms  "
                f"{c.change:+.1%} (99% {c.ratio_low - 1:+.1%}..{c.ratio_high - 1:+.1%})  "
                f"spread {escape(c.spread_text())}  could detect ±{c.detectable:.1%}"
            )
    else:
        table = Table(show_edge=False)
        left = ("benchmark", "verdict", "spread between processes")
        for column in (
            "benchmark",
            "verdict",
            "old ms",
            "new ms",
            "change",
            "99% interval",
            "spread between processes",
            "could detect",
        ):
            table.add_column(column, justify="left" if column in left else "right")
        for c in ordered:
            table.add_row(
                escape(c.name),
                verdict_of(c),
                f"{c.baseline_ms:.4g}",
                f"{c.current_ms:.4g}",
                f"{c.change:+.1%}",
                f"{c.ratio_low - 1:+.1%}..{c.ratio_high - 1:+.1%}",
                c.spread_text(),
                f"±{c.detectable:.1%}",
            )
        out.print(table)
    if any(c.spread is None for c in comparisons):
        out.print(
            "spread unmeasured: one round on each side, so only a change beyond 2x is called; "
            "save several rounds (pytest --gpu-benchmark-rounds=K) to measure it",
            markup=False,
        )
    for label, names in (("only in OLD", only_old), ("only in NEW", only_new)):
        if names:
            out.print(f"{label}: {', '.join(names)}", markup=False)
    if regressions:
        out.print(
            f"[bold red]{len(regressions)} regression(s)[/] past the threshold: "
            + escape(", ".join(c.name for c in regressions))
        )
