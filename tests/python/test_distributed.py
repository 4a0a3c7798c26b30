"""gpukeeper.distributed under torchrun with the gloo backend (CPU processes), and its
pieces that need no process group (the rank table, aggregating loaded results, OOM
snapshots, the checks before any collective)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import gpukeeper  # noqa: E402
from gpukeeper import distributed as gkd  # noqa: E402
from gpukeeper.base.errors import InvalidInputError  # noqa: E402
from gpukeeper.distributed.rank_memory import VECTOR_LENGTH  # noqa: E402
from torch_cuda import torch_cuda_usable  # noqa: E402

CHILD = Path(__file__).with_name("distributed_child.py")
MiB = 1 << 20


def torchrun(n: int, scenario: str, out: Path, backend: str = "gloo", timeout: float = 120,
             extra_env=None, **popen):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           str(CHILD), scenario, str(out), backend]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(extra_env or {}))
    if popen:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                **popen)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _gpus() -> int:
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


#: Ranks of the NCCL cases, one GPU each: 2 unless GPUKEEPER_TEST_WORLD_SIZE says more
#: (GPUKEEPER_TEST_WORLD_SIZE=4 on a machine of four GPUs).
NCCL_RANKS = int(os.environ.get("GPUKEEPER_TEST_WORLD_SIZE", "2"))
NCCL = pytest.mark.skipif(_gpus() < NCCL_RANKS or not dist.is_nccl_available(),
                          reason=f"needs {NCCL_RANKS} GPUs and NCCL")


@pytest.fixture(scope="module", params=[(2, "gloo"), (4, "gloo"), pytest.param((NCCL_RANKS, "nccl"), marks=NCCL)],
                ids=["2-ranks-gloo", "4-ranks-gloo", f"{NCCL_RANKS}-ranks-nccl"])
def api_run(request, tmp_path_factory):
    n, backend = request.param
    out = tmp_path_factory.mktemp(f"dist{n}{backend}")
    proc = torchrun(n, "api", out, backend)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return n, out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_rank_info_from_the_process_group(api_run):
    n, _, seen = api_run
    for r, s in enumerate(seen):
        assert s["rank_info"] == [r, n, "torch.distributed"]


def test_memory_reports_gathered_to_rank_0(api_run):
    n, _, seen = api_run
    assert [row[0] for row in seen[0]["reports"]] == list(range(n))
    assert all(row[1] == n and row[3] == "DevicesReport" for row in seen[0]["reports"])
    assert len({row[2] for row in seen[0]["reports"]}) == n  # one process per rank
    assert all(s["reports"] is None for s in seen[1:])


def test_summaries_gathered_to_every_rank(api_run):
    n, _, seen = api_run
    pids = [row[1] for row in seen[0]["summaries"]]
    for s in seen:
        assert [row[0] for row in s["summaries"]] == list(range(n))
        assert [row[1] for row in s["summaries"]] == pids
        assert all(row[2] == "RankMemory" for row in s["summaries"])


def test_summaries_describe_each_ranks_own_device(api_run):
    n, _, seen = api_run
    rows = seen[0]["summary_devices"]
    for r, (devices, others, hostname) in enumerate(rows):
        assert hostname == seen[r]["hostname"]  # the host name survives the int64 row
        if seen[r]["backend"] == "nccl":  # one GPU per rank: each row is its rank's device only
            assert devices == [r], rows
            assert others == [], f"rank {r} holds memory on other devices: {rows}"
        else:  # CPU mode: the host report; gloo on a GPU machine: the current device
            assert len(devices) <= 1 and (devices or others is None), rows


def test_summaries_say_how_old_the_process_figure_is(api_run):
    n, _, seen = api_run
    for s in seen:
        # CPU mode (no CUDA here): the RSS, read during the call. With CUDA, gloo ranks
        # report their device too, and NVML's figure may be a kept reading.
        assert len(s["summary_ages"]) == n and all(a is not None and a >= 0 for a in s["summary_ages"])
        if s["backend"] == "gloo" and not torch_cuda_usable():
            assert s["summary_ages"] == [0.0] * n
        assert len(s["fresh_ages"]) == n and all(a is not None and a < 50 for a in s["fresh_ages"])


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=NCCL)])
def test_transport_tensors_are_kept_per_group(tmp_path, backend):
    n = 3 if backend == "gloo" else NCCL_RANKS
    proc = torchrun(n, "buffers", tmp_path, backend)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    for s in seen:
        # Four summary gathers in the default group: one pair of tensors, reused.
        assert s["default"] == {"made": 1, "same": True, "ranks": list(range(n)),
                                "first": list(range(n)), "out_numel": n * VECTOR_LENGTH}
        # A group of the world's size that is not the default group: a pair of its own.
        assert s["everyone"]["ranks"] == list(range(n))
        assert s["everyone"]["disjoint"] and s["everyone"]["groups"] == s["everyone"]["pairs"]
    # The one-rank group: its own pair, sized for one row.
    assert seen[0]["alone"] == {"ranks": [0], "made": 2, "sizes": [1, n]}
    assert seen[0]["everyone"]["pairs"] == 3 and seen[1]["everyone"]["pairs"] == 2


def test_subgroup_gathers_to_its_destination(api_run):
    _, _, seen = api_run
    assert seen[0]["pair"] is None
    assert seen[1]["pair"] == [0, 1]


def test_rank_table_has_every_rank_and_the_spread(api_run):
    n, _, seen = api_run
    lines = seen[0]["table"].splitlines()
    assert lines[0] == f"gpukeeper memory across ranks ({n} of {n})"
    first_cells = [line.split()[0] for line in lines[3:] if not line.startswith("* ")]
    assert first_cells == [str(r) for r in range(n)] + ["min", "max", "sum", "outlier"]


def test_bad_arguments_are_typed_before_any_collective(api_run):
    n, _, seen = api_run
    errors = seen[0]["errors"]
    assert f"dst={n} is not a rank" in errors["dst_outside"]
    assert "dst must be a rank" in errors["dst_type"]
    assert "group must be a torch.distributed ProcessGroup" in errors["group_type"]
    assert "BenchmarkResult or a TrajectoryResult" in errors["aggregate_type"]
    assert "group must be a torch.distributed ProcessGroup" in errors["barrier_type"]


def test_barrier_keeps_ranks_calling_together(api_run):
    n, _, seen = api_run
    # Rank r asked for 5 + 5r calls: all measure until the last rank is done, so every
    # rank calls fn (and its all_reduce) equally often.
    # On a GPU the calls then run again back to back (the loop time), in batches of one
    # size on every rank.
    want = 5 + 5 * (n - 1)
    for s in seen:
        assert s["bench"]["n_calls"] == want
        assert s["bench"]["calls"] == seen[0]["bench"]["calls"]  # every rank called fn as often
        assert s["bench"]["loop_calls"] == seen[0]["bench"]["loop_calls"]
        if s["bench"]["work"] == "cpu":
            assert s["bench"]["calls"] == want + 2  # plus the warm-up
        else:
            assert s["bench"]["calls"] > want + 2
        assert f"the {n} ranks put in step" in s["bench"]["timing_method"]
        assert s["bench_group"] == 4
    assert seen[0]["bench"]["stop_reason"] == "n_calls"


@pytest.mark.quiet_machine
def test_aggregate_names_the_slowest_rank(api_run):
    n, _, seen = api_run
    agg = seen[0]["aggregate"]
    assert all(s["aggregate"] == agg for s in seen[1:]) or all(
        s["aggregate"]["per_rank"] == agg["per_rank"] for s in seen[1:])
    assert agg["world_size"] == n
    assert [t["rank"] for t in agg["per_rank"]] == list(range(n))
    assert agg["slowest_rank"] == n - 1  # the one that sleeps 20 ms per call
    assert agg["median_ms"]["max"] >= 20.0
    # On a GPU the headline is the loop time: in a batch of k calls the other ranks'
    # collectives wait for k - 1 of the last rank's sleeps, so they read up to
    # (k - 1) / k of its time (k = 2 for 20 ms calls in 25 ms batches), never all of it.
    assert agg["median_ms"]["min"] < 0.75 * agg["median_ms"]["max"]
    # So the slowest is at least a third slower than the fastest (1 / 0.75 - 1).
    assert agg["imbalance"] == pytest.approx(
        agg["median_ms"]["max"] / agg["median_ms"]["min"] - 1.0)
    assert agg["imbalance"] > 1.0 / 3.0
    assert "slowest rank" in seen[0]["aggregate_text"]


def test_aggregate_trajectories_sum_ns_per_day(api_run):
    n, _, seen = api_run
    t = seen[0]["trajectory"]
    per = t["ns_per_day_per_replica"]
    assert len(per) == n and all(v is not None and v > 0 for v in per)
    assert t["ns_per_day_total"] == pytest.approx(sum(per))
    assert per[0] > per[-1]  # rank r sleeps 3 (1 + r) ms per step
    assert t["slowest_rank"] == n - 1


def test_gpu_context_report_carries_the_rank(api_run):
    n, _, seen = api_run
    for r, s in enumerate(seen):
        rank, world, summary = s["context"]
        assert (rank, world) == (r, n)
        assert summary.startswith(f"rank {r} of {n}: ")


def test_oom_snapshot_per_rank(api_run):
    n, out, seen = api_run
    names = sorted(p.name for p in (out / "oom").glob("*.json"))
    assert len(names) == n
    for r, s in enumerate(seen):
        assert s["oom_file"].startswith(f"oom-rank{r}-pid")
        assert s["oom"] == r


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose: it holds nothing but its exit status
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.quiet_machine
@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=NCCL)])
def test_sigterm_from_the_launcher_ends_every_rank(tmp_path, backend):
    """torchrun forwards SIGTERM to the ranks; one waits in a collective for a peer that
    never comes. Every rank must be gone well before torchrun's own 30 s SIGKILL."""
    proc = torchrun(2, "sigterm", tmp_path, backend, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            time.sleep(0.2)
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
        time.sleep(1.0)  # rank 0 is inside the all_reduce by now
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = proc.stdout.read()
    assert proc.returncode != 0, output[-3000:]
    assert not any(_alive(p) for p in pids), output[-3000:]
    assert took < 20, f"the ranks took {took:.1f} s to end\n{output[-3000:]}"
    # The sleeping rank ended by SIGTERM through the guard: unwound, group destroyed.
    assert (tmp_path / "atexit1").read_text() == "False", output[-3000:]


# ------------------------------------------------------------------ no process group


def _result(name, median_ms, rank_shift=0.0):
    return gpukeeper.BenchmarkResult(name=name, times_ms=[median_ms + rank_shift + d for d in (-0.1, 0.0, 0.1)])


def test_aggregate_of_loaded_results_needs_no_group():
    agg = gkd.aggregate([_result("f", 1.0), _result("f", 3.0), _result("f", 2.0)])
    assert agg.slowest_rank == 1 and agg.fastest_rank == 0
    assert agg.median_ms == {"min": 1.0, "median": 2.0, "max": 3.0}
    assert agg.imbalance == pytest.approx(2.0)
    assert agg.rank is None
    text = agg.table()
    assert "1 (slowest)" in text and "200.0 % slower than rank 0" in text


def test_aggregate_rejects_mixed_and_empty():
    with pytest.raises(InvalidInputError, match="no results"):
        gkd.aggregate([])
    with pytest.raises(InvalidInputError, match="BenchmarkResult or a TrajectoryResult"):
        gkd.aggregate([_result("f", 1.0), "x"])


def test_collectives_without_a_process_group_are_typed():
    for call in (gkd.gather_memory_reports, lambda: gkd.aggregate(_result("f", 1.0)),
                 lambda: gpukeeper.benchmark_function(lambda: None, barrier=True)):
        with pytest.raises(InvalidInputError, match="no process group"):
            call()


def _row(rank, allocated, reserved=None, peak=None, context=0):
    return gkd.RankMemory(rank=rank, world_size=4, hostname="h", pid=100 + rank, devices=[rank],
                          allocated=allocated, reserved=reserved if reserved is not None else allocated,
                          peak=peak if peak is not None else allocated, context=context, process=None)


def test_rank_table_names_the_outlier_and_sums():
    rows = [_row(0, 1000 * MiB), _row(1, 1010 * MiB), _row(2, 3000 * MiB), _row(3, 990 * MiB)]
    text = gkd.format_rank_table(rows)
    body = {line.split()[0]: line for line in text.splitlines()[3:]}
    assert "rank 2" in body["outlier"]
    assert "5.9 GiB" in body["sum"]  # 6000 MiB
    assert "990.0 MiB" in body["min"] and "2.9 GiB" in body["max"]


def test_rank_table_no_outlier_within_noise_and_unknowns():
    rows = [_row(0, 1000 * MiB), _row(1, 1010 * MiB, context=None)]
    text = gkd.format_rank_table(rows)
    body = {line.split()[0]: line for line in text.splitlines()[3:]}
    assert "rank" not in body["outlier"]
    assert body["sum"].rstrip().endswith("?")  # one rank's context is unknown


def test_rank_table_bad_input():
    with pytest.raises(InvalidInputError, match="no reports"):
        gkd.format_rank_table([])
    with pytest.raises(InvalidInputError, match=r"reports\[1\] is a str"):
        gkd.format_rank_table([_row(0, 1), "x"])
    with pytest.raises(InvalidInputError, match="must be a list"):
        gkd.format_rank_table("abc")


def test_rank_table_from_devices_reports_without_ranks():
    reports = [gpukeeper.memory_report(), gpukeeper.memory_report()]
    text = gkd.format_rank_table(reports)
    assert [line.split()[0] for line in text.splitlines()[3:5]] == ["0", "1"]


def test_oom_snapshot_on_uncaught_oom(tmp_path):
    gkd.enable_oom_snapshots(tmp_path, max_snapshots=2)
    try:
        assert gkd.oom_snapshots_enabled()
        for _ in range(3):  # the third is over the budget
            sys.excepthook(MemoryError, MemoryError("out of memory here"), None)
        sys.excepthook(ValueError, ValueError("not an OOM"), None)
    finally:
        assert gkd.disable_oom_snapshots()
    assert not gkd.disable_oom_snapshots()
    files = sorted(tmp_path.glob("oom-norank-pid*.json"))
    assert len(files) == 2
    snap = json.loads(files[0].read_text())
    assert snap["error"]["type"] == "MemoryError" and snap["rank"] is None
    assert snap["memory_report"]["devices"] and "total" in snap["memory_report"]
    assert isinstance(snap["largest_live_blocks"], list)


def test_oom_snapshot_settings_are_typed(tmp_path):
    with pytest.raises(InvalidInputError, match="max_snapshots"):
        gkd.enable_oom_snapshots(tmp_path, max_snapshots=0)
    with pytest.raises(InvalidInputError, match="directory"):
        gkd.enable_oom_snapshots(None)
    with pytest.raises(InvalidInputError, match="no directory"):
        gkd.write_oom_snapshot()
    assert not gkd.oom_snapshots_enabled()


def test_rank_from_the_launcher_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = gkd.rank_info()
    assert (info.rank, info.world_size, info.local_rank, info.source) == (3, 8, 1, "environment")
    monkeypatch.setenv("RANK", "9")  # not below WORLD_SIZE: no rank
    assert gkd.rank_info() is None
