"""The routes by which PyTorch can allocate on gpukeeper's pool, side by side in one run:
what each costs in memory and time on a real training loop, and which features work.

Routes, each in fresh child processes (an allocator is chosen before PyTorch's first
CUDA allocation), in the order A B C C B A per round:

- ``native``: PyTorch's own caching allocator;
- ``component``: ``use_torch_allocator()``, gpukeeper's allocator component as PyTorch's
  CUDA allocator;
- ``mempool``: PyTorch's caching allocator kept, with ``torch.cuda.MemPool`` made from
  gpukeeper's exported malloc/free (``CUDAPluggableAllocator``) and the loop run inside
  ``torch.cuda.use_mem_pool``: PyTorch's documented way to plug in a custom allocator
  (torch 2.8 and newer), which keeps every feature of PyTorch's allocator, its segments
  coming from gpukeeper's pool.

The loop: torchvision ResNet-18 training (batch 64, 224x224, channels-last, bf16 autocast,
``cudnn.benchmark`` on), 30 steps, each synchronised. Per route: the step's median wall
time, the peak of memory PyTorch reports allocated, and the peak device memory the process
holds, read from NVML after every step (a counter gpukeeper does not produce). Prints a
Markdown table of medians and writes JSON (--json PATH).

    python benchmarks/python/torch_routes_bench.py [--json out.json] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

ROUTES = ["native", "component", "mempool"]
MiB = 1 << 20


def _process_memory(handle: Any, pynvml: Any) -> int:
    pid = os.getpid()
    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == pid:
            return int(proc.usedGpuMemory or 0)
    return 0


def child(route: str, steps: int) -> Dict[str, Any]:
    import pynvml
    import torch
    import torchvision

    context: Any = None
    if route == "component":
        import gpukeeper

        gpukeeper.use_torch_allocator()
    elif route == "mempool":
        import gpukeeper._core as core

        malloc_name, free_name = core._torch_malloc_symbols()
        allocator = torch.cuda.memory.CUDAPluggableAllocator(core.__file__, malloc_name, free_name)
        pool = torch.cuda.MemPool(allocator.allocator())
        context = torch.cuda.use_mem_pool(pool)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    torch.backends.cudnn.benchmark = True
    if context is not None:
        context.__enter__()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=100).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 100, (64,), device="cuda")
    times: List[float] = []
    peak_process = 0
    for _ in range(steps):
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        times.append((time.perf_counter() - start) * 1e3)
        peak_process = max(peak_process, _process_memory(handle, pynvml))
    if context is not None:
        context.__exit__(None, None, None)
    warm = times[5:]
    return {
        "route": route,
        "step_ms": statistics.median(warm),
        "peak_allocated_mib": torch.cuda.max_memory_allocated() / MiB,
        "peak_process_mib": peak_process / MiB,
        "final_loss": float(loss),
    }


def run(route: str, steps: int) -> Dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", route, "--steps", str(steps)],
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"route": route, "error": f"exit {done.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--child", choices=ROUTES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA device: nothing to compare")
        return 0
    order = ROUTES + ROUTES[::-1]
    results: Dict[str, List[Dict[str, Any]]] = {r: [] for r in ROUTES}
    for _ in range(args.rounds):
        for route in order:
            results[route].append(run(route, args.steps))
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
          f"ResNet-18 training, batch 64, {args.steps} steps, medians of {2 * args.rounds} processes")
    print("| route | step (ms) | vs native | peak allocated (MiB) | peak process memory, NVML (MiB) | errors |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for route in ROUTES:
        good = [r for r in results[route] if "error" not in r]
        errors = [r["error"] for r in results[route] if "error" in r]
        if not good:
            print(f"| {route} | - | - | - | - | {errors[0] if errors else ''} |")
            continue
        summary[route] = {k: statistics.median(r[k] for r in good)
                          for k in ("step_ms", "peak_allocated_mib", "peak_process_mib")}
    native = summary.get("native", {}).get("step_ms")
    for route, s in summary.items():
        ratio = f"{s['step_ms'] / native:.3f}" if native else "-"
        print(f"| {route} | {s['step_ms']:.2f} | {ratio} | {s['peak_allocated_mib']:.0f} | "
              f"{s['peak_process_mib']:.0f} | |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "summary": summary, "runs": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
