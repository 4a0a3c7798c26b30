"""``gpukeeper check``: is this installation sound on this machine?

Each check does real work (allocations, copies, a round trip of data, the pool's books,
typed errors on bad input, calibration kernels timed against the GPU's own clock) and
yields a ``CheckResult``. Without CUDA the host pool is
checked and the report says that the machine is in CPU mode. Times are taken by
``CUDATimer`` (gate and launch floor included), the timer users use.
"""

from __future__ import annotations

import struct
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Callable, Dict, Iterator, List

import gpukeeper._core as _core
from gpukeeper.base.errors import InvalidInputError
from gpukeeper.base.runtime import build_info, cuda_available
from gpukeeper.pool.memory_pool import MemoryPool, PoolStats, Precision
from gpukeeper.timing.timer import CUDATimer

__all__ = ["CheckResult", "run_checks"]


@dataclass
class CheckResult:
    """One check: its name, whether it passed, and what it saw."""

    name: str
    ok: bool
    detail: str
    seconds: float = 0.0
    data: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


class _Failed(Exception):
    pass


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise _Failed(message)


def _timed(name: str, fn: Callable[[], "tuple[str, Dict[str, Any]]"]) -> CheckResult:
    start = time.perf_counter()
    try:
        detail, data = fn()
        ok = True
    except _Failed as exc:
        detail, data, ok = str(exc), {}, False
    except Exception as exc:  # any other failure is a finding, not a crash of the check
        detail, data, ok = f"{type(exc).__name__}: {exc}", {}, False
    return CheckResult(name, ok, detail, time.perf_counter() - start, data)


def _check_build() -> "tuple[str, Dict[str, Any]]":
    info = build_info()
    kind = f"CUDA {info['cuda_version']} (static runtime)" if info["cuda"] else "CPU-only"
    return f"{kind} core, {info['compiler']}, {info['build_type']}", info


def _check_runtime(require_gpu: bool) -> "tuple[str, Dict[str, Any]]":
    status = cuda_available()
    data = {
        "available": status.available,
        "device_count": status.device_count,
        "driver_version": status.driver_version,
        "runtime_version": status.runtime_version,
        "reason": status.reason,
    }
    if not status:
        _expect(not require_gpu, f"a GPU was required, but CUDA is unavailable: {status.reason}")
        return f"CPU mode: CUDA unavailable ({status.reason})", data
    for device in range(status.device_count):
        free, total = _core.device_memory_info(device)
        _expect(0 < free <= total, f"device {device}: implausible memory info {free}/{total}")
        data[f"device{device}_free"] = free
        data[f"device{device}_total"] = total
    return f"{status.device_count} CUDA device(s), driver {status.driver_version}", data


def _stats(pool: MemoryPool, kind: str) -> PoolStats:
    stats = pool.stats(0)
    if stats is None:
        raise _Failed(f"{kind}: the pool has no device 0")
    return stats


