"""torch.distributed as gpukeeper sees it: this process's rank, the group a caller names,
and the few collectives gpukeeper makes (a joint decision, gathering Python objects or rows
of integers, tearing a process group down without hanging).

torch.distributed is the engine; nothing here opens a socket or a file of its own.
Like the other adapters this module never imports torch: a process that has not
imported it has no process group.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpukeeper.base import process_life
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.frameworks.torch_adapter import current_raw_stream

__all__ = [
    "GATHER_BUFFERS",
    "GatherBuffers",
    "RankInfo",
    "RankStep",
    "all_gather_int64",
    "check_dst",
    "check_group",
    "current_rank",
    "gather_objects",
    "group_ranks",
    "launcher_rank",
    "loaded_dist",
    "process_group_active",
    "shutdown_process_group",
]


@dataclass(frozen=True)
class RankInfo:
    """Where this process stands among its peers.

    ``source`` says how it was found: ``"torch.distributed"`` (an initialised process
    group) or ``"environment"`` (a launcher's RANK/WORLD_SIZE variables, before
    ``init_process_group``).
    """

    rank: int
    world_size: int
    local_rank: Optional[int]
    backend: Optional[str]
    source: str

    def label(self) -> str:
        """``"rank 3 of 8"``."""
        return f"rank {self.rank} of {self.world_size}"


def loaded_dist() -> Any:
    """``torch.distributed`` when torch is imported and built with it, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    try:
        return dist if dist is not None and dist.is_available() else None
    except Exception:
        return None


def process_group_active() -> bool:
    """Whether the default process group is initialised in this process."""
    dist = loaded_dist()
    try:
        return bool(dist is not None and dist.is_initialized())
    except Exception:
        return False


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or not value.strip().lstrip("-").isdigit():
        return None
    return int(value)


def launcher_rank() -> Optional[RankInfo]:
    """The rank a launcher (torchrun, or anything that sets RANK and WORLD_SIZE) gave this
    process, before or without a process group; None outside one."""
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None or world is None or world < 1 or not 0 <= rank < world:
        return None
    return RankInfo(rank, world, _env_int("LOCAL_RANK"), None, "environment")


def current_rank() -> Optional[RankInfo]:
    """This process's rank in the default process group when one is initialised, else the
    launcher's (environment), else None. Never initialises anything."""
    if process_group_active():
        dist = loaded_dist()
        try:
            return RankInfo(
                int(dist.get_rank()),
                int(dist.get_world_size()),
                _env_int("LOCAL_RANK"),
                str(dist.get_backend()),
                "torch.distributed",
            )
        except Exception:
            pass  # torn down between the two calls: the environment still says who we are
    return launcher_rank()


def check_group(group: Any, what: str) -> Any:
    """``group`` checked for a collective: None or a ``ProcessGroup`` with an initialised
    default group. Raises ``InvalidInputError`` (naming ``what``) otherwise."""
    dist = loaded_dist()
    if dist is None or not process_group_active():
        raise InvalidInputError(
            f"{what}: torch.distributed has no process group in this process; call "
            "torch.distributed.init_process_group() first (under torchrun, or with "
            "MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE set)"
        )
    if group is None:
        return None
    process_group = getattr(dist, "ProcessGroup", None)
    if process_group is not None and not isinstance(group, process_group):
        raise InvalidInputError(
            f"{what}: group must be a torch.distributed ProcessGroup or None, "
            f"got {type(group).__name__}"
        )
    return group


def _moves_cuda_tensors(dist: Any, group: Any) -> bool:
    """Whether ``group``'s collectives take CUDA tensors: NCCL moves device tensors only;
    gloo and the others (and a mixed backend's CPU side) take host tensors."""
    backend = str(dist.get_backend(group)).lower()
    return "nccl" in backend and "cpu:" not in backend


