"""CUDA graphs under use_torch_allocator(): captures get private pools (GraphPools), as under
PyTorch's own allocator, and replays give what eager code gives. The GPU cases run real
PyTorch code in a child process (torch_graphs_child.py); the C++ pools are tested in
tests/cpp/test_graph_pools.cpp."""

from __future__ import annotations

from pathlib import Path

import pytest
from child_process import run_child

from gpukeeper import _core
from gpukeeper.integrations import torch_allocator

torch = pytest.importorskip("torch")

CHILD = Path(__file__).with_name("torch_graphs_child.py")


def test_linking_without_pytorchs_libraries_says_why():
    why = _core._link_torch_graph_pools(["/no/such/libtorch_cuda.so"])
    assert "not found" in why and "1 searched" in why


def test_no_graph_pools_before_a_capture():
    assert torch_allocator.graph_pools(0) == []
    assert _core._torch_graph_pool_errors() == []
    assert _core._torch_graph_pools_release_unused(0) == 0


gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("route", ["auto", "pluggable"])
def test_gpu_a_graphs_memory_is_never_handed_to_eager_tensors(route):
    out = run_child(CHILD, "isolation", route=route, timeout=400)
    assert out["graph_status"] == ""
    [pool] = out["pools_after_capture"]
    assert pool["uses"] == 1 and not pool["capturing"]
    assert pool["allocated_bytes"] >= 4 << 20  # y and the captured temporaries' reuse
    assert out["allocated_counts_graph"] >= 4 << 20  # torch's counters include the graph's pool
    assert out["replay_max_error"] < 1e-4
    assert out["junk_intact"] and out["junk_after_replay_intact"]
    assert out["junk_addresses_outside_graph"]
    assert out["pools_after_reset_with_output_alive"] == 1  # y still lives in it
    assert out["pools_after_output_freed"] == 0
    # What is left is PyTorch's own: its CUDA generator makes graph-safe seed and offset
    # tensors at the first capture and keeps them (two 8-byte tensors, 256-byte blocks).
    assert 0 <= out["allocated_at_end"] <= 512


@gpu
def test_gpu_a_captured_training_step_trains_as_eager():
    out = run_child(CHILD, "train_step", timeout=400)
    assert out["graph_status"] == ""
    assert out["loss_max_diff"] < 1e-4, out["losses"]
    assert out["weight_max_diff"] < 1e-4
    assert out["pools"] == 1


@gpu
def test_gpu_make_graphed_callables_trains_as_eager():
    out = run_child(CHILD, "graphed_callables", timeout=400)
    assert out["weight_max_diff"] < 1e-4
    assert out["pools"], "the forward and backward graphs have a private pool"


@gpu
def test_gpu_torch_compile_reduce_overhead_matches_eager_or_says_what_is_missing():
    out = run_child(CHILD, "compiled", timeout=400)
    # Inductor's CUDA graph trees check the live allocations of their pool and checkpoint
    # it (checkPoolLiveAllocations, getCheckpointState, setCheckpointPoolState): PyTorch
    # gives these to its own allocator only, and a pluggable one raises, naming the call.
    # Never a wrong result.
    if "trees_error" in out:
        assert "does not yet support" in out["trees_error"], out["trees_traceback"]
        assert any(call in out["trees_error"] for call in (
            "checkPoolLiveAllocations", "getCheckpointState", "setCheckpointPoolState")), out["trees_error"]
    else:
        assert out["trees_max_diff"] < 1e-4
    # With plain CUDA graphs (torch._inductor.config.triton.cudagraph_trees = False) the
    # compiled model captures into gpukeeper's private pools and matches eager.
    assert "plain_error" not in out, out.get("plain_traceback")
    assert out["plain_max_diff"] < 1e-4
    assert out["plain_pools"]


@gpu
def test_gpu_capture_is_refused_where_the_callbacks_cannot_be_set():
    out = run_child(CHILD, "refused", timeout=400)
    assert out["raised"] is not None and "a test says so" in out["raised"]
    assert "use_torch_allocator()" in out["raised"]
