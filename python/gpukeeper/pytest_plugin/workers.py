"""pytest-xdist: one GPU per worker (``--gpu-devices``), and what workers hand back.

``--gpu-devices=all`` or ``--gpu-devices=0,1`` gives worker ``gwN`` the device
``LIST[N % len(LIST)]`` as its ``CUDA_VISIBLE_DEVICES``, so that every framework in the
worker sees that one device as device 0. It must be set before anything in the worker
initialises CUDA, so it is set in ``pytest_load_initial_conftests``, before the
conftest files are imported. ``all`` is resolved once, in the controller, and handed to
the workers through the environment: asking the driver in a worker would initialise CUDA
there before the variable is set. Entries are passed verbatim, so GPU UUIDs work too.
"""

from __future__ import annotations

import os
import re
from typing import List, Optional

from gpukeeper.base.device_names import cuda_status
from gpukeeper.base.errors import InvalidInputError

__all__ = [
    "RESOLVED_ENV",
    "WORKER_KEY",
    "assign_worker_device",
    "parse_device_list",
    "resolve_for_workers",
    "worker_index",
]

#: The environment variable through which the controller hands ``all`` resolved to workers.
RESOLVED_ENV = "GPUKEEPER_XDIST_DEVICES"
# The resolved list where ``all`` found no CUDA device: the workers keep the CPU.
NO_DEVICES = "cpu"
#: The key of gpukeeper's data in an xdist worker's ``workeroutput``.
WORKER_KEY = "gpukeeper"

# An ordinal, or a GPU or MIG UUID as nvidia-smi -L prints it (MIG-GPU-<uuid>/<gi>/<ci>
# in the older form): anything else is a typo, which CUDA would silently read as "no
# device" from that entry on.
_ENTRY = re.compile(r"\d+|(?:MIG-)?(?:GPU|MIG)-[0-9A-Fa-f-]+(?:/\d+/\d+)?", re.I)


def parse_device_list(text: str) -> List[str]:
    """``"0,1"`` as ``["0", "1"]``; ``InvalidInputError`` for an empty or malformed list
    (``all`` is resolved by :func:`resolve_for_workers`)."""
    entries = [e.strip() for e in str(text).split(",")]
    if not entries or any(not _ENTRY.fullmatch(e) for e in entries):
        raise InvalidInputError(
            f"--gpu-devices takes 'all' or a comma-separated list of CUDA devices (ordinals or "
            f"GPU UUIDs, as CUDA_VISIBLE_DEVICES names them), got {text!r}"
        )
    return entries


def resolve_for_workers(option: str) -> List[str]:
    """The device list the workers share: ``all`` becomes the devices visible here (the
    entries of ``CUDA_VISIBLE_DEVICES`` when it is set), and ``[NO_DEVICES]`` where there
    is no CUDA device: one command line serves CPU and GPU machines, and on a CPU one the
    workers run on the CPU (the report header says so)."""
    if option.strip() != "all":
        return parse_device_list(option)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        return parse_device_list(visible)
    count, _reason = cuda_status()
    if count == 0:
        return [NO_DEVICES]
    return [str(i) for i in range(count)]


def no_devices_reason() -> str:
    """Why ``all`` found no device (for the report header)."""
    return cuda_status()[1]


def worker_index() -> Optional[int]:
    """This process's xdist worker number (``gw3`` -> 3), None outside a worker."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    match = re.fullmatch(r"gw(\d+)", name)
    return int(match.group(1)) if match else None


def assign_worker_device(option: Optional[str]) -> Optional[str]:
    """In an xdist worker with ``--gpu-devices``: sets and returns this worker's
    ``CUDA_VISIBLE_DEVICES``; None elsewhere."""
    index = worker_index()
    if option is None or index is None:
        return None
    resolved = os.environ.get(RESOLVED_ENV)
    if not resolved and option.strip() == "all":
        raise InvalidInputError(
            "--gpu-devices=all: the xdist controller did not resolve the device list"
        )
    if resolved == NO_DEVICES:
        return None  # no CUDA device here: the workers run on the CPU
    devices = parse_device_list(resolved or option)
    device = devices[index % len(devices)]
    os.environ["CUDA_VISIBLE_DEVICES"] = device
    return device
