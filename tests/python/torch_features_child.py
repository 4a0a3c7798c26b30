"""Child process: one PyTorch allocator feature under one allocator, as a user meets it.

    python torch_features_child.py ALLOCATOR FEATURE

ALLOCATOR: ``native`` (PyTorch's caching allocator), ``gpukeeper`` (use_torch_allocator(),
the allocator component), ``gpukeeper-fixed`` (the same with expandable=False),
``gpukeeper-pluggable`` (route="pluggable"), ``native-expandable`` (PyTorch's with
expandable segments) or ``rmm`` (RMM's torch allocator). FEATURE: one of FEATURES below. Prints one JSON line: ``ok`` and the
feature's results, or ``ok: false`` with the error PyTorch raised. Used by
test_torch_features.py and by benchmarks/python/torch_compat_matrix.py, so that the
compatibility table and the tests come from the same runs.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict

import torch

MiB = 1 << 20


def use(allocator: str) -> None:
    """Puts ``allocator`` behind PyTorch, before any CUDA tensor."""
    if allocator == "gpukeeper":
        import gpukeeper

        gpukeeper.use_torch_allocator(route="component")
    elif allocator == "gpukeeper-fixed":
        import gpukeeper

        gpukeeper.use_torch_allocator(route="component", expandable=False)
    elif allocator == "gpukeeper-pluggable":
        import gpukeeper

        gpukeeper.use_torch_allocator(route="pluggable")
    elif allocator == "native-expandable":
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    elif allocator == "rmm":
        from rmm.allocators.torch import rmm_torch_allocator

        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    elif allocator != "native":
        raise SystemExit(f"unknown allocator {allocator!r}")


def cudnn_benchmark() -> Dict[str, Any]:
    """torchvision's ResNet-18 trains three steps with cudnn.benchmark on."""
    import torchvision

    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 3, 64, 64, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (16,), device="cuda")
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses}


def _count_calls(owner: Any, name: str, counts: Dict[str, int]) -> None:
    original = getattr(owner, name, None)
    if original is None:
        return

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[name] = counts.get(name, 0) + 1
        return original(*args, **kwargs)

    setattr(owner, name, counted)


def _graph_tree_counts() -> Dict[str, int]:
    """Counts the allocator calls CUDA graph trees make (looked up at each call)."""
    counts: Dict[str, int] = {}
    for name in ("_cuda_checkPoolLiveAllocations", "_cuda_getCheckpointState",
                 "_cuda_setCheckpointPoolState"):
        _count_calls(torch._C, name, counts)
    return counts


def reduce_overhead_inference() -> Dict[str, Any]:
    """A small convolutional net under torch.compile(mode="reduce-overhead"): two input
    shapes (two paths of the graph tree) and a branch taken after the first recording."""
    counts = _graph_tree_counts()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 8, 3, padding=1)).cuda().eval()

    def f(x: torch.Tensor, scale: bool) -> torch.Tensor:
        y = net(x)
        return y * 2 if scale else y.sin()

    compiled = torch.compile(f, mode="reduce-overhead")
    errors = []
    with torch.no_grad():
        for shape, scale in [((4, 3, 32, 32), True)] * 4 + [((8, 3, 16, 16), True)] * 3 + \
                [((4, 3, 32, 32), False)] * 3 + [((4, 3, 32, 32), True)] * 2:
            x = torch.randn(*shape, device="cuda")
            got = compiled(x, scale).clone()
            errors.append(float((got - f(x, scale)).abs().max()))
    return {"max_error": max(errors), "graph_tree_calls": counts}


def reduce_overhead_training() -> Dict[str, Any]:
    """An MLP trained under torch.compile(mode="reduce-overhead") against the same MLP
    trained eagerly from the same weights; a second batch size midway."""
    counts = _graph_tree_counts()

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                   torch.nn.Linear(128, 10)).cuda()

    eager, compiled_model = make(), make()
    compiled = torch.compile(compiled_model, mode="reduce-overhead")
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_c = torch.optim.SGD(compiled_model.parameters(), lr=0.05)
    torch.manual_seed(1)
    batches = [(torch.randn(n, 64, device="cuda"), torch.randint(0, 10, (n,), device="cuda"))
               for n in [32] * 5 + [48] * 3 + [32] * 3]
    diffs = []
    for x, y in batches:
        losses = []
        for model, opt in ((eager, opt_e), (compiled, opt_c)):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        diffs.append(abs(losses[0] - losses[1]))
    return {"max_loss_difference": max(diffs), "graph_tree_calls": counts}


