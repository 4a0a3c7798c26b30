"""A tensor that cannot be shared through torch.multiprocessing reaches the receiver as an
error, never as a wait: the guard on PyTorch's reducers (integrations/torch_ipc.py), run
both ways with PyTorch's own reducers on the CPU. A non-leaf tensor that requires grad is
one PyTorch itself refuses to send; a CUDA tensor the allocator cannot export fails the
same way in the queue's feeder thread."""

from __future__ import annotations

import queue
import warnings
from multiprocessing.reduction import ForkingPickler

import pytest

from gpukeeper.base.errors import GpuError
from gpukeeper.integrations import torch_ipc

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

# The receiver reads as most code does, with no timeout; the test bounds its own wait.
WAIT_S = 30


def _receive(inbox, outbox) -> None:
    try:
        item = inbox.get()
        outbox.put(("received", float(item.sum())))
    except Exception as exc:  # the child reports what its get() raised
        outbox.put(("raised", f"{type(exc).__name__}: {exc}"))


def _send_through_a_queue(tensor) -> tuple:
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_receive, args=(inbox, outbox), daemon=True)
    child.start()
    try:
        inbox.put(tensor)  # pickled in the queue's feeder thread, as users send
        try:
            return outbox.get(timeout=WAIT_S)
        except queue.Empty:
            return ("still waiting", f"no item after {WAIT_S} s")
    finally:
        child.terminate()
        child.join(timeout=30)


@pytest.fixture
def guard():
    torch_ipc.install(torch)
    yield
    torch_ipc.uninstall()


def _unsendable():
    leaf = torch.ones(4, requires_grad=True)
    return leaf * 2  # PyTorch refuses to pickle a non-leaf tensor that requires grad


def test_a_tensor_that_cannot_be_sent_raises_in_the_receivers_get(guard):
    with pytest.warns(RuntimeWarning, match="could not share"):
        kind, text = _send_through_a_queue(_unsendable())
    assert kind == "raised", text
    assert text.startswith("GpuError") and "requires_grad" in text


def test_without_the_guard_the_receiver_waits_for_an_item_that_never_comes():
    assert not torch_ipc.is_installed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kind, _ = _send_through_a_queue(_unsendable())
    assert kind == "still waiting"


def test_what_can_be_sent_is_pickled_as_before(guard):
    tensor = torch.arange(6.0)
    kind, total = _send_through_a_queue(tensor)
    assert (kind, total) == ("received", 15.0)
    reducer = ForkingPickler._extra_reducers[torch.Tensor]
    assert reducer.__wrapped__ is torch.multiprocessing.reductions.reduce_tensor


def test_in_process_the_item_raises_where_it_is_loaded(guard):
    with pytest.warns(RuntimeWarning):
        data = ForkingPickler.dumps(_unsendable())
    with pytest.raises(GpuError, match="could not share a Tensor"):
        ForkingPickler.loads(data)


def test_install_is_idempotent_and_uninstall_puts_pytorchs_reducers_back():
    torch_ipc.install(torch)
    torch_ipc.install(torch)
    assert ForkingPickler._extra_reducers[torch.Tensor].__wrapped__ is (
        torch.multiprocessing.reductions.reduce_tensor)
    torch_ipc.uninstall()
    assert ForkingPickler._extra_reducers[torch.Tensor] is torch.multiprocessing.reductions.reduce_tensor
    assert not torch_ipc.is_installed()
