"""The timing truth benchmark (benchmarks/python/timing_truth_bench.py) on the CPU: a quick
run with no GPU visible exits 0, says the GPU cases were skipped, and writes valid JSON
with its CPU row measured against the loop truth (each method run paired with the truth
slots around it) and the targets' verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The CPU case is torch.mm, timed by torch.utils.benchmark among others.
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "python" / "timing_truth_bench.py"

GPU_CASES = {"spin_10us", "spin_100us", "spin_1ms", "matmul_region", "launch_bound", "cuda_graph",
             "eager_vs_graph", "torch_compile", "cupy", "jax", "md_schnet", "md_openmm"}


def test_a_quick_run_without_a_gpu_skips_the_gpu_cases_and_writes_json(tmp_path):
    out = tmp_path / "timing_truth.json"
    # No device visible even on a GPU machine: this is the CPU path, and a quick one
    # (the GPU run is the benchmark's own job on the device).
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", GPUKEEPER_PROGRESS="0")
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=str(ROOT))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "no CUDA: GPU cases skipped" in proc.stdout

    report = json.loads(out.read_text())
    assert report["schema"] == "gpukeeper-timing-truth/1"
    assert report["cuda"] is False and report["gpu_cases_skipped"] is True
    assert {s["case"] for s in report["skipped"]} == GPU_CASES
    assert all(s["reason"].startswith("no CUDA") for s in report["skipped"])
    assert {"date", "python", "gpukeeper"} <= set(report["env"])

    rows = {r["case"]: r for r in report["rows"]}
    assert set(rows) == GPU_CASES | {"cpu"}
    cpu = rows["cpu"]
    assert cpu["status"] == "ok", cpu
    assert cpu["truth"]["loop_ms"] > 0 and cpu["truth"]["calls_per_rep"] >= 50
    assert cpu["truth"]["span_ms"] is None  # no events on the CPU
    methods = {m["method"]: m for m in cpu["methods"]}
    head = methods["gpukeeper headline"]
    assert head["error"] is None and head["value_ms"] > 0 and head["vs_loop_pct"] is not None
    assert methods["triton do_bench"]["value_ms"] is None  # n/a on the CPU
    assert methods["triton do_bench"]["runs"] == 0 and methods["triton do_bench"]["paired"] is None

    # --quick: 2 alternations of gpukeeper and torch.utils.benchmark (do_bench is n/a),
    # each run between two truth slots: 4 runs, 5 slots of one repetition.
    assert report["config"]["pairs"] == 2 and cpu["pairs"] == 2
    assert cpu["truth"]["slots"] == 5 and cpu["truth"]["reps"] == 5
    assert len(cpu["truth"]["slot_loop_ms"]) == 5
    for name in ("gpukeeper headline", "torch.utils.benchmark"):
        m = methods[name]
        assert m["runs"] == 2 and len(m["values_ms"]) == 2
        p = m["paired"]
        assert len(p["vs_loop_runs_pct"]) == 2 and p["pairs"] == 2
        assert p["vs_loop_pct"] is not None and p["vs_loop_spread_pct"] >= 0
    assert cpu["gpukeeper"]["runs"] == 2 and len(cpu["gpukeeper"]["per_run"]) == 2
    assert cpu["throttle"]["throttled"] is None  # CPU work: NVML not read

    # Only the CPU row is measured; its verdict is a measurement, never the exit status.
    assert [t["case"] for t in report["targets"]] == ["cpu"]
    target = report["targets"][0]
    assert target["verdict"] in ("met", "missed")
    assert target["limit"] in (1.0, 2.0)
    # Judged on the paired median; the unpaired error is kept beside it.
    assert target["error"] == head["paired"]["vs_loop_pct"]
    assert target["unpaired_error"] == head["vs_loop_pct"]


def test_an_unknown_case_is_a_usage_error():
    proc = subprocess.run([sys.executable, str(BENCH), "--cases", "no_such_case"],
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 2
    assert "unknown case" in proc.stderr


def _load_bench():
    import importlib.util

    sys.path.insert(0, str(BENCH.parent))  # its helpers (bench_env, timing_accuracy_bench)
    spec = importlib.util.spec_from_file_location("gpukeeper_timing_truth_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class _FakeResult:
    """What benchmark_function returns, with the loop fields, for a device-bound call."""

    def __init__(self, ms):
        self.median_ms = ms
        self.loop_median_ms = ms
        self.device_median_ms = ms * 0.99
        self.bound = "device"
        self.device_busy = 0.99
        self.loop_calls = 100
        self.n_calls = 10
        self.warnings = ["throttled: before: sw power cap; after: sw power cap, hw slowdown"]
        self.throttled = True
        self.clocks = {"nvml": "ok", "before": {"sm_clock_mhz": 1980, "reasons": 4},
                       "after": {"sm_clock_mhz": 1755, "reasons": 12}}
        self.speedup = None


class _FakeGpukeeper:
    def __init__(self, ms):
        self.ms = ms
        self.calls = []

    def benchmark_function(self, fn, *args, **kwargs):
        self.calls.append(kwargs)
        fn()
        return _FakeResult(self.ms)


class _FakeSpan:
    def start(self):
        pass

    def stop(self):
        pass

    def elapsed_ms(self):
        return 0.5  # over 50+ calls: a span truth far below the loop truth


class _FakeKernels:
    """A Truth ring whose kernels all lasted 10 us."""

    def reset(self):
        pass

    def durations_us(self):
        return [10.0, 10.0, 10.0]


def test_gpu_shaped_rows_get_errors_targets_and_tables(capsys):
    # The GPU paths of one timing case, run on the CPU with stand-ins for the device's
    # parts (gpukeeper's result, triton, the event pair, the kernels' clock), then the
    # tables and targets over rows of every kind.
    bench = _load_bench()
    ctx = bench.Context(bench.Settings.make(True, None))
    ctx.gk = _FakeGpukeeper(0.010)
    ctx.has_measure = True
    ctx._triton_tried = True
    ctx._triton = type("T", (), {"do_bench": staticmethod(lambda fn, return_mode: (fn(), 0.0101)[1])})
    w = bench.Workload("spin_10us", lambda: sum(range(50)), "torch", "stand-in kernel",
                       lambda _last=None: None, _FakeSpan, kernel_truth=_FakeKernels())
    row = bench.run_timing_case(ctx, w)
    assert ctx.gk.calls[0]["measure"] == "loop"
    assert row["status"] == "ok" and row["truth"]["calls_per_rep"] >= 50
    assert row["truth"]["globaltimer_ms"] == 0.010
    methods = {m["method"]: m for m in row["methods"]}
    assert abs(methods["gpukeeper device"]["vs_kernel_us"] - (-0.1)) < 1e-9
    assert methods["triton do_bench"]["value_ms"] == 0.0101
    assert methods["torch.utils.benchmark"]["value_ms"] > 0
    # Three methods, two alternations in ABBA order: 6 runs, 7 truth slots, each run
    # against the slots right before and after it.
    assert len(ctx.gk.calls) == 2 and row["truth"]["slots"] == 7
    for m in (methods["gpukeeper headline"], methods["triton do_bench"], methods["torch.utils.benchmark"]):
        assert m["runs"] == 2 and len(m["paired"]["truth_loop_ms"]) == 2
    slots = row["truth"]["slot_loop_ms"]
    gk_pairs = methods["gpukeeper headline"]["paired"]
    # gpukeeper ran first in the first alternation and last in the second (ABBA).
    assert gk_pairs["truth_loop_ms"] == [(slots[0] + slots[1]) / 2, (slots[5] + slots[6]) / 2]
    assert gk_pairs["vs_span_pct"] is not None  # the stand-in span is there
    # NVML's throttling, read from gpukeeper's result, goes into the row and its notes.
    assert row["throttle"]["throttled"] is True and row["throttle"]["throttled_in"] == 2
    assert row["throttle"]["reasons"] == ["sw power cap", "hw slowdown"]
    assert row["throttle"]["sm_clock_mhz"] == [1755, 1980]

    compare = {"case": "eager_vs_graph", "kind": "compare", "status": "ok", "error": None, "notes": [],
               "truth": {"eager": {"loop_ms": 0.1}, "cuda graph": {"loop_ms": 0.04}},
               "methods": [{"method": "gpukeeper headline (eager)", "vs_loop_pct": 0.5}],
               "speedup": {"gpukeeper": 2.4, "loop_truth": 2.5, "error_pct": -4.0,
                           "paired_errors_pct": [-6.0, -1.0, 0.5], "paired_error_pct": -1.0,
                           "paired_spread_pct": 6.5}}
    md = {"case": "md_openmm", "kind": "md", "status": "ok", "error": None, "notes": []}
    bench._md_summary(md, {"wall": [10.0, 10.0, 10.0, 10.0], "gpukeeper": [9.9, 9.7, 10.0, 9.9],
                           "openmm": [10.0, 10.0, 10.0, 10.0]}, ["wall", "openmm"])
    assert abs(md["ratios"]["wall"]["median"] - 0.99) < 1e-12
    assert abs(md["ratios"]["wall"]["iqr"] - 0.0075) < 1e-9  # quartiles 0.9850, 0.9925
    broken = {"case": "torch_compile", "kind": "timing", "status": "error", "error": "RuntimeError: x"}
    missing = {"case": "cupy", "kind": "timing", "status": "skipped", "error": None, "reason": "CuPy not importable"}
    report = {"rows": [row, compare, md, broken, missing]}
    targets = bench.collect_targets(report["rows"])
    by = {(t["case"], t["target"]): t for t in targets}
    assert by[("spin_10us", "device time vs %globaltimer")]["verdict"] == "met"  # -0.1 us: at the limit
    head = by[("spin_10us", "headline vs loop truth (device-bound)")]
    assert head["limit"] == 1.0 and head["verdict"] in ("met", "missed")
    speedup = by[("eager_vs_graph", "speedup vs loop truths' speedup")]
    assert speedup["verdict"] == "met" and speedup["error"] == -1.0  # the paired median, not -4.0
    assert by[("md_openmm", "ns/day vs wall (plain loop)")]["verdict"] == "met"  # median ratio 0.99
    assert by[("torch_compile", "headline vs loop truth")]["verdict"] == "not measured"
    assert not any(t["case"] == "cupy" for t in targets)
    bench.print_tables(report)
    bench.print_targets(targets)
    out = capsys.readouterr().out
    assert "eager vs CUDA graph" in out and "md_openmm" in out and "CuPy not importable" in out
    assert "THROTTLED" in out and "sw power cap" in out


def test_md_rounds_alternate_in_abba_order():
    bench = _load_bench()
    order = []
    got = bench._paired({"wall": lambda: order.append("W") or 1.0, "gpukeeper": lambda: order.append("G") or 1.0,
                         "openmm": lambda: order.append("O") or 1.0}, 4, lambda: order.append("|"))
    assert "".join(order) == "WGO|OGW|WGO|OGW|"
    assert all(len(v) == 4 for v in got.values())
    assert bench._abba(["a", "b", "c"], 3) == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