def _ipc_receiver(allocator: str, inbox: Any, outbox: Any) -> None:
    try:
        use(allocator)
        t = inbox.get(timeout=120)
        outbox.put(("first", float(t.sum()), float(t[0]), float(t[-1])))
        inbox.get(timeout=120)  # the sender has dropped its tensor and written junk elsewhere
        outbox.put(("second", float(t.sum()), float(t[0]), float(t[-1])))
        del t
        inbox.get(timeout=120)
    except Exception as exc:
        outbox.put(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()[-1500:]))


def _reply(outbox: Any, child: Any) -> Any:
    import queue

    while True:
        try:
            message = outbox.get(timeout=5)
        except queue.Empty:
            if not child.is_alive():
                raise RuntimeError(f"the receiving process died (exit code {child.exitcode})") from None
            continue
        if message[0] == "error":
            raise RuntimeError(f"in the receiving process: {message[1]}\n{message[2]}")
        return message


def _open_descriptors() -> Dict[str, str]:
    """This process's open descriptors and what each names."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # closed while listed (the listing's own descriptor)
    return found


def ipc(receiver: str, mib: int = 8) -> Dict[str, Any]:
    """A CUDA tensor of ``mib`` MiB put on a torch.multiprocessing queue, as users send
    (pickled in the queue's feeder thread), to a spawned child that runs ``receiver``'s
    allocator. The sender drops its tensor while the child still reads it: the block must
    not be handed out again until the child lets go, and its memory (and, for a block of an
    expandable range, the descriptors of its pages) must come back after both dropped it."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_ipc_receiver, args=(receiver, inbox, outbox), daemon=True)
    child.start()
    try:
        torch.cuda.synchronize()
        allocated_before = torch.cuda.memory_allocated()
        descriptors_before = _open_descriptors()
        n = mib * MiB // 8
        t = torch.arange(n, dtype=torch.float64, device="cuda")
        expected = float(n * (n - 1) / 2)
        inbox.put(t)
        first = _reply(outbox, child)
        del t
        junk = [torch.full((n,), -1.0, dtype=torch.float64, device="cuda") for _ in range(8)]
        torch.cuda.synchronize()
        inbox.put("go")
        second = _reply(outbox, child)
        inbox.put("done")
        child.join(timeout=60)
        del junk
        # PyTorch frees a sent block once the receiver's reference count says so.
        deadline = time.monotonic() + 30
        while torch.cuda.memory_allocated() > allocated_before and time.monotonic() < deadline:
            torch.cuda.ipc_collect()
            time.sleep(0.05)
        allocated_after = torch.cuda.memory_allocated()
        torch.cuda.empty_cache()
        return {"expected_sum": expected, "n": n, "first": list(first[1:]),
                "second": list(second[1:]), "child_exit": child.exitcode,
                "allocated_before": allocated_before, "allocated_after": allocated_after,
                "descriptors_left": sorted(set(_open_descriptors().items())
                                           - set(descriptors_before.items()))}
    finally:
        if child.is_alive():
            child.terminate()


def memory_history() -> Dict[str, Any]:
    """memory history with stack frames, a snapshot, and memory_viz's plots from it."""
    from torch.cuda import _memory_viz

    torch.cuda.memory._record_memory_history(max_entries=100000)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).cuda()
    x = torch.randn(64, 256, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    kept = torch.empty(3 * MiB + 5, dtype=torch.uint8, device="cuda")  # noqa: F841
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    traces = [t for dev in snap["device_traces"] for t in dev]
    this_file = os.path.basename(__file__)
    framed = [t for t in traces if any(this_file in f.get("filename", "") for f in t.get("frames", []))]
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    framed_blocks = [b for b in blocks if any(this_file in f.get("filename", "") for f in b.get("frames", []))]
    kept_block = [b for b in blocks if b.get("requested_size") == 3 * MiB + 5]
    trace_html = _memory_viz.trace_plot(snap)
    segment_html = _memory_viz.segment_plot(snap)
    return {"traces": len(traces), "traces_with_our_frames": len(framed),
            "actions": sorted({t["action"] for t in traces}),
            "live_blocks": len(blocks), "live_blocks_with_our_frames": len(framed_blocks),
            "kept_block_found": len(kept_block) == 1,
            "trace_plot_bytes": len(trace_html), "segment_plot_bytes": len(segment_html)}


def oom_observer() -> Dict[str, Any]:
    """torch._C._cuda_attach_out_of_memory_observer fires, and the error is PyTorch's."""
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(list(args)))
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(4 * total, dtype=torch.uint8, device="cuda")
        raised = None
    except torch.cuda.OutOfMemoryError as exc:
        raised = "OutOfMemoryError: " + str(exc).splitlines()[0]
    return {"raised": raised, "observer_calls": len(seen)}


