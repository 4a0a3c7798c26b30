"""Trajectory leak verdicts on the loops MD users write: verdict, where, cause and peak.

Runs ``benchmark_md_trajectory`` over a force field with forces by autograd (an MLP on
``--atoms`` atoms), 400 steps, in loops that are clean or carry one planted fault at full
size and at a tenth of it:

- ``graph``: each energy kept in a list without ``.detach()`` (its autograd graph lives on);
- ``scratch``: a 64 MiB scratch buffer every 50 steps (a neighbour-list rebuild): no leak,
  but the peak;
- ``cache``: a 256 KiB tensor kept each step;
- ``raw``: 1 MiB a step through the driver's ``cuMemAlloc`` with PyTorch loaded (an engine
  or a C extension): a leak outside every framework.

Then real clients: torch-geometric's SchNet (clean, and its energies kept), and OpenMM
with PyTorch imported (clean, and a Context kept per call). ``--aa N`` runs the clean loop
in N fresh processes (none may leak or get a cause); ``--cost`` compares the loop with a
plain one in ABCCBA rounds of fresh processes (25 us and 1 ms CPU steps, ~1.4 ms GPU steps),
with and without the leak check;
``--regions`` checks GPUContext on first use of cuBLAS/cuDNN and on a raw allocation.
Each row says what was expected and whether the verdict matched. Prints tables and
writes JSON.

    python benchmarks/python/md_verdicts_bench.py [--aa 20] [--cost 8] [--regions]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional

MiB = 1 << 20


def _driver() -> Any:
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    return cuda


def raw_alloc(cuda: Any, nbytes: int) -> int:
    """Device memory past every framework's allocator, on the current context."""
    ptr = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes))
    if rc != 0:
        raise RuntimeError(f"cuMemAlloc_v2 returned {rc}")
    return int(ptr.value)


