"""PyTorch on its own caching allocator vs on gpukeeper's pool (use_torch_allocator).

Each allocator runs in a fresh child process (PyTorch's allocator can only be chosen
before its first CUDA allocation), alternating, in one run of this program:
  - torch.empty(n bytes, device='cuda') + del, for 256 B, 64 KiB, 1 MiB, 64 MiB;
  - one training step of a small MLP (forward, backward, Adam), synchronized per step;
  - the memory queries training loops make every step (torch.cuda.memory_allocated(),
    max_memory_allocated(), memory_reserved(), memory_stats()), which under
    use_torch_allocator() answer from gpukeeper's books.
Prints a table of medians and writes JSON (--json PATH). Targets: within 10% of PyTorch
on torch.empty+del and 2% on the step; a memory query at most 1 us.

    python benchmarks/python/torch_allocator_bench.py [--json out.json] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

SIZES = [(256, "256B"), (64 << 10, "64KiB"), (1 << 20, "1MiB"), (64 << 20, "64MiB")]
QUERIES = ["memory_allocated", "max_memory_allocated", "memory_reserved", "memory_stats"]
QUERY_TARGET_NS = 1000.0


def time_queries(torch, quick: bool) -> dict:
    """Median ns per call of each memory query (batches of calls, median of batches)."""
    result = {}
    for name in QUERIES:
        fn = getattr(torch.cuda, name)
        per_batch = (200 if name == "memory_stats" else 2000) // (4 if quick else 1)
        for _ in range(50):
            fn()
        samples = []
        for _ in range(15 if quick else 41):
            start = time.perf_counter_ns()
            for _ in range(per_batch):
                fn()
            samples.append((time.perf_counter_ns() - start) / per_batch)
        result[name] = statistics.median(samples)
    return result


def child(mode: str, quick: bool) -> dict:
    import torch

    if mode == "gpukeeper":
        from gpukeeper.integrations import use_torch_allocator

        use_torch_allocator()
    out: dict = {"mode": mode, "empty_ns": {}, "step_us": None}
    batches = 15 if quick else 41
    per_batch = 2000 if quick else 5000
    for n, label in SIZES:
        for _ in range(200):
            t = torch.empty(n, dtype=torch.uint8, device="cuda")
            del t
        samples = []
        for _ in range(batches):
            start = time.perf_counter_ns()
            for _ in range(per_batch):
                t = torch.empty(n, dtype=torch.uint8, device="cuda")
                del t
            samples.append((time.perf_counter_ns() - start) / per_batch)
        out["empty_ns"][label] = statistics.median(samples)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048),
        torch.nn.GELU(), torch.nn.Linear(2048, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(512, 1024, device="cuda")

    def step() -> None:
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    steps = []
    for _ in range(60 if quick else 300):
        start = time.perf_counter_ns()
        step()
        torch.cuda.synchronize()
        steps.append((time.perf_counter_ns() - start) / 1e3)
    out["query_ns"] = time_queries(torch, quick)
    out["step_us"] = statistics.median(steps)
    out["step_us_p10"] = sorted(steps)[len(steps) // 10]
    out["step_us_p90"] = sorted(steps)[len(steps) * 9 // 10]
    out["torch"] = torch.__version__
    out["gpu"] = torch.cuda.get_device_name(0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--rounds", type=int, default=3, help="child pairs to run, alternating")
    parser.add_argument("--quick", action="store_true", help="a smoke test")
    parser.add_argument("--child", choices=["torch", "gpukeeper"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.quick)))
        return 0
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: nothing to compare")
        return 0
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA device: nothing to compare (CPU mode)")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"skipped": "no CUDA"}, fh)
        return 0
    runs: dict = {"torch": [], "gpukeeper": []}
    for _ in range(args.rounds):
        for mode in ("torch", "gpukeeper"):
            cmd = [sys.executable, __file__, "--child", mode] + (["--quick"] if args.quick else [])
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                print(done.stderr[-3000:])
                return 1
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))

    def med(mode: str, pick) -> float:
        return statistics.median(pick(r) for r in runs[mode])

    first = runs["torch"][0]
    print("PyTorch allocator vs gpukeeper (use_torch_allocator), medians over "
          f"{args.rounds} child processes each")
    print(f"gpu: {first['gpu']}; torch {first['torch']}")
    print(f"{'case':<28}{'PyTorch':>12}{'gpukeeper':>12}{'ratio':>9}  target")
    rows = []
    for _, label in SIZES:
        a = med("torch", lambda r: r["empty_ns"][label])
        b = med("gpukeeper", lambda r: r["empty_ns"][label])
        verdict = "met" if b <= 1.10 * a else "MISSED"
        rows.append({"case": f"empty+del {label}", "torch": a, "gpukeeper": b, "ratio": b / a,
                     "unit": "ns", "target": 1.10, "verdict": verdict})
        print(f"{'torch.empty+del ' + label:<28}{a:>10.0f}ns{b:>10.0f}ns{b / a:>9.3f}  <=1.10 {verdict}")
    a = med("torch", lambda r: r["step_us"])
    b = med("gpukeeper", lambda r: r["step_us"])
    verdict = "met" if b <= 1.02 * a else "MISSED"
    rows.append({"case": "MLP training step", "torch": a, "gpukeeper": b, "ratio": b / a,
                 "unit": "us", "target": 1.02, "verdict": verdict})
    print(f"{'MLP training step':<28}{a:>10.1f}us{b:>10.1f}us{b / a:>9.3f}  <=1.02 {verdict}")
    for name in QUERIES:
        a = med("torch", lambda r: r["query_ns"][name])
        b = med("gpukeeper", lambda r: r["query_ns"][name])
        target = QUERY_TARGET_NS if name != "memory_stats" else None
        verdict = "-" if target is None else ("met" if b <= target else "MISSED")
        rows.append({"case": f"{name}()", "torch": a, "gpukeeper": b, "ratio": b / a,
                     "unit": "ns", "target_ns": target, "verdict": verdict})
        goal = f"<={target / 1000:.0f}us {verdict}" if target else ""
        print(f"{name + '()':<28}{a:>10.0f}ns{b:>10.0f}ns{b / a:>9.3f}  {goal}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "runs": runs}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
