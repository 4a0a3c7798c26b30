"""Host cost of benchmark_md_trajectory's per-step bookkeeping.

Compares a bare loop ``for x in inputs: out = model(x)`` with the instrumented loop of
``benchmark_md_trajectory`` (its ``total_time_s`` covers the measured loop only), for
a no-op model (the overhead itself; target <= 1 us per step without per-step sync) and
a ~100 us busy step (the slowdown of a real step loop; target <= 2%). Each figure is the
best of ``--repeats`` runs (the least disturbed by the machine), bare and instrumented
runs alternating. On a CUDA machine with
PyTorch it adds the configurations with GPU event timing (a mark every k-th step, k chosen
by ``event_every="auto"``; and a mark after every step, ``event_every=1``, the cost of
per-step GPU times), and two real GPU step loops:
a 100 us calibration kernel per step (GPU-bound), and a small MLP force field (energy and
forces by autograd for 256 atoms, ~100 us of launches per step: host-bound). The bare
GPU loops end with a synchronize, as the instrumented one does.

    python benchmarks/python/md_overhead_bench.py [--steps N] [--repeats R] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any, Callable, Dict, List

import gpukeeper
from gpukeeper.md import benchmark_md_trajectory


def noop(x: Any) -> Any:
    return x


def busy_100us(x: Any) -> Any:
    end = time.perf_counter_ns() + 100_000
    while time.perf_counter_ns() < end:
        pass
    return x


def bare_loop(model: Callable[[Any], Any], inputs: List[Any], sync: Callable[[], Any] = lambda: None) -> float:
    t = time.perf_counter()
    for x in inputs:
        out = model(x)  # noqa: F841  (kept alive as the instrumented loop keeps it)
    out = None
    sync()
    return time.perf_counter() - t


def measure(model: Callable[[Any], Any], steps: int, repeats: int,
            sync: Callable[[], Any] = lambda: None, inputs: Any = None, **kw: Any) -> Dict[str, Any]:
    inputs = list(range(steps)) if inputs is None else [inputs] * steps
    for _ in range(3):
        model(inputs[0])
    sync()
    # Bare and instrumented runs alternate, so that both see the same machine (clock
    # changes and neighbours on a shared host move both alike); best of each.
    bares, runs = [], []
    for _ in range(repeats):
        bares.append(bare_loop(model, inputs, sync))
        runs.append(benchmark_md_trajectory(model, inputs, warmup_steps=10, progress=False, **kw))
    bare = min(bares)
    best = min(runs, key=lambda r: r.total_time_s)
    inst = best.total_time_s
    return {
        "bare_s": bare,
        "instrumented_s": inst,
        "overhead_us_per_step": (inst - bare) / steps * 1e6,
        "slowdown_pct": 100.0 * (inst - bare) / bare,
        "memory_sample_every": best.memory_sample_every,
        "memory_source": best.memory_source,
        "timing_source": best.timing_source,
        "event_every": best.event_every,
    }


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000, help="steps of the no-op runs")
    ap.add_argument("--busy-steps", type=int, default=2000, help="steps of the 100 us runs")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    a = ap.parse_args(argv)

    configs = [
        ("noop, host timing, no memory", noop, a.steps, dict(device="cpu", check_memory_leak=False)),
        ("noop, host timing, memory auto", noop, a.steps, dict(device="cpu")),
        ("100us, host timing, no memory", busy_100us, a.busy_steps, dict(device="cpu", check_memory_leak=False)),
        ("100us, host timing, memory auto", busy_100us, a.busy_steps, dict(device="cpu")),
    ]
    if gpukeeper.cuda_available():
        try:
            import torch

            if torch.cuda.is_available():
                torch.zeros(1, device="cuda")
                sync = torch.cuda.synchronize
                configs += [
                    ("noop, GPU events, memory auto", noop, a.steps, dict(device="cuda:0")),
                    ("noop, GPU events every step, memory auto", noop, a.steps,
                     dict(device="cuda:0", event_every=1)),
                    ("noop, host timing, CUDA memory auto", noop, a.steps,
                     dict(device="cuda:0", timing="host")),
                    ("100us, GPU events, memory auto", busy_100us, a.busy_steps, dict(device="cuda:0")),
                ]
                from gpukeeper import _core

                if _core.calibration_kernels_available():
                    stream = torch.cuda.current_stream().cuda_stream

                    def kernel_100us(x: Any) -> Any:
                        _core.spin_kernel(100_000, stream)
                        return x

                    configs += [
                        ("GPU 100us kernel, GPU events, memory auto", kernel_100us, a.busy_steps,
                         dict(device="cuda:0", sync=sync)),
                        ("GPU 100us kernel, GPU events, no memory", kernel_100us, a.busy_steps,
                         dict(device="cuda:0", check_memory_leak=False, sync=sync)),
                        ("GPU 100us kernel, GPU events every step", kernel_100us, a.busy_steps,
                         dict(device="cuda:0", check_memory_leak=False, sync=sync, event_every=1)),
                        ("GPU 100us kernel, host timing, no memory", kernel_100us, a.busy_steps,
                         dict(device="cuda:0", timing="host", check_memory_leak=False, sync=sync)),
                    ]
                mlp = torch.nn.Sequential(
                    torch.nn.Linear(3, 64), torch.nn.SiLU(), torch.nn.Linear(64, 64), torch.nn.SiLU(),
                    torch.nn.Linear(64, 1)).cuda()
                positions = torch.randn(256, 3, device="cuda")

                def forcefield(pos: Any) -> Any:
                    pos = pos.detach().requires_grad_(True)
                    energy = mlp(pos).sum()
                    (forces,) = torch.autograd.grad(energy, pos)
                    return energy.detach(), forces

                configs += [
                    ("MLP force field, GPU events, memory auto", forcefield, a.busy_steps,
                     dict(device="cuda:0", sync=sync, inputs=positions)),
                    ("MLP force field, host timing, no memory", forcefield, a.busy_steps,
                     dict(device="cuda:0", timing="host", check_memory_leak=False, sync=sync,
                          inputs=positions)),
                ]
        except ImportError:
            pass
    rows = []
    for label, model, steps, kw in configs:
        m = measure(model, steps, a.repeats, **kw)
        m.update(config=label, steps=steps)
        rows.append(m)
    print(f"{'configuration':44s} {'steps':>6s} {'bare ms':>9s} {'instr ms':>9s} "
          f"{'us/step':>8s} {'slowdown':>9s} {'mem every':>9s} {'ev every':>8s}")
    for r in rows:
        print(f"{r['config']:44s} {r['steps']:6d} {r['bare_s'] * 1e3:9.2f} {r['instrumented_s'] * 1e3:9.2f} "
              f"{r['overhead_us_per_step']:8.3f} {r['slowdown_pct']:8.2f}% {str(r['memory_sample_every']):>9s} "
              f"{str(r['event_every']):>8s}")
    if a.json:
        meta = {"python": platform.python_version(), "platform": platform.platform(),
                "gpukeeper": gpukeeper.__version__, "cuda": bool(gpukeeper.cuda_available())}
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
