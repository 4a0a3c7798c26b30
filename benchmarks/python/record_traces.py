#!/usr/bin/env python3
"""Records allocation traces of real PyTorch work on a GPU, for benchmarks/cpp/trace_replay.

Workloads (each run in a fresh subprocess, so that the allocator starts empty):
  transformer  nn.TransformerEncoder (4 layers, d_model 512, 8 heads, batch 16) with a token
               embedding and an LM head, trained with AdamW; the sequence length is drawn
               afresh every step, uniformly in [64, 1024].
  forcefield   a small message-passing force field in plain torch: random structures
               (200..3000 atoms, constant density) every step, a radius graph (5 A cutoff)
               recomputed each step so that the edge count changes, per-edge MLP messages
               aggregated with index_add_, energy = sum of per-atom energies, forces =
               -autograd.grad(energy, pos) (create_graph=False).
  mdlong       a long molecular-dynamics run (default 1200 steps) with that force field:
               1500 atoms under velocity Verlet in a periodic box, the radius graph rebuilt
               every step (the edge count drifts), and every 100 steps an analysis
               (a radial distribution histogram over all pairs) that allocates large.
  twostream    training on the default stream while a second stream makes the next batch
               (tensors handed over with record_stream, freed on the other stream) and
               evaluates the model every 4 steps; batch sizes vary (32..512).

Each workload runs twice with the same seed (so with the same shapes):
  1. PyTorch's default allocator, recording with torch.cuda.memory._record_memory_history
     (context=None: no stack traces, only the event history); the snapshot's
     device_traces are converted to the text trace below. PyTorch's own
     max_memory_reserved / max_memory_allocated (and the requested-bytes peak from
     memory_stats) of that run go into the trace's header.
  2. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set before the subprocess starts,
     since PyTorch reads it at initialisation), not recording; its peaks are appended to
     the trace as metadata, so trace_replay prints both of PyTorch's ratios beside its own.

Trace format (one event per line):
  a <id> <size> <stream>   an allocation: the trace entry's size, which is the bytes the
                           program asked for (not rounded: with torch 2.11 the peak of their
                           live sum equals memory_stats' requested_bytes.all.peak), and its
                           cudaStream_t as an integer (0: the legacy default stream)
  f <id>                   its free, at the "free_requested" event: the moment the program
                           dropped the tensor. PyTorch's "free_completed" (the block becomes
                           reusable once other streams' uses recorded with record_stream are
                           done) is used only for a block that had no free_requested. On one
                           stream the two coincide.
  # <key>: <value>         metadata
Segment events (segment_alloc/free/map/unmap) are not replayed; they give PyTorch's reserved
peak as seen in the trace (trace_torch_peak_reserved), a cross-check of max_memory_reserved.

  python record_traces.py --out-dir bench-results/traces
  python record_traces.py --workloads forcefield --steps-forcefield 50
Writes <out-dir>/<workload>.trace and <out-dir>/record_traces.json; prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

WORKLOADS = ("transformer", "forcefield", "mdlong", "twostream")


# --------------------------------------------------------------------------- workloads

def run_transformer(torch, steps: int, seed: int, dev, info: dict) -> None:
    nn = torch.nn
    F = torch.nn.functional
    torch.manual_seed(seed)
    rng = random.Random(seed)
    d, heads, layers, vocab, batch = 512, 8, 4, 8192, 16
    emb = nn.Embedding(vocab, d).to(dev)
    layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.1,
                                       batch_first=True)
    enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(dev)
    head = nn.Linear(d, vocab).to(dev)
    params = [*emb.parameters(), *enc.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    lengths = []
    for _ in range(steps):
        L = rng.randint(64, 1024)
        lengths.append(L)
        x = torch.randint(0, vocab, (batch, L), device=dev)
        y = torch.randint(0, vocab, (batch, L), device=dev)
        mask = nn.Transformer.generate_square_subsequent_mask(L, device=dev)
        h = enc(emb(x), mask=mask, is_causal=True)
        loss = F.cross_entropy(head(h).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, y, mask, h, loss
    torch.cuda.synchronize(dev)
    info["config"] = {"d_model": d, "heads": heads, "layers": layers, "vocab": vocab,
                      "batch": batch, "dim_feedforward": 4 * d, "optimizer": "AdamW",
                      "seq_len": "uniform in [64, 1024] each step"}
    info["shapes"] = {"seq_len": lengths}


def make_forcefield(torch, hidden=128, rbf=32, layers=3, species=10, cutoff=5.0):
    nn = torch.nn

    def mlp(i, o):
        return nn.Sequential(nn.Linear(i, hidden), nn.SiLU(), nn.Linear(hidden, o))

    class ForceField(nn.Module):
        def __init__(self):
            super().__init__()
            self.cutoff = cutoff
            self.embed = nn.Embedding(species, hidden)
            self.message = nn.ModuleList(mlp(2 * hidden + rbf, hidden) for _ in range(layers))
            self.update = nn.ModuleList(mlp(2 * hidden, hidden) for _ in range(layers))
            self.readout = mlp(hidden, 1)
            self.register_buffer("centers", torch.linspace(0.0, cutoff, rbf))
            self.gamma = (rbf / cutoff) ** 2

        def forward(self, z, pos, edge_index):
            src, dst = edge_index[0], edge_index[1]
            vec = pos[dst] - pos[src]
            dist = vec.norm(dim=-1)
            envelope = 0.5 * (torch.cos(dist * (torch.pi / self.cutoff)) + 1.0)
            basis = torch.exp(-self.gamma * (dist[:, None] - self.centers) ** 2) * envelope[:, None]
            h = self.embed(z)
            for message, update in zip(self.message, self.update):
                m = message(torch.cat([h[src], h[dst], basis], dim=-1))
                agg = torch.zeros_like(h).index_add_(0, dst, m)
                h = h + update(torch.cat([h, agg], dim=-1))
            return self.readout(h).sum()

    return ForceField()


def radius_graph(torch, pos, cutoff):
    with torch.no_grad():
        d = torch.cdist(pos, pos)
        adj = d < cutoff
        adj.fill_diagonal_(False)
        edge_index = adj.nonzero().t().contiguous()  # [2, E]: (src, dst)
        del d, adj
    return edge_index


def run_forcefield(torch, steps: int, seed: int, dev, info: dict) -> None:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    cutoff, density = 5.0, 0.1  # atoms per cubic Angstrom (about liquid water's)
    model = make_forcefield(torch, cutoff=cutoff).to(dev)
    atoms, edges = [], []
    for _ in range(steps):
        n = rng.randint(200, 3000)
        box = (n / density) ** (1.0 / 3.0)
        z = torch.randint(0, 10, (n,), device=dev)
        pos = (torch.rand(n, 3, device=dev) * box).requires_grad_(True)
        edge_index = radius_graph(torch, pos.detach(), cutoff)
        energy = model(z, pos, edge_index)
        (grad,) = torch.autograd.grad(energy, pos, create_graph=False)
        forces = -grad
        atoms.append(n)
        edges.append(int(edge_index.shape[1]))
        del z, pos, edge_index, energy, grad, forces
    torch.cuda.synchronize(dev)
    info["config"] = {"hidden": 128, "rbf": 32, "layers": 3, "cutoff_A": cutoff,
                      "density_per_A3": density, "atoms": "uniform in [200, 3000] each step",
                      "forces": "-autograd.grad(energy, pos), create_graph=False"}
    info["shapes"] = {"atoms": atoms, "edges": edges}


def run_mdlong(torch, steps: int, seed: int, dev, info: dict) -> None:
    torch.manual_seed(seed)
    n, cutoff, density, dt = 1500, 5.0, 0.1, 1e-3
    box = (n / density) ** (1.0 / 3.0)
    model = make_forcefield(torch, cutoff=cutoff).to(dev)
    for p in model.parameters():
        p.requires_grad_(False)  # inference: forces only
    z = torch.randint(0, 10, (n,), device=dev)
    pos = torch.rand(n, 3, device=dev) * box
    vel = torch.randn(n, 3, device=dev) * 0.01
    edges = []

    def forces(p):
        p = p.detach().requires_grad_(True)
        edge_index = radius_graph(torch, p.detach(), cutoff)
        energy = model(z, p, edge_index)
        (grad,) = torch.autograd.grad(energy, p)
        edges.append(int(edge_index.shape[1]))
        return -grad

    f = forces(pos)
    for step in range(steps):
        vel = vel + 0.5 * dt * f
        pos = torch.remainder(pos + dt * vel, box)
        f = forces(pos)
        vel = vel + 0.5 * dt * f
        if step % 100 == 99:
            with torch.no_grad():
                d = torch.cdist(pos, pos)
                torch.histc(d, bins=200, min=0.0, max=box / 2)
                del d
    torch.cuda.synchronize(dev)
    info["config"] = {"atoms": n, "integrator": "velocity Verlet", "dt": dt, "cutoff_A": cutoff,
                      "analysis": "all-pairs distance histogram every 100 steps"}
    info["shapes"] = {"edges": edges[:: max(1, len(edges) // 200)]}


def run_twostream(torch, steps: int, seed: int, dev, info: dict) -> None:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                          nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    main, side = torch.cuda.current_stream(dev), torch.cuda.Stream(dev)
    sizes = []

    def make_batch():
        b = rng.choice((32, 64, 128, 256, 512))
        sizes.append(b)
        with torch.cuda.stream(side):
            x = torch.randn(b, 256, device=dev)
            y = torch.randint(0, 10, (b,), device=dev)
        return x, y

    nxt = make_batch()
    for step in range(steps):
        main.wait_stream(side)
        x, y = nxt
        x.record_stream(main)
        y.record_stream(main)
        nxt = make_batch()  # the side stream works on the next batch meanwhile
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 4 == 3:
            side.wait_stream(main)
            with torch.cuda.stream(side), torch.no_grad():
                ev = torch.randn(1024, 256, device=dev)
                (model(ev).argmax(-1) == 0).float().mean()
                del ev
        del x, y, loss
    torch.cuda.synchronize(dev)
    info["config"] = {"model": "MLP 256-1024-1024-10", "optimizer": "AdamW",
                      "streams": "default (training) + one side stream (batches, evaluation)",
                      "batch": "one of 32..512 each step"}
    info["shapes"] = {"batch": sizes}


RUNNERS = {"transformer": run_transformer, "forcefield": run_forcefield, "mdlong": run_mdlong,
           "twostream": run_twostream}


# --------------------------------------------------------------------------- conversion

def convert(device_trace) -> tuple[list[str], dict]:
    """PyTorch's device_traces[dev] -> trace lines, and what was seen on the way."""
    lines: list[str] = []
    live: dict[int, tuple[int, int]] = {}  # addr -> (id, size)
    next_id = 1
    counts: dict[str, int] = {}
    requested = peak_requested = 0
    reserved = peak_reserved = 0
    unmatched_frees = realloc_live = 0
    streams: set[int] = set()
    for e in device_trace:
        action = e["action"]
        counts[action] = counts.get(action, 0) + 1
        if action == "alloc":
            addr, size, stream = int(e["addr"]), int(e["size"]), int(e.get("stream", 0))
            if addr in live:  # an address handed out twice without a free: a lost event
                realloc_live += 1
                old_id, old_size = live.pop(addr)
                lines.append(f"f {old_id}")
                requested -= old_size
            live[addr] = (next_id, size)
            lines.append(f"a {next_id} {size} {stream}")
            next_id += 1
            streams.add(stream)
            requested += size
            peak_requested = max(peak_requested, requested)
        elif action in ("free_requested", "free_completed"):
            entry = live.pop(int(e["addr"]), None)
            if entry is not None:
                lines.append(f"f {entry[0]}")
                requested -= entry[1]
            elif action == "free_requested":
                unmatched_frees += 1
        elif action in ("segment_alloc", "segment_map"):
            reserved += int(e["size"])
            peak_reserved = max(peak_reserved, reserved)
        elif action in ("segment_free", "segment_unmap"):
            reserved -= int(e["size"])
    stats = {
        "events": len(device_trace),
        "actions": counts,
        "allocs": counts.get("alloc", 0),
        "unmatched_frees": unmatched_frees,
        "readdressed_live_blocks": realloc_live,
        "live_at_end": len(live),
        "streams": sorted(streams),
        "trace_peak_requested": peak_requested,
        "trace_torch_peak_reserved": peak_reserved,
    }
    return lines, stats


