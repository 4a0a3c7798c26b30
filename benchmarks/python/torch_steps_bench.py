"""Real training and inference steps under PyTorch's allocator and under gpukeeper's
(use_torch_allocator(), the allocator component), side by side in one run.

Each allocator runs in fresh child processes (PyTorch's allocator is chosen before its
first CUDA allocation), in the order A B B A for each round, so that a drift of the
machine over the run falls on both alike, after a discarded warm-up child (the first
process of a run was the slowest, whichever allocator it ran). Within a child every case
is timed in chunks, the cases taking turns, so that each spans the child's whole run.
Cases, each timed per step with the wall clock of a synchronized loop (medians):

- torchvision ResNet-50 training step (batch 64, bf16 autocast, channels-last), cuDNN
  benchmark off, with a synchronisation each step (``loss.item()``) and without one
  (20 steps, then one synchronisation);
- the same with ``torch.backends.cudnn.benchmark = True``;
- a transformers GPT-2 (4 layers, width 512) under ``torch.compile(mode="reduce-overhead")``:
  inference (batch 8 x 128 tokens) and training steps;
- ``torch.empty(64 KiB)`` + ``del`` while memory history is recorded.

Prints a table of medians and ratios and writes JSON (--json PATH).

    python benchmarks/python/torch_steps_bench.py [--json out.json] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

CASES = [
    ("resnet50_sync", "ResNet-50 step, synchronised each step", "ms"),
    ("resnet50_nosync", "ResNet-50 step, 20 steps per synchronisation", "ms"),
    ("resnet50_cudnn_benchmark", "ResNet-50 step, cudnn.benchmark, synchronised", "ms"),
    ("gpt2_ro_inference", "GPT-2 reduce-overhead inference step", "ms"),
    ("gpt2_ro_training", "GPT-2 reduce-overhead training step", "ms"),
    ("history_alloc", "empty(64 KiB)+del while history is recorded", "ns"),
]


def _timed(step: Callable[[], Any], sync: Callable[[], Any], steps: int, per_sync: int = 1) -> List[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        for _ in range(per_sync):
            out = step()
        sync(out)
        times.append((time.perf_counter() - start) * 1e3 / per_sync)
    return times


# A case is a function that times one chunk of steps and returns its samples. A child runs
# every case's chunks in turn, PASSES times: the host of a shared machine changes speed in
# phases of about a second, and a case timed in one stretch would take one phase's speed.
PASSES = 8


def resnet_cases(torch: Any, quick: bool) -> Dict[str, Callable[[], List[float]]]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (64,), device="cuda")

    def step() -> Any:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    item = lambda loss: loss.item()  # noqa: E731
    n = 3 if quick else 6

    def chunk(benchmark: bool, per_sync: int) -> Callable[[], List[float]]:
        def run() -> List[float]:
            torch.backends.cudnn.benchmark = benchmark
            _timed(step, item, 1)
            return _timed(step, item, n if per_sync == 1 else 1, per_sync=per_sync)
        return run

    for benchmark in (False, True):  # cuDNN's first choices, out of the timed chunks
        torch.backends.cudnn.benchmark = benchmark
        _timed(step, item, 5)
    return {"resnet50_sync": chunk(False, 1), "resnet50_nosync": chunk(False, 20),
            "resnet50_cudnn_benchmark": chunk(True, 1)}


def gpt2_cases(torch: Any, quick: bool) -> Dict[str, Callable[[], List[float]]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=256,
                        use_cache=False)
    torch.manual_seed(0)
    ids = torch.randint(0, 8192, (8, 128), device="cuda")
    n = 5 if quick else 15
    model = GPT2LMHeadModel(config).cuda().eval()
    compiled = torch.compile(model, mode="reduce-overhead")

    def infer() -> Any:
        with torch.no_grad():
            return compiled(ids).logits

    trained = GPT2LMHeadModel(config).cuda().train()
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-4)
    compiled_train = torch.compile(trained, mode="reduce-overhead")

    def train() -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled_train(ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    item = lambda loss: loss.item()  # noqa: E731
    _timed(infer, sync, 10)
    _timed(train, item, 10)
    return {"gpt2_ro_inference": lambda: _timed(infer, sync, n),
            "gpt2_ro_training": lambda: _timed(train, item, n)}


def history_case(torch: Any, quick: bool) -> Dict[str, Callable[[], List[float]]]:
    def run() -> List[float]:
        torch.cuda.memory._record_memory_history(max_entries=100000)
        for _ in range(200):
            t = torch.empty(1 << 16, dtype=torch.uint8, device="cuda")
            del t
        samples = []
        for _ in range(2 if quick else 5):
            start = time.perf_counter_ns()
            for _ in range(500):
                t = torch.empty(1 << 16, dtype=torch.uint8, device="cuda")
                del t
            samples.append((time.perf_counter_ns() - start) / 500)
        torch.cuda.memory._record_memory_history(enabled=None)
        return samples

    return {"history_alloc": run}


def child(mode: str, quick: bool) -> Dict[str, Any]:
    import torch

    if mode == "gpukeeper":
        import gpukeeper

        gpukeeper.use_torch_allocator(route="component")
    out: Dict[str, Any] = {"mode": mode, "torch": torch.__version__,
                           "gpu": torch.cuda.get_device_name(0)}
    cases: Dict[str, Callable[[], List[float]]] = {}
    cases.update(resnet_cases(torch, quick))
    cases.update(gpt2_cases(torch, quick))
    cases.update(history_case(torch, quick))
    samples: Dict[str, List[float]] = {name: [] for name in cases}
    for _ in range(2 if quick else PASSES):
        for name, run in cases.items():
            samples[name] += run()
    for name, values in samples.items():
        out[name] = statistics.median(values)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--rounds", type=int, default=2, help="A B B A rounds")
    parser.add_argument("--warmup", type=int, default=1,
                        help="children run first and discarded (the first process of a run "
                             "measured 8-15%% slower steps on the H100, whichever allocator)")
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
        print("PyTorch sees no CUDA device: nothing to compare")
        return 0
    runs: Dict[str, List[Dict[str, Any]]] = {"torch": [], "gpukeeper": []}
    order = [("torch" if i % 2 == 0 else "gpukeeper", False) for i in range(args.warmup)]
    for _ in range(args.rounds):
        order += [(mode, True) for mode in ("torch", "gpukeeper", "gpukeeper", "torch")]
    for mode, kept in order:
        cmd = [sys.executable, __file__, "--child", mode] + (["--quick"] if args.quick else [])
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-4000:])
            return 1
        if kept:
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    first = runs["torch"][0]
    print(f"PyTorch's allocator vs gpukeeper's (allocator component); medians over "
          f"{len(runs['torch'])} processes each, A B B A")
    print(f"GPU: {first['gpu']}; torch {first['torch']}")
    print(f"{'case':<50}{'PyTorch':>12}{'gpukeeper':>12}{'ratio':>8}")
    rows = []
    for key, label, unit in CASES:
        a = statistics.median(r[key] for r in runs["torch"])
        b = statistics.median(r[key] for r in runs["gpukeeper"])
        rows.append({"case": key, "label": label, "unit": unit, "torch": a, "gpukeeper": b,
                     "ratio": b / a,
                     "torch_each": [r[key] for r in runs["torch"]],
                     "gpukeeper_each": [r[key] for r in runs["gpukeeper"]]})
        fmt = ".2f" if unit == "ms" else ".0f"
        print(f"{label:<50}{a:>10{fmt}}{unit}{b:>10{fmt}}{unit}{b / a:>8.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "runs": runs}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
