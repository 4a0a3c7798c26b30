"""Rich display and plots: ``_repr_html_`` of results, reports and comparisons, and the
matplotlib figures of ``plot()`` (CPU only; matplotlib optional).

Every object is a real one made the cheap way (a tiny callable on the CPU, a host-pool
buffer kept alive inside a ``GPUContext``); the HTML is checked for its key figures, for
escaping and for size, the figures for being real, non-blank PNG images.
"""

from __future__ import annotations

import dataclasses
import mmap
from html import escape as html_escape
import subprocess
import sys
from typing import Any, Callable, Iterator, List

import pytest

import gpukeeper
from gpukeeper import (
    BenchmarkResult,
    GPUContext,
    ImplementationComparison,
    InvalidInputError,
    MemoryPool,
    Precision,
    benchmark_function,
    benchmark_md_trajectory,
    compare_implementations,
    memory_report,
)
from gpukeeper.cleanup import CleanupReport, LeakedArray
from gpukeeper.base.byte_figures import fmt_bytes
from gpukeeper.base.html_table import html_fields, html_table
from gpukeeper.timing import format_comparison_table
from gpukeeper.timing.regression import Comparison, compare_runs, comparisons_html

EVIL = "<b>x</b>"
ESCAPED = "&lt;b&gt;x&lt;/b&gt;"
MAX_HTML = 20_000  # "compact": a notebook cell, not a page
MiB = 1 << 20


def _small(n: int = 200) -> int:
    return sum(range(n))


def _checked_html(obj: Any) -> str:
    html = obj._repr_html_()
    assert isinstance(html, str) and html.startswith("<div")
    assert len(html) < MAX_HTML, len(html)
    assert "<script" not in html.lower()
    return html


@pytest.fixture(scope="module")
def bench() -> BenchmarkResult:
    return benchmark_function(_small, n_calls=40, warmup=2, device="cpu", name=EVIL)


@pytest.fixture(scope="module")
def comparison() -> ImplementationComparison:
    return compare_implementations({EVIL: lambda: _small(100), "slow": lambda: _small(3000)},
                                   n_calls=25, warmup=1, device="cpu")


def _fresh_pages(nbytes: int) -> mmap.mmap:
    """Pages that really add to the resident set (a freed heap block might be reused)."""
    m = mmap.mmap(-1, nbytes)
    m.write(b"\x01" * nbytes)
    return m


@pytest.fixture(scope="module")
def leaky_trajectory() -> Iterator[Any]:
    kept: List[mmap.mmap] = []

    def step(frame: int) -> int:
        kept.append(_fresh_pages(256 << 10))  # 256 KiB kept alive per step: a leak
        return _small(50)

    r = benchmark_md_trajectory(step, list(range(10)), n_steps=80, warmup_steps=2, device="cpu",
                                memory_sample_every=1, name=EVIL)
    yield r
    for m in kept:
        m.close()


@pytest.fixture(scope="module")
def clean_trajectory() -> Any:
    calls = [0]

    def step(frame: int) -> int:
        calls[0] += 1
        # One step a thousand times slower than the others: an outlier to mark.
        return _small(200_000 if calls[0] == 40 else 200)

    r = benchmark_md_trajectory(step, list(range(10)), n_steps=60, warmup_steps=2, device="cpu",
                                timestep_fs=2.0, name="clean")
    assert len(r.outlier_steps) >= 1
    return r


@pytest.fixture
def leaked_cleanup() -> Iterator[CleanupReport]:
    pool = MemoryPool("host")
    with GPUContext(device="cpu", warn_on_leak=False, tolerance_bytes=0) as ctx:
        kept = pool.get_managed_buffer(0, MiB, Precision.Fp32)  # 4 MiB, held past the exit
    yield ctx.report
    kept.release()
    pool.emergency_cleanup_all()


# --------------------------------------------------------------------- htmltable


def test_html_table_escapes_every_cell_and_line() -> None:
    html = html_table(EVIL, ["<th>", "b"], [[EVIL, None], ["&", 1.5]],
                      notes=["<i>note</i>"], warnings=["<script>alert(1)</script>"])
    assert "<b>" not in html and "<i>" not in html and "<script>" not in html
    assert html.count(ESCAPED) == 2 and "&lt;th&gt;" in html and "&amp;" in html
    assert "&lt;i&gt;note&lt;/i&gt;" in html and "warning: &lt;script&gt;" in html
    assert "<td" in html and "<thead>" in html and ">1.5<" in html
    assert "<thead>" not in html_fields("t", [("a", 1)])


@pytest.mark.parametrize("call", [
    lambda: html_table("t", ["a", "b"], [["1"]]),
    lambda: html_table("t", None, [["1", "2"], ["3"]]),
    lambda: html_table("t", ["a"], 5),
    lambda: html_fields("t", [("a", 1, 2)]),
])
def test_html_table_bad_input(call: Callable[[], Any]) -> None:
    with pytest.raises(InvalidInputError):
        call()


# --------------------------------------------------------------------- rich display


