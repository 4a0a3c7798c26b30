"""Soak: a real model step after step inside the trajectory profiler; memory must stay flat.

A force field runs in chunks of ``benchmark_md_trajectory`` for ``--minutes``. ``--model mlp`` (the default) is
energy of ``--atoms`` atoms from a per-atom MLP plus a pairwise soft repulsion;
``--model schnet`` is torch-geometric's SchNet, a learned potential nobody here wrote, over
the pairs within its cutoff (a new graph, of a new size, every step). Forces come by
autograd, as MD codes with learned potentials compute them. On CUDA, PyTorch's allocations go
through gpukeeper's pool (``gpukeeper.integrations.use_torch_allocator``; ``--no-hook``
leaves PyTorch's own allocator); on the CPU the model and tensors are CPU ones.

Between chunks, every ``--sample-every`` seconds, it samples the process's RSS
(``gpukeeper.base.host_memory``) and on CUDA each framework's allocated and reserved bytes
(``gpukeeper.frameworks``) and this process's device memory as NVML sees it
(``gpukeeper.base.nvml``). After a warm-up (``--warmup-fraction`` of the run, at least one
sample) each series gets a least-squares slope in MiB/min and the slope's standard error
(the noise). A series is growing when its slope exceeds its bound by more than twice its
standard error; the run fails (exit status 1) when any series grows. The bounds: RSS 1 MiB/min,
device memory 1 MiB/min (``--rss-bound``, ``--device-bound``).

    python benchmarks/python/soak.py [--minutes 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import gpukeeper
from gpukeeper import frameworks
from gpukeeper.base import host_memory as host
from gpukeeper.base import nvml
from gpukeeper.md import benchmark_md_trajectory

MiB = 1 << 20
SCHEMA = "gpukeeper.soak/1"


def make_forcefield(torch: Any, atoms: int, device: str) -> Tuple[Callable[[Any], Any], List[Any]]:
    """The step function (positions -> energy, forces) and a few position sets to cycle."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(3, 128), torch.nn.SiLU(), torch.nn.Linear(128, 128), torch.nn.SiLU(),
        torch.nn.Linear(128, 1)).to(device)

    def forcefield(pos: Any) -> Any:
        pos = pos.detach().requires_grad_(True)
        d = pos[:, None, :] - pos[None, :, :]
        pair = torch.exp(-(d * d).sum(-1)).triu(diagonal=1)  # Gaussian repulsion, each pair once
        energy = mlp(pos).sum() + pair.sum()
        (grad,) = torch.autograd.grad(energy, pos)
        return energy.detach(), -grad

    box = float(atoms) ** (1 / 3) * 1.5
    positions = [torch.rand(atoms, 3, device=device) * box for _ in range(8)]
    return forcefield, positions


def make_schnet(torch: Any, atoms: int, device: str) -> Tuple[Callable[[Any], Any], List[Any]]:
    """torch-geometric's SchNet as the force field. Its default neighbour search needs
    torch-cluster, which the GPU image lacks, so the graph (every pair within the cutoff)
    is built here in plain torch; the network is PyG's."""
    from torch_geometric.nn.models import SchNet

    cutoff = 5.0

    def pairs_within_cutoff(pos: Any, batch: Any) -> Tuple[Any, Any]:
        d = torch.cdist(pos, pos)
        close = (d < cutoff) & ~torch.eye(pos.shape[0], dtype=torch.bool, device=pos.device)
        edge_index = close.nonzero().t()
        return edge_index, d[edge_index[0], edge_index[1]]

    torch.manual_seed(0)
    model = SchNet(hidden_channels=64, num_filters=64, num_interactions=3, cutoff=cutoff,
                   interaction_graph=pairs_within_cutoff).to(device)
    z = torch.randint(1, 10, (atoms,), device=device)

    def forcefield(pos: Any) -> Any:
        pos = pos.detach().requires_grad_(True)
        energy = model(z, pos).sum()
        (grad,) = torch.autograd.grad(energy, pos)
        return energy.detach(), -grad

    box = float(atoms) ** (1 / 3) * 1.5
    positions = [torch.rand(atoms, 3, device=device) * box for _ in range(8)]
    return forcefield, positions


MODELS = {"mlp": make_forcefield, "schnet": make_schnet}


