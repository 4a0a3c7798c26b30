"""Which rank the tables across ranks name as the outlier: the rule alone (pick_outlier),
the memory table and the timing aggregate over planted figures, the summary row's
encoding, and real gloo jobs of 2, 3 and 8 processes (NCCL with GPUKEEPER_TEST_WORLD_SIZE
GPUs where there are that many)."""

import json
import socket
import sys
from pathlib import Path

import pytest

import gpukeeper
from gpukeeper import distributed as gkd
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.distributed.rank_memory import HOSTNAME_BYTES, VECTOR_LENGTH
from gpukeeper.distributed.rank_outliers import ABOVE_MEDIAN, BELOW_MEDIAN, MAX_OF_TWO, MIN_OF_TWO

MiB = 1 << 20
GiB = 1 << 30


def pick(values, **kw):
    p = gkd.pick_outlier(dict(enumerate(values)), **kw)
    return None if p is None else (p.rank, p.how)


# ------------------------------------------------------------------------ the rule


def test_two_ranks_name_the_larger_and_say_so():
    assert pick([304 * MiB, 2.3 * GiB]) == (1, MAX_OF_TWO)  # the case the median got wrong
    assert pick([2.3 * GiB, 304 * MiB]) == (0, MAX_OF_TWO)
    assert pick([304, 2300], direction="low") == (0, MIN_OF_TWO)
    assert pick([5, 5]) is None and pick([5, 5], direction="low") is None
    assert gkd.pick_outlier({0: 1.0, 1: 2.0}).of_two


def test_three_ranks_only_the_bad_side_counts():
    # Rank 0 is furthest from the median (900 below), rank 2 is the one above it.
    assert pick([100, 1000, 1010]) == (2, ABOVE_MEDIAN)
    assert pick([100, 1000, 1010], direction="low") == (0, BELOW_MEDIAN)
    assert pick([100, 1000, 1000]) is None  # nothing above the median
    assert pick([1000, 1000, 5000]) == (2, ABOVE_MEDIAN)
    assert pick([7, 7, 7]) is None and pick([7, 7, 7], direction="low") is None


def test_eight_ranks():
    four = [0.3, 2.3, 4.3, 6.3]
    assert pick(four) == (3, ABOVE_MEDIAN)  # ranks 0 and 3 equally far: the high one
    assert pick(four, direction="low") == (0, BELOW_MEDIAN)
    eight = [80, 80, 80, 0, 80, 80, 150, 80]
    assert pick(eight) == (6, ABOVE_MEDIAN)
    assert pick(eight, direction="low") == (3, BELOW_MEDIAN)
    assert pick([1, 1, 1, 1, 1, 1, 1, 0]) is None  # one low rank is not a memory outlier
    assert pick([9] * 8) is None


def test_ties_go_to_the_lowest_rank_of_the_highest_value():
    assert pick([1, 5, 1, 5, 1]) == (1, ABOVE_MEDIAN)
    assert gkd.pick_outlier({7: 1.0, 3: 9.0, 5: 9.0, 1: 1.0, 0: 1.0}).rank == 3
    assert pick([3, 1, 3, 1], direction="low") == (1, BELOW_MEDIAN)  # the median is 2
    assert pick([3, 1, 1, 1], direction="low") is None  # most ranks share the lowest
    assert pick([1, 5, 5, 5]) is None


def test_thresholds_and_unknowns():
    assert pick([1000, 1000, 1050], min_fraction=0.10) is None  # 5 % above: noise
    assert pick([1000, 1000, 1150], min_fraction=0.10) == (2, ABOVE_MEDIAN)
    assert pick([1000, 1000, 1050], min_gap=64) is None
    assert pick([1000, 1100], min_fraction=0.2) is None  # two ranks: against the other one
    assert pick([None, 1000, None, 3000]) == (3, MAX_OF_TWO)  # two known figures
    assert pick([None, 5]) is None and pick([]) is None


