"""Child process for test_torch_graphs.py: CUDA graphs under use_torch_allocator() (run as a
script: PyTorch's allocator can only be chosen before its first CUDA allocation). Each mode
captures and replays real PyTorch code and compares it with the same code run eagerly;
prints one JSON line."""

from __future__ import annotations

import copy
import json
import os
import sys
import traceback

import torch

from gpukeeper.base.errors import GpuError
from gpukeeper.integrations import torch_allocator

MiB = 1 << 20
# The route into PyTorch (use_torch_allocator(route=)): the tests run the pluggable one too.
ROUTE = os.environ.get("GPUKEEPER_TORCH_ROUTE", "auto")


def _start() -> dict:
    torch_allocator.use_torch_allocator(route=ROUTE)
    return {"graph_status": torch_allocator.graph_capture_status()}


def isolation() -> dict:
    """A graph's addresses are never handed to eager tensors: junk made after the capture
    keeps its value through replays, and replays stay right after the junk is written."""
    out = _start()
    x = torch.randn(1 << 20, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up, as PyTorch asks, on a side stream
        for _ in range(2):
            (x * 2 + 1).sin().sum()
    torch.cuda.current_stream().wait_stream(s)
    before = torch.cuda.memory_allocated()
    with torch.cuda.graph(g):
        tmp = [x * (i + 1) for i in range(6)]  # temporaries freed inside the capture
        y = sum(t.sin() for t in tmp)
        del tmp
    pools = torch_allocator.graph_pools(0)
    out["pools_after_capture"] = [{k: p[k] for k in ("uses", "capturing", "allocated_bytes", "reserved_bytes")} for p in pools]
    out["allocated_counts_graph"] = torch.cuda.memory_allocated() - before
    junk = [torch.full((n,), 7.0, device="cuda") for n in (1 << 20, 1 << 20, 1 << 18, 1 << 20, 4096) * 4]
    errors = []
    for step in range(5):
        x.copy_(torch.randn_like(x))
        g.replay()
        expect = sum((x * (i + 1)).sin() for i in range(6))
        errors.append(float((y - expect).abs().max()))
        for j in junk:
            j.fill_(float(step))  # eager writes between replays
    torch.cuda.synchronize()
    del expect, j
    out["replay_max_error"] = max(errors)
    out["junk_intact"] = all(bool((j == 4.0).all()) for j in junk)
    junk2 = [torch.full((1 << 20,), 3.0, device="cuda") for _ in range(8)]
    g.replay()
    torch.cuda.synchronize()
    out["junk_after_replay_intact"] = all(bool((j == 3.0).all()) for j in junk2)
    y_addr = y.data_ptr()
    out["junk_addresses_outside_graph"] = all(
        not (t.data_ptr() <= y_addr < t.data_ptr() + t.numel() * 4) for t in junk + junk2)
    del junk, junk2
    # The graph goes, then its output: the pool's memory goes back.
    g.reset()
    out["pools_after_reset_with_output_alive"] = len(torch_allocator.graph_pools(0))
    del y
    out["pools_after_output_freed"] = len(torch_allocator.graph_pools(0))
    out["allocated_at_end"] = torch.cuda.memory_allocated() - x.numel() * 4
    return out


def train_step() -> dict:
    """A whole training step (forward, backward, optimizer step) captured once and
    replayed on new batches gives the losses and weights of the same steps run eagerly."""
    out = _start()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                                torch.nn.GELU(), torch.nn.Linear(256, 8)).cuda()
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.MSELoss()
    batches = [(torch.randn(128, 64, device="cuda"), torch.randn(128, 8, device="cuda")) for _ in range(23)]
    static_x = torch.zeros(128, 64, device="cuda")
    static_t = torch.zeros(128, 8, device="cuda")

    def step(m, o, xb, tb):
        o.zero_grad(set_to_none=True)
        loss = loss_fn(m(xb), tb)
        loss.backward()
        o.step()
        return loss

    eager_losses = [float(step(eager, eager_opt, xb, tb)) for xb, tb in batches]
    # Warm-up on a side stream (three real steps, as PyTorch's example), then capture.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for xb, tb in batches[:3]:
            static_x.copy_(xb)
            static_t.copy_(tb)
            step(model, opt, static_x, static_t)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = loss_fn(model(static_x), static_t)
        static_loss.backward()
        opt.step()
    graph_losses = []
    for xb, tb in batches[3:]:
        static_x.copy_(xb)
        static_t.copy_(tb)
        g.replay()
        graph_losses.append(float(static_loss))
    out["loss_max_diff"] = max(abs(a - b) for a, b in zip(graph_losses, eager_losses[3:]))
    out["weight_max_diff"] = max(float((p - q).abs().max()) for p, q in zip(model.parameters(), eager.parameters()))
    out["losses"] = [eager_losses[3], graph_losses[0], eager_losses[-1], graph_losses[-1]]
    out["pools"] = len(torch_allocator.graph_pools(0))
    return out


def graphed_callables() -> dict:
    """torch.cuda.make_graphed_callables: forward and backward graphs of a module train as
    the eager module does."""
    out = _start()
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 4)).cuda()
    eager = copy.deepcopy(model)
    sample = torch.randn(16, 32, device="cuda", requires_grad=False)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    eager_opt = torch.optim.Adam(eager.parameters(), lr=1e-3)
    diffs = []
    for _ in range(10):
        xb = torch.randn(16, 32, device="cuda")
        for m, o in ((graphed, opt), (eager, eager_opt)):
            o.zero_grad(set_to_none=True)
            loss = m(xb).pow(2).mean()
            loss.backward()
            o.step()
        diffs.append(max(float((p - q).abs().max()) for p, q in zip(model.parameters(), eager.parameters())))
    out["weight_max_diff"] = max(diffs)
    out["pools"] = [p["uses"] for p in torch_allocator.graph_pools(0)]
    return out


def compiled() -> dict:
    """torch.compile(mode="reduce-overhead") against eager: with Inductor's CUDA graph trees
    (the default), then with plain CUDA graphs (cudagraph_trees off)."""
    out = _start()
    import torch._inductor.config as inductor_config

    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).cuda().eval()

    def max_diff() -> float:
        fast = torch.compile(model, mode="reduce-overhead")
        diffs = []
        with torch.no_grad():
            for _ in range(6):
                xb = torch.randn(32, 64, device="cuda")
                got = fast(xb).clone()
                diffs.append(float((got - model(xb)).abs().max()))
        return max(diffs)

    for label, trees in (("trees", True), ("plain", False)):
        inductor_config.triton.cudagraph_trees = trees
        torch._dynamo.reset()
        try:
            out[f"{label}_max_diff"] = max_diff()
            out[f"{label}_pools"] = [p["uses"] for p in torch_allocator.graph_pools(0)]
        except Exception as exc:  # what torch needs that a pluggable allocator lacks, named
            out[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[-800:]}"
            out[f"{label}_traceback"] = traceback.format_exc()[-2000:]
    return out


def refused() -> dict:
    """Where the callbacks cannot be set, a capture is refused with the reason."""
    out = _start()
    torch_allocator._refuse_graph_capture(torch, "a test says so")
    x = torch.ones(4, device="cuda")
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            x * 2
        out["raised"] = None
    except GpuError as exc:
        out["raised"] = str(exc)
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    modes = {"isolation": isolation, "train_step": train_step, "graphed_callables": graphed_callables,
             "compiled": compiled, "refused": refused}
    print(json.dumps(modes[mode]()))