def fit(times_min: List[float], values_mib: List[float]) -> Tuple[float, float]:
    """Least-squares slope (MiB/min) of values over times and its standard error (nan
    with fewer than three points)."""
    n = len(times_min)
    if n < 2:
        return float("nan"), float("nan")
    mt = sum(times_min) / n
    mv = sum(values_mib) / n
    sxx = sum((t - mt) ** 2 for t in times_min)
    if sxx == 0:
        return float("nan"), float("nan")
    slope = sum((t - mt) * (v - mv) for t, v in zip(times_min, values_mib)) / sxx
    if n < 3:
        return slope, float("nan")
    resid = sum((v - mv - slope * (t - mt)) ** 2 for t, v in zip(times_min, values_mib))
    return slope, math.sqrt(resid / (n - 2) / sxx)


class Sampler:
    """Reads RSS and, on CUDA, the frameworks' counters and NVML's figure for this process."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.nvml_read: Optional[Callable[[], int]] = None
        self.nvml_why = "no CUDA"
        if cuda:
            self.nvml_read, self.nvml_why = nvml.process_memory_reader(0)
        self.t0 = time.monotonic()
        self.samples: List[Dict[str, Any]] = []

    def sample(self) -> None:
        values: Dict[str, int] = {"rss": int(host.process_rss_bytes())}
        if self.cuda:
            for name, mem in frameworks.memory_by_framework(0).items():
                if mem.allocated is not None:
                    values[f"{name}.allocated"] = int(mem.allocated)
                if mem.reserved is not None:
                    values[f"{name}.reserved"] = int(mem.reserved)
            if self.nvml_read is not None:
                values["nvml.process"] = int(self.nvml_read())
        self.samples.append({"t_s": round(time.monotonic() - self.t0, 3), "bytes": values})


def verdicts(samples: List[Dict[str, Any]], warmup_s: float, rss_bound: float,
             device_bound: float) -> Dict[str, Dict[str, Any]]:
    """Slope, noise and verdict of every series, fitted on the samples after the warm-up."""
    kept = [s for s in samples if s["t_s"] >= warmup_s]
    names = sorted({k for s in kept for k in s["bytes"]})
    out: Dict[str, Dict[str, Any]] = {}
    for name in names:
        points = [(s["t_s"] / 60, s["bytes"][name] / MiB) for s in kept if name in s["bytes"]]
        slope, err = fit([p[0] for p in points], [p[1] for p in points])
        bound = rss_bound if name == "rss" else device_bound
        if math.isnan(slope) or math.isnan(err):
            verdict = "too few samples"
        else:
            verdict = "growing" if slope > bound + 2 * err else "flat"
        out[name] = {
            "n": len(points),
            "first_mib": round(points[0][1], 3) if points else None,
            "last_mib": round(points[-1][1], 3) if points else None,
            "slope_mib_per_min": None if math.isnan(slope) else round(slope, 4),
            "stderr_mib_per_min": None if math.isnan(err) else round(err, 4),
            "bound_mib_per_min": bound,
            "verdict": verdict,
        }
    return out


def print_table(report: Dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text where rich is not installed
        for name, s in report["series"].items():
            print(f"{name:24s} slope {s['slope_mib_per_min']} +- {s['stderr_mib_per_min']} MiB/min "
                  f"(bound {s['bound_mib_per_min']}): {s['verdict']}")
        print(f"verdict: {report['verdict']}")
        return
    table = Table(title=f"soak ({report['config']['model']}): {report['steps']} steps in {report['duration_s']:.0f} s on "
                        f"{report['config']['device']} (fit after {report['config']['warmup_s']:.0f} s)")
    for col in ("series", "samples", "first MiB", "last MiB", "slope MiB/min", "noise (1 se)", "bound", "verdict"):
        table.add_column(col, justify="left" if col in ("series", "verdict") else "right")
    for name, s in report["series"].items():
        table.add_row(name, str(s["n"]), f"{s['first_mib']:.2f}", f"{s['last_mib']:.2f}",
                      "-" if s["slope_mib_per_min"] is None else f"{s['slope_mib_per_min']:+.3f}",
                      "-" if s["stderr_mib_per_min"] is None else f"{s['stderr_mib_per_min']:.3f}",
                      f"{s['bound_mib_per_min']:g}", s["verdict"])
    Console(stderr=False).print(table)
    print(f"step: mean {report['step_ms']['mean']:.3f} ms over {report['chunks']} profiler runs; "
          f"verdict: {report['verdict'].upper()}")


def run(args: argparse.Namespace) -> Dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available() and not args.cpu
    hook = False
    if cuda and not args.no_hook:
        from gpukeeper.integrations import use_torch_allocator

        use_torch_allocator()  # before the first CUDA tensor
        hook = True
    device = "cuda" if cuda else "cpu"
    forcefield, positions = MODELS[args.model](torch, args.atoms, device)
    duration = args.minutes * 60
    warmup_s = max(args.warmup_fraction * duration, args.sample_every)
    sampler = Sampler(cuda)
    chunk, steps, chunks, step_ms, leaks = 50, 0, 0, [], []
    sampler.sample()
    end = sampler.t0 + duration
    while time.monotonic() < end:
        result = benchmark_md_trajectory(
            forcefield, positions, n_steps=chunk, warmup_steps=10 if chunks == 0 else 2,
            device=device, check_memory_leak=True, progress=False, n_atoms=args.atoms,
            timestep_fs=0.5, name="soak")
        steps += result.n_steps
        chunks += 1
        step_ms.append(result.host.mean_ms if result.gpu is None else result.gpu.mean_ms)
        leaks.append(result.memory_leak)
        sampler.sample()
        # The next chunk lasts about one sampling interval (never past the end).
        per_step = max(result.total_time_s / max(result.n_steps, 1), 1e-6)
        left = max(end - time.monotonic(), 0.0)
        chunk = int(max(10, min(args.sample_every, left) / per_step))
    duration_s = time.monotonic() - sampler.t0
    series = verdicts(sampler.samples, warmup_s, args.rss_bound, args.device_bound)
    growing = [name for name, s in series.items() if s["verdict"] == "growing"]
    return {
        "schema": SCHEMA,
        "config": {
            "minutes": args.minutes, "sample_every_s": args.sample_every, "warmup_s": warmup_s,
            "model": args.model, "atoms": args.atoms, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "torch_hook": hook, "rss_bound_mib_per_min": args.rss_bound,
            "device_bound_mib_per_min": args.device_bound,
            "nvml": "process reader" if sampler.nvml_read is not None else sampler.nvml_why,
        },
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "gpukeeper": gpukeeper.__version__, "build": gpukeeper.build_info()},
        "duration_s": round(duration_s, 2),
        "steps": steps,
        "chunks": chunks,
        "step_ms": {"mean": sum(step_ms) / len(step_ms) if step_ms else float("nan"),
                    "min_chunk": min(step_ms, default=float("nan")),
                    "max_chunk": max(step_ms, default=float("nan"))},
        "profiler_leak_verdicts": {"leak": sum(1 for v in leaks if v is True),
                                   "no_leak": sum(1 for v in leaks if v is False),
                                   "none": sum(1 for v in leaks if v is None)},
        "samples": sampler.samples,
        "series": series,
        "growing": growing,
        "verdict": "fail" if growing else "pass",
    }


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long to run (default 10)")
    p.add_argument("--json", metavar="FILE", help="write the figures and samples here")
    p.add_argument("--sample-every", type=float, default=None,
                   help="seconds between samples (default: the run's length / 40, 1 to 5 s)")
    p.add_argument("--warmup-fraction", type=float, default=0.2,
                   help="part of the run left out of the fit (default 0.2)")
    p.add_argument("--atoms", type=int, default=256)
    p.add_argument("--model", choices=sorted(MODELS), default="mlp",
                   help="mlp (default) or schnet (needs torch-geometric)")
    p.add_argument("--rss-bound", type=float, default=1.0, help="MiB/min (default 1)")
    p.add_argument("--device-bound", type=float, default=1.0, help="MiB/min (default 1)")
    p.add_argument("--no-hook", action="store_true", help="keep PyTorch's own CUDA allocator")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where CUDA is available")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.atoms < 2 or not 0 <= args.warmup_fraction < 1:
        p.error("--minutes must be > 0, --atoms >= 2 and --warmup-fraction in [0, 1)")
    if args.sample_every is None:
        args.sample_every = min(5.0, max(1.0, args.minutes * 60 / 40))
    report = run(args)
    print_table(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if report["verdict"] == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