def test_benchmark_result_html(bench: BenchmarkResult) -> None:
    html = _checked_html(bench)
    assert ESCAPED in html and EVIL not in html
    for figure in (bench.median_ms, bench.p5_ms, bench.p25_ms, bench.p75_ms, bench.p95_ms,
                   bench.p99_ms, bench.min_ms, bench.max_ms, bench.mean_ms, bench.std_ms):
        assert f"{figure:.4f}" in html
    assert f">{bench.n_calls}<" in html and "calls/s" in html and "cpu" in html


def test_benchmark_result_html_memory_speedup_and_warnings() -> None:
    r = BenchmarkResult(name="m", times_ms=[1.0, 2.0, 3.0], memory_source="host_rss",
                        memory_before_bytes=MiB, memory_after_bytes=3 * MiB,
                        memory_peak_bytes=5 * MiB, speedup=2.5, warnings=["noisy <run>"])
    html = _checked_html(r)
    assert "memory delta (host_rss)" in html and "2.0 MiB" in html and "5.0 MiB" in html
    assert "2.50x" in html and "warning: noisy &lt;run&gt;" in html


def test_comparison_is_a_dict_with_a_table_and_html(comparison: ImplementationComparison) -> None:
    assert isinstance(comparison, dict) and isinstance(comparison, ImplementationComparison)
    assert list(comparison) == [EVIL, "slow"]
    assert all(isinstance(r, BenchmarkResult) for r in comparison.values())
    assert comparison.table() == format_comparison_table(comparison)
    assert "ImplementationComparison" in gpukeeper.__all__
    html = _checked_html(comparison)
    assert ESCAPED in html and EVIL not in html and "1.00x (baseline)" in html
    slow = comparison["slow"]
    assert f"{slow.median_ms:.4f}" in html and f"{slow.speedup:.2f}x" in html


def test_comparison_html_marks_differences_within_the_noise() -> None:
    def result(name: str, times: List[float]) -> BenchmarkResult:
        return BenchmarkResult(name=name, times_ms=times, host_times_ms=times)

    c = ImplementationComparison(base=result("base", [1.0, 1.1, 1.2, 1.3, 1.4]),
                                 close=result("close", [1.05, 1.15, 1.25, 1.35, 1.45]),
                                 far=result("far", [0.1, 0.11, 0.12, 0.13, 0.14]))
    html = _checked_html(c)
    assert ">~0.96x<" in html and ">10.00x<" in html and "within the noise" in html


def test_trajectory_html_clean(clean_trajectory: Any) -> None:
    r = clean_trajectory
    html = _checked_html(r)
    assert f"{r.n_steps} (+{r.warmup_steps} warm-up)" in html
    for figure in (r.median_ms, r.mean_ms, r.p95_ms, r.p99_ms):
        assert f"{figure:.4f}" in html
    assert f"{r.ns_per_day:.3f}" in html and "ns/day" in html
    verdict = {True: "LEAK", False: "stable", None: "inconclusive"}[r.memory_leak]
    assert f">{verdict}" in html and r.memory_leak is not True
    assert f"{len(r.outlier_steps)} step(s)" in html


def test_trajectory_html_leak(leaky_trajectory: Any) -> None:
    r = leaky_trajectory
    assert r.memory_leak is True, r.memory_leak_reason
    html = _checked_html(r)
    assert ESCAPED in html and EVIL not in html
    assert ">LEAK" in html
    assert any("leak" in w for w in r.warnings) and "warning: memory grows" in html
    assert f"leak verdict: {html_escape(r.memory_leak_reason)}" in html
    assert fmt_bytes(r.memory_peak_bytes) in html and f"{r.memory_slope_bytes_per_step:+.1f} B/step" in html


def test_memory_report_html_holds_the_table() -> None:
    report = memory_report("cpu")
    html = _checked_html(report)
    assert "gpukeeper memory report: CPU mode" in html and "allocated" in html
    total = next(line for line in report.table().splitlines() if line.startswith("total"))
    assert " ".join(total.split()[1:]) in html  # the same figure, e.g. "15.5 GiB"
    for note in report.notes:
        assert html_escape(note) in html


def test_devices_report_html_holds_each_section_and_the_total() -> None:
    everything = memory_report()  # every device: the host's one report without CUDA
    html = _checked_html(everything)
    for device in everything:
        assert device._repr_html_() in html  # each device's own table, unchanged
    total_title = everything.table().split("\n\n")[-1].splitlines()[0]
    assert html_escape(total_title) in html
    assert html_escape(f"host {everything.hostname}") in html


def test_cleanup_report_html_held_memory(leaked_cleanup: CleanupReport) -> None:
    report = leaked_cleanup
    assert report.held == {"host": {"gpukeeper": 4 * MiB}}
    html = _checked_html(report)
    assert ">host<" in html and ">gpukeeper<" in html and ">held<" in html
    assert ">4.0 MiB<" in html and "warning: " in html and "still held after cleanup" in html


