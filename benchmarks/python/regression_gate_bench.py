"""How often the benchmark regression gate cries wolf, and how often it catches a real
slowdown, measured on results from fresh processes.

Each process is a fresh Python that runs ``gpukeeper.benchmark_function`` on one workload
and writes its ``BenchmarkResult`` JSON: "A/A" processes run the unchanged workload,
"planted" processes run it slowed by a known fraction (extra work proportional to the
call: more loop iterations, more tiny kernels, or a matmul whose inner dimension is that
much longer). Processes
run one after another, A/A and planted interleaved, so that a drift of the machine over
the run touches both alike.

Trials are then formed from these processes, each with the gate's own verdict
(``compare_runs`` with ``--fail``'s threshold, as ``pytest --gpu-benchmark-compare-fail``
and ``gpukeeper compare`` decide):

- A/A: baseline = k rounds from distinct A/A processes, current = another A/A process.
  A "slower" verdict past the threshold is a false alarm.
- planted: baseline = k A/A rounds, current = one planted process. "slower" past the
  threshold is a detection.

Processes are reused across trials (trials are drawn at random, seeded), but no trial
has the same process in its baseline and as its current run.

    python benchmarks/python/regression_gate_bench.py                 # CPU rows, a few minutes
    python benchmarks/python/regression_gate_bench.py --aa 60 --planted 12 --trials 400 --json out.json

With torch seeing CUDA the same is done for a CUDA matmul (device-bound) and 20 tiny
kernels a call (launch-bound): the GPU rows. Beside each verdict of the gate stands asv's
rule applied to the same calls (a Mann-Whitney U test at p < 0.002 and a 1.1 factor).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import environment, try_import  # noqa: E402

WORKLOADS = ("matmul", "launch", "python")
# asv's rule, applied to the same calls: a change is reported when the Mann-Whitney U test
# gives p < 0.002 and the medians differ by more than a factor of 1.1.
ASV_P = 0.002
ASV_FACTOR = 1.1


# --------------------------------------------------------------------- one process


def _child(args: argparse.Namespace) -> None:
    import gpukeeper

    fn = _workload(args.workload, args.device, args.slowdown)
    result = gpukeeper.benchmark_function(fn, n_calls=args.calls, warmup=args.warmup,
                                          device=args.device, name=f"{args.workload}-{args.device}")
    Path(args.child).write_text(result.to_json())


def _workload(name: str, device: str, slowdown: float) -> Any:
    if name == "python":
        n = 20_000
        extra = int(round(n * slowdown))

        def loop() -> int:
            total = 0
            for i in range(n + extra):
                total += i
            return total

        return loop
    import torch

    if name == "launch":
        # Launch-bound: 20 tiny kernels a call; a slowdown adds kernels in proportion.
        x = torch.zeros(256, device=device)
        count = 20 + int(round(20 * slowdown))

        def launch() -> Any:
            for _ in range(count):
                x.add_(1.0)
            return x

        return launch
    size = 1024 if device == "cuda" else 256
    # One matmul whose inner dimension is longer by the slowdown: the work grows in
    # proportion in a single kernel, in steps of the kernel's K tile (32-64), far finer
    # than its output tiles (a second kernel for the extra would add its launch as well).
    inner = size + int(round(size * slowdown))
    a = torch.randn(size, inner, device=device)
    b = torch.randn(inner, size, device=device)

    def matmul() -> Any:
        return a @ b

    return matmul


# --------------------------------------------------------------------- the processes


def _run_processes(workload: str, device: str, aa: int, planted: Dict[float, int], calls: int,
                   warmup: int, folder: Path, progress: Any) -> Dict[float, List[Any]]:
    """``{slowdown: [BenchmarkResult, ...]}``, slowdown 0.0 for A/A, one result per process."""
    from gpukeeper.timing.benchmark_result import BenchmarkResult

    queue: List[float] = [0.0] * aa
    for level, count in planted.items():
        queue += [level] * count
    random.Random(7).shuffle(queue)  # interleaved: a drift of the machine touches every kind
    found: Dict[float, List[Any]] = {0.0: [], **{level: [] for level in planted}}
    for i, level in enumerate(queue):
        out = folder / f"{workload}-{device}-{i}-{level!r}.json"
        if out.is_file():  # --processes-dir from an earlier run: its processes again
            found[level].append(BenchmarkResult.from_json(out.read_text()))
            continue
        cmd = [sys.executable, __file__, "--child", str(out), "--workload", workload, "--device", device,
               "--slowdown", repr(level), "--calls", str(calls), "--warmup", str(warmup)]
        subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)
        found[level].append(BenchmarkResult.from_json(out.read_text()))
        progress(f"{workload}/{device}: process {i + 1}/{len(queue)}")
    return found


# --------------------------------------------------------------------- trials


def _trials(aa: Sequence[Any], current_pool: Sequence[Any], rounds: int, trials: int, same_pool: bool,
            threshold: Any, confirm: int, seed: int) -> Dict[str, List[Any]]:
    """``{"one": [...], "confirmed": [...]}``: each trial's comparison from its one current
    process, and the gate's verdict after it decided (``decide``: up to ``confirm`` more
    processes of the same kind, drawn one at a time while undecided or slower past the
    threshold, all its rounds compared together)."""
    from gpukeeper.timing.regression import compare_runs, decide

    rng = random.Random(seed)
    one: List[Any] = []
    confirmed: List[Any] = []
    asv: List[bool] = []
    for _ in range(trials):
        if same_pool:
            picked = rng.sample(range(len(aa)), rounds + 1)  # distinct processes
            base, cur_i = [aa[i] for i in picked[:-1]], picked[-1]
            others = [aa[i] for i in range(len(aa)) if i not in picked]
            cur = aa[cur_i]
        else:
            base = rng.sample(list(aa), rounds)
            cur_i = rng.randrange(len(current_pool))
            cur = current_pool[cur_i]
            others = [r for i, r in enumerate(current_pool) if i != cur_i]
        one.append(compare_runs(base, cur, threshold=threshold))
        fresh = rng.sample(others, min(confirm, len(others)))
        decided = decide(base, cur, iter(fresh), threshold, confirm)
        confirmed.append(decided)
        asv.append(_asv_slower(base, cur))
    return {"one": one, "confirmed": confirmed, "asv": asv}


def _u_test_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p of the Mann-Whitney U test (normal approximation with the tie
    correction), as asv computes it for its samples."""
    n1, n2 = len(a), len(b)
    merged = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(merged)
    ties = 0.0
    i = 0
    while i < len(merged):
        j = i
        while j + 1 < len(merged) and merged[j + 1][0] == merged[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    r1 = sum(r for r, (_, side) in zip(ranks, merged) if side == 0)
    u = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return math.erfc(max(z, 0.0) / math.sqrt(2))


def _asv_slower(base: Sequence[Any], cur: Any) -> bool:
    """asv's verdict on the same processes: every call of the baseline rounds against the
    calls of the one current process."""
    a = [t for r in base for t in r.times_ms]
    b = list(cur.times_ms)
    ratio = statistics.median(b) / statistics.median(a)
    return ratio > ASV_FACTOR and _u_test_p(a, b) < ASV_P


def _summary(runs: Dict[str, List[Any]], threshold: Any) -> Dict[str, Any]:
    from gpukeeper.timing.regression import regression

    comparisons = runs["one"]
    verdicts = {v: sum(c.verdict == v for c in comparisons) for v in ("slower", "same", "undecided", "faster")}
    spreads = [c.spread for c in comparisons if c.spread is not None]
    return {
        "trials": len(comparisons),
        "failed": sum(regression(c, threshold) for c in comparisons),
        "failed_confirmed": sum(regression(c, threshold) for c in runs["confirmed"]),
        "asv_slower": sum(runs["asv"]),
        "current_rounds_mean": statistics.mean(c.rounds_current for c in runs["confirmed"]),
        "verdicts": verdicts,
        "median_change": statistics.median(c.change for c in comparisons),
        "median_spread": statistics.median(spreads) if spreads else None,
        "spreads": spreads,
    }


def _between_process_std(results: Sequence[Any]) -> float:
    logs = [math.log(r.median_ms) for r in results]
    return statistics.stdev(logs) if len(logs) > 1 else math.nan


def measure_row(workload: str, device: str, args: argparse.Namespace, folder: Path, progress: Any
                ) -> List[Dict[str, Any]]:
    """The rows of one workload on one device: per baseline size, A/A and each planted level."""
    from gpukeeper.timing.regression import parse_fail_threshold, regression

    threshold = parse_fail_threshold(args.fail)
    levels = [float(x) for x in args.levels.split(",")]
    t0 = time.perf_counter()
    found = _run_processes(workload, device, args.aa, {lv: args.planted for lv in levels}, args.calls,
                           args.warmup, folder, progress)
    seconds = time.perf_counter() - t0
    aa = found[0.0]
    aa_median = statistics.median(r.median_ms for r in aa)
    rows = []
    for k in [int(x) for x in args.rounds.split(",")]:
        if k + 1 > len(aa):
            continue
        row: Dict[str, Any] = {
            "workload": workload, "device": device, "rounds": k, "processes_aa": len(aa),
            "processes_planted": args.planted, "calls": args.calls, "process_seconds": seconds,
            "between_process_std": _between_process_std(aa), "aa_median_ms": aa_median,
            "confirm": args.confirm,
            "aa": _summary(_trials(aa, aa, k, args.trials, True, threshold, args.confirm, 11 + k), threshold),
            "planted": {},
        }
        for level in levels:
            got = found[level]
            true = statistics.median(r.median_ms for r in got) / aa_median - 1
            runs = _trials(aa, got, k, args.trials, False, threshold, args.confirm, 97 + k + int(level * 100))
            s = _summary(runs, threshold)
            s["true_slowdown"] = true
            # Detection is asked only of slowdowns larger than the spread the trial measured.
            eligible = [i for i, c in enumerate(runs["one"]) if c.spread is not None and true > c.spread]
            s["beyond_spread"] = len(eligible)
            s["beyond_spread_detected"] = sum(regression(runs["confirmed"][i], threshold) for i in eligible)
            row["planted"][str(level)] = s
        rows.append(row)
    return rows


# --------------------------------------------------------------------- output


def _print(rows: List[Dict[str, Any]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    levels = args.levels.split(",")
    table = Table(title=f"regression gate at --fail {args.fail}: share of trials failed, A/A and planted, "
                        f"{args.trials} trials per cell (gate, after deciding / asv's rule on the same calls)")
    for col in ("workload", "device", "baseline rounds", "between-process std", "A/A median spread",
                "A/A failed: gate / asv"):
        table.add_column(col, justify="left" if col in ("workload", "device") else "right")
    for lv in levels:
        table.add_column(f"planted +{float(lv):.0%}: true; caught: gate (rounds) / asv", justify="right")
    for r in rows:
        aa = r["aa"]
        n = aa["trials"]
        spread = "unmeasured" if aa["median_spread"] is None else f"±{aa['median_spread']:.1%}"
        cells = [r["workload"], r["device"], str(r["rounds"]), f"{r['between_process_std']:.1%}", spread,
                 f"{aa['failed_confirmed'] / n:.1%} / {aa['asv_slower'] / n:.1%}"]
        for lv in levels:
            p = r["planted"][str(float(lv))]
            cells.append(f"{p['true_slowdown']:+.0%}; {p['failed_confirmed'] / n:.0%} "
                         f"({p['current_rounds_mean']:.1f}) / {p['asv_slower'] / n:.0%}")
        table.add_row(*cells)
    console = Console(width=max(Console().width, 160))
    console.print(table)
    console.print(
        "Processes are reused across trials (drawn at random, seeded); no trial has one process in both its "
        "baseline and its current run. gate: failed after deciding as the pytest gate does (decide: up to "
        f"{args.confirm} more fresh processes, one at a time, while undecided or slower past the threshold); "
        "rounds: the current rounds it took, on average. asv: a Mann-Whitney U test at p < 0.002 and a 1.1 "
        "factor on the medians, on every call of the baseline rounds against the one current process's "
        "calls. spread: the 99% bound on how far a fresh process of the same code lands from the baseline. "
        "true: the planted processes' median over the A/A processes'.", markup=False)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default=None,
                   help="workloads, comma-separated: matmul (a torch matmul: 256x256 on the CPU, "
                        "1024x1024 on the GPU), launch (20 tiny kernels a call, GPU only), python (a "
                        "pure-Python loop, CPU only); default all, python alone without torch")
    p.add_argument("--aa", type=int, default=16, help="A/A processes per row (default %(default)s)")
    p.add_argument("--planted", type=int, default=4, help="processes per planted level (default %(default)s)")
    p.add_argument("--levels", default="0.1,0.2,0.5,1.0,2.0", help="planted slowdowns (default %(default)s)")
    p.add_argument("--rounds", default="1,5",
                   help="baseline rounds per trial; 5 is what a saved run gets by default (default %(default)s)")
    p.add_argument("--devices", default=None,
                   help="cpu, cuda or both, comma-separated (default: cpu, and cuda where torch sees it)")
    p.add_argument("--trials", type=int, default=100, help="trials per cell (default %(default)s)")
    p.add_argument("--calls", type=int, default=200, help="n_calls per process (default %(default)s)")
    p.add_argument("--warmup", type=int, default=20, help="warm-up calls per process (default %(default)s)")
    p.add_argument("--fail", default="median:5%", help="the gate's threshold (default %(default)s)")
    p.add_argument("--confirm", type=int, default=4,
                   help="at most this many processes decide a regression or an undecided change past the threshold, as --gpu-benchmark-confirm (default %(default)s)")
    p.add_argument("--no-gpu", action="store_true", help="CPU rows only")
    p.add_argument("--json", metavar="FILE", help="write the rows and the environment as JSON")
    p.add_argument("--processes-dir", metavar="DIR",
                   help="keep each process's result here, and take those already there instead of "
                        "running them again (new trials on the same processes)")
    p.add_argument("--child", metavar="OUT", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    p.add_argument("--slowdown", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    torch, why = try_import("torch")
    workloads = (args.workload or ("matmul,launch,python" if torch is not None else "python")).split(",")
    if any(w not in WORKLOADS for w in workloads):
        p.error(f"--workload takes {', '.join(WORKLOADS)}, got {args.workload!r}")
    if "matmul" in workloads and torch is None:
        p.error(f"--workload matmul needs torch ({why})")
    cuda = torch is not None and not args.no_gpu and torch.cuda.is_available()
    devices = (args.devices or ("cpu,cuda" if cuda else "cpu")).split(",")
    if "cuda" in devices and not cuda:
        p.error("--devices cuda: torch does not see CUDA here")
    # The pure-Python loop has no device; the launch-bound workload is about kernels.
    plan = [(w, d) for d in devices for w in workloads
            if not (w == "python" and d != "cpu") and not (w == "launch" and d != "cuda")]
    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        folder = Path(args.processes_dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for wl, device in plan:
            rows += measure_row(wl, device, args, folder,
                                lambda line: print(line, file=sys.stderr, flush=True) if os.isatty(2) else None)
    _print(rows, args)
    if args.json:
        import gpukeeper

        doc = {"environment": environment(gpukeeper, torch, None), "argv": sys.argv[1:], "rows": rows,
               "skipped": [] if any(d == "cuda" for _, d in plan) else ["GPU rows: torch does not see CUDA" if torch is not None
                                                    else f"GPU rows: torch is missing ({why})"]}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
