"""Trajectory leak verdicts that say where memory grows and why: torch's CPU autograd
loops that MD users write (a result kept without ``.detach()``, a cache of tensors), a
clean loop in fresh processes (never a leak, never a cause), the planted causes at a
tenth of their size, and memory that grows outside every framework."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpukeeper.md.leak import MiB, outside_frameworks
from gpukeeper.timing.memory_readers import MemorySeries
from gpukeeper.timing.sampling import StepSampler

torch = pytest.importorskip("torch")

import gpukeeper  # noqa: E402

LOOPS = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    SIZE = {size}
    w = torch.randn(SIZE, requires_grad=True)
    x = torch.randn(SIZE)
    kept = []

    def clean(_):
        e = torch.tanh(w * x).sum()
        e.backward()
        w.grad = None
        return e.detach()

    def graph(_):
        e = torch.tanh(w * x).sum()  # tanh's output is saved for backward, every step
        kept.append(e)  # without .detach(): the graph survives
        return e

    def cache(_):
        kept.append(torch.randn(SIZE // 4))
        return None
""")


def _loops(size: int) -> dict:
    space: dict = {}
    exec(LOOPS.format(size=size), space)
    return space


def _run(fn, steps: int = 300):
    return gpukeeper.benchmark_md_trajectory(fn, [0], n_steps=steps, device="cpu", progress=False)


@pytest.mark.parametrize("size", [65536, 6554])  # as planted, and at a tenth of the size
def test_a_graph_kept_alive_is_named_as_the_cause(size: int) -> None:
    loops = _loops(size)
    r = _run(loops["graph"])
    assert r.memory_leak is True and r.memory_leak_where is not None
    assert r.memory_leak_cause.startswith("an autograd graph survives each step")
    assert "300 results made during the run still carry a grad_fn" in r.memory_leak_cause
    assert ".detach()" in r.memory_leak_cause and "cause: an autograd graph" in r.summary()


@pytest.mark.parametrize("size", [65536, 6554])
def test_tensors_kept_alive_are_named_by_shape(size: int) -> None:
    loops = _loops(size)
    r = _run(loops["cache"])
    assert r.memory_leak is True
    assert f"300 tensors of shape ({size // 4},) (float32) made during the run are still alive" \
        in r.memory_leak_cause
    assert "about 1 per step" in r.memory_leak_cause


def test_clean_loops_in_fresh_processes_never_leak_nor_get_a_cause() -> None:
    code = LOOPS.format(size=65536) + textwrap.dedent("""
        import gpukeeper
        r = gpukeeper.benchmark_md_trajectory(clean, [0], n_steps=300, device="cpu", progress=False)
        print(r.memory_leak, repr(r.memory_leak_where), repr(r.memory_leak_cause))
    """)
    seen = []
    for _ in range(20):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        seen.append(done.stdout.strip().splitlines()[-1])
    assert all(line.split()[0] in ("False", "None") for line in seen), seen
    assert all(line.endswith("None ''") for line in seen), seen


def test_memory_outside_every_framework_is_a_leak_and_the_cache_is_not() -> None:
    n, tol = 300, 1.0
    # NVML's figure grew 300 MiB while the frameworks' reserved bytes stayed: outside.
    verdict, cache = outside_frameworks((100 << 20, 64 << 20), (400 << 20, 64 << 20), n, tol)
    assert verdict is not None and verdict.leak and cache == 0
    assert verdict.growth == pytest.approx(300 * MiB)
    assert "outside every framework" in verdict.reason and "an engine or an extension" in verdict.reason
    # The frameworks' cache grew by as much: explained, not outside.
    verdict, cache = outside_frameworks((100 << 20, 64 << 20), (400 << 20, 364 << 20), n, tol)
    assert verdict is None and cache == pytest.approx(300 * MiB)
    assert outside_frameworks(None, (1, 1), n, tol) == (None, 0.0)


def test_readings_during_the_run_tell_a_one_off_allocation_from_a_leak() -> None:
    n, tol, base = 400, 1.0, 64 << 20
    steps = [50 * k for k in range(1, 8)]
    # A library that sets itself up once, 40 MiB at step 120, and then nothing more.
    once = [(float(x), base + (40 << 20 if x >= 120 else 0)) for x in steps]
    verdict, _ = outside_frameworks((base, 0), (base + (40 << 20), 0), n, tol, once)
    assert verdict is None
    # The same 40 MiB from the end points alone is called a leak: the readings matter.
    assert outside_frameworks((base, 0), (base + (40 << 20), 0), n, tol)[0] is not None
    # A tenth of a MiB a step, read at every 50th step: a leak, slope and all.
    steady = [(float(x), base + x * (100 << 10)) for x in steps]
    verdict, _ = outside_frameworks((base, 0), (base + n * (100 << 10), 0), n, tol, steady)
    assert verdict is not None and verdict.leak and verdict.samples == 9
    assert verdict.slope == pytest.approx(100 << 10, rel=1e-6)
    assert "9 readings" in verdict.reason