# --------------------------------------------------------------------------- child

def child(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("CUDA is not available", file=sys.stderr)
        return 3
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    info: dict = {"workload": args.child, "steps": args.steps, "seed": args.seed,
                  "record": bool(args.trace),
                  "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                  "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                  "gpu_name": torch.cuda.get_device_name(dev)}
    if args.trace:
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=args.max_entries)
    torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    RUNNERS[args.child](torch, args.steps, args.seed, dev, info)
    info["elapsed_s"] = time.perf_counter() - t0
    stats = torch.cuda.memory_stats(dev)
    info["torch_max_memory_reserved"] = torch.cuda.max_memory_reserved(dev)
    info["torch_max_memory_allocated"] = torch.cuda.max_memory_allocated(dev)
    info["torch_peak_requested"] = int(stats.get("requested_bytes.all.peak", 0))
    info["torch_num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
    info["torch_segments_peak"] = int(stats.get("segment.all.peak", 0))
    if args.trace:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        traces = snap.get("device_traces") or []
        device_trace = traces[dev.index] if len(traces) > dev.index else []
        del snap
        lines, tstats = convert(device_trace)
        tstats["ring_buffer_full"] = len(device_trace) >= args.max_entries
        info["trace"] = tstats
        header = {
            "source": f"record_traces.py {args.child} steps={args.steps} seed={args.seed}",
            "workload": args.child,
            "torch": f"{torch.__version__} (CUDA {torch.version.cuda})",
            "gpu": info["gpu_name"],
            "free_event": "free_requested (free_completed only where no free_requested was seen)",
            "alloc_size": "requested bytes (the alloc trace entry's size)",
            "torch_max_memory_reserved": info["torch_max_memory_reserved"],
            "torch_max_memory_allocated": info["torch_max_memory_allocated"],
            "torch_peak_requested": info["torch_peak_requested"],
            "trace_peak_requested": tstats["trace_peak_requested"],
            "trace_torch_peak_reserved": tstats["trace_torch_peak_reserved"],
            "trace_events": tstats["events"],
            "ring_buffer_full": tstats["ring_buffer_full"],
        }
        with open(args.trace, "w") as f:
            for k, v in header.items():
                f.write(f"# {k}: {v}\n")
            f.write("\n".join(lines))
            f.write("\n")
    with open(args.result, "w") as f:
        json.dump(info, f, indent=2)
    return 0


# --------------------------------------------------------------------------- parent

def run_child(workload, steps, seed, out_dir, record, expandable, max_entries, timeout):
    tag = "expandable" if expandable else "default"
    result = os.path.join(out_dir, f"{workload}.{tag}.json")
    trace = os.path.join(out_dir, f"{workload}.trace") if record else ""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, "--steps", str(steps),
           "--seed", str(seed), "--result", result, "--max-entries", str(max_entries)]
    if trace:
        cmd += ["--trace", trace]
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if expandable:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "mode": tag}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-15:]
        return {"error": f"exit {proc.returncode}: " + "\n".join(tail), "mode": tag}
    with open(result) as f:
        info = json.load(f)
    info["wall_s"] = wall
    info["mode"] = tag
    if trace:
        info["trace_path"] = trace
    return info