def _collective_device(dist: Any, group: Any) -> Any:
    """Where a collective's tensor must live: the current CUDA device for NCCL, the CPU
    for gloo and the others."""
    torch = sys.modules["torch"]
    if _moves_cuda_tensors(dist, group):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class RankStep:
    """Puts the ranks of a group in step and lets them decide together when to stop.

    ``step(done)`` is a collective: every rank of the group calls it the same number of
    times. It returns when every rank has called it (a barrier) and answers True once
    *every* rank says ``done``: a rank that is done keeps stepping while another is not,
    so collective-heavy functions never wait on a peer that has left the loop.
    """

    def __init__(self, group: Any) -> None:
        dist = loaded_dist()
        self._dist = dist
        self.group = group
        self.world_size = int(dist.get_world_size(group))
        torch = sys.modules["torch"]
        # Made once: a tensor per step would show in the allocator counters being measured.
        self._flag = torch.zeros(1, dtype=torch.int32, device=_collective_device(dist, group))
        self._max = dist.ReduceOp.MAX

    def step(self, done: bool) -> bool:
        """True when every rank of the group is done; returns once all have called."""
        flag = self._flag
        flag.fill_(0 if done else 1)
        self._dist.all_reduce(flag, op=self._max, group=self.group)
        # .item() waits for the result on the host: for NCCL the reduction runs on the
        # GPU, and the ranks are only in step once it has completed.
        return int(flag.item()) == 0

    def agree_max(self, value: int) -> int:
        """The largest ``value`` any rank of the group gives (a collective), so that every
        rank sizes a loop alike: ranks that call ``fn`` a different number of times would
        leave a collective inside it waiting."""
        flag = self._flag
        flag.fill_(int(value))
        self._dist.all_reduce(flag, op=self._max, group=self.group)
        return int(flag.item())


def gather_objects(obj: Any, group: Any, dst: Optional[int]) -> Optional[List[Any]]:
    """Every rank's ``obj`` (picklable) in rank order: on ``dst`` (a global rank) only,
    None elsewhere; on every rank when ``dst`` is None. A collective over ``group``."""
    dist = loaded_dist()
    size = int(dist.get_world_size(group))
    if dst is None:
        out: List[Any] = [None] * size
        dist.all_gather_object(out, obj, group=group)
        return out
    me = int(dist.get_rank())
    out_or_none = [None] * size if me == dst else None
    dist.gather_object(obj, out_or_none, dst=dst, group=group)
    return out_or_none


class KeptGather:
    """What one key of :class:`GatherBuffers` keeps: the collective's tensors (``row``
    in, ``out`` of ``size`` x row), and for a CUDA device their pinned host twins, the
    event that says a row has left ``host_in`` and the stream of the key (None on the
    CPU), made once so that a call asks torch only for the stream's handle.
    ``in_flight``: a row copy from ``host_in`` may still be under way (the last call
    returned without waiting for its stream)."""

    __slots__ = ("row", "out", "size", "host_in", "host_out", "sent", "stream", "in_flight")

    def __init__(
        self,
        row: Any,
        out: Any,
        size: int,
        host_in: Any = None,
        host_out: Any = None,
        sent: Any = None,
        stream: Any = None,
    ) -> None:
        self.row, self.out, self.size = row, out, size
        self.host_in, self.host_out, self.sent, self.stream = host_in, host_out, sent, stream
        self.in_flight = False