def test_bad_input_is_typed():
    with pytest.raises(InvalidInputError, match="direction"):
        gkd.pick_outlier({0: 1.0, 1: 2.0}, direction="up")
    with pytest.raises(InvalidInputError, match="mapping"):
        gkd.pick_outlier([1.0, 2.0])
    with pytest.raises(InvalidInputError, match="a rank must be an int >= 0"):
        gkd.pick_outlier({"0": 1.0})
    with pytest.raises(InvalidInputError, match="number or None"):
        gkd.pick_outlier({0: "1"})
    with pytest.raises(InvalidInputError, match="min_gap"):
        gkd.pick_outlier({0: 1.0}, min_gap=-1)


# ------------------------------------------------------------------ tables over rows


def _row(rank, allocated, world=8, other_devices=None):
    return gkd.RankMemory(rank=rank, world_size=world, hostname="h", pid=100 + rank, devices=[rank],
                          allocated=allocated, reserved=allocated, peak=allocated, context=0,
                          process=allocated + 500 * MiB, other_devices=other_devices)


def _outlier_row(text):
    return next(line for line in text.splitlines() if line.startswith("outlier"))


def test_memory_table_two_ranks_names_the_larger_and_marks_it():
    text = gkd.format_rank_table([_row(0, 304 * MiB, 2), _row(1, int(2.3 * GiB), 2)])
    cells = _outlier_row(text).split()[1:]
    assert cells == ["rank", "1*"] * 3 + ["-", "rank", "1*"], text  # equal contexts: none
    assert text.rstrip().endswith("* max of 2 ranks: a median cannot tell which one stands out")


def test_memory_table_three_and_eight_ranks():
    text = gkd.format_rank_table([_row(0, 100 * MiB, 3), _row(1, 1000 * MiB, 3), _row(2, 1100 * MiB, 3)])
    assert _outlier_row(text).split()[1:3] == ["rank", "2"], text
    assert "*" not in text
    sizes = [80, 80, 80, 0, 80, 80, 150, 80]
    text = gkd.format_rank_table([_row(r, s * MiB) for r, s in enumerate(sizes)])
    assert _outlier_row(text).split()[1:3] == ["rank", "6"], text
    text = gkd.format_rank_table([_row(r, 0 if r == 3 else 80 * MiB) for r in range(8)])
    assert _outlier_row(text).split()[1:5] == ["-"] * 4, text


def test_memory_table_shows_memory_on_other_devices():
    text = gkd.format_rank_table([_row(0, MiB, 2), _row(1, MiB, 2, other_devices=[0])])
    assert "1 (+ 0)" in text


def _result(ms):
    return gpukeeper.BenchmarkResult(name="f", times_ms=[ms - 0.01, ms, ms + 0.01])


def test_aggregate_names_the_slow_outlier():
    agg = gkd.aggregate([_result(1.0), _result(3.0)])
    assert (agg.outlier_rank, agg.outlier_how) == (1, MAX_OF_TWO)
    assert "outlier: rank 1* (* max of 2 ranks" in agg.table()
    agg = gkd.aggregate([_result(v) for v in (10, 10, 1, 10, 10, 10, 12, 10)])
    assert (agg.outlier_rank, agg.outlier_how, agg.slowest_rank) == (6, ABOVE_MEDIAN, 6)
    assert "outlier: rank 6 (20.0 % above the median" in agg.table()
    agg = gkd.aggregate([_result(v) for v in (10, 10.1, 10, 1)])  # a fast rank is not an outlier
    assert agg.outlier_rank is None and "outlier: none" in agg.table()
    assert agg.to_dict()["outlier_rank"] is None


# ------------------------------------------------------------------ the summary row


def test_summary_row_round_trip():
    row = _row(3, 5 * GiB, other_devices=[0, 7])
    vec = row.to_vector()
    assert len(vec) == VECTOR_LENGTH and all(isinstance(v, int) for v in vec)
    assert gkd.RankMemory.from_vector(vec) == row
    unknown = gkd.RankMemory(rank=0, world_size=None, hostname="nodé-1", pid=1, devices=[],
                             allocated=None, reserved=0, peak=None, context=None, process=None)
    assert gkd.RankMemory.from_vector(unknown.to_vector()) == unknown


