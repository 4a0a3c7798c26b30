"""Process ends: however a script with the exit guard installed ends - normally,
by an exception, by SIGINT (also inside autograd), by SIGTERM, or by a DataLoader worker
killed under it - it exits with the conventional status and leaves no process behind; on
a GPU machine, also no device memory.

Each case runs a PyTorch child (sys.executable), records its descendants from /proc while
it runs (with their start times, so that a reused pid is not mistaken for a survivor), ends
it, and checks that none of them is still alive. Where CUDA is available the child also
holds a model and 256 MiB on device 0, and NVML (gpukeeper.base.nvml) must show that its pid
holds nothing afterwards and that the device's used memory is back at the baseline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

torch = pytest.importorskip("torch")

from gpukeeper.base import nvml  # noqa: E402  (after the skip: a torch-less run skips the module)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")

TORCH_CUDA = torch.cuda.is_available()
SIGINT_STATUSES = (-signal.SIGINT, 128 + signal.SIGINT)

CHILD = r'''
import os, sys, time
import torch
from gpukeeper.cleanup import GPUContext, install_exit_guard

mode, device = sys.argv[1], sys.argv[2]
install_exit_guard(sync_timeout=5.0, exit_timeout=20.0)


class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.full((8,), float(i))


with GPUContext():
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.Tanh(), torch.nn.Linear(2048, 512)).to(device)
    x = torch.randn(512, 512, device=device)
    if device == "cuda":
        big = torch.empty(256 << 20, dtype=torch.uint8, device=device)
        torch.cuda.synchronize()
    if mode == "killed-worker":
        loader = torch.utils.data.DataLoader(Slow(), batch_size=4, num_workers=2)
        batches = iter(loader)
        next(batches)
        print("READY", *[w.pid for w in batches._workers], flush=True)
        try:
            for batch in batches:
                model(x).sum().item()
        except Exception as e:  # said on stdout: the surviving worker writes to stderr too
            print("ERROR", type(e).__name__, e, flush=True)
            raise
    else:
        print("READY", flush=True)
    if mode == "raise":
        raise RuntimeError("boom")
    end = time.monotonic() + (30.0 if mode != "normal" else 0.2)
    while time.monotonic() < end:
        if mode == "sigint-plain":
            sum(range(1000))
        else:  # most of a step is spent in torch's C++ autograd engine
            model.zero_grad()
            model(x).square().mean().backward()
    del model, x
print("DONE", flush=True)
'''

# (mode, signal sent after READY, exit statuses, text expected in stderr, or for
# killed-worker in stdout: the error torch raised in the parent)
CASES = [
    ("normal", None, (0,), ""),
    ("raise", None, (1,), "RuntimeError: boom"),
    ("sigint-plain", signal.SIGINT, SIGINT_STATUSES, "KeyboardInterrupt"),
    ("sigint-autograd", signal.SIGINT, SIGINT_STATUSES, "KeyboardInterrupt"),
    ("sigterm", signal.SIGTERM, (128 + signal.SIGTERM,), ""),
    # torch reports the dead worker ("DataLoader worker (pid N) is killed by signal"), or,
    # when the parent reads the pipe the worker died writing to first (seen under load),
    # the torn connection: either way the parent fails and exits.
    ("killed-worker", "kill-worker", (1,), ("ERROR RuntimeError DataLoader worker", "ERROR ConnectionResetError")),
]


# ------------------------------------------------------------------ processes, from /proc


def _stat(pid: int) -> Optional[Tuple[str, int, int]]:
    """(state, parent pid, start time) of ``pid``, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the command name may hold spaces
    return fields[0], int(fields[1]), int(fields[19])


def _descendants(root: int) -> Dict[int, int]:
    """Every process below ``root`` now: pid -> start time."""
    parents: Dict[int, Tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                parents[int(name)] = (st[1], st[2])
    found: Dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, start) in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


def _alive(pid: int, start: int) -> bool:
    """The process that had ``start`` is still running (a zombie has ended: its memory is
    gone, only its exit status waits for a parent to read it)."""
    st = _stat(pid)
    return st is not None and st[2] == start and st[0] not in ("Z", "X")


def _wait_gone(procs: Dict[int, int], timeout: float) -> List[int]:
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid, start in procs.items() if _alive(pid, start)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


# ------------------------------------------------------------------ the device, from NVML


def _device_used() -> int:
    free, total, _source = nvml.device_free_total(0)
    return total - free


def _check_device_released(pid: int, baseline: int) -> None:
    """NVML no longer lists ``pid`` with memory, and the device's used memory is back at
    ``baseline`` (the driver frees a dead process's memory shortly after it is reaped)."""
    tolerance = 16 << 20
    deadline = time.monotonic() + 10
    while True:
        reading = nvml.this_process_memory(0, pid)
        used = _device_used()
        holds = reading.listed is True and (reading.used_bytes or 0) > 0
        if (not holds and used - baseline <= tolerance) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not holds, f"NVML still lists pid {pid} with {reading.used_bytes} bytes"
    assert used - baseline <= tolerance, (used, baseline)


# ------------------------------------------------------------------ the cases


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not TORCH_CUDA, reason="needs PyTorch with a usable CUDA device"))])
@pytest.mark.parametrize("mode, send, statuses, expected", CASES, ids=[c[0] for c in CASES])
def test_process_ends_with_its_status_and_leaves_nothing(tmp_path: Path, device, mode, send, statuses, expected):
    if device == "cuda":
        torch.cuda.synchronize()
        baseline = _device_used()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ)  # the child imports the gpukeeper under test, as this process does
    proc = subprocess.Popen(
        [sys.executable, str(script), mode, device],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        # A suite started in the background inherits SIGINT ignored; the child must not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read() if proc.poll() is not None else "")
        family = _descendants(proc.pid)
        family[proc.pid] = _stat(proc.pid)[2]
        if device == "cuda":
            reading = nvml.this_process_memory(0, proc.pid)
            if reading.listed is not None:
                assert reading.listed, "the child holds a CUDA context: NVML should list it"
            assert _device_used() - baseline > 256 << 20  # it really holds device memory
        if mode == "killed-worker":
            workers = [int(p) for p in line.split()[1:]]
            assert len(workers) == 2 and all(pid in family for pid in workers), (workers, family)
            time.sleep(0.2)
            os.kill(workers[0], signal.SIGKILL)
        elif send is not None:
            time.sleep(0.5)  # inside the loop (for sigint-autograd: mostly in backward)
            proc.send_signal(send)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = line + out
    assert proc.returncode in statuses, (mode, proc.returncode, err[-2000:])
    seen = out if mode == "killed-worker" else err
    assert any(e in seen for e in (expected if isinstance(expected, tuple) else (expected,))), (out, err[-2000:])
    assert ("DONE" in out) == (mode == "normal")
    left = _wait_gone(family, timeout=10)
    assert not left, f"still running after the child ended: {left}"
    if device == "cuda":
        _check_device_released(proc.pid, baseline)
