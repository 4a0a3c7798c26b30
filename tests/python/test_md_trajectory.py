"""benchmark_md_trajectory: statistics against numpy, memory verdicts, throughput."""

from __future__ import annotations

import json
import math
import mmap

import numpy as np
import pytest

import gpukeeper
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base import host_memory as host
from gpukeeper.md import benchmark_md_trajectory, latency_stats, leak_verdict

CUDA = gpukeeper.cuda_available()
gpu = pytest.mark.skipif(not CUDA, reason=f"no usable CUDA device: {CUDA.reason}")


def _fresh_pages(nbytes: int) -> mmap.mmap:
    """Memory that really adds to the RSS: new anonymous pages, all touched (a numpy
    array might reuse heap memory freed by an earlier test and add nothing)."""
    m = mmap.mmap(-1, nbytes)
    m.write(b"\x01" * nbytes)
    return m


def _work(x: np.ndarray) -> float:
    return float((x @ x).sum())


FRAMES = [np.random.default_rng(i).standard_normal((32, 32)) for i in range(8)]


def test_statistics_match_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.gamma(4.0, 0.25, size=2001)
    x[[100, 900]] = 50.0
    s = latency_stats(list(x))
    assert s.mean_ms == pytest.approx(np.mean(x))
    assert s.median_ms == pytest.approx(np.median(x))
    assert s.std_ms == pytest.approx(np.std(x, ddof=1))  # sample std, as gpukeeper.timing.stats
    for q, v in ((5, s.p5_ms), (95, s.p95_ms), (99, s.p99_ms)):
        assert v == pytest.approx(np.percentile(x, q))
    assert (s.min_ms, s.max_ms) == (np.min(x), np.max(x))
    assert s.jitter_ms == pytest.approx(np.std(np.diff(x), ddof=1))
    d = len(x) // 10
    assert s.drift_ms == pytest.approx(np.median(x[-d:]) - np.median(x[:d]))
    mad = np.median(np.abs(x - np.median(x)))
    assert s.mad_ms == pytest.approx(mad)
    thr = np.median(x) + 5 * max(1.4826 * mad, 0.01 * np.median(x))
    assert list(s.outlier_steps) == list(np.nonzero(x > thr)[0])
    assert 100 in s.outlier_steps and 900 in s.outlier_steps


def test_drift_detected() -> None:
    x = list(np.linspace(1.0, 2.0, 1000))
    s = latency_stats(x)
    assert s.drift_pct == pytest.approx(100 * (np.median(x[-100:]) - np.median(x[:100])) / np.median(x[:100]))
    assert s.drift_pct > 80


def test_clean_cpu_trajectory() -> None:
    calls = []

    def model(x: np.ndarray) -> float:
        calls.append(1)
        return _work(x)

    r = benchmark_md_trajectory(model, FRAMES * 50, warmup_steps=7, device="cpu",
                                timestep_fs=1.0, n_atoms=32, name="clean")
    assert len(calls) == 400 + 7
    assert r.n_steps == 400 and len(r.host_times_ms) == 400 and r.gpu_times_ms is None
    assert r.timing_source == "host" and r.device == "cpu" and r.name == "clean"
    assert r.mean_ms == pytest.approx(np.mean(r.host_times_ms))
    assert r.p99_ms == pytest.approx(np.percentile(r.host_times_ms, 99))
    assert r.memory_leak is False and r.memory_source == "process_rss"
    assert abs(r.memory_delta_gb * 1024) < 1.0
    assert r.memory_steps[0] == 0 and r.memory_steps[-1] == 400
    assert r.peak_memory_gb >= r.final_memory_gb > 0
    assert "clean on cpu" in r.summary()
    d = json.loads(r.to_json())
    assert d["n_steps"] == 400 and len(d["host_times_ms"]) == 400 and d["memory_leak"] is False


