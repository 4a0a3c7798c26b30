"""GPU work that no framework owns, on a real device: OpenMM's CUDA platform (its own
context, made with cuCtxCreate) and JAX. Each case runs in a fresh subprocess, so that
which frameworks are imported is exactly what the case says.

Needs: a CUDA device, ``openmm`` with its CUDA platform (``pip install openmm[cuda12]``),
``nvidia-ml-py`` (NVML's per-process figure is the memory source), for the second case
``torch`` with CUDA, and ``jax[cuda12]`` for the JAX case. Each is skipped with its reason
when something is missing.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any, Dict

import pytest
from child_process import run_json_child

import gpukeeper

PACKAGE_ROOT = str(Path(gpukeeper.__file__).resolve().parent.parent)

OPENMM_CHILD = textwrap.dedent(
    '''
    import json, statistics, sys, time

    def done(**out):
        print("RESULT " + json.dumps(out))
        sys.exit(0)

    mode = sys.argv[1]
    try:
        import pynvml  # noqa: F401
    except ImportError as exc:
        done(skip=f"nvidia-ml-py is not installed: {exc}")
    if mode == "torch":
        try:
            import torch
        except ImportError as exc:
            done(skip=f"torch is not installed: {exc}")
        if not torch.cuda.is_available():
            done(skip="torch has no CUDA")
        torch.zeros(1, device="cuda")  # torch's context first, as an ML force field would
    try:
        import openmm as mm
        from openmm import unit
    except ImportError as exc:
        done(skip=f"openmm cannot be imported: {exc}")
    try:
        platform = mm.Platform.getPlatformByName("CUDA")
    except Exception as exc:
        done(skip=f"openmm has no CUDA platform: {exc}")

    import gpukeeper
    from gpukeeper.md import benchmark_md_trajectory

    # 4096 argon-like LJ particles on a cubic lattice in a periodic box (~20 per nm^3).
    side, spacing = 16, 0.37
    box = side * spacing
    system = mm.System()
    system.setDefaultPeriodicBoxVectors(mm.Vec3(box, 0, 0), mm.Vec3(0, box, 0), mm.Vec3(0, 0, box))
    lj = mm.NonbondedForce()
    lj.setNonbondedMethod(mm.NonbondedForce.CutoffPeriodic)
    lj.setCutoffDistance(1.0)
    positions = []
    for i in range(side):
        for j in range(side):
            for k in range(side):
                system.addParticle(39.948)
                lj.addParticle(0.0, 0.34, 0.996)
                positions.append(mm.Vec3(i * spacing, j * spacing, k * spacing))
    system.addForce(lj)
    dt_fs = 2.0
    integrator = mm.LangevinMiddleIntegrator(120 * unit.kelvin, 1 / unit.picosecond,
                                             dt_fs * unit.femtoseconds)
    context = mm.Context(system, integrator, platform)
    context.setPositions(positions)
    mm.LocalEnergyMinimizer.minimize(context, 10.0, 100)
    context.setVelocitiesToTemperature(120 * unit.kelvin)

    steps_per_call, calls = 50, 400

    def step(_):
        integrator.step(steps_per_call)

    def synchronize():
        context.getState()  # downloads from the device: waits for the queued steps

    for _ in range(20):  # kernels compiled and caches warm before either clock runs
        step(None)
    synchronize()

    def reference():
        t0 = time.perf_counter()
        for _ in range(calls):
            step(None)
        synchronize()
        seconds = time.perf_counter() - t0
        return calls * steps_per_call * dt_fs * 1e-6 * 86400.0 / seconds

    ref, ours, result = [], [], None
    def measured():
        return benchmark_md_trajectory(step, list(range(calls)), warmup_steps=5,
                                       timestep_fs=steps_per_call * dt_fs,
                                       synchronize=synchronize)

    # Paired: each gpukeeper run beside a plain run of the same calls, the order
    # alternating so that a drift of the device's speed (clocks, heat) cancels; the
    # verdict is the median of the pairs' ratios (plain runs alone vary by several %).
    for i in range(5):
        if i % 2 == 0:
            ref.append(reference())
            result = measured()
        else:
            result = measured()
            ref.append(reference())
        ours.append(result.ns_per_day)
    done(
        mode=mode,
        torch_imported="torch" in sys.modules,
        work=result.work,
        device=result.device,
        memory_source=result.memory_source,
        memory_leak=result.memory_leak,
        memory_leak_reason=result.memory_leak_reason,
        timing_method=result.timing_method,
        throughput_source=result.throughput_source,
        synchronized=result.synchronized,
        ref_ns_day=ref,
        ns_day=ours,
        ref_median=statistics.median(ref),
        median=statistics.median(ours),
        pair_ratio=statistics.median(o / r for o, r in zip(ours, ref)),
        warnings=result.warnings,
    )
    '''
)

JAX_CHILD = textwrap.dedent(
    '''
    import json, sys

    def done(**out):
        print("RESULT " + json.dumps(out))
        sys.exit(0)

    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:
        done(skip=f"jax cannot be imported: {exc}")
    if not any(d.platform == "gpu" for d in jax.devices()):
        done(skip=f"jax has no GPU: {jax.devices()}")

    from gpukeeper import GPUContext
    from gpukeeper.timing import benchmark_function

    f = jax.jit(lambda x: (x @ x).sum())
    x = jnp.ones((2048, 2048), dtype=jnp.float32)
    r = benchmark_function(f, x, n_calls=50, warmup=5)
    with GPUContext(warn_on_leak=False) as ctx:
        y = f(x)
        y.block_until_ready()
        del y
    done(work=r.work, timing=r.timing, backend=r.backend, device=r.device,
         memory_source=r.memory_source, memory_before=r.memory_before_bytes,
         timing_method=r.timing_method, summary=r.summary(),
         cleanup=str(ctx.report), unreturnable=ctx.report.unreturnable)
    '''
)


def _run_child(tmp_path: Path, code: str, *args: str) -> Dict[str, Any]:
    script = tmp_path / "child.py"
    script.write_text(code)
    env = dict(os.environ)
    # JAX's defaults (75% preallocated, never returned) are what the JAX case checks.
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    env.pop("XLA_PYTHON_CLIENT_ALLOCATOR", None)
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = run_json_child(script, *args, timeout=900, env=env, prefix="RESULT ")
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


@pytest.mark.quiet_machine
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["plain", "torch"])
def test_openmm_trajectory_is_gpu_work_with_nvml_memory(tmp_path: Path, mode: str) -> None:
    out = _run_child(tmp_path, OPENMM_CHILD, mode)
    assert out["torch_imported"] == (mode == "torch")
    assert out["work"] == "gpu" and out["device"].startswith("cuda:"), out
    assert out["memory_source"] == "nvml_process", out
    assert out["synchronized"] is True, out
    assert out["memory_leak"] is not True, out["memory_leak_reason"]
    ratio = out["pair_ratio"]
    # 10%: on an H100, 2026-11-23, single pairs differed by -4.5% to +4%, and the median of
    # five pairs read 1.027 in one run of the suite and 0.970 in another (plain runs alone
    # vary that much); on a busier H100 host, 2026-11-24, pairs ranged 0.94-1.10 and the
    # median read 1.066. A missing synchronize or a wrong step count is off by far more.
    assert abs(ratio - 1.0) <= 0.10, (
        f"gpukeeper {out['ns_day']} vs wall clock {out['ref_ns_day']} ns/day "
        f"({out['throughput_source']})")


@pytest.mark.gpu
def test_jax_jitted_function_is_gpu_work_with_jax_memory(tmp_path: Path) -> None:
    out = _run_child(tmp_path, JAX_CHILD)
    assert out["work"] == "gpu" and out["backend"] == "jax" and out["timing"] == "host", out
    assert out["device"].startswith("cuda:")
    assert out["memory_source"] == "jax" and out["memory_before"] is not None
    assert "block_until_ready" in out["timing_method"]
    assert "GPU work" in out["summary"]
    # Default preallocation: JAX keeps most of the device and never gives it back.
    assert out["unreturnable"], out["cleanup"]
    assert ("XLA_PYTHON_CLIENT_PREALLOCATE=false" in out["cleanup"]
            or "XLA_PYTHON_CLIENT_ALLOCATOR=platform" in out["cleanup"]), out["cleanup"]