def late_install() -> Dict[str, Any]:
    """use_torch_allocator() after PyTorch allocated: a typed error that says what to do."""
    import gpukeeper
    from gpukeeper.base.errors import GpuError

    torch.ones(1, device="cuda")
    try:
        gpukeeper.use_torch_allocator()
    except GpuError as exc:
        return {"error_type": type(exc).__name__, "message": str(exc)}
    return {"error_type": None}


def empty_del_ns(recording: bool) -> float:
    """Median ns of torch.empty(64 KiB) + del, with memory history recorded or not."""
    if recording:
        torch.cuda.memory._record_memory_history(max_entries=100000)
    for _ in range(200):
        t = torch.empty(1 << 16, dtype=torch.uint8, device="cuda")
        del t
    samples = []
    for _ in range(21):
        start = time.perf_counter_ns()
        for _ in range(500):
            t = torch.empty(1 << 16, dtype=torch.uint8, device="cuda")
            del t
        samples.append((time.perf_counter_ns() - start) / 500)
    if recording:
        torch.cuda.memory._record_memory_history(enabled=None)
    samples.sort()
    return samples[len(samples) // 2]


def history_cost() -> Dict[str, Any]:
    return {"plain_ns": empty_del_ns(False), "recording_ns": empty_del_ns(True)}


def _receive_forged(allocator: str, inbox: Any, outbox: Any) -> None:
    """A receiving process: rebuilds each argument tuple it gets, and reports the error."""
    from torch.multiprocessing import reductions

    use(allocator)
    while True:
        args = inbox.get(timeout=120)
        if args is None:
            return
        try:
            reductions.rebuild_cuda_tensor(*args)
            outbox.put("")
        except Exception as exc:  # the error a receiver would meet is the result
            outbox.put(f"{type(exc).__name__}: {exc}")


def ipc_refused() -> Dict[str, Any]:
    """What a receiving process meets when an expandable range's handle cannot be opened:
    a sender that has exited (its pid written into a real handle), and a handle of another
    layout (cut short)."""
    import struct
    import subprocess as sp

    import torch.multiprocessing as mp
    from torch.multiprocessing import reductions

    t = torch.ones(MiB, device="cuda")  # 4 MiB: an expandable range under the default layout
    _, args = reductions.reduce_tensor(t)
    handle = bytes(args[7])
    gone = sp.Popen(["true"])
    gone.wait()
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_receive_forged, args=("gpukeeper", inbox, outbox), daemon=True)
    child.start()
    try:
        answers = {}
        for name, forged in (("sender_gone", handle[:2] + struct.pack("<i", gone.pid) + handle[6:]),
                             ("other_layout", handle[:-2])):
            forged_args = list(args)
            forged_args[7] = forged
            inbox.put(tuple(forged_args))
            answers[name] = outbox.get(timeout=120)
        inbox.put(None)
        child.join(timeout=60)
        return {"type": chr(handle[1]), **answers, "child_exit": child.exitcode}
    finally:
        if child.is_alive():
            child.terminate()


def segment_history() -> Dict[str, Any]:
    """Memory history's segment events: a 64 MiB tensor made, dropped and its memory
    released with empty_cache(), as the trace records them (bytes per action)."""
    torch.cuda.memory._record_memory_history(max_entries=100000)
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    del x
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    by_action: Dict[str, int] = {}
    for trace in snapshot["device_traces"]:
        for entry in trace:
            by_action[entry["action"]] = by_action.get(entry["action"], 0) + int(entry["size"])
    return {"bytes_by_action": by_action}


FEATURES: Dict[str, Callable[[], Dict[str, Any]]] = {
    "cudnn_benchmark": cudnn_benchmark,
    "reduce_overhead_inference": reduce_overhead_inference,
    "reduce_overhead_training": reduce_overhead_training,
    "ipc_to_native": lambda: ipc("native"),
    "ipc_to_gpukeeper": lambda: ipc("gpukeeper"),
    "ipc_4mib_to_native": lambda: ipc("native", 4),
    "ipc_4mib_to_gpukeeper": lambda: ipc("gpukeeper", 4),
    "ipc_256mib_to_native": lambda: ipc("native", 256),
    "ipc_256mib_to_gpukeeper": lambda: ipc("gpukeeper", 256),
    "memory_history": memory_history,
    "segment_history": segment_history,
    "ipc_refused": ipc_refused,
    "oom_observer": oom_observer,
    "history_cost": history_cost,
}


def main() -> int:
    allocator, feature = sys.argv[1], sys.argv[2]
    if feature == "late_install":
        print(json.dumps({"ok": True, **late_install()}))
        return 0
    use(allocator)
    try:
        out = {"ok": True, **FEATURES[feature]()}
    except Exception as exc:  # the error a user would meet is the result
        out = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
               "traceback": traceback.format_exc()[-2000:]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
