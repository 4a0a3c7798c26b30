"""The registry of framework adapters, and the questions asked of all of them.

``ADAPTERS`` lists one adapter per framework; everything else here answers over them, so
that the measuring code names no framework: which ones run GPU work, which one a result
belongs to, which timer backends they give, where their allocations are made, the
distributions ``gpukeeper info`` lists. A new framework is one adapter module and one
line in ``ADAPTERS``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Tuple

from gpukeeper.frameworks.adapter import FrameworkAdapter
from gpukeeper.frameworks.cupy_adapter import CupyAdapter
from gpukeeper.frameworks.jax_adapter import JaxAdapter
from gpukeeper.frameworks.pools_adapter import PoolsAdapter
from gpukeeper.frameworks.torch_adapter import TorchAdapter

__all__ = [
    "ADAPTERS",
    "adapter",
    "array_frameworks",
    "device_properties",
    "distributions",
    "framework_dirs",
    "result_framework",
    "result_gpu_device",
    "waiting_on_result",
]

#: The adapters, in the order reports list them (and in which they are asked: the first
#: that answers a question answers it). Tests replace entries to fake a machine.
ADAPTERS: Dict[str, FrameworkAdapter] = {
    "torch": TorchAdapter(),
    "cupy": CupyAdapter(),
    "jax": JaxAdapter(),
    "gpukeeper": PoolsAdapter(),
}


def adapter(name: str) -> FrameworkAdapter:
    """The adapter registered as ``name`` (KeyError for an unknown name)."""
    return ADAPTERS[name]


def waiting_on_result(kind: Optional[str]) -> Optional[FrameworkAdapter]:
    """The adapter of a framework whose work is waited for by blocking on its result
    (``waits_on_result``), registered as ``kind`` (a plan's kind is then the framework's
    name); None for any other name."""
    fw = ADAPTERS.get(kind) if kind is not None else None
    return fw if fw is not None and fw.waits_on_result else None


def result_framework(value: Any) -> Optional[FrameworkAdapter]:
    """The first framework that waits on results whose GPU arrays ``value`` holds, or None."""
    for fw in ADAPTERS.values():
        if fw.waits_on_result and fw.holds_arrays(value):
            return fw
    return None


def result_gpu_device() -> Optional[Tuple[FrameworkAdapter, int]]:
    """(the first loaded framework that waits on results and has a GPU, its first GPU's
    id), or None."""
    for fw in ADAPTERS.values():
        if fw.waits_on_result:
            ids = fw.gpu_device_ids()
            if ids:
                return fw, ids[0]
    return None


def array_frameworks() -> Tuple[str, ...]:
    """The names of the frameworks whose live arrays Python can list (an array type)."""
    return tuple(
        name
        for name, fw in ADAPTERS.items()
        if type(fw).array_type is not FrameworkAdapter.array_type
    )


def device_properties(device: int) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(the framework's name, its ``get_gpu_info`` fields of ``device``) from the first
    loaded framework that can read them; None when none can."""
    for name, fw in ADAPTERS.items():
        props = fw.device_properties(device)
        if props:
            return name, props
    return None


def distributions() -> Tuple[str, ...]:
    """The frameworks' distributions, in registry order, for ``gpukeeper info``."""
    return tuple(d for fw in ADAPTERS.values() for d in fw.distributions)


def framework_dirs() -> List[str]:
    """The folders of the loaded frameworks' packages, each ending in a path separator:
    where a stack leaves the user's code."""
    dirs = []
    for fw in ADAPTERS.values():
        for name in fw.modules:
            path = getattr(sys.modules.get(name), "__file__", None)
            if path:
                dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return dirs
