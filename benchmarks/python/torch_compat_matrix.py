"""Which PyTorch allocator features work under which allocator: one row per feature, one
column per allocator, each cell from a fresh process running the feature as a user would
(tests/python/torch_features_child.py, the script the GPU tests run too).

Allocators: PyTorch's own caching allocator; gpukeeper (use_torch_allocator(), the
allocator component), also with expandable=False; gpukeeper through PyTorch's
pluggable-allocator interface; RMM's torch allocator (when rmm is installed). Prints a
Markdown table and writes JSON (--json PATH).

    python benchmarks/python/torch_compat_matrix.py [--json out.json] [--jobs 4]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

CHILD = Path(__file__).resolve().parents[2] / "tests" / "python" / "torch_features_child.py"

FEATURES: List[Tuple[str, str]] = [
    ("cudnn_benchmark", "cuDNN benchmark mode (ResNet-18 training)"),
    ("reduce_overhead_inference", "torch.compile reduce-overhead, inference, 2 shapes + branch"),
    ("reduce_overhead_training", "torch.compile reduce-overhead, training"),
    ("ipc_4mib_to_native", "4 MiB CUDA tensor through torch.multiprocessing to a native child"),
    ("ipc_4mib_to_gpukeeper", "4 MiB CUDA tensor through torch.multiprocessing to a gpukeeper child"),
    ("ipc_256mib_to_native", "256 MiB CUDA tensor through torch.multiprocessing to a native child"),
    ("ipc_256mib_to_gpukeeper", "256 MiB CUDA tensor through torch.multiprocessing to a gpukeeper child"),
    ("memory_history", "memory history with stack frames, snapshot, memory_viz"),
    ("segment_history", "memory history's segment events (64 MiB taken, given back)"),
    ("oom_observer", "out-of-memory observer"),
]
ALLOCATORS = ["native", "gpukeeper", "gpukeeper-fixed", "gpukeeper-pluggable", "rmm"]


def run(allocator: str, feature: str) -> Dict:
    try:
        done = subprocess.run([sys.executable, str(CHILD), allocator, feature],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "timed out after 300 s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": f"exit {done.returncode}: {tail[:200]}"}
    return json.loads(lines[-1])


def verdict(feature: str, out: Dict) -> str:
    """'works' only when the feature also gave the right answer."""
    if not out.get("ok"):
        return "fails: " + out.get("error", "?")[:120]
    good = True
    if feature.startswith("ipc"):
        good = (out["second"] == out["first"] and out["first"][0] == out["expected_sum"]
                and out["allocated_after"] == out["allocated_before"])
    elif feature == "segment_history":
        got = out["bytes_by_action"]
        taken = got.get("segment_alloc", 0) + got.get("segment_map", 0)
        given = got.get("segment_free", 0) + got.get("segment_unmap", 0)
        good = taken >= 64 << 20 and given == taken
    elif feature == "memory_history":
        good = out["traces_with_our_frames"] > 0 and out["live_blocks_with_our_frames"] > 0
    elif feature == "oom_observer":
        good = out["observer_calls"] >= 1 and bool(out["raised"])
    elif feature == "reduce_overhead_training":
        good = out["max_loss_difference"] < 1e-4
    elif feature == "reduce_overhead_inference":
        good = out["max_error"] < 1e-2
    return "works" if good else "wrong result"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--jobs", type=int, default=4, help="processes at once")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: nothing to compare")
        return 0
    if not torch.cuda.is_available():
        print("PyTorch sees no CUDA device: nothing to compare")
        return 0
    allocators = list(ALLOCATORS)
    try:
        import rmm  # noqa: F401
    except ImportError:
        allocators.remove("rmm")
    jobs = [(a, f) for f, _ in FEATURES for a in allocators]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(jobs, pool.map(lambda job: run(*job), jobs)))
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    print("| feature | " + " | ".join(allocators) + " |")
    print("|---|" + "---|" * len(allocators))
    rows = []
    for feature, label in FEATURES:
        cells = [verdict(feature, results[(a, feature)]) for a in allocators]
        rows.append({"feature": feature, "label": label,
                     "cells": dict(zip(allocators, cells)),
                     "raw": {a: results[(a, feature)] for a in allocators}})
        print(f"| {label} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