def _check_pool(kind: str, expandable: Any = "auto") -> "tuple[str, Dict[str, Any]]":
    pool = MemoryPool(kind, expandable=expandable)
    sizes = [64, 16 << 10, 256 << 10, 2 << 20]  # fp32 elements: 256 B .. 8 MiB
    buffers = []
    for i, count in enumerate(sizes * 2):
        buf = pool.get_managed_buffer(0, count, Precision.Fp32)
        pattern = bytes([(i * 37 + j) % 251 for j in range(256)]) * (buf.nbytes // 256)
        buf.copy_from_host(pattern)
        buffers.append((buf, pattern))
    spans = sorted((b.ptr, b.ptr + b.nbytes) for b, _ in buffers)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        _expect(end <= start, f"{kind}: live buffers overlap")
    for buf, pattern in buffers:
        _expect(buf.to_bytes() == pattern, f"{kind}: data written was not read back")
    stats = _stats(pool, kind)
    expected = sum(-(-b.nbytes // 256) * 256 for b, _ in buffers)
    _expect(
        stats.allocated_bytes == expected,
        f"{kind}: allocated {stats.allocated_bytes} != sum of live blocks {expected}",
    )
    # The layout in force: with the default, device memory puts the large buffers in an
    # expandable range and the small ones in fixed segments.
    segments = sorted({"expandable" if seg.expandable else "fixed" for seg in pool.snapshot(0)})
    for buf, _ in buffers:
        buf.release()
    before = _stats(pool, kind)
    again = [pool.get_managed_buffer(0, count, Precision.Fp32) for count in sizes]
    after = _stats(pool, kind)
    _expect(
        after.cache_misses == before.cache_misses and after.reserved_bytes == before.reserved_bytes,
        f"{kind}: freed blocks were not reused (new segments were allocated)",
    )
    for buf in again:
        buf.release()
    try:
        pool.get_managed_buffer(0, 0, Precision.Fp32)
        raise _Failed(f"{kind}: a zero-size request did not raise")
    except InvalidInputError:
        pass
    problems = pool.validate(0)
    _expect(problems == "", f"{kind}: pool books inconsistent: {problems}")
    stats = _stats(pool, kind)
    _expect(stats.allocated_bytes == 0, f"{kind}: {stats.allocated_bytes} bytes still allocated")
    released = pool.emergency_cleanup(0)
    _expect(_stats(pool, kind).reserved_bytes == 0, f"{kind}: reserved bytes left after cleanup")
    data = {
        "hits": stats.cache_hits,
        "misses": stats.cache_misses,
        "peak_reserved": stats.peak_reserved_bytes,
        "released": released,
        "segments": segments,
    }
    return (
        f"{len(buffers)} buffers written and read back, reuse hit, "
        f"{released >> 20} MiB returned on cleanup",
        data,
    )


def _check_cleanup() -> "tuple[str, Dict[str, Any]]":
    from gpukeeper.cleanup import GPUContext

    kind = "device" if cuda_available() else "host"
    pool = MemoryPool(kind)
    with GPUContext(warn_on_leak=False) as ctx:
        kept = pool.get_managed_buffer(0, 1 << 20, Precision.Fp32)
        cycle: List[Any] = [kept]
        cycle.append(cycle)  # only the garbage collector can free this
        del kept, cycle
    report = ctx.report
    if report is None:
        raise _Failed("GPUContext left no report")
    _expect(
        _stats(pool, kind).allocated_bytes == 0,
        "a buffer in a reference cycle survived GPUContext",
    )
    _expect(_stats(pool, kind).reserved_bytes == 0, "GPUContext left the pool's cache reserved")
    _expect(not report.leaked, f"GPUContext reported a leak: {report.summary()}")
    return f"{kind} buffer in a reference cycle freed and released on exit", {
        "released_bytes": report.released_bytes,
        "gc_runs": report.gc_runs,
    }


def _check_report() -> "tuple[str, Dict[str, Any]]":
    from gpukeeper.account.account_reader import memory_report

    report = memory_report()  # every visible device (the host in CPU mode)
    data = report.to_dict()
    _expect(len(report) > 0, "the report covers no device")
    for device in report:
        where = "the host" if device.device is None else f"CUDA device {device.device}"
        _expect(device.total_bytes > 0, f"the report of {where} has no total")
        _expect(device.free_bytes <= device.total_bytes, f"free exceeds total on {where}")
    _expect(
        report.total_bytes == sum(d.total_bytes for d in report),
        "the total is not the devices' sum",
    )
    count = f"{len(report)} device{'s' if len(report) != 1 else ''}"
    return f"{report.mode} report of {count}, NVML: {report[0].nvml}", {"report": data}


# A hidden-latency event pair must read a calibration kernel within this much of the
# kernel's own %globaltimer duration: 1 us plus 0.1 %. Looser than the benchmark's 0.5 us
# target on purpose: this check catches a timer that is wrong, on a machine that may be
# busy, and cudaEventElapsedTime itself resolves about 0.5 us.
_TIMING_TOLERANCE_US = 1.0
_TIMING_TOLERANCE_REL = 1e-3
_TIMING_KERNELS_NS = (10_000, 100_000, 1_000_000)
_TIMING_ROUNDS = 7


def _check_timing(require_gpu: bool) -> "tuple[str, Dict[str, Any]]":
    if not cuda_available():
        return _check_host_clock()
    if not _core.calibration_kernels_available():
        _expect(not require_gpu, "this build has no calibration kernels (built without CUDA)")
        return (
            "no calibration kernels in this build (built without CUDA): accuracy not verified",
            {},
        )
    return _check_kernel_timing()


def _check_host_clock() -> "tuple[str, Dict[str, Any]]":
    """CPU mode: ``CUDATimer`` on the host clock reads a 10 ms sleep as 9 .. 60 ms."""
    timer = CUDATimer("check", device="cpu")
    with timer:
        time.sleep(0.01)
    ms = timer.elapsed_ms
    _expect(9.0 <= ms <= 60.0, f"the steady-clock timer read a 10 ms sleep as {ms:.3f} ms")
    return f"CPU mode: steady-clock timer read a 10 ms sleep as {ms:.2f} ms", {"sleep_ms": ms}


def _kernel_error_us(timer: CUDATimer, ns: int, out: Any) -> float:
    """``timer``'s reading of a spin kernel of ``ns`` on device 0's legacy default stream,
    started on an idle stream, less the kernel's own %globaltimer duration (us)."""
    _core.spin_kernel(0, 0, out=out.ptr)  # module loaded, `out` touched
    _core.synchronize(0)  # an idle stream: the launch latency is in front of the kernel
    took = timer.time_call(_core.spin_kernel, (ns, 0), {"out": out.ptr})
    _expect(took.launch_hidden is not False, f"{ns // 1000} us: the launch-latency gate timed out")
    first, last = struct.unpack("<QQ", out.to_bytes()[:16])
    return took.elapsed_ms * 1e3 - (last - first) / 1e3


def _check_kernel_timing() -> "tuple[str, Dict[str, Any]]":
    """Calibration kernels against ``CUDATimer``: with the launch latency hidden (the
    timer subtracts the launch floor, taken in place beside each call) within 1 us +
    0.1 % of the kernel's own clock."""
    import statistics

    hidden = CUDATimer("check", device=0, backend="gpukeeper", stream=0, hide_launch_latency=True)
    plain = CUDATimer("check", device=0, backend="gpukeeper", stream=0)
    process_floor_us = hidden.floor_ms * 1e3  # the once-per-process floor, before any call
    _expect(0.0 < process_floor_us < 20.0, f"implausible launch floor {process_floor_us:.3f} us")
    pool = MemoryPool("auto")
    out = pool.get_managed_buffer(0, 2, Precision.Int64)  # the kernel's first and last ns
    parts = []
    data: Dict[str, Any] = {}
    try:
        for ns in _TIMING_KERNELS_NS:
            hidden_us, plain_us = [], []
            for _ in range(_TIMING_ROUNDS):
                hidden_us.append(_kernel_error_us(hidden, ns, out))
                plain_us.append(_kernel_error_us(plain, ns, out))
            err = statistics.median(hidden_us)
            limit = _TIMING_TOLERANCE_US + _TIMING_TOLERANCE_REL * ns / 1e3
            _expect(
                abs(err) <= limit,
                f"{ns // 1000} us kernel: events read {err:+.3f} us off its own clock "
                f"(limit {limit:.3f} us)",
            )
            data[f"{ns // 1000}us"] = {
                "hidden_error_us": err,
                "plain_error_us": statistics.median(plain_us),
            }
            parts.append(f"{ns // 1000} us {err:+.2f}")
    finally:
        out.release()
        pool.emergency_cleanup(0)
    floor_us = hidden.floor_ms * 1e3  # the median of the in-place brackets
    _expect(0.0 < floor_us < 20.0, f"implausible launch floor {floor_us:.3f} us")
    data["launch_floor_us"] = floor_us
    data["process_floor_us"] = process_floor_us
    return (
        "calibration kernels vs events, launch latency hidden, floor taken in place "
        f"{floor_us:.2f} us subtracted (error us): "
        + ", ".join(parts)
        + f"; plain event pair on 10 us: {data['10us']['plain_error_us']:+.2f} us"
    ), data


def run_checks(require_gpu: bool = False) -> Iterator[CheckResult]:
    """Runs every check, yielding each result as it completes."""
    yield _timed("build", _check_build)
    yield _timed("runtime", lambda: _check_runtime(require_gpu))
    kinds: List[str] = ["host"]
    status = cuda_available()
    if status:
        kinds += ["device", "async", "pinned"]
    for kind in kinds:
        yield _timed(f"pool[{kind}]", partial(_check_pool, kind))
    expandable_kind = "device" if status else "host"
    yield _timed(f"pool[{expandable_kind}+exp]", lambda: _check_pool(expandable_kind, True))
    yield _timed("cleanup", _check_cleanup)
    yield _timed("report", _check_report)
    yield _timed("timing", lambda: _check_timing(require_gpu))