def ratio(a, b):
    return a / b if a and b else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="bench-results/traces")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help="comma-separated, from: " + ", ".join(WORKLOADS))
    p.add_argument("--steps-transformer", type=int, default=40)
    p.add_argument("--steps-forcefield", type=int, default=80)
    p.add_argument("--steps-mdlong", type=int, default=1200)
    p.add_argument("--steps-twostream", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-entries", type=int, default=5_000_000,
                   help="PyTorch's trace ring buffer (default 5,000,000 events)")
    p.add_argument("--no-expandable", action="store_true", help="skip the expandable_segments runs")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per subprocess")
    p.add_argument("--json", help="summary JSON (default <out-dir>/record_traces.json)")
    # internal: one workload in this process
    p.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--trace", default="", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)

    try:
        import torch
    except ImportError as e:
        print(f"record_traces: PyTorch is not installed ({e}); nothing recorded")
        return 0
    if not torch.cuda.is_available():
        print("record_traces: CUDA is not available; nothing recorded "
              "(benchmarks/python/synth_trace.py writes synthetic traces for CPU runs)")
        return 0
    os.makedirs(args.out_dir, exist_ok=True)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}")
    steps = {"transformer": args.steps_transformer, "forcefield": args.steps_forcefield,
             "mdlong": args.steps_mdlong, "twostream": args.steps_twostream}

    summary = {"benchmark": "record_traces", "torch": torch.__version__,
               "torch_cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
               "workloads": {}}
    failed = False
    for w in workloads:
        print(f"recording {w} ({steps[w]} steps) ...", flush=True)
        rec = run_child(w, steps[w], args.seed, args.out_dir, True, False, args.max_entries, args.timeout)
        entry = {"default": rec}
        if "error" in rec:
            print(f"  {w}: recording failed: {rec['error']}", file=sys.stderr)
            failed = True
        else:
            t = rec["trace"]
            print(f"  {t['events']} events, {t['allocs']} allocs, streams {t['streams']}, "
                  f"{rec['elapsed_s']:.1f} s" + ("; RING BUFFER FULL, trace truncated"
                                                 if t["ring_buffer_full"] else ""), flush=True)
        if not args.no_expandable:
            print(f"running {w} with expandable_segments:True ...", flush=True)
            exp = run_child(w, steps[w], args.seed, args.out_dir, False, True, args.max_entries, args.timeout)
            entry["expandable"] = exp
            if "error" in exp:
                print(f"  {w}: expandable run failed: {exp['error']}", file=sys.stderr)
                failed = True
            elif "error" not in rec:
                with open(rec["trace_path"], "a") as f:
                    f.write(f"# torch_expandable_max_memory_reserved: {exp['torch_max_memory_reserved']}\n")
                    f.write(f"# torch_expandable_max_memory_allocated: {exp['torch_max_memory_allocated']}\n")
                    f.write(f"# torch_expandable_peak_requested: {exp['torch_peak_requested']}\n")
        summary["workloads"][w] = entry

    # Table
    print("\nPyTorch's own allocator on the recorded workloads")
    print(f"{'workload':<12} {'run':<11} {'peak req':>10} {'peak alloc':>11} {'peak resv':>10} "
          f"{'resv/alloc':>10} {'resv/req':>9} {'retries':>7} {'time s':>7}")
    gib = float(1 << 30)
    for w, entry in summary["workloads"].items():
        for tag, info in entry.items():
            if "error" in info:
                print(f"{w:<12} {tag:<11} FAILED")
                continue
            ra = ratio(info["torch_max_memory_reserved"], info["torch_max_memory_allocated"])
            rr = ratio(info["torch_max_memory_reserved"], info["torch_peak_requested"])
            info["reserved_over_allocated"] = ra
            info["reserved_over_requested"] = rr
            print(f"{w:<12} {tag:<11} {info['torch_peak_requested'] / gib:9.2f}G "
                  f"{info['torch_max_memory_allocated'] / gib:10.2f}G "
                  f"{info['torch_max_memory_reserved'] / gib:9.2f}G "
                  f"{ra or float('nan'):10.3f} {rr or float('nan'):9.3f} "
                  f"{info.get('torch_num_alloc_retries', 0):7d} {info['elapsed_s']:7.1f}")
    path = args.json or os.path.join(args.out_dir, "record_traces.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=2)
    print(f"\nJSON written to {path}; traces in {args.out_dir}/")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
