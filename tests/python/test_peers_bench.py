"""The peers benchmark (benchmarks/python/peers_bench.py): a quick run never fails over a
missing peer or a missing GPU, reports every row with its status, and its ratios carry
their targets' verdicts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "benchmarks" / "python" / "peers_bench.py"
sys.path.insert(0, str(PEERS.parent))  # its helpers (bench_env, bench_timeit)
_spec = importlib.util.spec_from_file_location("gpukeeper_peers_bench", PEERS)
peers = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = peers  # its dataclasses look their module up there
_spec.loader.exec_module(peers)

CASES = {"gpukeeper_release", "gpukeeper_with", "gpukeeper_release_stream", "cupy_alloc",
         "cupy_pool_malloc", "rmm_pool", "rmm_async"}


def test_a_quick_run_reports_every_row_and_fails_none(tmp_path):
    out = tmp_path / "peers.json"
    proc = subprocess.run([sys.executable, str(PEERS), "--quick", "--no-torch", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    report = json.loads(out.read_text())
    rows = report["results"]
    assert {r["case"] for r in rows} == CASES
    assert len(rows) == len(CASES) * len(peers.SIZES)
    assert {r["status"] for r in rows} <= {peers.OK, peers.NOT_INSTALLED, peers.NO_CUDA}
    for r in rows:
        if r["case"] == "gpukeeper_release_stream":  # needs a CUDA stream and device memory
            assert r["status"] == peers.OK or not peers.find_peers().cuda
        elif r["case"].startswith("gpukeeper"):  # on host memory where there is no GPU
            assert r["status"] == peers.OK and r["ns_median"] > 0
    assert all(e["status"] == "left out" for e in report["torch"].values())
    assert "ratio gpukeeper release() / CuPy alloc (<= 0.8):" in proc.stdout


def test_ratios_carry_verdicts_and_say_what_was_not_measured():
    def row(case, key, ns):
        return {"case": case, "workload": key, "status": peers.OK, "ns_median": ns}

    rows = [row("gpukeeper_release", "256B", 70.0), row("gpukeeper_with", "256B", 110.0),
            row("cupy_alloc", "256B", 100.0)]
    torch = {"native": {"status": peers.OK, "median_ns": {"256B": 200.0}},
             "gpukeeper": {"status": peers.OK, "median_ns": {"256B": 180.0}},
             "rmm": {"status": peers.NOT_INSTALLED}}
    by = {(r["ratio"], r["workload"]): r for r in peers.ratios(rows, torch)}
    release = by[("gpukeeper release() / CuPy alloc", "256B")]
    assert release["value"] == 0.7 and release["verdict"] == "met"
    assert by[("gpukeeper with / CuPy alloc", "256B")]["verdict"] == "MISSED"
    assert by[("gpukeeper release() / CuPy alloc", "4KiB")]["verdict"] == "not measured"
    assert by[("torch: gpukeeper / native", "256B")]["value"] == 0.9
    assert by[("torch: gpukeeper / rmm", "256B")]["value"] is None


def test_torch_children_run_and_report_through_the_parent():
    # The parent believes torch has CUDA; each child finds out for itself and reports
    # (here, on a machine without a GPU: "no CUDA"; on one with a GPU: timings).
    class FakeCuda:
        @staticmethod
        def is_available() -> bool:
            return True

    class FakeTorch:
        cuda = FakeCuda()

    p = peers.Peers(torch=FakeTorch())
    args = peers.parse_args(["--quick", "--rounds", "1"])
    result = peers.run_torch_children(p, args)
    assert set(result) == {m for m, _ in peers.TORCH_MODES}
    for mode, entry in result.items():
        assert entry["status"] in {peers.OK, peers.NO_CUDA, peers.NOT_INSTALLED}, (mode, entry)
        assert entry["children"][0]["mode"] == mode
        if entry["status"] == peers.OK:
            assert set(entry["median_ns"]) == {k for _s, k in peers.SIZES}