def mlp_loops(atoms: int, scale: float) -> Dict[str, Callable[[Any], Any]]:
    import torch

    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 128), torch.nn.SiLU(), torch.nn.Linear(128, 128), torch.nn.SiLU(),
        torch.nn.Linear(128, 1),
    ).to(dev)
    n_graph = max(1, int(atoms * scale))
    pos = torch.randn(atoms, 3, device=dev, requires_grad=True)
    pos_graph = torch.randn(n_graph, 3, device=dev, requires_grad=True)
    kept: List[Any] = []
    step = [0]
    cuda = _driver()

    def forces(p: Any, keep: bool = False) -> Any:
        e = model(p).sum()
        (f,) = torch.autograd.grad(e, p, retain_graph=keep)
        if keep:
            kept.append(e)
        return f

    def clean(_: Any) -> Any:
        return forces(pos)

    def graph(_: Any) -> Any:
        forces(pos)
        return forces(pos_graph, keep=True)

    def scratch(_: Any) -> Any:
        f = forces(pos)
        if step[0] % 50 == 0:
            buf = torch.empty(int(64 * MiB * scale), dtype=torch.uint8, device=dev)
            buf.fill_(1)
            del buf
        step[0] += 1
        return f

    def cache(_: Any) -> Any:
        f = forces(pos)
        kept.append(torch.empty(int(256 * 1024 * scale) // 4, device=dev))
        return f

    def raw(_: Any) -> Any:
        f = forces(pos)
        kept.append(raw_alloc(cuda, int(MiB * scale)))
        return f

    def reset() -> None:
        # Each loop starts from what the clean one holds: earlier loops' leaks are freed.
        for k in kept:
            if isinstance(k, int):
                cuda.cuMemFree_v2(ctypes.c_uint64(k))
        kept.clear()
        step[0] = 0
        torch.cuda.empty_cache()

    loops = {"clean": clean, "graph": graph, "scratch": scratch, "cache": cache, "raw": raw}
    return loops, reset


EXPECTED = {  # loop -> (leak, where, a word the cause must hold, a spike expected)
    "clean": (False, None, "", False),
    "graph": (True, "torch", "autograd graph", False),
    "scratch": (False, None, "", True),
    "cache": (True, "torch", "tensors of shape", False),
    "raw": (True, "outside frameworks", "", False),
}


def verdict_row(name: str, r: Any, expected: Any) -> Dict[str, Any]:
    leak, where, word, spike = expected
    ok = bool(r.memory_leak) == leak and r.memory_leak_where == where
    ok = ok and ((word in r.memory_leak_cause) if word else r.memory_leak_cause == "")
    ok = ok and (("spikes" in r.memory_peak_text) == spike)
    return {
        "loop": name,
        "leak": r.memory_leak,
        "where": r.memory_leak_where,
        "cause": r.memory_leak_cause[:90],
        "peak_mb": round((r.memory_peak_bytes or 0) / MiB, 1),
        "peak_text": r.memory_peak_text,
        "headroom_mb": None if r.memory_headroom_bytes is None else r.memory_headroom_bytes // MiB,
        "ms_per_step": round(r.stats.median_ms, 4),
        "expected": f"leak={leak} where={where} cause~{word!r} spike={spike}",
        "ok": ok,
    }


def run_loops(atoms: int, steps: int, only: Optional[str]) -> List[Dict[str, Any]]:
    from gpukeeper.md import benchmark_md_trajectory

    rows = []
    for scale in (1.0, 0.1):
        loops, reset = mlp_loops(atoms, scale)
        for name, fn in loops.items():
            if only and name != only:
                continue
            if scale != 1.0 and name == "clean":
                continue
            reset()
            r = benchmark_md_trajectory(fn, [0], n_steps=steps, device="cuda", progress=False)
            row = verdict_row(name, r, EXPECTED[name])
            row["size"] = "full" if scale == 1.0 else "1/10"
            rows.append(row)
    return rows


def run_schnet(steps: int) -> List[Dict[str, Any]]:
    import torch
    from torch_geometric.nn.models import SchNet

    from gpukeeper.md import benchmark_md_trajectory

    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = SchNet(hidden_channels=64, num_filters=64, num_interactions=3, cutoff=5.0).to(dev)

    class DenseRadiusGraph(torch.nn.Module):
        """SchNet's own graph needs pyg-lib or torch-cluster; the same edges, dense."""

        def forward(self, pos: Any, batch: Any) -> Any:
            d = torch.cdist(pos, pos)
            mask = (d < 5.0) & ~torch.eye(len(pos), dtype=torch.bool, device=pos.device)
            edge_index = mask.nonzero().t()
            diff = pos[edge_index[0]] - pos[edge_index[1]]
            return edge_index, diff.norm(dim=-1)

    model.interaction_graph = DenseRadiusGraph()
    z = torch.randint(1, 10, (200,), device=dev)
    pos = (torch.rand(200, 3, device=dev) * 12.0).requires_grad_(True)
    batch = torch.zeros(200, dtype=torch.long, device=dev)
    kept: List[Any] = []

    def step(keep: bool) -> Callable[[Any], Any]:
        def fn(_: Any) -> Any:
            e = model(z, pos, batch).sum()
            (f,) = torch.autograd.grad(e, pos, retain_graph=keep)
            if keep:
                kept.append(e)
            return f

        return fn

    rows = []
    for name, keep in (("schnet clean", False), ("schnet graph", True)):
        r = benchmark_md_trajectory(step(keep), [0], n_steps=steps, device="cuda", progress=False)
        exp = EXPECTED["graph" if keep else "clean"]
        rows.append(verdict_row(name, r, exp) | {"size": "real"})
    return rows


def run_openmm(steps: int) -> List[Dict[str, Any]]:
    import openmm
    import openmm.unit as u
    import torch  # noqa: F401  (loaded beside the engine, as openmm-torch users have it)

    from gpukeeper.md import benchmark_md_trajectory

    torch.zeros(1, device="cuda")
    n = 2000
    system = openmm.System()
    nb = openmm.NonbondedForce()
    nb.setNonbondedMethod(openmm.NonbondedForce.CutoffPeriodic)
    nb.setCutoffDistance(1.0 * u.nanometer)
    box = 4.0
    system.setDefaultPeriodicBoxVectors(
        openmm.Vec3(box, 0, 0), openmm.Vec3(0, box, 0), openmm.Vec3(0, 0, box)
    )
    import random

    random.seed(0)
    positions = []
    side = 13
    for i in range(n):
        system.addParticle(39.9)
        nb.addParticle(0.0, 0.34, 0.99)
        a, b, c = i % side, (i // side) % side, i // (side * side)
        positions.append(openmm.Vec3(a, b, c) * (box / side))
    system.addForce(nb)
    platform = openmm.Platform.getPlatformByName("CUDA")
    integrator = openmm.LangevinMiddleIntegrator(120 * u.kelvin, 1 / u.picosecond, 0.002 * u.picoseconds)
    context = openmm.Context(system, integrator, platform)
    context.setPositions(positions)
    openmm.LocalEnergyMinimizer.minimize(context, maxIterations=50)
    contexts: List[Any] = []

    def clean(_: Any) -> Any:
        integrator.step(10)

    def leaky(_: Any) -> Any:
        integrator.step(10)
        extra = openmm.Context(system, openmm.VerletIntegrator(0.001), platform)
        contexts.append(extra)

    def sync() -> None:
        context.getState(getEnergy=False)

    rows = []
    # With synchronize= the engine's memory is read from NVML's figure for the process
    # (the series "nvml_process" grows); without, PyTorch's counters are the series and
    # the engine's memory is outside every framework.
    engine = (True, "nvml_process", "", False)
    for name, fn, exp, k, wait in (
        ("openmm clean", clean, EXPECTED["clean"], steps, sync),
        ("openmm clean, no synchronize=", clean, EXPECTED["clean"], steps, None),
        ("openmm context kept", leaky, engine, 20, sync),
        ("openmm context kept, no synchronize=", leaky, EXPECTED["raw"], 20, None),
    ):
        r = benchmark_md_trajectory(
            fn, [0], n_steps=k, warmup_steps=3, device="cuda", synchronize=wait, progress=False
        )
        row = verdict_row(name, r, exp) | {"size": "real", "source": r.memory_source}
        rows.append(row)
    return rows


def one_clean_process(atoms: int, steps: int) -> Dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", "clean", "--atoms", str(atoms), "--steps", str(steps)],
        capture_output=True, text=True, timeout=300,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if not line:
        return {"error": out.stderr[-400:]}
    return json.loads(line[-1])


def run_aa(count: int, atoms: int, steps: int) -> Dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        rows = list(pool.map(lambda _: one_clean_process(atoms, steps), range(count)))
    leaks = sum(1 for r in rows if r.get("leak"))
    causes = sum(1 for r in rows if r.get("cause"))
    errors = [r["error"] for r in rows if "error" in r]
    return {"processes": count, "leaks": leaks, "causes": causes, "errors": errors[:2]}


COST_CHILD = r"""
import sys, time, json
kind, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
import gpukeeper
from gpukeeper.md import benchmark_md_trajectory
if kind.startswith("cpu"):
    ns = 25_000 if kind == "cpu25us" else 1_000_000
    def step(x):
        end = time.perf_counter_ns() + ns
        while time.perf_counter_ns() < end:
            pass
        return x
    sync = lambda: None
    dev = "cpu"
else:
    import torch
    a = torch.randn(2048, 2048, device="cuda")
    def step(x):
        b = a
        for _ in range(4):
            b = a @ b
        return b
    sync = torch.cuda.synchronize
    dev = "cuda"
for _ in range(50):
    step(0)
sync()
if mode == "plain":
    t = time.perf_counter()
    for x in range(n):
        out = step(x)
    out = None
    sync()
    dt = time.perf_counter() - t
else:
    r = benchmark_md_trajectory(step, [0], n_steps=n, warmup_steps=5, device=dev,
                                progress=False, check_memory_leak=(mode == "gpukeeper"))
    dt = r.total_time_s
    h = r.host_times_ms
    med = sorted(h)[len(h) // 2]
    extra = {"host_sum_s": sum(h) / 1e3, "max_step_ms": max(h), "max_at": h.index(max(h)),
             "slow_steps": sum(1 for v in h if v > 1.5 * med), "sample_every": r.memory_sample_every}
    print(json.dumps({"s_per_step": dt / n, **extra}))
    sys.exit(0)
print(json.dumps({"s_per_step": dt / n}))
"""


def run_cost(pairs: int) -> List[Dict[str, Any]]:
    rows = []
    for kind, n in (("cpu25us", 20000), ("cpu1ms", 1500), ("gpu1ms", 1500)):
        modes = ("plain", "gpukeeper", "no-leak-check")
        per: Dict[str, List[float]] = {m: [] for m in modes}
        ratios: Dict[str, List[float]] = {m: [] for m in modes[1:]}
        details: List[Dict[str, Any]] = []
        for _ in range(pairs):
            got: Dict[str, List[float]] = {}
            for mode in ("plain", "gpukeeper", "no-leak-check", "no-leak-check", "gpukeeper",
                         "plain"):
                out = subprocess.run(
                    [sys.executable, "-c", COST_CHILD, kind, mode, str(n)],
                    capture_output=True, text=True, timeout=300,
                )
                rec = json.loads(out.stdout.strip().splitlines()[-1])
                per[mode].append(rec["s_per_step"])
                got.setdefault(mode, []).append(rec["s_per_step"])
                if mode != "plain":
                    details.append({"mode": mode, **rec})
            for m in modes[1:]:
                ratios[m].append(statistics.mean(got[m]) / statistics.mean(got["plain"]))
        rows.append(
            {
                "step": kind,
                "plain_us": round(statistics.median(per["plain"]) * 1e6, 2),
                "gpukeeper_us": round(statistics.median(per["gpukeeper"]) * 1e6, 2),
                "cost_pct_median_of_pairs": round((statistics.median(ratios["gpukeeper"]) - 1) * 100, 3),
                "without_leak_check_pct": round(
                    (statistics.median(ratios["no-leak-check"]) - 1) * 100, 3
                ),
                "pairs": pairs,
                "details": details,
            }
        )
    return rows


def run_regions() -> List[Dict[str, Any]]:
    import torch

    from gpukeeper import GPUContext

    torch.zeros(1, device="cuda")
    cuda = _driver()
    rows = []
    kept: List[Any] = []

    def first_matmul() -> None:
        a = torch.randn(512, 512, device="cuda")
        (a @ a).sum().item()

    def first_conv() -> None:
        x = torch.randn(8, 16, 32, 32, device="cuda")
        w = torch.randn(32, 16, 3, 3, device="cuda")
        torch.nn.functional.conv2d(x, w).sum().item()

    def raw64() -> None:
        kept.append(raw_alloc(cuda, 64 * MiB))

    def raw320() -> None:
        kept.append(raw_alloc(cuda, 320 * MiB))

    # One region cannot tell a library's set-up from a leak: growth is said past 32 MiB and
    # held past 256 MiB.
    for name, fn, leak in (
        ("first matmul (cuBLAS set up)", first_matmul, False),
        ("first conv2d (cuDNN set up)", first_conv, False),
        ("raw cuMemAlloc 64 MiB (said, not held)", raw64, False),
        ("raw cuMemAlloc 320 MiB", raw320, True),
    ):
        ctx = GPUContext(warn_on_leak=False, deferred_release=False)
        t0 = time.perf_counter()
        with ctx:
            fn()
        dt = time.perf_counter() - t0
        report = ctx.report
        assert report is not None
        outside = sum(per.get("outside frameworks", 0) for per in report.held.values())
        before = report.before.get("cuda:0", {}).get("outside frameworks")
        after = report.after.get("cuda:0", {}).get("outside frameworks")
        grew = (after.allocated - before.allocated) if before and after else None
        rows.append(
            {
                "region": name,
                "outside_grew_mb": None if grew is None else round(grew / MiB, 1),
                "held_outside_mb": round(outside / MiB, 1),
                "leak": report.leaked,
                "said": any("outside every framework" in n for n in report.notes),
                "expected_leak": leak,
                "ok": report.leaked == leak,
                "ms": round(dt * 1e3, 2),
            }
        )
    return rows


def table(title: str, rows: List[Dict[str, Any]], cols: List[str]) -> None:
    print(f"\n{title}")
    widths = [max(len(c), *(len(str(r.get(c))) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(str(r.get(c)).ljust(w) for c, w in zip(cols, widths)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--atoms", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--aa", type=int, default=0, help="fresh processes of the clean loop")
    ap.add_argument("--cost", type=int, default=0, help="ABBA pairs of fresh processes")
    ap.add_argument("--regions", action="store_true")
    ap.add_argument("--no-clients", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.child:
        row = run_loops(args.atoms, args.steps, args.child)[0]
        print(json.dumps({"leak": row["leak"], "cause": row["cause"], "where": row["where"]}))
        return
    import torch

    import gpukeeper

    out: Dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "gpukeeper": gpukeeper.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    cols = ["loop", "size", "leak", "where", "peak_mb", "headroom_mb", "ok", "cause"]
    out["loops"] = run_loops(args.atoms, args.steps, None)
    table(f"MLP force field, {args.atoms} atoms, {args.steps} steps", out["loops"], cols)
    for r in out["loops"]:
        if r["peak_text"]:
            print(f"  {r['loop']} ({r['size']}): {r['peak_text']}")
    if not args.no_clients:
        for name, fn in (("schnet", run_schnet), ("openmm", run_openmm)):
            try:
                out[name] = fn(args.steps)
                table(name, out[name], cols)
            except Exception as e:  # a client that does not install here
                out[name] = {"error": f"{type(e).__name__}: {e}"}
                print(f"\n{name}: {out[name]['error']}")
    if args.regions:
        out["regions"] = run_regions()
        table("GPUContext regions", out["regions"],
              ["region", "outside_grew_mb", "held_outside_mb", "leak", "said", "ok", "ms"])
    if args.aa:
        out["aa"] = run_aa(args.aa, args.atoms, args.steps)
        print(f"\nA/A: {out['aa']}")
    if args.cost:
        out["cost"] = run_cost(args.cost)
        table("loop cost (ABBA, fresh processes)", out["cost"],
              ["step", "plain_us", "gpukeeper_us", "cost_pct_median_of_pairs",
               "without_leak_check_pct", "pairs"])
        for r in out["cost"]:
            for d in r["details"][:4]:
                print(f"  {r['step']} {d}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
