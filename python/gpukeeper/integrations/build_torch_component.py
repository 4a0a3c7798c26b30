"""``python -m gpukeeper.integrations.build_torch_component``: builds the PyTorch allocator
component for the installed PyTorch where the package carries none for its release (see
``torch_component.build``), or says which build serves it. ``--status`` only reports."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

__all__ = ["main"]


def main(argv: Optional[List[str]] = None) -> int:
    """Returns 0 when a component serves the installed PyTorch (after building it), else 1."""
    from gpukeeper.base.errors import GpuError
    from gpukeeper.integrations import torch_component

    p = argparse.ArgumentParser(
        prog="python -m gpukeeper.integrations.build_torch_component",
        description="Builds gpukeeper's PyTorch allocator component for the installed PyTorch "
        "(once, into a per-user cache) unless a build for its release exists. Carried: torch "
        + ", ".join(torch_component.supported_releases())
        + ".",
    )
    p.add_argument("--status", action="store_true", help="only say which build serves, or why none")
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed", file=sys.stderr)
        return 1
    path = torch_component.library_path(torch)
    if path is None and not args.status:
        try:
            path = torch_component.build(torch)
        except GpuError as exc:
            print(exc, file=sys.stderr)
            return 1
    if path is None:
        print(f"no PyTorch allocator component for torch {torch.__version__}", file=sys.stderr)
        return 1
    print(f"torch {torch.__version__}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
