#!/usr/bin/env python3
"""Writes synthetic allocation traces whose request sizes change from step to step.

They imitate, without a GPU and without PyTorch, the allocation pattern of the workloads
that record_traces.py records on a GPU machine, so that trace_replay can be tried (and its
fragmentation numbers sanity-checked) anywhere:

  transformer  a small encoder trained with a sequence length drawn afresh every step:
               persistent weights and Adam state, activations saved in the forward pass
               and freed in reverse order in the backward pass, short-lived temporaries
               (attention scores, softmax, dropout masks), gradients freed by zero_grad.
  md           a message-passing force field: a random structure of varying atom count
               each step, a radius graph whose edge count varies with it, per-edge messages
               of a few interaction layers kept for the force (autograd) pass.
  random       a random walk of a live set: log-uniform sizes 256 B .. 64 MiB, alloc and
               free in random order, the live set growing and shrinking in waves.

Output format (read by benchmarks/cpp/trace_replay):
  a <id> <size> <stream>     allocation of <size> bytes on <stream> (always 0 here)
  f <id>                     free of allocation <id>
  # <key>: <value>           metadata

  python synth_trace.py --kind transformer --steps 40 -o transformer.trace
  python synth_trace.py --kind all --out-dir traces/
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys


class Tracer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.next_id = 1
        self.live: dict[int, int] = {}
        self.requested = 0
        self.peak = 0

    def alloc(self, size: int, stream: int = 0) -> int:
        size = max(1, int(size))
        i = self.next_id
        self.next_id += 1
        self.live[i] = size
        self.requested += size
        self.peak = max(self.peak, self.requested)
        self.lines.append(f"a {i} {size} {stream}")
        return i

    def free(self, i: int) -> None:
        self.requested -= self.live.pop(i)
        self.lines.append(f"f {i}")

    def free_all(self, ids) -> None:
        for i in ids:
            self.free(i)


F32 = 4


def transformer(tr: Tracer, steps: int, rng: random.Random, d: int = 512, layers: int = 4,
                heads: int = 8, batch: int = 16, vocab: int = 8192) -> None:
    ff = 4 * d
    # Parameters: embedding, per layer qkv, out proj, two FFN matrices, norms, head.
    param_sizes = [vocab * d * F32]
    for _ in range(layers):
        param_sizes += [3 * d * d * F32, 3 * d * F32, d * d * F32, d * F32,
                        ff * d * F32, ff * F32, d * ff * F32, d * F32,
                        d * F32, d * F32, d * F32, d * F32]
    param_sizes += [vocab * d * F32, vocab * F32]
    params = [tr.alloc(s) for s in param_sizes]
    adam: list[int] = []
    for _step in range(steps):
        L = rng.randint(64, 1024)
        tokens = batch * L
        x_ids = tr.alloc(tokens * 8)  # int64 token ids
        y_ids = tr.alloc(tokens * 8)
        saved: list[int] = []
        h = tr.alloc(tokens * d * F32)  # embedding output
        saved.append(h)
        for _ in range(layers):
            qkv = tr.alloc(tokens * 3 * d * F32)
            saved.append(qkv)
            scores = tr.alloc(batch * heads * L * L * F32)
            probs = tr.alloc(batch * heads * L * L * F32)
            tr.free(scores)
            mask = tr.alloc(batch * heads * L * L)  # dropout mask (bool)
            saved += [probs, mask]
            attn = tr.alloc(tokens * d * F32)
            saved.append(attn)
            proj = tr.alloc(tokens * d * F32)
            res1 = tr.alloc(tokens * d * F32)
            tr.free(proj)
            stats = tr.alloc(tokens * 2 * F32)  # layer-norm mean/rstd
            n1 = tr.alloc(tokens * d * F32)
            saved += [res1, stats, n1]
            f1 = tr.alloc(tokens * ff * F32)
            g1 = tr.alloc(tokens * ff * F32)  # activation
            saved += [f1, g1]
            f2 = tr.alloc(tokens * d * F32)
            res2 = tr.alloc(tokens * d * F32)
            tr.free(f2)
            stats2 = tr.alloc(tokens * 2 * F32)
            n2 = tr.alloc(tokens * d * F32)
            saved += [res2, stats2, n2]
        logits = tr.alloc(tokens * vocab * F32)
        lse = tr.alloc(tokens * F32)
        loss = tr.alloc(F32)
        # Backward: gradient of the logits, then layer by layer in reverse.
        glogits = tr.alloc(tokens * vocab * F32)
        tr.free_all([lse, logits])
        grads = [tr.alloc(s) for s in param_sizes[-2:]]
        gh = tr.alloc(tokens * d * F32)
        tr.free(glogits)
        per_layer = (len(saved) - 1) // layers
        for layer in reversed(range(layers)):
            chunk = saved[1 + layer * per_layer: 1 + (layer + 1) * per_layer]
            lg = [tr.alloc(s) for s in param_sizes[1 + layer * 12: 1 + (layer + 1) * 12]]
            grads += lg
            tmp_ff = tr.alloc(tokens * ff * F32)
            tmp_ff2 = tr.alloc(tokens * ff * F32)
            tr.free(tmp_ff)
            gscores = tr.alloc(batch * heads * L * L * F32)
            gprobs = tr.alloc(batch * heads * L * L * F32)
            tr.free(gscores)
            tr.free(tmp_ff2)
            new_gh = tr.alloc(tokens * d * F32)
            tr.free_all([gprobs, gh])
            gh = new_gh
            tr.free_all(reversed(chunk))
        grads.append(tr.alloc(param_sizes[0]))
        tr.free_all([gh, saved[0], loss, x_ids, y_ids])
        # Adam: state allocated lazily on the first step, kept; a few temporaries.
        if not adam:
            adam = [tr.alloc(s) for s in param_sizes for _ in range(2)]
        for s in param_sizes[:3]:
            t = tr.alloc(s)
            tr.free(t)
        tr.free_all(grads)  # zero_grad(set_to_none=True)
    tr.free_all(adam)
    tr.free_all(params)


def md(tr: Tracer, steps: int, rng: random.Random, hidden: int = 128, layers: int = 3,
       rbf: int = 32) -> None:
    weights = []
    for _ in range(layers):
        weights += [(2 * hidden + rbf) * hidden * F32, hidden * F32, hidden * hidden * F32,
                    hidden * F32, hidden * hidden * F32, hidden * F32]
    weights += [hidden * hidden * F32, hidden * F32, hidden * F32, F32, 100 * hidden * F32]
    params = [tr.alloc(s) for s in weights]
    for _step in range(steps):
        n = rng.randint(200, 3000)
        neighbours = rng.uniform(20.0, 60.0)
        e = int(n * neighbours)
        pos = tr.alloc(n * 3 * F32)
        species = tr.alloc(n * 8)
        dist_all = tr.alloc(n * n * F32)  # cdist for the radius graph
        mask = tr.alloc(n * n)
        tr.free(dist_all)
        edge_index = tr.alloc(2 * e * 8)
        tr.free(mask)
        saved: list[int] = []
        vec = tr.alloc(e * 3 * F32)
        dist = tr.alloc(e * F32)
        basis = tr.alloc(e * rbf * F32)
        saved += [vec, dist, basis]
        h = tr.alloc(n * hidden * F32)
        saved.append(h)
        for _ in range(layers):
            hi = tr.alloc(e * hidden * F32)
            hj = tr.alloc(e * hidden * F32)
            cat = tr.alloc(e * (2 * hidden + rbf) * F32)
            tr.free_all([hi, hj])
            m1 = tr.alloc(e * hidden * F32)
            a1 = tr.alloc(e * hidden * F32)
            m2 = tr.alloc(e * hidden * F32)
            saved += [cat, m1, a1, m2]
            agg = tr.alloc(n * hidden * F32)
            u = tr.alloc(n * hidden * F32)
            h2 = tr.alloc(n * hidden * F32)
            saved += [agg, u, h2]
        out = tr.alloc(n * F32)
        energy = tr.alloc(F32)
        # forces = -grad(energy, pos): the backward through every layer.
        g = tr.alloc(n * hidden * F32)
        for layer in reversed(range(layers)):
            chunk = saved[4 + layer * 7: 4 + (layer + 1) * 7]
            gm = tr.alloc(e * hidden * F32)
            gm2 = tr.alloc(e * hidden * F32)
            gcat = tr.alloc(e * (2 * hidden + rbf) * F32)
            tr.free_all([gm, gm2])
            gn = tr.alloc(n * hidden * F32)
            tr.free_all([gcat, g])
            g = gn
            tr.free_all(reversed(chunk))
        gvec = tr.alloc(e * 3 * F32)
        forces = tr.alloc(n * 3 * F32)
        tr.free_all([gvec, g, out, energy])
        tr.free_all(reversed(saved[:4]))
        tr.free_all([edge_index, forces, species, pos])
    tr.free_all(params)


def random_walk(tr: Tracer, steps: int, rng: random.Random) -> None:
    lo, hi = math.log(256), math.log(64 << 20)
    live: list[int] = []
    for step in range(steps):
        target = int(200 + 150 * math.sin(step / 7.0))
        for _ in range(400):
            if live and (len(live) > target or rng.random() < 0.45):
                tr.free(live.pop(rng.randrange(len(live))))
            else:
                live.append(tr.alloc(int(math.exp(rng.uniform(lo, hi))) // 4 * 4 + 4))
    tr.free_all(live)


KINDS = {"transformer": (transformer, 40), "md": (md, 80), "random": (random_walk, 60)}


def write(kind: str, steps: int | None, seed: int, path: str) -> Tracer:
    fn, default_steps = KINDS[kind]
    steps = default_steps if steps is None else steps
    tr = Tracer()
    fn(tr, steps, random.Random(seed))
    with open(path, "w") as f:
        f.write(f"# source: synth_trace.py --kind {kind} --steps {steps} --seed {seed}\n")
        f.write(f"# workload: synthetic-{kind}\n")
        f.write(f"# trace_peak_requested: {tr.peak}\n")
        f.write("# free_event: synthetic (the program's release)\n")
        f.write("\n".join(tr.lines))
        f.write("\n")
    return tr


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=[*KINDS, "all"], default="all")
    p.add_argument("--steps", type=int, default=None, help="steps (default per kind)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--out", help="output file (one kind)")
    p.add_argument("--out-dir", default=".", help="directory for --kind all (synth_<kind>.trace)")
    args = p.parse_args(argv)
    kinds = list(KINDS) if args.kind == "all" else [args.kind]
    if args.out and len(kinds) > 1:
        p.error("--out takes one --kind; use --out-dir for all")
    os.makedirs(args.out_dir, exist_ok=True)
    for kind in kinds:
        path = args.out or os.path.join(args.out_dir, f"synth_{kind}.trace")
        tr = write(kind, args.steps, args.seed, path)
        print(f"{path}: {len(tr.lines)} events, peak requested {tr.peak / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