class GatherBuffers:
    """The tensors of :func:`all_gather_int64` (a row in, ``world x row`` out), kept
    between calls: one set per (group, device, current stream, row length), the
    :data:`CAPACITY` made last kept. Making them on each call costs two
    allocations and, for NCCL, lets the caching allocator hand the collective a
    different block each time; kept, they stay allocated in PyTorch's counters between
    calls (a few hundred bytes; the allocator rounds each up to 512). For a CUDA device
    the rows go through pinned host twins, copied without a wait on either side but the
    one for the gathered rows: a copy from pageable memory waits for the device twice.
    A group's world size and backend are asked once, when its first set is made: the
    Python calls that answer them cost as much as the rest of a call on a busy host.

    A set is never shared by two groups: a group's set is keyed by the group itself
    (the default group by the object behind it, so a default group made again gets
    sets of its own), and goes when the group is freed (a weak reference) or the
    default group is torn down through :func:`shutdown_process_group`. The stream is in
    the key so that the row written for a call is ordered after the previous collective
    that read it: NCCL runs on its own stream, ordered after the stream current when it
    was called.
    """

    CAPACITY = 8

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._pairs: "OrderedDict[Tuple[Any, ...], Tuple[Any, KeptGather]]" = OrderedDict()
        # id(group) -> (reference, world size, whether its collectives move CUDA tensors)
        self._groups: Dict[int, Tuple[Any, int, bool]] = {}
        self.made = 0  # sets made since the start (a test reads it)

    def pair(self, torch: Any, dist: Any, group: Any, length: int) -> KeptGather:
        """The tensors for one call over ``group`` (None: the default group): kept ones
        when this key had them, else new ones."""
        owner = _default_group(dist) if group is None else group
        ident = id(owner)
        facts = self._groups.get(ident)
        if facts is None or facts[0]() is not owner:
            facts = self._facts(dist, group, owner)
        ref, size, cuda = facts
        device = stream = None
        if cuda:
            device = torch.cuda.current_device()
            stream = current_raw_stream(torch, device)
        key = (ident, device, stream, length)
        kept = self._pairs.get(key)
        if kept is not None and kept[0]() is owner:
            return kept[1]
        made = self._make(torch, device, size, length)
        with self.lock:
            self._pairs[key] = (ref, made)
            while len(self._pairs) > self.CAPACITY:
                self._pairs.popitem(last=False)
            self.made += 1
        return made

    @staticmethod
    def _make(torch: Any, device: Optional[int], size: int, length: int) -> KeptGather:
        if device is None:
            return KeptGather(
                torch.empty(length, dtype=torch.int64),
                torch.empty(size * length, dtype=torch.int64),
                size,
            )
        where = torch.device("cuda", device)
        return KeptGather(
            torch.empty(length, dtype=torch.int64, device=where),
            torch.empty(size * length, dtype=torch.int64, device=where),
            size,
            torch.empty(length, dtype=torch.int64, pin_memory=True),
            torch.empty(size * length, dtype=torch.int64, pin_memory=True),
            torch.cuda.Event(),
            torch.cuda.current_stream(where),
        )

    def _facts(self, dist: Any, group: Any, owner: Any) -> Tuple[Any, int, bool]:
        ident = id(owner)

        def forget(_ref: Any) -> None:
            with self.lock:
                self._groups.pop(ident, None)
                for key in [k for k in self._pairs if k[0] == ident]:
                    del self._pairs[key]

        try:
            ref: Any = weakref.ref(owner, forget)
        except TypeError:  # a group type without weak references: kept while cached
            ref = lambda: owner  # noqa: E731
        facts = (ref, int(dist.get_world_size(group)), _moves_cuda_tensors(dist, group))
        with self.lock:
            self._groups[ident] = facts
            if len(self._groups) > 4 * self.CAPACITY:
                # Groups without weak references never say they are gone: keep only the
                # facts of groups that still have tensors kept.
                live = {k[0] for k in self._pairs} | {ident}
                self._groups = {k: v for k, v in self._groups.items() if k in live}
        return facts

    def keys(self) -> List[Dict[str, Any]]:
        """What is kept, oldest first: group (the id of the group object), device (the
        CUDA device's index, None on the CPU), stream (its handle), row length and the
        group's size."""
        with self.lock:
            names = ("group", "device", "stream", "length")
            return [
                {**dict(zip(names, k)), "size": kept.size}
                for k, (_ref, kept) in self._pairs.items()
            ]

    def tensors(self) -> List[Tuple[Any, Any]]:
        """The kept (row, out) pairs of the collective, oldest first."""
        with self.lock:
            return [(kept.row, kept.out) for _ref, kept in self._pairs.values()]

    def clear(self) -> None:
        """Forgets every set and group (a torn-down default group, or a test)."""
        with self.lock:
            self._pairs.clear()
            self._groups.clear()


def _default_group(dist: Any) -> Any:
    # The object behind group=None: torn down and made again, it is a new object.
    world = getattr(getattr(dist, "group", None), "WORLD", None)
    return dist if world is None else world


#: The process's one cache of :func:`all_gather_int64`'s tensors.
GATHER_BUFFERS = GatherBuffers()


