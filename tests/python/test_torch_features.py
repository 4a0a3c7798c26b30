"""PyTorch's allocator features under use_torch_allocator(): cuDNN's benchmark mode, CUDA
graph trees (reduce-overhead), CUDA IPC, memory history, the OOM observer. The GPU cases
run real PyTorch code in child processes (torch_features_child.py), under gpukeeper's
allocator component and under PyTorch's own allocator, and compare. The CPU cases check
the component's source against the installed PyTorch's headers and the fallback's
messages."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from child_process import run_json_child

from gpukeeper.integrations import torch_allocator, torch_component

torch = pytest.importorskip("torch")

HERE = Path(__file__).parent
CHILD = HERE / "torch_features_child.py"
ROOT = HERE.parent.parent
gpu = pytest.mark.gpu
MiB = 1 << 20


def feature(allocator: str, name: str, timeout: float = 240) -> dict:
    return run_json_child(CHILD, allocator, name, timeout=timeout)


def _cuda_include() -> str:
    for root in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", "/usr"):
        if root and os.path.exists(os.path.join(root, "include", "cuda_runtime_api.h")):
            return os.path.join(root, "include")
    return ""


def test_the_component_compiles_against_the_installed_pytorch(tmp_path):
    """The component's C++ against this PyTorch's headers (a CPU build ships them too):
    a PyTorch release that changes its allocator interface fails here, without a GPU."""
    compiler = shutil.which("c++") or shutil.which("g++")
    include = Path(torch.__file__).parent / "include"
    cuda = _cuda_include()
    if compiler is None or not (include / "c10" / "cuda" / "CUDACachingAllocator.h").exists() or not cuda:
        pytest.skip("needs a C++ compiler, PyTorch's C++ headers and the CUDA runtime's headers")
    # A CPU build of PyTorch lacks the one header its CMake generates for CUDA builds.
    macros = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    if not (include / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists():
        macros.parent.mkdir(parents=True)
        macros.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    for source in sorted(glob.glob(str(ROOT / "csrc" / "torch_ext" / "*.cpp"))):
        done = subprocess.run(
            [compiler, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
             f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{ROOT / 'csrc'}", "-isystem", str(include),
             "-isystem", str(include / "torch" / "csrc" / "api" / "include"),
             "-isystem", str(tmp_path), "-isystem", cuda, source],
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{os.path.basename(source)}:\n{done.stderr[-4000:]}"


def test_status_says_why_the_component_cannot_serve():
    class FakeTorch:
        __version__ = "0.0.1+cpu"

    why = torch_component.status(FakeTorch())
    assert "none for torch 0.0.1+cpu" in why and torch_component.BUILD_COMMAND in why


def test_route_is_checked_before_anything_changes():
    from gpukeeper.base.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="route"):
        torch_allocator.use_torch_allocator(route="fast")
    assert not torch_allocator.is_active()


def test_component_route_refused_with_the_reason_where_it_cannot_serve(monkeypatch):
    from gpukeeper.base.errors import GpuError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch_component, "status", lambda _torch: "no component here")
    with pytest.raises(GpuError, match="no component here"):
        torch_allocator.use_torch_allocator(route="component")
    assert not torch_allocator.is_active()


def test_auto_refuses_rather_than_take_the_pluggable_route_unasked(monkeypatch):
    """Without a component, "auto" raises at once, naming the way out, instead of leaving
    cudnn.benchmark or memory history to crash later inside PyTorch."""
    from gpukeeper.base.errors import GpuError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch_component, "status", lambda _torch: "no component here")
    with pytest.raises(GpuError, match="no component here.*route='pluggable'"):
        torch_allocator.use_torch_allocator()
    assert not torch_allocator.is_active() and torch_allocator.route() == ""


# ---------------------------------------------------------------- on a GPU


@pytest.fixture(scope="module")
def component():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    why = torch_component.status(torch)
    if why:
        pytest.fail(f"the allocator component cannot serve this PyTorch: {why}")


@gpu
def test_gpu_cudnn_benchmark_trains_resnet_as_native(component):
    mine = feature("gpukeeper", "cudnn_benchmark")
    native = feature("native", "cudnn_benchmark")
    assert mine["ok"], mine
    assert native["ok"], native
    # cuDNN picks algorithms by timing them, differently in each process: the
    # losses agree to rounding of those algorithms (0.2% seen after three steps).
    assert mine["losses"] == pytest.approx(native["losses"], rel=1e-2)
    assert mine["losses"][-1] < mine["losses"][0]


@gpu
def test_gpu_cudnn_benchmark_fails_on_the_pluggable_route_as_pytorch_says(component):
    out = feature("gpukeeper-pluggable", "cudnn_benchmark")
    assert not out["ok"] and "cacheInfo" in out["error"]


@gpu
def test_gpu_reduce_overhead_inference_with_two_paths_and_a_branch(component):
    mine = feature("gpukeeper", "reduce_overhead_inference")
    native = feature("native", "reduce_overhead_inference")
    assert mine["ok"], mine
    assert native["ok"], native
    # Compiled code differs from eager by its own rounding, the same under both allocators.
    assert mine["max_error"] <= native["max_error"] * 1.01 + 1e-6 and mine["max_error"] < 1e-2
    # The graph tree made the same allocator calls as under PyTorch's allocator.
    assert mine["graph_tree_calls"] == native["graph_tree_calls"]
    # Both shapes and the branch are new paths of the tree: checkpoints were set.
    assert mine["graph_tree_calls"].get("_cuda_checkPoolLiveAllocations", 0) > 0
    assert mine["graph_tree_calls"].get("_cuda_setCheckpointPoolState", 0) > 0


@gpu
def test_gpu_reduce_overhead_training_matches_eager(component):
    mine = feature("gpukeeper", "reduce_overhead_training")
    native = feature("native", "reduce_overhead_training")
    assert mine["ok"], mine
    assert native["ok"], native
    assert mine["max_loss_difference"] < 1e-4
    assert mine["graph_tree_calls"] == native["graph_tree_calls"]


def _check_crossed(out: dict) -> None:
    assert out["ok"], out
    n = out["n"]
    assert out["first"] == [out["expected_sum"], 0.0, float(n - 1)]
    # The sender dropped its tensor and filled new ones with -1: the receiver's view is
    # unchanged, so the block was not handed out again while the receiver held it.
    assert out["second"] == out["first"]
    assert out["child_exit"] == 0
    # Once both dropped it, the sender's block is free again and none of its pages'
    # descriptors stays open (PyTorch keeps its reference-count file, /dev/shm/cuda.shm.*,
    # open for the next send, under every allocator).
    assert out["allocated_after"] == out["allocated_before"], out
    left = [target for _, target in out["descriptors_left"] if not target.startswith("/dev/shm/cuda.shm.")]
    assert left == [], out


@gpu
@pytest.mark.parametrize("receiver", ["native", "gpukeeper"])
def test_gpu_a_cuda_tensor_crosses_torch_multiprocessing(component, receiver):
    _check_crossed(feature("gpukeeper-fixed", f"ipc_to_{receiver}"))


@gpu
@pytest.mark.parametrize("size", ["4mib", "256mib"])
@pytest.mark.parametrize("receiver", ["native", "gpukeeper"])
def test_gpu_a_tensor_of_an_expandable_range_crosses_torch_multiprocessing(component, receiver, size):
    """The default layout puts these blocks in expandable ranges: their pages travel as
    POSIX descriptors, as PyTorch's own expandable segments send them."""
    _check_crossed(feature("gpukeeper", f"ipc_{size}_to_{receiver}"))


