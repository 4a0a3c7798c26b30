"""The rank rows' transport on a CUDA device, without one: the kept tensors, their pinned
twins, the stream they are keyed on and the waits, against a stand-in for torch's CUDA
side built on CPU tensors and a collective that gathers two ranks' rows."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any, List

import pytest

from gpukeeper.frameworks import ranks

real = pytest.importorskip("torch")


class FakeStream:
    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1


class FakeEvent:
    def __init__(self) -> None:
        self.recorded_on: List[Any] = []
        self.waited = 0

    def record(self, stream: Any = None) -> None:
        self.recorded_on.append(stream)

    def synchronize(self) -> None:
        self.waited += 1


class FakeCudaTorch:
    """torch as the transport uses it on a CUDA device: tensors are CPU ones (device and
    pin_memory are dropped), the current stream's handle is ``raw``, and the calls that
    build a Stream object are counted; the rest is the real torch."""

    int64 = real.int64

    def __init__(self, raw_query: bool = True) -> None:
        self.raw = 0x5000
        self.streams_built = 0
        self.events: List[FakeEvent] = []
        self._C = SimpleNamespace()
        if raw_query:
            self._C._cuda_getCurrentRawStream = lambda device: self.raw
        self.cuda = SimpleNamespace(
            current_device=lambda: 0,
            current_stream=self._current_stream,
            Event=self._event,
        )

    def __getattr__(self, name: str) -> Any:
        # torch's own code looks itself up in sys.modules while this stands in there
        return getattr(real, name)

    def _current_stream(self, device: Any = None) -> FakeStream:
        self.streams_built += 1
        return FakeStream(self.raw)

    def _event(self) -> FakeEvent:
        self.events.append(FakeEvent())
        return self.events[-1]

    @staticmethod
    def device(kind: str, index: int) -> Any:
        return _Device(kind, index)

    @staticmethod
    def empty(n: int, dtype: Any = None, device: Any = None, pin_memory: bool = False) -> Any:
        return real.empty(n, dtype=dtype)

    @staticmethod
    def tensor(values: Any, dtype: Any = None) -> Any:
        return real.tensor(values, dtype=dtype)


class _Device:
    def __init__(self, kind: str, index: int) -> None:
        self.type, self.index = kind, index

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


class FakeGroup:
    """A process group object (weakly referenced, as torch's are)."""


class TwoRanks:
    """torch.distributed with NCCL and two ranks: the peer's row is this rank's plus 100."""

    def __init__(self) -> None:
        self.gathers = 0
        self.facts_asked = 0

    def get_world_size(self, group: Any = None) -> int:
        self.facts_asked += 1
        return 2

    def get_backend(self, group: Any = None) -> str:
        self.facts_asked += 1
        return "nccl"

    def get_rank(self) -> int:
        return 0

    def all_gather_into_tensor(self, out: Any, row: Any, group: Any = None) -> None:
        self.gathers += 1
        out.view(2, -1).copy_(real.stack([row, row + 100]))


@pytest.fixture
def cuda_side(monkeypatch):
    fake, dist = FakeCudaTorch(), TwoRanks()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(ranks, "loaded_dist", lambda: dist)
    ranks.GATHER_BUFFERS.clear()
    yield fake, dist
    ranks.GATHER_BUFFERS.clear()


def test_rows_travel_through_kept_pinned_twins_on_the_keyed_stream(cuda_side):
    fake, dist = cuda_side
    made = ranks.GATHER_BUFFERS.made
    for step in range(3):
        rows = ranks.all_gather_int64([step, 2, 3], None, None)
        assert rows == [[step, 2, 3], [step + 100, 102, 103]]
    assert dist.gathers == 3
    assert ranks.GATHER_BUFFERS.made - made == 1  # one set of tensors for the three calls
    # The Stream object is built once, with the set; each call asks only for the handle.
    assert fake.streams_built == 1
    (kept,) = [k for _ref, k in ranks.GATHER_BUFFERS._pairs.values()]
    assert kept.stream.synchronized == 3  # each call waits for its rows, on that stream
    # That wait also covers the row's copy out of the pinned twin: no event is needed.
    assert kept.sent.recorded_on == [] and kept.sent.waited == 0
    assert ranks.GATHER_BUFFERS.keys()[0]["stream"] == fake.raw
    # The group's size and backend were asked once, not on every call.
    assert dist.facts_asked == 2


def test_a_rank_that_does_not_wait_guards_its_pinned_row_with_the_event(cuda_side):
    _fake, dist = cuda_side
    assert ranks.all_gather_int64([1, 2], None, 1) is None  # rank 0 is not dst
    (kept,) = [k for _ref, k in ranks.GATHER_BUFFERS._pairs.values()]
    assert kept.stream.synchronized == 0  # nothing waited for
    assert kept.sent.recorded_on == [kept.stream] and kept.in_flight
    # The next call waits for that row to leave before writing the twin again.
    assert ranks.all_gather_int64([3, 4], None, 0) == [[3, 4], [103, 104]]
    assert kept.sent.waited == 1 and not kept.in_flight
    assert kept.sent.recorded_on == [kept.stream]  # this call waited for its stream
    assert dist.gathers == 2


def test_a_default_group_made_again_gets_new_tensors(cuda_side):
    _fake, dist = cuda_side
    made = ranks.GATHER_BUFFERS.made
    dist.group = SimpleNamespace(WORLD=FakeGroup())
    assert ranks.all_gather_int64([1], None, None) == [[1], [101]]
    dist.group = SimpleNamespace(WORLD=FakeGroup())  # torn down and initialised again
    assert ranks.all_gather_int64([2], None, None) == [[2], [102]]
    assert ranks.GATHER_BUFFERS.made - made == 2  # the new default group got its own set
    # and the first group's set went with it
    assert [k["group"] for k in ranks.GATHER_BUFFERS.keys()] == [id(dist.group.WORLD)]


def test_another_current_stream_gets_its_own_tensors(cuda_side):
    fake, _dist = cuda_side
    ranks.all_gather_int64([1], None, None)
    fake.raw = 0x6000
    assert ranks.all_gather_int64([2], None, None) == [[2], [102]]
    assert [k["stream"] for k in ranks.GATHER_BUFFERS.keys()] == [0x5000, 0x6000]
    assert fake.streams_built == 2


def test_a_torch_without_the_raw_query_keys_on_the_stream_object(monkeypatch):
    fake, dist = FakeCudaTorch(raw_query=False), TwoRanks()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(ranks, "loaded_dist", lambda: dist)
    ranks.GATHER_BUFFERS.clear()
    try:
        assert ranks.all_gather_int64([7], None, None) == [[7], [107]]
        assert ranks.GATHER_BUFFERS.keys()[0]["stream"] == fake.raw
    finally:
        ranks.GATHER_BUFFERS.clear()


def test_facts_of_groups_without_weak_references_stay_bounded(cuda_side):
    _fake, dist = cuda_side
    # Objects that refuse weak references: kept alive while cached, so forgotten by bound.
    groups = [(i,) for i in range(100)]
    for group in groups:
        assert ranks.all_gather_int64([1], group, None) == [[1], [101]]
    kept = ranks.GATHER_BUFFERS
    assert len(kept._pairs) == kept.CAPACITY
    assert len(kept._groups) <= 4 * kept.CAPACITY + 1
    assert dist.facts_asked == 2 * len(groups)