def test_summary_row_cuts_long_host_names():
    name = "n" * (HOSTNAME_BYTES - 1) + "é" + "tail"  # the cut falls inside a character
    row = gkd.RankMemory(rank=0, world_size=1, hostname=name, pid=1, devices=[0], allocated=0,
                         reserved=0, peak=0, context=0, process=0)
    back = gkd.RankMemory.from_vector(row.to_vector())
    assert back.hostname == "n" * (HOSTNAME_BYTES - 1)
    with pytest.raises(InvalidInputError, match="not a summary row"):
        gkd.RankMemory.from_vector([0] * VECTOR_LENGTH)
    with pytest.raises(InvalidInputError, match="not a summary row"):
        gkd.RankMemory.from_vector(row.to_vector()[:-1])


def test_memory_report_scope_outside_a_job_is_every_device(monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    rank = gpukeeper.memory_report(scope="rank")
    assert len(rank.devices) == len(gpukeeper.memory_report().devices)
    assert rank.other_devices is None
    with pytest.raises(InvalidInputError, match="scope"):
        gpukeeper.memory_report(scope="all")


# ------------------------------------------------------------------ real jobs

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
sys.path.insert(0, str(Path(__file__).parent))
from test_distributed import NCCL, NCCL_RANKS, torchrun  # noqa: E402

# Per world size: MiB each rank holds and ms each rank's planted median takes. The old
# rule (furthest from the median either way, ties to the lowest rank) names another rank
# in every column asked about here.
PLANTS = {
    2: ([8, 160], [1.0, 3.0], 1, 1),  # (hold, ms, memory outlier, time outlier)
    3: ([8, 200, 300], [1.0, 10.0, 12.0], 2, 2),
    8: ([80, 80, 80, 0, 80, 80, 150, 80], [10, 10, 10, 1, 10, 10, 12, 10], 6, 6),
}


def _nccl_plant(n):
    hold = [80] * n
    hold[0], hold[-1] = 0, 150
    ms = [10.0] * n
    ms[0], ms[-1] = 1.0, 12.0
    return hold, ms, n - 1, n - 1


@pytest.mark.parametrize("n,backend", [(2, "gloo"), (3, "gloo"), (8, "gloo"),
                                       pytest.param(NCCL_RANKS, "nccl", marks=NCCL)],
                         ids=["2-ranks-gloo", "3-ranks-gloo", "8-ranks-gloo", f"{NCCL_RANKS}-ranks-nccl"])
def test_real_job_names_the_planted_rank(tmp_path, n, backend):
    hold, ms, memory_rank, time_rank = PLANTS[n] if backend == "gloo" else _nccl_plant(n)
    env = {"GPUKEEPER_TEST_HOLD_MIB": ",".join(map(str, hold)),
           "GPUKEEPER_TEST_MS": ",".join(map(str, ms))}
    if backend == "gloo":  # CPU mode on a GPU machine too, so the host pools are the memory
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = torchrun(n, "outliers", tmp_path, backend, timeout=90, extra_env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    mark = "*" if n == 2 else ""
    for text in (seen[0]["table"], seen[n - 1]["summary_table"]):
        # allocated and reserved: the rank that holds the most
        assert _outlier_row(text).split()[1:5] == ["rank", f"{memory_rank}{mark}"] * 2, text
        assert ("* max of 2 ranks" in text) == (n == 2), text
    allocated = seen[0]["summary_allocated"]
    assert allocated[memory_rank] - min(allocated) >= 140 * MiB
    agg = seen[0]["aggregate"]
    assert (agg["outlier_rank"], agg["slowest_rank"]) == (time_rank, time_rank), agg["text"]
    assert agg["outlier_how"] == (MAX_OF_TWO if n == 2 else ABOVE_MEDIAN)
    assert socket.gethostname()[:HOSTNAME_BYTES] in seen[0]["summary_table"]