@gpu
def test_gpu_a_native_sender_of_expandable_segments_reaches_a_gpukeeper_receiver(component):
    out = feature("native-expandable", "ipc_4mib_to_gpukeeper")
    _check_crossed(out)


@gpu
def test_gpu_a_handle_that_cannot_be_opened_says_why_and_what_to_do(component):
    out = feature("gpukeeper", "ipc_refused")
    assert out["ok"], out
    assert out["type"] == "e"
    assert "has exited" in out["sender_gone"] and "expandable=False" in out["sender_gone"], out
    assert "layout" in out["other_layout"] and "expandable=False" in out["other_layout"], out
    assert out["child_exit"] == 0


@gpu
def test_gpu_on_the_pluggable_route_an_unsendable_tensor_raises_in_the_receiver(component):
    """PyTorch's pluggable interface cannot share memory: the receiver's get() raises with
    the sender's reason instead of waiting for an item the feeder thread dropped."""
    out = feature("gpukeeper-pluggable", "ipc_4mib_to_native", timeout=200)
    assert not out["ok"]
    assert "GpuError" in out["traceback"] and "could not share" in out["traceback"]


@gpu
@pytest.mark.parametrize("allocator", ["native", "gpukeeper", "gpukeeper-fixed"])
def test_gpu_memory_history_records_segments_taken_and_given_back(component, allocator):
    """As under PyTorch's allocator: a fixed layout's segments appear as segment_alloc and
    segment_free, an expandable range's pages as segment_map and segment_unmap, and after
    empty_cache() every byte taken was given back."""
    out = feature(allocator, "segment_history")
    assert out["ok"], out
    got = out["bytes_by_action"]
    assert got.get("alloc", 0) >= 64 * MiB, got
    taken = got.get("segment_alloc", 0) + got.get("segment_map", 0)
    given = got.get("segment_free", 0) + got.get("segment_unmap", 0)
    assert taken >= 64 * MiB and given == taken, got
    if allocator == "gpukeeper":
        assert got.get("segment_map", 0) >= 64 * MiB, got
    if allocator == "gpukeeper-fixed":
        assert got.get("segment_alloc", 0) >= 64 * MiB, got


@gpu
def test_gpu_memory_history_carries_frames_to_memory_viz(component):
    out = feature("gpukeeper", "memory_history")
    assert out["ok"], out
    assert {"alloc", "free_requested", "free_completed"} <= set(out["actions"])
    assert out["traces_with_our_frames"] > 0
    assert out["live_blocks_with_our_frames"] > 0 and out["kept_block_found"]
    assert out["trace_plot_bytes"] > 1000 and out["segment_plot_bytes"] > 1000


@gpu
def test_gpu_the_oom_observer_fires(component):
    out = feature("gpukeeper", "oom_observer")
    assert out["ok"], out
    assert out["raised"].startswith("OutOfMemoryError: CUDA out of memory.")
    assert out["observer_calls"] == 1


@gpu
def test_gpu_installing_after_cuda_is_in_use_is_a_typed_error(component):
    out = feature("native", "late_install")
    assert out["error_type"] == "GpuError"
    assert "before the first CUDA tensor" in out["message"]


@pytest.mark.quiet_machine
@gpu
def test_gpu_recording_history_costs_at_most_twice_native(component):
    mine = feature("gpukeeper", "history_cost")
    native = feature("native", "history_cost")
    assert mine["ok"] and native["ok"]
    assert mine["recording_ns"] <= 2.0 * native["recording_ns"], (mine, native)
