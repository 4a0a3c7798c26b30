"""The production notes' patterns on a GPU (run one at a time in a fresh process by
test_production_notes.py: the notes' check needs a process that holds no other CUDA memory).

With its own verification lines: after the cleanup,
``torch.cuda.memory_allocated()`` is back at its value on entry and
``torch.cuda.memory_reserved()`` is "minimal" (at most 2 MiB).

Each test starts from a clean state (every cache released, the entry value measured)
and uses a small real model: Linear layers (cuBLAS, and so its workspace) and an Adam
step (so that the optimizer holds state). Skipped without a usable CUDA device.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from gpukeeper.cleanup import GPUContext, LeakWarning, cleanup_cuda, cleanup_models, deferred

torch = pytest.importorskip("torch")

MiB = 1 << 20


class MyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
        )

    def forward(self, x):
        return self.net(x)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 3) -> float:
    x = torch.randn(256, 512, device="cuda")
    loss = None
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (model(x) - x).square().mean()
        loss.backward()
        optimizer.step()
    return float(loss)


@pytest.fixture
def entry() -> Iterator[int]:
    """``torch.cuda.memory_allocated()`` on entry, with every cache released."""
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no usable CUDA device")
    deferred.disarm_all()
    torch.cuda.init()
    cleanup_cuda()  # synchronize, empty every cache (cuBLAS workspaces too), collect
    reserved = torch.cuda.memory_reserved()
    if reserved > 2 * MiB:
        pytest.fail(
            f"the process holds {reserved} bytes of CUDA memory before the test (live tensors "
            "of other tests): run each case in a fresh process, as test_production_notes.py does"
        )
    yield torch.cuda.memory_allocated()
    deferred.disarm_all()


@pytest.mark.gpu
def test_pattern_2_context_manager_names_deleted_after_the_block(entry):
    with pytest.warns(LeakWarning):  # the names outlive the block: said at exit
        with GPUContext() as ctx:
            model = MyModel().cuda()
            optimizer = torch.optim.Adam(model.parameters())
            x = torch.randn(256, 512, device="cuda")
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            scores = x @ x.T
    assert ctx.report.deferred > 0
    assert torch.cuda.memory_reserved() > 2 * MiB  # held by the names: nothing to give back yet
    del model, optimizer, x, loss, scores
    print(torch.cuda.memory_allocated())  # must be back to its value at entry
    print(torch.cuda.memory_reserved())  # must be "minimal"
    assert torch.cuda.memory_allocated() == entry
    assert torch.cuda.memory_reserved() <= 2 * MiB


@pytest.mark.gpu
def test_pattern_2_exception_path_names_deleted_after_the_block(entry):
    with pytest.warns(LeakWarning):
        try:
            with GPUContext() as ctx:
                model = MyModel().cuda()
                x = torch.randn(256, 512, device="cuda")
                loss = model(x).square().mean()
                loss.backward()
                raise RuntimeError("training failed")
        except RuntimeError as e:
            print(f"Error: {e}")
    assert ctx.report.exc_type == "RuntimeError" and ctx.report.deferred > 0
    del model, x, loss
    print(torch.cuda.memory_allocated())
    print(torch.cuda.memory_reserved())
    assert torch.cuda.memory_allocated() == entry
    assert torch.cuda.memory_reserved() <= 2 * MiB


@pytest.mark.gpu
def test_pattern_2_release_names_without_del(entry):
    with GPUContext(release_names=True) as ctx:
        model = MyModel().cuda()
        optimizer = torch.optim.Adam(model.parameters())
        _train(model, optimizer)
    assert not ctx.report.leaked and ctx.report.deferred == 0
    print(torch.cuda.memory_allocated())
    print(torch.cuda.memory_reserved())
    assert torch.cuda.memory_allocated() == entry
    assert torch.cuda.memory_reserved() <= 2 * MiB
    assert all(p.numel() == 0 for p in model.parameters())


@pytest.mark.gpu
def test_pattern_3_cleanup_models(entry):
    model = MyModel().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    assert _train(model, optimizer) > 0  # ... training
    cleanup_models(model, optimizer)
    print(torch.cuda.memory_allocated())
    print(torch.cuda.memory_reserved())
    assert torch.cuda.memory_allocated() == entry
    assert torch.cuda.memory_reserved() <= 2 * MiB