def test_leaky_cpu_trajectory_is_flagged() -> None:
    kept = []

    def model(x: np.ndarray) -> float:
        kept.append(_fresh_pages(128 << 10))  # 128 KiB per step kept alive
        return _work(x)

    r = benchmark_md_trajectory(model, FRAMES * 50, device="cpu", memory_sample_every=1)
    assert r.memory_leak is True
    assert r.memory_slope_bytes_per_step == pytest.approx(131072, rel=0.2)
    assert r.memory_delta_gb * 1024 > 40
    assert any("leak" in w for w in r.warnings)


def test_growth_that_stops_is_not_a_leak() -> None:
    cache = []

    def model(x: np.ndarray) -> float:
        if len(cache) < 40:  # a cache filling over the first steps, then stable
            cache.append(_fresh_pages(128 << 10))
        return _work(x)

    r = benchmark_md_trajectory(model, FRAMES * 50, warmup_steps=0, device="cpu",
                                memory_sample_every=1)
    assert r.memory_delta_gb * 1024 > 3  # growth is seen ...
    assert r.memory_leak is False  # ... but it is not a leak


# --------------------------------------------------------------------- leak verdicts under noise

MB = 1 << 20
glibc = pytest.mark.skipif(host.malloc_in_use_reader() is None, reason="no glibc mallinfo2 here")


