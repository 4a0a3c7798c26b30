"""The example notebooks (``examples/*.ipynb``) run for real in a Jupyter kernel
(ipykernel, driven by nbclient), in a temporary directory, and their outputs are checked:
the magics' tables, the benchmark and trajectory numbers, and the trajectory's picture
(a PNG that is not blank).

Marked ``notebooks`` (select with ``-m notebooks``, or leave out with
``-m "not notebooks"``); about 10 s on a 2-core CPU. The kernel runs this interpreter,
so it imports the gpukeeper under test; on a GPU machine the notebooks choose CUDA
themselves.
"""

from __future__ import annotations

import base64
import io
import json
import re
import sys
from pathlib import Path
from typing import Any, List

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("torch")
mpimg = pytest.importorskip("matplotlib.image")

pytestmark = pytest.mark.notebooks

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CELL_TIMEOUT_S = 120


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``python3`` kernelspec that runs this interpreter, found first (JUPYTER_PATH):
    an installed spec may name another ``python``, without gpukeeper."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (gpukeeper tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    work = tmp_path / "work"
    work.mkdir()
    return work


def execute(name: str, workdir: Path) -> Any:
    """Runs ``examples/<name>`` in a fresh kernel with ``workdir`` as its current
    directory; a failing cell fails the test with the cell's traceback."""
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    for cell in nb.cells:
        assert not cell.get("outputs"), f"{name} is committed with outputs: clear them"
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    client.execute()
    return nb


def text_of(nb: Any, starts: str) -> str:
    """The printed and displayed text of the code cell whose source starts with ``starts``."""
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(starts)]
    assert len(cells) == 1, f"{len(cells)} cells start with {starts!r}"
    parts: List[str] = []
    for out in cells[0].outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
    return "\n".join(parts)


def check_png(data: bytes) -> None:
    """A real, non-empty picture: the PNG signature, a plausible size, not one colour."""
    assert data.startswith(PNG_SIGNATURE)
    pixels = mpimg.imread(io.BytesIO(data), format="png")
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert float(pixels[..., :3].var()) > 0.0  # not blank


def test_quickstart(kernel_env: Path):
    nb = execute("quickstart.ipynb", kernel_env)
    head = text_of(nb, "import torch")
    assert "gpukeeper 0." in head and "running on " in head
    report = text_of(nb, "%gpu_report")
    assert "gpukeeper memory report:" in report and ("CPU mode" in report or "CUDA device" in report)
    pool = text_of(nb, "pool = MemoryPool()")
    assert "buffer: 4.0 MiB of" in pool
    assert "after the with block (allocated, peak bytes): (0, 4194304)" in pool
    assert "GPUContext: nothing held above the baseline" in text_of(nb, "with GPUContext()")
    bench = text_of(nb, "a = torch.randn")
    assert "matmul 512x512: 50 calls on" in bench and "median" in bench and "headline: median" in bench
    timeit = text_of(nb, "%gpu_timeit -n 50")
    assert "a @ b: 50 calls on" in timeit and "median" in timeit
    assert "best of 3 rounds" in text_of(nb, "res = %gpu_timeit -o")
    assert re.search(r"\(20, [0-9.]+\)", text_of(nb, "res = %gpu_timeit -o"))
    clean = text_of(nb, "%%gpu_memory\nt = torch.ones")
    assert "no leak" in clean and "1048576.0" in clean
    leak = text_of(nb, "%%gpu_memory\nkept =")
    assert "LEAK: 4.0 MiB still held after the cell" in leak
    assert "kept: gpukeeper ManagedBuffer (1048576,) fp32, 4.0 MiB on" in leak
    assert "pool after del (allocated, peak bytes): (0," in text_of(nb, "del kept")


def test_md_trajectory(kernel_env: Path):
    nb = execute("md_trajectory.ipynb", kernel_env)
    assert "216 particles in a box of" in text_of(nb, "n_side = 6")
    assert "md_step(0): 20 calls on" in text_of(nb, "%gpu_timeit")
    summary = text_of(nb, "e_start = energy_per_atom()")
    assert "MD trajectory: LJ velocity Verlet on" in summary
    assert "steps: 200 (+20 warm-up)" in summary and "ns/day" in summary
    headline = text_of(nb, 'print(f"steps/s')
    numbers = dict(re.findall(r"^(steps/s|ns/day|us/atom-step)\s+([0-9.,]+)", headline, re.M))
    assert set(numbers) == {"steps/s", "ns/day", "us/atom-step"}
    assert all(float(v.replace(",", "")) > 0 for v in numbers.values())
    assert re.search(r"^memory leak\s+(False|None)$", headline, re.M)  # never True
    drift = float(re.search(r"^energy drift\s+([-+0-9.]+) per atom", headline, re.M).group(1))
    assert abs(drift) < 0.1  # velocity Verlet conserves energy (up to the plain cutoff)
    assert "no leak" in text_of(nb, "%%gpu_memory")

    pictures = [out.data["image/png"] for c in nb.cells if c.cell_type == "code"
                for out in c.outputs if "image/png" in out.get("data", {})]
    assert len(pictures) == 1  # the trajectory's figure, shown inline once
    check_png(base64.b64decode(pictures[0]))
    saved = kernel_env / "trajectory.png"
    assert saved.is_file() and saved.stat().st_size > 10_000
    check_png(saved.read_bytes())


def test_a_returned_figure_is_shown_once(kernel_env: Path):
    """A plot() call shows its figure exactly once whether the cell ends with the call,
    assigns the figure, ends in ';', or ends with the assigned figure's name."""
    cells = {
        "bare": "r.plot()",
        "assigned": "fig = r.plot()",
        "silenced": "r.plot();",
        "named": "fig2 = r.plot()\nfig2",
        "two": "a = r.plot()\nr.plot()",
    }
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(
        "from gpukeeper import benchmark_function\n"
        "r = benchmark_function(lambda: sum(range(100)), n_calls=30, warmup=2, device='cpu')"))
    nb.cells.extend(nbformat.v4.new_code_cell(src) for src in cells.values())
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(kernel_env)}}
    )
    client.execute()
    for (name, _), cell in zip(cells.items(), nb.cells[1:]):
        pictures = [out for out in cell.outputs if "image/png" in out.get("data", {})]
        assert len(pictures) == (2 if name == "two" else 1), (name, cell.outputs)
        for out in pictures:
            check_png(base64.b64decode(out["data"]["image/png"]))
