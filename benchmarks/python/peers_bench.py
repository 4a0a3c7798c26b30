#!/usr/bin/env python3
"""gpukeeper's allocation round trips against its peers' (CuPy, RMM, PyTorch), in one run.

From Python, one alloc+free round trip, for 256 B, 4 KiB, 64 KiB, 1 MiB and 16 MiB:
  gpukeeper  b = pool.get_managed_buffer(0, n // 4, Precision.Fp32); b.release()
  gpukeeper  with pool.get_managed_buffer(0, n // 4, Precision.Fp32): pass
  cupy       m = cupy.cuda.alloc(n); del m        (the default MemoryPool, via the allocator)
  cupy       m = pool.malloc(n); del m            (MemoryPool.malloc called directly)
  rmm        b = rmm.DeviceBuffer(size=n); del b  under PoolMemoryResource(CudaMemoryResource())
  rmm        the same under CudaAsyncMemoryResource()
(the rmm resource made current with rmm.mr.set_current_device_resource before its rows).

torch.empty(n, dtype=torch.uint8, device='cuda') + del under PyTorch's own caching
allocator, under RMM's (rmm.allocators.torch.rmm_torch_allocator over a
PoolMemoryResource) and under gpukeeper's (use_torch_allocator()). An allocator can be
chosen only once per process, before the first CUDA tensor, so each runs in a child
process of this program; the three alternate, --rounds times, and the table shows the
median of the children's medians.

Ratios (medians): gpukeeper release() / CuPy alloc (target <= 0.8), the with form / CuPy
(target <= 1.0), gpukeeper / RMM; for torch, gpukeeper / native, gpukeeper / RMM.

A peer that is not installed is a row saying so. Without CUDA the peers' rows say "no
CUDA" and gpukeeper's run on host memory (named in the output), as a smoke test; the
ratios then mean nothing. Exit status 1 only when a row failed.

Timing is bench_timeit's (shared with alloc_roundtrip.py): each statement compiled inline
by timeit, warm-up, then --repeat batches of about --batch-ms; median, p10, p90 across
batches of ns per round trip.

  python benchmarks/python/peers_bench.py [--json PATH] [--quick] [--rounds N] [--no-torch]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import environment, try_import  # noqa: E402
from bench_timeit import measure  # noqa: E402

SIZES = [(256, "256B"), (4 << 10, "4KiB"), (64 << 10, "64KiB"), (1 << 20, "1MiB"), (16 << 20, "16MiB")]
TORCH_MODES = [("native", "PyTorch caching allocator"),
               ("rmm", "rmm_torch_allocator (PoolMemoryResource)"),
               ("gpukeeper", "gpukeeper use_torch_allocator()"),
               ("gpukeeper-graph", "gpukeeper use_torch_allocator(), a CUDA graph alive")]
CHILD_MARK = "peers-child-result "  # starts the line of a torch child's JSON
NOT_INSTALLED = "not installed"
IMPORT_FAILED = "import failed"  # installed, but its import raised (a broken install)
NO_CUDA = "no CUDA"
FAILED = "failed"
OK = "ok"


@dataclass
class Case:
    """One Python round trip to time at every size."""

    key: str
    label: str
    stmt: str
    namespace: Callable[[int], Dict[str, Any]] = lambda n: {}  # globals for size n
    setup: Optional[Callable[[], None]] = None  # runs before the case's first size
    status: str = OK  # or why it is not measured: NOT_INSTALLED, NO_CUDA, FAILED
    reason: str = ""


@dataclass
class Peers:
    """What this process could import and whether CUDA is usable."""

    gk: Any = None
    cupy: Any = None
    rmm: Any = None
    torch: Any = None
    why: Dict[str, str] = field(default_factory=dict)  # module -> why it is missing
    cuda: bool = False
    cuda_reason: str = ""

    def missing(self, name: str) -> str:
        """The status of a module that did not import: not installed, or a broken install."""
        gone = f"ModuleNotFoundError: No module named '{name}'"
        return NOT_INSTALLED if self.why[name].startswith(gone) else IMPORT_FAILED


# ----------------------------------------------------------------------------- peers

def find_peers() -> Peers:
    """Imports what is installed, and decides whether CUDA is usable (gpukeeper's view,
    else CuPy's)."""
    p = Peers()
    for name in ("gpukeeper", "cupy", "rmm", "torch"):
        mod, why = try_import(name)
        setattr(p, "gk" if name == "gpukeeper" else name, mod)
        if mod is None:
            p.why[name] = why or "import failed"
    if p.gk is not None:
        avail = p.gk.cuda_available()
        p.cuda, p.cuda_reason = bool(avail), getattr(avail, "reason", "") or ""
    elif p.cupy is not None:
        try:
            p.cuda = p.cupy.cuda.runtime.getDeviceCount() > 0
        except Exception as e:
            p.cuda_reason = f"{type(e).__name__}: {e}"
    return p


def unavailable(key: str, label: str, status: str, reason: str) -> Case:
    """A row that is reported, with its reason, but not timed."""
    return Case(key, label, "", status=status, reason=reason)


def gpukeeper_cases(p: Peers) -> List[Case]:
    """gpukeeper's two forms, on MemoryPool() (device memory with CUDA, host without)."""
    labels = [("gpukeeper_release", "gpukeeper get_managed_buffer + release()"),
              ("gpukeeper_with", "gpukeeper with get_managed_buffer(...)")]
    if p.gk is None:
        return [unavailable(k, lbl, p.missing("gpukeeper"), p.why["gpukeeper"]) for k, lbl in labels]
    try:
        pool = p.gk.MemoryPool()
    except Exception as e:
        return [unavailable(k, lbl, FAILED, f"MemoryPool(): {type(e).__name__}: {e}") for k, lbl in labels]
    fp32 = p.gk.Precision.Fp32

    def ns(n: int) -> Dict[str, Any]:
        return {"get": pool.get_managed_buffer, "fp32": fp32, "n": n // 4}

    kind = "" if pool.kind == "device" else f" [{pool.kind} memory]"
    cases = [Case(labels[0][0], labels[0][1] + kind, "b = get(0, n, fp32); b.release()", ns),
             Case(labels[1][0], labels[1][1] + kind, "with get(0, n, fp32):\n    pass", ns)]
    # On a stream other than the legacy default the pool asks CUDA whether the stream is
    # capturing a graph (PoolRegistry::pool_for): this row is what that costs.
    label = ("gpukeeper_release_stream", "gpukeeper release(), on a non-default stream")
    if p.cupy is None:
        cases.append(unavailable(*label, p.missing("cupy"), p.why["cupy"]))
    elif not p.cuda or pool.kind != "device":
        cases.append(unavailable(*label, NO_CUDA, p.cuda_reason or "needs device memory"))
    else:
        stream = p.cupy.cuda.Stream(non_blocking=True)
        cases.append(Case(label[0], label[1], "b = get(0, n, fp32, s); b.release()",
                          lambda n: dict(ns(n), s=stream.ptr)))
    return cases


def cupy_cases(p: Peers) -> List[Case]:
    """CuPy's default MemoryPool, through cupy.cuda.alloc and through its malloc."""
    labels = [("cupy_alloc", "cupy.cuda.alloc + del (default MemoryPool)"),
              ("cupy_pool_malloc", "cupy MemoryPool.malloc + del")]
    if p.cupy is None:
        return [unavailable(k, lbl, p.missing("cupy"), p.why["cupy"]) for k, lbl in labels]
    if not p.cuda:
        return [unavailable(k, lbl, NO_CUDA, p.cuda_reason) for k, lbl in labels]
    cupy = p.cupy
    malloc = cupy.get_default_memory_pool().malloc
    return [Case(labels[0][0], labels[0][1], "m = alloc(n); del m", lambda n: {"alloc": cupy.cuda.alloc, "n": n}),
            Case(labels[1][0], labels[1][1], "m = malloc(n); del m", lambda n: {"malloc": malloc, "n": n})]


def rmm_cases(p: Peers, pool_bytes: int) -> List[Case]:
    """rmm.DeviceBuffer under a PoolMemoryResource, then under a CudaAsyncMemoryResource."""
    labels = [("rmm_pool", "rmm.DeviceBuffer + del (PoolMemoryResource)"),
              ("rmm_async", "rmm.DeviceBuffer + del (CudaAsyncMemoryResource)")]
    if p.rmm is None:
        return [unavailable(k, lbl, p.missing("rmm"), p.why["rmm"]) for k, lbl in labels]
    if not p.cuda:
        return [unavailable(k, lbl, NO_CUDA, p.cuda_reason) for k, lbl in labels]
    rmm = p.rmm
    made: Dict[str, Any] = {}  # the resources, kept alive for the whole run

    def use(key: str, make: Callable[[], Any]) -> Callable[[], None]:
        def setup() -> None:
            made[key] = make()
            rmm.mr.set_current_device_resource(made[key])
        return setup

    def ns(n: int) -> Dict[str, Any]:
        return {"DeviceBuffer": rmm.DeviceBuffer, "n": n}

    stmt = "b = DeviceBuffer(size=n); del b"
    return [
        Case(labels[0][0], labels[0][1], stmt, ns, use("pool", lambda: rmm.mr.PoolMemoryResource(
            rmm.mr.CudaMemoryResource(), initial_pool_size=pool_bytes))),
        Case(labels[1][0], labels[1][1], stmt, ns, use("async", rmm.mr.CudaAsyncMemoryResource)),
    ]


def run_python_cases(cases: List[Case], repeat: int, batch_ns: float) -> List[Dict[str, Any]]:
    """Times every case at every size; a case whose set-up or statement fails is a failed
    row with the error, never an exception out of here."""
    rows = []
    for case in cases:
        if case.status == OK and case.setup is not None:
            try:
                case.setup()
            except Exception as e:
                case.status, case.reason = FAILED, f"set-up: {type(e).__name__}: {e}"
        for size, key in SIZES:
            row: Dict[str, Any] = {"case": case.key, "label": case.label, "workload": key,
                                   "size_bytes": size, "stmt": case.stmt, "status": case.status,
                                   "reason": case.reason}
            if case.status == OK:
                try:
                    row.update(measure(case.stmt, case.namespace(size), repeat, batch_ns))
                except Exception as e:
                    row.update(status=FAILED, reason=f"{type(e).__name__}: {e}")
                    print(f"  {case.label} {key} failed: {row['reason']}", file=sys.stderr)
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- torch

def torch_child(mode: str, repeat: int, batch_ns: float, rmm_pool_bytes: int) -> Dict[str, Any]:
    """In a fresh process: install the allocator of ``mode``, then time torch.empty + del
    at every size. Returns a status and, when ok, the timings per size."""
    out: Dict[str, Any] = {"mode": mode, "status": OK, "reason": "", "empty": {}}
    torch, why = try_import("torch")
    if torch is None:
        return dict(out, status=NOT_INSTALLED, reason=why)
    out["torch"] = torch.__version__
    if not torch.cuda.is_available():
        return dict(out, status=NO_CUDA, reason="torch.cuda.is_available() is False")
    keep = []  # the rmm resource must outlive every allocation
    if mode == "rmm":
        rmm, why = try_import("rmm")
        if rmm is None:
            return dict(out, status=NOT_INSTALLED, reason=why)
        try:
            from rmm.allocators.torch import rmm_torch_allocator
        except Exception as e:
            return dict(out, status=NOT_INSTALLED, reason=f"rmm.allocators.torch: {type(e).__name__}: {e}")
        if rmm_torch_allocator is None:
            return dict(out, status=FAILED, reason="rmm.allocators.torch.rmm_torch_allocator is None "
                                                   "(this torch has no CUDAPluggableAllocator)")
        # rmm's torch allocator serves from the device's current resource: a pool, so that it
        # caches like the other two (the default resource is plain cudaMalloc).
        keep.append(rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=rmm_pool_bytes))
        rmm.mr.set_current_device_resource(keep[-1])
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        out["rmm"] = rmm.__version__
    elif mode in ("gpukeeper", "gpukeeper-graph"):
        from gpukeeper.integrations import use_torch_allocator

        use_torch_allocator()
        if mode == "gpukeeper-graph":
            # A captured graph kept alive: its private pool exists while eager tensors come
            # and go, which is what the hook's free path pays for (torch_allocator.cpp).
            static = torch.zeros(1 << 10, device="cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                static * 2  # warm-up outside the capture, as PyTorch's docs ask
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out_static = static * 2
            keep += [static, graph, out_static]
    ns = {"empty": torch.empty, "u8": torch.uint8}
    for size, key in SIZES:
        ns["n"] = size
        out["empty"][key] = measure("t = empty(n, dtype=u8, device='cuda'); del t", ns, repeat, batch_ns)
    out["gpu"] = torch.cuda.get_device_name(0)
    return out


def run_torch_children(p: Peers, args: argparse.Namespace) -> Dict[str, Any]:
    """The three torch allocators, each in its own child, alternating for --rounds rounds.
    Returns per mode: status, reason, the children's results, median per size."""
    result: Dict[str, Any] = {}
    if p.torch is None:
        return {m: {"status": p.missing("torch"), "reason": p.why["torch"]} for m, _ in TORCH_MODES}
    if not p.torch.cuda.is_available():
        return {m: {"status": NO_CUDA, "reason": "torch.cuda.is_available() is False"} for m, _ in TORCH_MODES}
    runs: Dict[str, List[Dict[str, Any]]] = {m: [] for m, _ in TORCH_MODES}
    for _ in range(args.rounds):
        for mode, _label in TORCH_MODES:
            if runs[mode] and runs[mode][-1]["status"] != OK:
                continue  # a mode that could not run once will not run the next time either
            cmd = [sys.executable, os.path.abspath(__file__), "--torch-child", mode,
                   "--repeat", str(args.repeat), "--batch-ms", str(args.batch_ms),
                   "--rmm-pool-mib", str(args.rmm_pool_mib)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout)
                found = [ln for ln in done.stdout.splitlines() if ln.startswith(CHILD_MARK)]
                if not found:
                    raise RuntimeError(f"exit status {done.returncode}: {done.stderr.strip()[-1500:]}")
                child = json.loads(found[-1][len(CHILD_MARK):])
                if done.returncode != 0:
                    # The timings were taken; the process failed after them (at its exit).
                    child["exit_status"] = done.returncode
                    child["stderr_tail"] = done.stderr.strip()[-1500:]
                    print(f"NOTE: torch child {mode} exited with status {done.returncode} after "
                          "reporting its timings", file=sys.stderr)
                runs[mode].append(child)
            except Exception as e:  # a crash or a hang of one child is its row's failure
                runs[mode].append({"mode": mode, "status": FAILED, "reason": f"{type(e).__name__}: {e}"})
    for mode, _label in TORCH_MODES:
        last = runs[mode][-1]
        ok = [r for r in runs[mode] if r["status"] == OK]
        entry: Dict[str, Any] = {"status": last["status"] if not ok else OK, "reason": last.get("reason", ""),
                                 "children": runs[mode], "median_ns": {}}
        for _size, key in SIZES:
            if ok:
                entry["median_ns"][key] = statistics.median(r["empty"][key]["ns_median"] for r in ok)
        result[mode] = entry
    return result


# ----------------------------------------------------------------------------- ratios

# (name, numerator case, denominator case, target or None); medians at the same size.
PY_RATIOS = [
    ("gpukeeper release() / CuPy alloc", "gpukeeper_release", "cupy_alloc", 0.8),
    ("gpukeeper with / CuPy alloc", "gpukeeper_with", "cupy_alloc", 1.0),
    # The words, "CuPy's pool malloc + free": the pool's own entry point, without
    # cupy.cuda.alloc's allocator indirection.
    ("gpukeeper release() / CuPy pool malloc", "gpukeeper_release", "cupy_pool_malloc", 0.8),
    ("gpukeeper with / CuPy pool malloc", "gpukeeper_with", "cupy_pool_malloc", 1.0),
    ("gpukeeper release(): a stream / the default", "gpukeeper_release_stream", "gpukeeper_release", None),
    ("gpukeeper release() / rmm pool", "gpukeeper_release", "rmm_pool", None),
    ("gpukeeper release() / rmm async", "gpukeeper_release", "rmm_async", None),
]
TORCH_RATIOS = [
    ("torch: gpukeeper / native", "gpukeeper", "native", None),
    ("torch: gpukeeper / rmm", "gpukeeper", "rmm", None),
    ("torch: rmm / native", "rmm", "native", None),
    ("torch: gpukeeper, a graph alive / none", "gpukeeper-graph", "gpukeeper", None),
]


def ratios(rows: List[Dict[str, Any]], torch: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every ratio at every size: value (None where a side is missing) and verdict."""
    def py(case: str, key: str) -> Optional[float]:
        for r in rows:
            if r["case"] == case and r["workload"] == key and r["status"] == OK:
                return r["ns_median"]
        return None

    def tc(mode: str, key: str) -> Optional[float]:
        return torch.get(mode, {}).get("median_ns", {}).get(key)

    out = []
    for table, get in ((PY_RATIOS, py), (TORCH_RATIOS, tc)):
        for name, num, den, target in table:
            for _size, key in SIZES:
                a, b = get(num, key), get(den, key)
                value = a / b if a is not None and b else None
                verdict = ("not measured" if value is None else
                           "-" if target is None else "met" if value <= target else "MISSED")
                out.append({"ratio": name, "numerator": num, "denominator": den, "workload": key,
                            "value": value, "target": target, "verdict": verdict})
    return out


# ----------------------------------------------------------------------------- output

def cell_ns(row: Optional[Dict[str, Any]]) -> str:
    """A median in ns for a table cell, or why there is none."""
    if row is None:
        return "-"
    if row["status"] != OK:
        return row["status"]
    return f"{row['ns_median']:,.0f}"


def print_tables(rows: List[Dict[str, Any]], torch: Dict[str, Any], rat: List[Dict[str, Any]],
                 title: str) -> None:
    """Three tables (Python round trips, torch.empty + del, ratios) with rich where it is
    installed, plain text otherwise; then the ratios once more as plain `ratio` lines,
    which scripts can grep."""
    keys = [k for _s, k in SIZES]
    tables = []
    cases = list(dict.fromkeys((r["case"], r["label"]) for r in rows))
    body = []
    for case, label in cases:
        by = {r["workload"]: r for r in rows if r["case"] == case}
        body.append([label] + [cell_ns(by.get(k)) for k in keys])
    tables.append((f"{title}: Python round trip, ns (median)", ["case"] + keys, body))
    body = []
    for mode, label in TORCH_MODES:
        entry = torch.get(mode, {})
        if entry.get("status") != OK:
            body.append([label] + [entry.get("status", "-")] * len(keys))
        else:
            body.append([label] + [f"{entry['median_ns'][k]:,.0f}" for k in keys])
    tables.append(("torch.empty(n, uint8, 'cuda') + del, ns (median of the children's medians)",
                   ["allocator"] + keys, body))
    body = []
    for name in dict.fromkeys(r["ratio"] for r in rat):
        mine = {r["workload"]: r for r in rat if r["ratio"] == name}
        target = mine[keys[0]]["target"]
        cells = []
        for k in keys:
            r = mine[k]
            if r["value"] is None:
                cells.append("-")
            else:
                cells.append(f"{r['value']:.2f}" + ("" if target is None else f" {r['verdict']}"))
        body.append([name + ("" if target is None else f" (<= {target})")] + cells)
    tables.append(("ratios of medians (below 1: gpukeeper faster)", ["ratio"] + keys, body))
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for t_title, cols, t_body in tables:
            print(f"\n{t_title}")
            print(f"{cols[0]:<52}" + "".join(f"{c:>15}" for c in cols[1:]))
            for line in t_body:
                print(f"{line[0]:<52}" + "".join(f"{c:>15}" for c in line[1:]))
    else:
        console = Console(width=max(Console().width, 140))  # wide enough in a log file
        for t_title, cols, t_body in tables:
            table = Table(title=t_title)
            for i, c in enumerate(cols):
                table.add_column(c, justify="left" if i == 0 else "right", no_wrap=i == 0)
            for line in t_body:
                table.add_row(*line)
            console.print(table)
    for line in tables[2][2]:
        print("ratio " + line[0] + ": " + "; ".join(f"{k} {v}" for k, v in zip(keys, line[1:])))


def write_json(path: str, data: Dict[str, Any]) -> None:
    """Writes ``data`` to ``path``, making its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
    print(f"\nJSON written to {path}")


# ----------------------------------------------------------------------------- main

def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    """The command line; --quick shortens every timing to a smoke test."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--repeat", type=int, default=51, help="timed batches per row (default 51)")
    p.add_argument("--batch-ms", type=float, default=5.0, help="target time per batch (default 5 ms)")
    p.add_argument("--rounds", type=int, default=3,
                   help="child processes per torch allocator, alternating (default 3)")
    p.add_argument("--rmm-pool-mib", type=int, default=1024,
                   help="initial size of RMM's PoolMemoryResource (default 1024 MiB)")
    p.add_argument("--no-torch", action="store_true", help="leave out the torch allocators")
    p.add_argument("--child-timeout", type=float, default=300.0, help="seconds per torch child (default 300)")
    p.add_argument("--quick", action="store_true", help="11 batches of ~1 ms, 1 round (a smoke test)")
    p.add_argument("--torch-child", choices=[m for m, _ in TORCH_MODES], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeat, args.batch_ms, args.rounds = 11, 1.0, 1
    return args


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the benchmark (or, with --torch-child, one torch child); exit status 1 only
    when a row failed."""
    args = parse_args(argv)
    batch_ns = args.batch_ms * 1e6
    if args.torch_child:
        result = torch_child(args.torch_child, args.repeat, batch_ns, args.rmm_pool_mib << 20)
        print(CHILD_MARK + json.dumps(result), flush=True)
        return 0

    p = find_peers()
    env = environment(p.gk, p.torch, p.cupy, p.rmm)
    notes = []
    if not p.cuda:
        notes.append(f"no CUDA ({p.cuda_reason or 'no device'}): the peers' rows are not measured; "
                     "gpukeeper's run on host memory as a smoke test, and the ratios mean nothing")
    print("gpukeeper against its peers: allocation round trips")
    print(f"python {env['python']}; cpu: {env['cpu']}; gpu: {env.get('gpu_name', 'none')}")
    print(f"versions: gpukeeper {env.get('gpukeeper', '-')}, cupy {env.get('cupy', '-')}, "
          f"rmm {env.get('rmm', '-')}, torch {env.get('torch', '-')}")
    for name, why in p.why.items():
        print(f"{name}: {p.missing(name)} ({why})")
    for n in notes:
        print(f"NOTE: {n}")

    cases = gpukeeper_cases(p) + cupy_cases(p) + rmm_cases(p, args.rmm_pool_mib << 20)
    rows = run_python_cases(cases, args.repeat, batch_ns)
    torch = ({m: {"status": "left out", "reason": "--no-torch"} for m, _ in TORCH_MODES}
             if args.no_torch else run_torch_children(p, args))
    rat = ratios(rows, torch)
    print_tables(rows, torch, rat, env.get("gpu_name", "no GPU"))

    # A broken install counts as a failure where CUDA is usable; without CUDA it may be
    # only the missing driver.
    bad = (FAILED, IMPORT_FAILED) if p.cuda else (FAILED,)
    failed = [f"{r['label']} {r['workload']}: {r['reason']}" for r in rows if r["status"] in bad]
    failed += [f"torch {m}: {e.get('reason')}" for m, e in torch.items() if e.get("status") in bad]
    for line in failed:
        print(f"FAILED: {line}", file=sys.stderr)
    if args.json:
        write_json(args.json, {
            "benchmark": "peers_python",
            "environment": env,
            "config": {"repeat": args.repeat, "batch_ms": args.batch_ms, "rounds": args.rounds,
                       "rmm_pool_initial_bytes": args.rmm_pool_mib << 20,
                       "timer": "timeit (time.perf_counter), statement compiled inline, gc off",
                       "statistic": "mean ns per round trip within a batch; median/p10/p90 across "
                                    "batches; torch: median over the children of their medians"},
            "cuda": p.cuda,
            "not_imported": p.why,
            "notes": notes,
            "results": rows,
            "torch": torch,
            "ratios": rat,
        })
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
