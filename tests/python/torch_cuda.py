"""PyTorch with a usable CUDA device, for the tests that need one.

``torch_cuda()`` returns ``torch`` and skips the calling test when PyTorch is missing or
cannot use CUDA; ``torch_cuda_usable()`` answers the same question without skipping (for
``skipif`` at import)."""

from __future__ import annotations

from typing import Any

import pytest


def torch_cuda_usable() -> bool:
    """Whether PyTorch is installed and can use CUDA (imports torch when it is there)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def torch_cuda() -> Any:
    """``torch``, or a skip of the calling test when PyTorch cannot use CUDA here."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch cannot use CUDA here")
    return torch
