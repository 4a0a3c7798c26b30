"""Small helpers shared by the Python benchmarks (imported from their own folder): the
machine and library versions for the JSON's environment block, optional imports."""

from __future__ import annotations

import datetime
import json
import platform
import sys
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform reports."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def try_import(name: str) -> Tuple[Optional[Any], Optional[str]]:
    """(module, None), or (None, why) when ``name`` is missing or fails to import."""
    try:
        return __import__(name), None
    except Exception as e:  # ImportError, or a broken install
        return None, f"{type(e).__name__}: {e}"


def to_jsonable(val: Any) -> Any:
    """A dict, a struct-like object (public attributes) or a scalar, as JSON-ready data."""
    if isinstance(val, (bool, int, float, str, type(None))):
        return val
    if isinstance(val, tuple) and not hasattr(val, "_asdict"):
        return [to_jsonable(v) for v in val]
    if hasattr(val, "_asdict"):
        val = val._asdict()
    elif hasattr(val, "keys"):
        val = {k: val[k] for k in val.keys()}
    elif not isinstance(val, dict):
        val = {k: getattr(val, k) for k in dir(val)
               if not k.startswith("_") and not callable(getattr(val, k))}
    return json.loads(json.dumps(val, default=str))


def environment(gk: Any, torch: Any, cupy: Any, rmm: Any = None) -> Dict[str, Any]:
    """The environment block of a benchmark's JSON: time, Python, CPU, and for each of
    the modules given (None where missing) its version and what it says of the GPU."""
    env: Dict[str, Any] = {
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_name(),
    }
    if gk is not None:
        env["gpukeeper"] = getattr(gk, "__version__", "unknown")
        for name in ("build_info", "cuda_available"):
            fn = getattr(gk, name, None)
            if fn is None:
                continue
            try:
                env[name] = to_jsonable(fn())
            except Exception as e:  # report, never fail the run over it
                env[name] = f"error: {e}"
    if torch is not None:
        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["gpu_name"] = torch.cuda.get_device_name(0)
            env["gpu_total_memory"] = torch.cuda.get_device_properties(0).total_memory
    if cupy is not None:
        env["cupy"] = cupy.__version__
        try:
            env["cuda_driver_version"] = cupy.cuda.runtime.driverGetVersion()
            env["cuda_runtime_version"] = cupy.cuda.runtime.runtimeGetVersion()
        except Exception:
            pass
    if rmm is not None:
        env["rmm"] = getattr(rmm, "__version__", "unknown")
    return env


def calibration_torch() -> Optional[Any]:
    """torch, when it sees a GPU and gpukeeper's build has the calibration kernels; else
    None, having said why nothing is measured (such a benchmark then exits 0)."""
    torch, why = try_import("torch")
    from gpukeeper import _core

    if torch is None or not torch.cuda.is_available() or not _core.calibration_kernels_available():
        print(f"no CUDA or no calibration kernels here: nothing measured ({why or 'torch sees no GPU'})")
        return None
    return torch


def write_report(path: Optional[str], torch: Any, readings: Dict[str, Any]) -> None:
    """Writes ``readings`` with the environment block and the command's arguments as JSON
    to ``path`` (nothing when None)."""
    if not path:
        return
    import gpukeeper

    with open(path, "w") as fh:
        json.dump({"environment": environment(gpukeeper, torch, None), "argv": sys.argv[1:], **readings}, fh, indent=1)



class NcclRank(NamedTuple):
    """This process as one rank of an NCCL job: the world size, its local rank, ``meet()``
    (puts the ranks in step: an ``all_reduce`` waited for on the host) and a tensor kept
    on its device (a context and an allocation, as in training)."""

    world: int
    local: int
    meet: Callable[[], None]
    kept: Any


def nccl_rank(torch: Any, dist: Any) -> Optional[NcclRank]:
    """Under torchrun with a GPU per rank and NCCL: this rank with its device set and the
    process group initialised. None, after saying so, otherwise."""
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not (torch.cuda.is_available() and torch.cuda.device_count() >= world and dist.is_nccl_available()):
        print("needs one GPU per rank and NCCL: nothing measured")
        return None
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    flag = torch.zeros(1, dtype=torch.int64, device="cuda")

    def meet() -> None:
        dist.all_reduce(flag)
        flag.item()

    return NcclRank(world, local, meet, torch.ones(1 << 20, device="cuda"))