def test_cleanup_report_html_lists_leaks_escaped(leaked_cleanup: CleanupReport) -> None:
    leak = LeakedArray("torch", "cuda:0", "Tensor", (3, 4), "float32", 48, True, ("<f>.py:3 in make",))
    report = dataclasses.replace(leaked_cleanup, leaks=[leak], leaks_found=3, notes=["a <note>"])
    html = _checked_html(report)
    assert ">torch Tensor<" in html and ">(3, 4)<" in html and ">float32<" in html and ">48 B<" in html
    assert "&lt;f&gt;.py:3 in make" in html and "... and 2 more" in html
    assert "note: a &lt;note&gt;" in html


def test_cleanup_report_html_nothing_held() -> None:
    with GPUContext(device="cpu", warn_on_leak=False) as ctx:
        pass
    html = _checked_html(ctx.report)
    assert "nothing held above the baseline" in html and "warning:" not in html


def test_saved_run_comparison_html(bench: BenchmarkResult) -> None:
    slower = BenchmarkResult(name=EVIL, times_ms=[t * 3 for t in bench.times_ms])
    c = compare_runs(bench, slower)
    assert c.verdict == "slower"
    html = _checked_html(c)
    assert ESCAPED in html and ">slower<" in html and f"{c.change:+.1%}" in html
    steady = BenchmarkResult(name="steady", times_ms=[1.0 + 0.001 * (i % 5) for i in range(50)])
    both = comparisons_html([c, compare_runs([steady, steady], steady)])  # "same" needs a measured spread
    assert both.count("<tr>") == 3 and ">same<" in both
    with pytest.raises(InvalidInputError):
        comparisons_html([bench])  # type: ignore[list-item]
    assert isinstance(c, Comparison)


# --------------------------------------------------------------------- plots


def _assert_png_drawn(path: Any) -> None:
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    pixels = matplotlib.image.imread(str(path))
    assert pixels.var() > 0  # not a blank canvas


def _legend_texts(ax: Any) -> List[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend is not None else []


def test_benchmark_plot(bench: BenchmarkResult, tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    out = tmp_path / "bench.png"
    fig = bench.plot(out, bins=20)
    try:
        assert isinstance(fig, Figure)
        _assert_png_drawn(out)
        labels = " ".join(_legend_texts(fig.axes[0]))
        for name in ("mean", "median", "p5", "p95", "p99"):
            assert f"{name} " in labels
        assert f"{bench.p99_ms:.4f}" in labels and EVIL in fig.axes[0].get_title()
    finally:
        plt.close(fig)


def test_comparison_plot(comparison: ImplementationComparison, tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    out = tmp_path / "compare.png"
    fig = comparison.plot(out)
    try:
        assert isinstance(fig, Figure)
        _assert_png_drawn(out)
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_yticklabels()] == [EVIL, "slow"]
        texts = " ".join(t.get_text() for t in ax.texts)
        assert "baseline" in texts and f"{comparison['slow'].speedup:.2f}x" in texts
    finally:
        plt.close(fig)


def test_trajectory_plot_marks_the_leak_on_a_second_axis(leaky_trajectory: Any, tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    out = tmp_path / "trajectory.png"
    fig = leaky_trajectory.plot(out, bins=10)
    try:
        assert isinstance(fig, Figure)
        _assert_png_drawn(out)
        timeline, hist, memory = fig.axes  # the twin axis is added last
        assert memory.get_shared_x_axes().joined(timeline, memory)
        assert "memory" in memory.get_ylabel()
        assert any(t.get_text() == "LEAK" for t in memory.texts)
        assert any("(LEAK)" in label for label in _legend_texts(timeline))
        assert hist.get_ylabel() == "steps"
    finally:
        plt.close(fig)


def test_trajectory_plot_marks_outliers(clean_trajectory: Any) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    r = clean_trajectory
    fig = r.plot()
    try:
        labels = _legend_texts(fig.axes[0])
        assert f"outliers ({len(r.outlier_steps)})" in labels
        marks = [c for c in fig.axes[0].collections if c.get_label().startswith("outliers")]
        assert [int(x) for x, _ in marks[0].get_offsets()] == list(r.outlier_steps)
        assert not any("LEAK" in label for label in labels)
        assert not any(t.get_text() == "LEAK" for ax in fig.axes for t in ax.texts)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("bins", [0, -1, 2.5, True, "10"])
def test_plot_bins_must_be_a_positive_int(bench: BenchmarkResult, clean_trajectory: Any, bins: Any) -> None:
    with pytest.raises(InvalidInputError, match="bins must be an int >= 1"):
        bench.plot(bins=bins)
    with pytest.raises(InvalidInputError, match="bins must be an int >= 1"):
        clean_trajectory.plot(bins=bins)


@pytest.mark.parametrize("which", ["bench", "comparison", "clean_trajectory"])
def test_plot_without_matplotlib_names_the_fix(which: str, request: pytest.FixtureRequest,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    obj = request.getfixturevalue(which)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    with pytest.raises(ImportError, match="pip install matplotlib"):
        obj.plot()


def test_importing_gpukeeper_does_not_import_matplotlib() -> None:
    code = ("import sys, gpukeeper, gpukeeper.base.plotting, gpukeeper.base.html_table, "
            "gpukeeper.timing.benchmark_plot, gpukeeper.timing.comparison_plot, gpukeeper.md.trajectory_plot; "
            "assert 'matplotlib' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