def all_gather_int64(
    values: Sequence[int], group: Any, dst: Optional[int]
) -> Optional[List[List[int]]]:
    """Every rank's row of ``len(values)`` int64s, in group-rank order: on ``dst`` (a
    global rank) only, None elsewhere; on every rank when ``dst`` is None. A collective
    over ``group``; every rank must give a row of the same length.

    One tensor ``all_gather`` (on the current CUDA device for NCCL, the CPU otherwise): a
    row of fixed size needs neither pickling nor the size exchange that
    ``gather_object`` makes first, so it costs one small collective. For ``dst`` the rows
    travel to every rank too (at this size a gather is no cheaper), and only ``dst``
    waits for them and reads them back to the host. The tensors are kept between calls
    (:data:`GATHER_BUFFERS`).
    """
    dist = loaded_dist()
    torch = sys.modules["torch"]
    kept = GATHER_BUFFERS.pair(torch, dist, group, len(values))
    skip = dst is not None and int(dist.get_rank()) != dst
    row, out = kept.row, kept.out
    if kept.host_in is None:
        row.copy_(torch.tensor(values, dtype=torch.int64))
    else:
        if kept.in_flight:  # a rank that did not wait last time: its row may still be leaving
            kept.sent.synchronize()
            kept.in_flight = False
        kept.host_in.copy_(torch.tensor(values, dtype=torch.int64))
        row.copy_(kept.host_in, non_blocking=True)
        if skip:  # otherwise the wait for the rows below covers this copy too
            kept.sent.record(kept.stream)
            kept.in_flight = True
    # all_gather_single is the current name (torch 2.13 deprecates all_gather_into_tensor);
    # both take a flat output of world x row; the list form is for torch versions with neither.
    flat = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
    if flat is not None:
        flat(out, row, group=group)
    else:
        dist.all_gather(list(out.view(kept.size, -1).unbind(0)), row, group=group)
    if skip:
        return None
    if kept.host_out is None:
        return out.view(kept.size, -1).tolist()
    kept.host_out.copy_(out, non_blocking=True)
    kept.stream.synchronize()  # the collective, then the copy back
    return kept.host_out.view(kept.size, -1).tolist()


def check_dst(dst: Any, group: Any, what: str) -> Optional[int]:
    """``dst`` checked: None, or a global rank that is a member of ``group``."""
    if dst is None:
        return None
    if isinstance(dst, bool) or not isinstance(dst, int):
        raise InvalidInputError(f"{what}: dst must be a rank (int) or None, got {dst!r}")
    dist = loaded_dist()
    world = int(dist.get_world_size())
    if not 0 <= dst < world:
        raise InvalidInputError(f"{what}: dst={dst} is not a rank of this job (world size {world})")
    if group is not None:
        try:
            ranks = dist.get_process_group_ranks(group)
        except Exception:
            ranks = None
        if ranks is not None and dst not in ranks:
            raise InvalidInputError(
                f"{what}: dst={dst} is not in the group (its ranks: {sorted(ranks)})"
            )
    return dst


def group_ranks(group: Any) -> List[int]:
    """The global ranks of ``group`` (None: the default group) in group-rank order."""
    dist = loaded_dist()
    if group is None:
        return list(range(int(dist.get_world_size())))
    try:
        return [int(r) for r in dist.get_process_group_ranks(group)]
    except Exception:
        return list(range(int(dist.get_world_size(group))))


def shutdown_process_group(timeout_s: float, abort: bool = False) -> Optional[str]:
    """Tears the default process group down, bounded by ``timeout_s``: what an ending
    process does so that NCCL's communicators do not hang its exit.

    A peer that died or stopped leaves collectives pending; destroying NCCL's
    communicators then can block, so the teardown runs in a daemon thread and the caller
    waits at most ``timeout_s``. ``abort``: abort NCCL's communicators first, where torch
    offers it (an abort never waits for peers): for a process ended by a signal, whose
    peers are being ended too. Returns None when done (or when there was no group), else
    what happened, in words; never raises (it runs on the way out of a process).
    """
    dist = loaded_dist()
    if dist is None or not process_group_active():
        return None
    outcome: List[Optional[str]] = []

    def teardown() -> None:
        try:
            aborter = getattr(getattr(dist, "distributed_c10d", None), "_abort_process_group", None)
            backend = str(dist.get_backend()).lower()
            if abort and aborter is not None and "nccl" in backend:
                aborter()
            if dist.is_initialized():
                dist.destroy_process_group()
            GATHER_BUFFERS.clear()
            outcome.append(None)
        except Exception as e:  # an ending process reports and goes on
            outcome.append(f"process group teardown failed: {type(e).__name__}: {e}")

    worker = process_life.start_thread("gpukeeper-pg-teardown", teardown)
    worker.join(timeout_s)
    if worker.is_alive():
        return (
            f"process group teardown still blocked after {timeout_s:g} s; left to the process's end"
        )
    return outcome[0] if outcome else None
