"""FAISS on the GPU with memory that fits: index sizing, batched search, cleanup.

>>> temp = calculate_faiss_temp_memory(n_points=1_000_000, k=30)   # bytes
>>> index, res = create_faiss_index(n_dims=3, n_points=1_000_000, k=30)

faiss is imported on first use; ``FaissUnavailableError`` says when it is missing, has no
GPU support (faiss-cpu) or sees no GPU.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Optional, Tuple

from gpukeeper.base.errors import GpuError, InvalidInputError
from gpukeeper.base.nvml import device_free_total

GiB = 1 << 30

__all__ = [
    "FaissUnavailableError",
    "calculate_faiss_temp_memory",
    "create_faiss_gpu_resources",
    "create_faiss_index",
]


class FaissUnavailableError(GpuError, ImportError):
    """FAISS is not installed, or was built without GPU support (``faiss-cpu``), or sees
    no GPU. Also an ``ImportError``, so ``except ImportError`` keeps working."""


_MiB = 1 << 20
# FAISS constants, faiss/gpu (see calculate_faiss_temp_memory's docstring).
_FAISS_MAX_K = 2048  # GPU_MAX_SELECTION_K
_FAISS_PAGE_BYTES = 256 * _MiB  # kNonPinnedPageSize: queries are copied in pages this size
_FAISS_ALIGN = 256  # StandardGpuResources rounds every allocation up to 256 bytes


def _faiss_tiers(total_bytes: int) -> Tuple[int, int]:
    """(tile memory target, StandardGpuResources' temp memory cap) for a GPU this size."""
    if total_bytes <= 4 * GiB:
        return 512 * _MiB, 512 * _MiB
    if total_bytes <= 8 * GiB:
        return 768 * _MiB, 1 * GiB
    return 1 * GiB, 1536 * _MiB


def _count(value: Any, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidInputError(f"{what} must be an int, got {type(value).__name__}")
    if int(value) < minimum:
        raise InvalidInputError(f"{what} must be at least {minimum}, got {value}")
    return int(value)


def _align(n: int) -> int:
    return -(-n // _FAISS_ALIGN) * _FAISS_ALIGN


def calculate_faiss_temp_memory(
    n_points: int,
    k: int,
    *,
    n_queries: Optional[int] = None,
    dims: int = 3,
    device: int = 0,
    max_fraction: float = 0.25,
    available_bytes: Optional[int] = None,
    total_bytes: Optional[int] = None,
) -> int:
    """Bytes of FAISS GPU temporary memory for a brute-force (flat, L2, float32) k-NN
    search of ``n_queries`` queries (default: the ``n_points`` points themselves) among
    ``n_points`` vectors of ``dims`` floats; pass it to ``res.setTempMemory``.

    The formula follows FAISS's own code (faiss/gpu/impl/Distance.cu ``runDistance``,
    ``chooseTileSize``; faiss/gpu/GpuIndex.cu; faiss/gpu/StandardGpuResources.cpp),
    every buffer rounded up to 256 bytes as StandardGpuResources does:

    * query tile ``R = min(1024 if dims <= 32 else 512, n_queries)`` rows;
    * database tile ``C = min(target / (2 * 4) / preferred_rows, n_points)`` columns,
      ``target`` = 512 MiB (GPU <= 4 GiB), 768 MiB (<= 8 GiB), else 1 GiB, of which
      each of the two streams' distance buffers takes half; ``T = ceil(n_points / C)``;
    * ``2 * R * C * 4``: the double-buffered float32 distance tiles;
    * ``2 * R * T * k * (4 + 8)``: per-tile k-selection results, float32 distances and
      int64 indices, double-buffered;
    * ``Q * 4``: query norms (L2), ``Q * dims * 4``: the queries copied to the device,
      ``Q * k * (4 + 8)``: the result distances and labels, where ``Q`` is the number of
      queries in one page (``n_queries``, paged at 256 MiB of query data).

    The sum is then capped by what StandardGpuResources accepts (512 MiB, 1 GiB, else
    1.5 GiB) and by ``max_fraction`` of the device's available memory; requests above
    the stack go to cudaMalloc as "temporary memory overflow", so a cap costs speed,
    not correctness. ``available_bytes``/``total_bytes`` default to device ``device``'s
    (the host has no FAISS GPU to ask: without CUDA, a GPU over 8 GiB with no
    availability cap is assumed). Example: 1,000,000 3-D points, k = 30, on an H200:
    1 GiB tiles + 343 MiB results + small buffers = about 1.36 GiB.
    """
    n_points = _count(n_points, "n_points")
    k = _count(k, "k")
    if k > _FAISS_MAX_K:
        raise InvalidInputError(f"k must be at most {_FAISS_MAX_K} on a FAISS GPU, got {k}")
    dims = _count(dims, "dims")
    n_queries = n_points if n_queries is None else _count(n_queries, "n_queries")
    if (
        isinstance(max_fraction, bool)
        or not isinstance(max_fraction, numbers.Real)
        or not (0 < float(max_fraction) <= 1)
    ):
        raise InvalidInputError(f"max_fraction must be in (0, 1], got {max_fraction!r}")

    if total_bytes is None or available_bytes is None:
        try:
            free, total, _source = device_free_total(device)
        except Exception:
            free, total = None, None  # no CUDA device: formula only (documented)
        total_bytes = total if total_bytes is None else total_bytes
        available_bytes = free if available_bytes is None else available_bytes
    target, cap = _faiss_tiers(total_bytes if total_bytes is not None else 16 * GiB)

    preferred_rows = 1024 if dims <= 32 else 512
    rows = min(preferred_rows, n_queries)
    cols = min(target // (2 * 4) // preferred_rows, n_points)
    col_tiles = -(-n_points // cols)
    per_page = max(1, _FAISS_PAGE_BYTES // (4 * dims))
    q = min(n_queries, per_page)

    need = (
        2 * _align(rows * cols * 4)
        + 2 * _align(rows * col_tiles * k * 4)
        + 2 * _align(rows * col_tiles * k * 8)
        + _align(q * 4)
        + _align(q * dims * 4)
        + _align(q * k * 4)
        + _align(q * k * 8)
    )
    need = min(need, cap)
    if available_bytes is not None:
        need = min(need, int(float(max_fraction) * available_bytes))
    return max(0, int(need))


def _import_faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:
        raise FaissUnavailableError(
            f"faiss is not installed ({exc}); install faiss-gpu (or faiss-cpu for CPU indexes)"
        ) from exc
    return faiss


def _faiss_gpu_problem(faiss: Any, device: int) -> str:
    """Why faiss cannot use GPU ``device``; '' when it can."""
    if not hasattr(faiss, "StandardGpuResources"):
        return "faiss was built without GPU support (faiss-cpu); install faiss-gpu"
    try:
        count = int(faiss.get_num_gpus())
    except Exception as exc:
        return f"faiss.get_num_gpus() failed: {exc}"
    if count == 0:
        return "faiss sees no GPU"
    if device >= count:
        return f"faiss sees {count} GPU(s); device {device} does not exist"
    return ""


def create_faiss_gpu_resources(
    n_points: Optional[int] = None,
    k: Optional[int] = None,
    device: int = 0,
    *,
    n_queries: Optional[int] = None,
    dims: int = 3,
    temp_memory: Optional[int] = None,
) -> Any:
    """A ``faiss.StandardGpuResources`` whose temporary memory fits the search.

    ``temp_memory`` bytes when given, else :func:`calculate_faiss_temp_memory` of
    ``n_points``/``k`` when both are given, else FAISS's default. Raises
    ``FaissUnavailableError`` when faiss is missing, has no GPU support or sees no
    such device, ``InvalidInputError`` for bad sizes.
    """
    device = _count(device, "device", 0)
    if temp_memory is None and n_points is not None and k is not None:
        temp_memory = calculate_faiss_temp_memory(
            n_points, k, n_queries=n_queries, dims=dims, device=device
        )
    elif temp_memory is not None:
        temp_memory = _count(temp_memory, "temp_memory", 0)
    faiss = _import_faiss()
    problem = _faiss_gpu_problem(faiss, device)
    if problem:
        raise FaissUnavailableError(f"FAISS GPU resources unavailable: {problem}")
    res = faiss.StandardGpuResources()
    if temp_memory is not None:
        res.setTempMemory(int(temp_memory))
    return res


def create_faiss_index(
    n_dims: int,
    n_points: int,
    *,
    use_gpu: bool = True,
    approximate: bool = False,
    k: int = 30,
    device: int = 0,
    metric: str = "l2",
    nlist: Optional[int] = None,
    nprobe: Optional[int] = None,
    res: Any = None,
    fallback_to_cpu: bool = True,
) -> Tuple[Any, Any]:
    """An empty FAISS index for ``n_points`` vectors of ``n_dims`` floats, and its GPU
    resources: ``(index, res)``; ``res`` is None for a CPU index.

    * Exact (``IndexFlatL2``/``IndexFlatIP``) unless ``approximate=True`` and
      ``n_points > 100_000``: then ``IndexIVFFlat`` with ``nlist = 4 * sqrt(n_points)``
      lists (FAISS's guideline is 4 to 16 times sqrt(N)), at most ``n_points // 39``
      (FAISS warns below 39 training points per list), and ``nprobe =
      max(1, nlist // 16)`` unless given (at most nlist and 2048, the GPU's limit).
      Such an index must be trained: ``if not index.is_trained: index.train(points)``;
      then ``index.add(points)``.
    * ``use_gpu=True`` moves it to GPU ``device`` with resources from
      :func:`create_faiss_gpu_resources` (sized for ``n_points``, ``k``; or ``res``).
      When faiss has no GPU support or sees no GPU, the CPU index is returned with a
      ``RuntimeWarning`` (``fallback_to_cpu=False``: ``FaissUnavailableError``).

    ``FaissUnavailableError`` when faiss is not installed.
    """
    n_dims = _count(n_dims, "n_dims")
    n_points = _count(n_points, "n_points")
    k = _count(k, "k")
    device = _count(device, "device", 0)
    metric_name = str(metric).lower()
    if metric_name not in ("l2", "ip"):
        raise InvalidInputError(f"metric must be 'l2' or 'ip', got {metric!r}")
    faiss = _import_faiss()
    faiss_metric = faiss.METRIC_L2 if metric_name == "l2" else faiss.METRIC_INNER_PRODUCT

    if approximate and n_points > 100_000:
        lists = nlist if nlist is not None else int(4 * math.sqrt(n_points))
        lists = max(1, min(_count(lists, "nlist"), n_points // 39))
        quantizer = faiss.IndexFlatL2(n_dims) if metric_name == "l2" else faiss.IndexFlatIP(n_dims)
        index = faiss.IndexIVFFlat(quantizer, n_dims, lists, faiss_metric)
        probes = _count(nprobe, "nprobe") if nprobe is not None else max(1, lists // 16)
        index.nprobe = min(lists, probes, _FAISS_MAX_K)  # GPU IVF search caps nprobe too
        # faiss's Python wrapper keeps the quantizer alive (referenced_objects).
    else:
        index = faiss.IndexFlatL2(n_dims) if metric_name == "l2" else faiss.IndexFlatIP(n_dims)

    if not use_gpu:
        return index, None
    problem = _faiss_gpu_problem(faiss, device)
    if problem:
        if not fallback_to_cpu:
            raise FaissUnavailableError(f"FAISS GPU index unavailable: {problem}")
        warnings.warn(
            f"FAISS GPU unavailable ({problem}): using a CPU index", RuntimeWarning, stacklevel=2
        )
        return index, None
    if res is None:
        res = create_faiss_gpu_resources(n_points, min(k, _FAISS_MAX_K), device, dims=n_dims)
    gpu_index = faiss.index_cpu_to_gpu(res, device, index)
    return gpu_index, res