def test_the_sampler_takes_the_dear_reading_at_its_own_period() -> None:
    level = [0]
    series = [MemorySeries("counter", lambda: level[0], True)]
    side_calls: list = []

    def side() -> int:
        side_calls.append(level[0])
        return level[0] * 2

    sampler = StepSampler(series, 10, 200, side, 4)
    sampler.start()
    for i in range(200):
        level[0] = i
        if i % 10 == 9:
            sampler.sample(i)
    sampler.finish()
    assert sampler.side_count == len(side_calls) == 5  # samples 4, 8, 12, 16, 20
    assert list(sampler.side_steps[:5]) == [39, 79, 119, 159, 199]
    assert list(sampler.side_values[:5]) == [78, 158, 238, 318, 398]


class _Allocator:
    """In use: 10 MiB, and a 64 MiB scratch for one step in every 50 (a neighbour-list
    rebuild); a peak counter that can be reset, as PyTorch's."""

    def __init__(self) -> None:
        self.level = 10 << 20
        self.top = self.level

    def step(self, i: int) -> None:
        if i % 50 == 0:
            self.top = max(self.top, self.level + (64 << 20))  # allocated, used, freed

    def reset(self) -> bool:
        self.top = self.level
        return True


def test_the_true_peak_is_read_per_interval_and_its_recurrence_is_said() -> None:
    from gpukeeper.md.leak import memory_outcome
    from gpukeeper.timing.memory_readers import MemorySeries
    from gpukeeper.timing.sampling import StepSampler

    alloc = _Allocator()
    series = MemorySeries("torch", lambda: alloc.level, True, peak=lambda: alloc.top,
                          reset_peak=alloc.reset)
    n, every = 400, 24
    sampler = StepSampler([series], every, n)
    sampler.start()
    for i in range(n):
        alloc.step(i)
        if (i + 1) % every == 0:
            sampler.sample(i)
    final = sampler.finish()
    warnings: list = []
    out = memory_outcome(sampler, final, n, 1.0, warnings)
    # The samples alone sit at 10 MiB; the counter saw the 74 MiB spikes between them.
    assert max(out.bytes) == 10 << 20 and out.peak == 74 << 20
    assert out.peak_text.startswith("peak 74.00 MiB: spikes of up to 64.00 MiB above the steps' own")
    assert "in 8 of 17 sampling intervals" in out.peak_text and "about every 48 steps" in out.peak_text
    assert out.leak is False


def test_a_flat_run_says_its_peak_is_level() -> None:
    from gpukeeper.md.leak import peak_pattern

    text = peak_pattern([24, 48, 72], [5 << 20] * 3, [9 << 20] * 3, 1.0)
    assert text.startswith("peak 9.00 MiB, about 4.00 MiB above the memory in use in every")
    assert text.endswith("no spike")
    assert peak_pattern([], [], [], 1.0) == ""
    # A leak's rising level, with the same working memory each interval: no spike.
    rising = [(5 + k) << 20 for k in range(6)]
    text = peak_pattern([24 * (k + 1) for k in range(6)], rising, [r + (3 << 20) for r in rising], 1.0)
    assert text.endswith("no spike")


def test_with_tracking_the_cause_names_the_line_that_made_the_survivors() -> None:
    # 64 Ki floats: a graph keeps about 0.75 MiB a step, well above the host RSS's noise
    # on a busy machine
    w = torch.randn(65536, requires_grad=True)
    x = torch.randn(65536)
    kept = []

    def graph(_):
        e = torch.tanh(w * x).sum()  # the line the cause must name
        kept.append(e)
        return e

    r = gpukeeper.benchmark_md_trajectory(
        graph, [0], n_steps=200, device="cpu", progress=False, track_allocations=True
    )
    assert r.memory_leak is True
    line = graph.__code__.co_firstlineno + 1
    assert f"made at {__file__}:{line} in graph" in r.memory_leak_cause, r.memory_leak_cause
    assert any("track_allocations" in w for w in r.warnings)
    with pytest.raises(gpukeeper.InvalidInputError):
        gpukeeper.benchmark_md_trajectory(graph, [0], n_steps=5, track_allocations="yes")
