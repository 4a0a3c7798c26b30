#!/usr/bin/env python3
"""Python allocation round trip (allocate + release), side by side in one run.

Rows, for 256 B, 64 KiB, 1 MiB and 64 MiB:
  gpukeeper   buf = pool.get_managed_buffer(0, n // 4, Precision.Fp32); buf.release()
  gpukeeper   with pool.get_managed_buffer(0, n // 4, Precision.Fp32): pass
  gpukeeper   the first form on MemoryPool(expandable=True), where gpukeeper has it
  torch       t = torch.empty(n, dtype=torch.uint8, device='cuda'); del t
  torch       the same with a torch.device object made once (no string parsing)
  cupy        m = cupy.cuda.alloc(n); del m          (CuPy's default MemoryPool)

The pool is gpukeeper.MemoryPool() ("auto": device memory when CUDA is usable, else
host memory, which is then said in the output). Rows whose library is missing, or that
need CUDA where there is none, are skipped with the reason.

Method: each statement is compiled inline by timeit (no per-call wrapper); warm-up
batches (which also calibrate), then --repeat batches of `number` round trips, `number` chosen so that a batch
takes about --batch-ms (at most 10000); reported are the median, p10 and p90 across
batches of ns per round trip. The garbage collector is off while timing (timeit's
default).

  python alloc_roundtrip.py [--json PATH] [--repeat N] [--batch-ms MS] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_env import environment, to_jsonable, try_import  # noqa: E402
from bench_timeit import measure  # noqa: E402

SIZES = [(256, "256B"), (64 << 10, "64KiB"), (1 << 20, "1MiB"), (64 << 20, "64MiB")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--repeat", type=int, default=51, help="timed batches per row (default 51)")
    p.add_argument("--batch-ms", type=float, default=5.0, help="target time per batch (default 5 ms)")
    p.add_argument("--kind", default="auto", help="gpukeeper.MemoryPool kind (default auto)")
    p.add_argument("--quick", action="store_true", help="11 batches of ~1 ms (a smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeat, args.batch_ms = 11, 1.0
    batch_ns = args.batch_ms * 1e6

    gk, gk_err = try_import("gpukeeper")
    torch, torch_err = try_import("torch")
    cupy, cupy_err = try_import("cupy")

    torch_cuda = torch is not None and torch.cuda.is_available()
    if torch is not None and not torch_cuda:
        torch_err = "torch.cuda.is_available() is False"
    cupy_cuda = False
    if cupy is not None:
        try:
            cupy_cuda = cupy.cuda.runtime.getDeviceCount() > 0
            if not cupy_cuda:
                cupy_err = "no CUDA device"
        except Exception as e:
            cupy_err = f"no usable CUDA device ({type(e).__name__}: {e})"

    env = environment(gk, torch, cupy)
    notes = []
    skipped = {}
    pool = None
    pool_kind = None
    if gk is None:
        skipped["gpukeeper"] = gk_err
    else:
        try:
            pool = gk.MemoryPool() if args.kind == "auto" else gk.MemoryPool(args.kind)
            pool_kind = getattr(pool, "kind", None)
            if callable(pool_kind):
                pool_kind = pool_kind()
            pool_kind = str(pool_kind) if pool_kind is not None else args.kind
        except Exception as e:
            skipped["gpukeeper"] = f"MemoryPool({args.kind!r}) failed: {type(e).__name__}: {e}"
    pool_exp = None
    if pool is not None:
        try:  # expandable segments, where the installed gpukeeper has them
            pool_exp = (gk.MemoryPool(expandable=True) if args.kind == "auto"
                        else gk.MemoryPool(args.kind, expandable=True))
        except TypeError:
            skipped["gpukeeper_expandable"] = "this gpukeeper has no expandable segments"
        except Exception as e:
            skipped["gpukeeper_expandable"] = f"MemoryPool(expandable=True) failed: {type(e).__name__}: {e}"
    if torch is None or not torch_cuda:
        skipped["torch"] = torch_err
    if cupy is None or not cupy_cuda:
        skipped["cupy"] = cupy_err
    gpu = torch_cuda or cupy_cuda
    if not gpu:
        notes.append("no CUDA device: gpukeeper rows use whatever MemoryPool() chose (host memory "
                     "in CPU mode); torch and CuPy rows skipped")

    print("gpukeeper Python allocation round trip")
    print(f"python {env['python']}; cpu: {env['cpu']}; gpu: {env.get('gpu_name', 'none')}")
    print(f"versions: gpukeeper {env.get('gpukeeper', '-')}, torch {env.get('torch', '-')}, "
          f"cupy {env.get('cupy', '-')}; gpukeeper pool kind: {pool_kind or '-'}")
    for k, v in skipped.items():
        print(f"skipped {k}: {v}")
    for n in notes:
        print(f"NOTE: {n}")

    if cupy is not None and cupy_cuda:
        env["cupy_allocator"] = repr(cupy.cuda.get_allocator())
        if "MemoryPool" not in env["cupy_allocator"]:
            notes.append(f"CuPy's allocator is {env['cupy_allocator']}, not the default MemoryPool")
            print(f"NOTE: {notes[-1]}")

    rows = []
    for size, key in SIZES:
        n_elems = size // 4
        cases = []
        if pool is not None:
            ns = {"get": pool.get_managed_buffer, "fp32": gk.Precision.Fp32, "n": n_elems}
            cases.append(("gpukeeper_release", "gpukeeper get_managed_buffer + release()",
                          "b = get(0, n, fp32); b.release()", ns))
            cases.append(("gpukeeper_with", "gpukeeper with get_managed_buffer(...)",
                          "with get(0, n, fp32):\n    pass", ns))
        if pool_exp is not None:
            ns = {"get": pool_exp.get_managed_buffer, "fp32": gk.Precision.Fp32, "n": n_elems}
            cases.append(("gpukeeper_expandable_release",
                          "gpukeeper expandable: get_managed_buffer + release()",
                          "b = get(0, n, fp32); b.release()", ns))
        if "torch" not in skipped:
            ns = {"torch": torch, "empty": torch.empty, "u8": torch.uint8, "n": size,
                  "dev": torch.device("cuda")}
            cases.append(("torch_empty", "torch.empty(device='cuda') + del",
                          "t = empty(n, dtype=u8, device='cuda'); del t", ns))
            cases.append(("torch_empty_devobj", "torch.empty(device=torch.device) + del",
                          "t = empty(n, dtype=u8, device=dev); del t", ns))
        if "cupy" not in skipped:
            ns = {"alloc": cupy.cuda.alloc, "n": size}
            cases.append(("cupy_alloc", "cupy.cuda.alloc (MemoryPool) + del",
                          "m = alloc(n); del m", ns))
        for case_key, label, stmt, ns in cases:
            row = {"case": case_key, "label": label, "size_bytes": size, "workload": key,
                   "stmt": stmt}
            try:
                row.update(measure(stmt, ns, args.repeat, batch_ns))
                row["error"] = None
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"
                print(f"  {label} {key} failed: {row['error']}", file=sys.stderr)
            rows.append(row)

    # Table
    def get(case, key):
        for r in rows:
            if r["case"] == case and r["workload"] == key and r["error"] is None:
                return r
        return None

    print("\nns per round trip (median, p10, p90 across batches)")
    print(f"{'size':<7} {'case':<52} {'median':>9} {'p10':>9} {'p90':>9} {'n x batches':>12} {'vs cupy':>8}")
    last = None
    for r in rows:
        if last is not None and r["workload"] != last:
            print()
        last = r["workload"]
        if r["error"]:
            print(f"{r['workload']:<7} {r['label']:<52}   FAILED: {r['error']}")
            continue
        ref = get("cupy_alloc", r["workload"])
        vs = f"{ref['ns_median'] / r['ns_median']:.2f}x" if ref and r["case"] != "cupy_alloc" else "-"
        print(f"{r['workload']:<7} {r['label']:<52} {r['ns_median']:9.0f} {r['ns_p10']:9.0f} "
              f"{r['ns_p90']:9.0f} {str(r['number_per_batch']) + ' x ' + str(r['batches']):>12} {vs:>8}")

    # Target: the gpukeeper round trip no slower than CuPy's pool in the same run.
    targets = []
    print("\nTarget: gpukeeper round trip no slower than CuPy's pool")
    for size, key in SIZES:
        g = get("gpukeeper_release", key)
        c = get("cupy_alloc", key)
        if g is None:
            continue
        t = {"size": key, "gpukeeper_ns": g["ns_median"], "cupy_ns": c["ns_median"] if c else None}
        if c is None:
            t["met"] = None
            print(f"  {key:<6} not measured (no CuPy row)")
        else:
            t["ratio_gpukeeper_over_cupy"] = g["ns_median"] / c["ns_median"]
            t["met"] = g["ns_median"] <= c["ns_median"]
            print(f"  {key:<6} {'met' if t['met'] else 'MISSED'}: gpukeeper {g['ns_median']:.0f} ns, "
                  f"cupy {c['ns_median']:.0f} ns")
        targets.append(t)

    def pool_stats(p):
        if p is None:
            return None
        try:
            return to_jsonable(p.stats(0))
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}

    stats = pool_stats(pool)
    stats_exp = pool_stats(pool_exp)

    if args.json:
        out = {
            "benchmark": "alloc_roundtrip_python",
            "environment": env,
            "config": {"repeat": args.repeat, "batch_ms": args.batch_ms, "pool_kind": pool_kind,
                       "timer": "timeit (time.perf_counter), statement compiled inline, gc off",
                       "statistic": "mean ns per round trip within a batch; median/p10/p90 across batches"},
            "skipped": skipped,
            "notes": notes,
            "results": rows,
            "targets": targets,
            "gpukeeper_pool_stats": stats,
            "gpukeeper_expandable_pool_stats": stats_exp,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"\nJSON written to {args.json}")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