def _noisy_model(seed: int, leak_bytes: int = 0, keep: list = None):
    """A CPU model that makes and drops numpy arrays of 1-4 MB each step (the C allocator
    keeps and reuses their pages: RSS moves by megabytes), optionally keeping
    ``leak_bytes`` per step alive."""
    rng = np.random.default_rng(seed)
    kept = [] if keep is None else keep

    def model(x: float) -> float:
        a = np.ones(int(rng.integers(1, 5)) * MB // 8)
        b = a * 2.0 + x
        if leak_bytes:
            kept.append(np.ones(leak_bytes // 8))
        return float(b.sum())

    return model


@glibc
def test_clean_noisy_cpu_loop_is_never_a_leak() -> None:
    for seed in range(5):
        r = benchmark_md_trajectory(_noisy_model(seed), [1.0] * 100, device="cpu", warmup_steps=5)
        assert r.memory_leak is False, r.memory_leak_reason
        assert r.memory_leak_source == "malloc_in_use"
        assert r.memory_source == "process_rss" and "malloc_in_use" in r.memory_series
        assert "process_rss" in r.memory_leak_reason  # RSS stays as the cross-check


@glibc
def test_planted_leak_of_ten_times_the_tolerance_is_found_under_noise() -> None:
    for seed in range(3):
        kept: list = []
        # 100 kB a step over 100 steps: 10 MB, 10x the 1 MB tolerance.
        r = benchmark_md_trajectory(_noisy_model(seed, 100_000, kept), [1.0] * 100, device="cpu",
                                    warmup_steps=5)
        assert r.memory_leak is True, r.memory_leak_reason
        assert r.memory_leak_source == "malloc_in_use"
        growth = r.memory_series["malloc_in_use"][-1] - r.memory_series["malloc_in_use"][0]
        assert growth == pytest.approx(100 * 100_000, rel=0.1)


@glibc
def test_series_noisier_than_the_tolerance_is_inconclusive() -> None:
    rng = np.random.default_rng(7)

    def model(x: float) -> np.ndarray:
        # The result is kept until the next step: 1-20 MB alive at every sample.
        return np.ones(int(rng.integers(1, 21)) * MB // 8)

    r = benchmark_md_trajectory(model, [1.0] * 120, device="cpu", warmup_steps=2,
                                memory_sample_every=1)
    assert r.memory_leak is None
    assert r.memory_leak_reason.startswith("inconclusive: malloc_in_use noise")
    assert "> tolerance 1 MiB" in r.memory_leak_reason
    assert r.memory_noise_bytes > MB
    assert any("inconclusive" in w for w in r.warnings)
    assert "inconclusive" in r.summary()


def test_leak_verdict_steady_leak_jump_and_flat() -> None:
    xs = list(range(0, 101, 5))
    steady = leak_verdict(xs, [1000 + 50_000 * x for x in xs], 100, 1.0, "s")
    assert steady.leak is True and steady.noise < 1.0 and steady.steady == 1.0
    jump = leak_verdict(xs, [0 if x < 80 else 6 * MB for x in xs], 100, 1.0, "rss")
    assert jump.leak is None and jump.reason.startswith("inconclusive: rss noise 6.00 MiB > tolerance 1 MiB")
    flat = leak_verdict(xs, [5 * MB] * len(xs), 100, 1.0)
    assert flat.leak is False and flat.growth == 0.0
    # A leak far above the noise is a leak even when the noise exceeds the tolerance.
    noisy = [50 * MB * x // 100 + (2 * MB if i % 2 else 0) for i, x in enumerate(xs)]
    big = leak_verdict(xs, noisy, 100, 1.0)
    assert big.noise > MB and big.leak is True and "above its noise" in big.reason
    with pytest.raises(InvalidInputError):
        leak_verdict([1], [1], 10, 1.0)
    with pytest.raises(InvalidInputError):
        leak_verdict([1, 2], [1, 2], 0, 1.0)


def test_ns_per_day_arithmetic() -> None:
    r = benchmark_md_trajectory(_work, FRAMES, n_steps=200, device="cpu",
                                timestep_fs=2.0, n_atoms=100, check_memory_leak=False)
    assert r.steps_per_s == pytest.approx(200 / r.total_time_s)
    # 2 fs per step: steps/s * 2e-6 ns * 86400 s/day
    assert r.ns_per_day == pytest.approx(r.steps_per_s * 2.0e-6 * 86400)
    assert r.us_per_atom_step == pytest.approx(1e6 / r.steps_per_s / 100)
    assert r.memory_leak is None and r.memory_delta_gb == 0.0


def test_cycling_and_sync_every_and_generators() -> None:
    seen = []
    r = benchmark_md_trajectory(lambda x: seen.append(x), iter(range(3)), n_steps=10,
                                warmup_steps=2, device="cpu", sync_every=1,
                                check_memory_leak=False)
    assert seen == [0, 1] + [i % 3 for i in range(10)]
    assert r.sync_every == 1 and r.n_steps == 10


def test_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    benchmark_md_trajectory(_work, FRAMES, n_steps=300, device="cpu", progress=True,
                            check_memory_leak=False)
    err = capsys.readouterr().err
    assert "300/300" in err and "100%" in err and "trajectory" in err


@pytest.mark.parametrize(
    "kwargs",
    [dict(model_func=1, inputs=[1]), dict(inputs=[]), dict(inputs="abc"),
     dict(warmup_steps=-1), dict(timestep_fs=0.0), dict(n_atoms=0), dict(sync_every=0),
     dict(memory_sample_every=0), dict(timing="fast"), dict(n_steps=0)],
)
def test_bad_input(kwargs: dict) -> None:
    args = dict(model_func=_work, inputs=FRAMES, device="cpu")
    args.update(kwargs)
    with pytest.raises(InvalidInputError):
        benchmark_md_trajectory(**args)


def test_timing_gpu_without_cuda_is_error() -> None:
    if CUDA:
        pytest.skip("CUDA present")
    with pytest.raises(InvalidInputError):
        benchmark_md_trajectory(_work, FRAMES, device="cpu", timing="gpu")


def test_model_exception_propagates() -> None:
    def boom(x: object) -> None:
        raise KeyError("model failed")

    with pytest.raises(KeyError):
        benchmark_md_trajectory(boom, FRAMES, device="cpu")


def test_plot(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    r = benchmark_md_trajectory(_work, FRAMES, n_steps=100, device="cpu")
    out = tmp_path / "traj.png"
    fig = r.plot(out)
    assert out.stat().st_size > 1000 and len(fig.axes) == 3
    # The timeline's legend sits beside its axes, so that it hides no outlier marker.
    timeline = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    legend = timeline.get_legend().get_window_extent(renderer)
    assert legend.x0 >= timeline.get_window_extent(renderer).x1


def test_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def fake(name: str, *a: object, **k: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real(name, *a, **k)

    r = benchmark_md_trajectory(_work, FRAMES, n_steps=20, device="cpu", check_memory_leak=False)
    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        r.plot()


def test_mlff_utilities_example() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(16, 3)
    trajectory = [torch.randn(8, 16) for _ in range(50)]
    with torch.no_grad():
        result = benchmark_md_trajectory(model_func=lambda atoms: model(atoms),
                                         inputs=trajectory, check_memory_leak=True)
    assert result.mean_ms > 0
    assert math.isfinite(result.memory_delta_gb * 1024)


# --------------------------------------------------------------------- GPU


@gpu
def test_gpu_leak_of_1mb_per_100_steps_is_flagged() -> None:
    torch = pytest.importorskip("torch")
    # Large enough that the stream is busy when the marks are probed (a 256^2 matmul is
    # launch-bound, and then the events rightly give way to the host clock).
    w = torch.randn(1024, 1024, device="cuda")
    kept = []

    def model(i: int) -> torch.Tensor:
        if i % 100 == 99:
            kept.append(torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
        return w @ w

    r = benchmark_md_trajectory(model, list(range(2000)), device="cuda:0", memory_sample_every=10)
    assert r.timing_source == "gpu" and len(r.gpu_times_ms) == 2000
    assert r.memory_leak is True
    assert r.memory_slope_bytes_per_step == pytest.approx((1 << 20) / 100, rel=0.25)


@gpu
def test_gpu_clean_model_with_allocator_warmup_growth_is_not_flagged() -> None:
    torch = pytest.importorskip("torch")
    w = torch.randn(256, 256, device="cuda")
    state = {"n": 0}

    def model(i: int) -> torch.Tensor:
        state["n"] += 1
        # Growing temporaries over the first steps: the caching allocator reserves more
        # segments, then reuses them; nothing stays allocated.
        size = min(state["n"], 50) * 4096
        tmp = torch.empty(size, device="cuda")
        return (w @ w).sum() + tmp[:1].sum()

    r = benchmark_md_trajectory(model, list(range(2000)), warmup_steps=0, device="cuda:0")
    assert r.memory_leak is False
    assert abs(r.memory_slope_bytes_per_step) * 2000 < (1 << 20)


@gpu
@pytest.mark.quiet_machine
def test_gpu_step_times_are_the_kernels_and_host_work_between_steps_is_not_counted() -> None:
    torch = pytest.importorskip("torch")
    from gpukeeper import _core

    if not _core.calibration_kernels_available():
        pytest.skip("built without the calibration kernels")
    torch.zeros(1, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def model(i: int) -> int:
        _core.spin_kernel(100_000, stream)  # GPU-bound: 100 us of device work per step
        return i

    # A memory sample every 10 steps (PyTorch's counters: tens of us of host time) and a
    # ring of 64 marks (resolved with a wait 15 times): neither may show up as step time.
    r = benchmark_md_trajectory(model, list(range(1000)), device="cuda:0",
                                memory_sample_every=10, event_ring=64)
    assert r.timing_source == "gpu" and len(r.gpu_times_ms) == 1000
    assert 100.0 <= r.gpu.median_ms * 1e3 <= 106.0
    assert r.gpu.max_ms * 1e3 < 150.0, f"slowest step {r.gpu.max_ms * 1e3:.1f} us"
    assert len(r.gpu.outlier_steps) <= 5


def test_a_bar_of_slow_steps_is_redrawn_every_quarter_second() -> None:
    from gpukeeper.md.trajectory import _progress_bar

    fast = _progress_bar(True, 100_000, None, 1e-6)
    slow = _progress_bar(True, 100_000, None, 0.05)  # 50 ms steps: 1% would be 50 s
    marks = _progress_bar(True, 100_000, 4, 0.05)
    try:
        assert fast is not None and fast.every == 1000  # 1% comes first
        assert slow is not None and slow.every == 5  # a quarter second of steps
        assert marks is not None and marks.every == 4  # on a step that ends a GPU interval
    finally:
        for bar in (fast, slow, marks):
            if bar is not None:
                bar.close()
