#!/usr/bin/env python3
"""Assembles the CUDA runtime a binary wheel is built against, for one CUDA major release,
from NVIDIA's pip wheels; prints the folder.

    python3 scripts/cuda_runtime_tree.py --cuda 12|13 [--from DIR]

The folder is what GPUKEEPER_CUDA_RUNTIME_ROOT takes (cmake/pip_cuda_toolkit.cmake):
    include/    cuda_runtime_api.h, cuda.h and the rest of the runtime's headers, crt/
    lib/        libcudart_static.a
    facts.txt   cuda=<major>, wheels=<the wheel files it came from>

The core needs no more than this: its device code is PTX that the driver compiles. Each
release is pinned to one minor version (RUNTIMES below): code built against it runs on
every driver of that major release that minor-version compatibility covers, and a wheel
built twice is built the same. The cache is ${XDG_CACHE_HOME:-~/.cache}/gpukeeper/
cuda-runtime/cu<major> (GPUKEEPER_CACHE_DIR replaces ${XDG_CACHE_HOME:-~/.cache}/gpukeeper)
and is reused when present. Without network, --from names a folder that holds the wheels.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gk_cache  # noqa: E402  (scripts/gk_cache.py)


class Piece(NamedTuple):
    requirement: str  # what pip downloads
    prefix: str  # the folder inside the wheel that is copied
    into: str  # where it goes in the tree


# CUDA 12: 12.9 (cudaGetDriverEntryPointByVersion, which the core uses, is from 12.5). Its
# crt/ headers come only in the nvcc wheel, of which nothing else is kept.
# CUDA 13: 13.0, the release every CUDA 13 driver runs.
RUNTIMES: Dict[int, List[Piece]] = {
    12: [
        Piece("nvidia-cuda-runtime-cu12==12.9.79", "nvidia/cuda_runtime/include/", "include/"),
        Piece("nvidia-cuda-runtime-cu12==12.9.79", "nvidia/cuda_runtime/lib/libcudart_static.a",
              "lib/libcudart_static.a"),
        Piece("nvidia-cuda-nvcc-cu12==12.9.86", "nvidia/cuda_nvcc/include/crt/", "include/crt/"),
    ],
    13: [
        Piece("nvidia-cuda-runtime==13.0.96", "nvidia/cu13/include/", "include/"),
        Piece("nvidia-cuda-runtime==13.0.96", "nvidia/cu13/lib/libcudart_static.a",
              "lib/libcudart_static.a"),
        Piece("nvidia-cuda-crt==13.0.88", "nvidia/cu13/include/crt/", "include/crt/"),
    ],
}

# What a complete tree has; cmake/pip_cuda_toolkit.cmake checks the same files.
NEEDED = ["include/cuda_runtime_api.h", "include/cuda.h", "include/crt/host_defines.h",
          "lib/libcudart_static.a"]


def say(text: str) -> None:
    print(f"cuda-runtime: {text}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return gk_cache.cache_root("cuda-runtime")


def _wheel_name(requirement: str) -> str:
    """The file-name prefix of a requirement's wheel: nvidia_cuda_runtime_cu12-12.9.79-."""
    name, version = requirement.split("==")
    return f"{name.replace('-', '_')}-{version}-"


def _find_wheel(folder: Path, requirement: str) -> Optional[Path]:
    found = sorted(folder.glob(_wheel_name(requirement) + "*.whl"))
    return found[0] if found else None


def _download(requirements: List[str], python: str, into: Path) -> None:
    # The wheels hold no Python code: those for this machine's platform serve any build.
    command = [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "-d", str(into), *requirements]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"pip could not download {' '.join(requirements)}: {last[0]}")


def _extract(wheel: Path, piece: Piece, tree: Path) -> int:
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not name.startswith(piece.prefix) or name.endswith("/"):
                continue
            if name.endswith("__init__.py"):
                continue
            dest = tree / (piece.into + name[len(piece.prefix):])
            dest.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(name) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            count += 1
    if count == 0:
        raise RuntimeError(f"{wheel.name} holds nothing under {piece.prefix}")
    return count


def complete(tree: Path) -> bool:
    return all((tree / rel).is_file() for rel in NEEDED) and (tree / "facts.txt").is_file()


def assemble(major: int, python: str, given: Optional[Path] = None) -> Path:
    """The runtime tree for CUDA `major`, from the cache, from `given` or from PyPI."""
    if major not in RUNTIMES:
        raise ValueError(f"CUDA {major}: the binary wheels are built for CUDA "
                         f"{' and '.join(str(m) for m in sorted(RUNTIMES))}")
    pieces = RUNTIMES[major]
    dest = cache_root() / f"cu{major}"
    if complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    requirements = sorted({p.requirement for p in pieces})
    with tempfile.TemporaryDirectory(prefix="gpukeeper-cuda-runtime.", dir=dest.parent) as tmp:
        wheels = Path(tmp) / "wheels"
        wheels.mkdir()
        if given is not None:
            for requirement in requirements:
                wheel = _find_wheel(given, requirement)
                if wheel is None:
                    raise RuntimeError(f"{given} has no wheel of {requirement}")
                shutil.copy(wheel, wheels)
        else:
            say(f"downloading {' '.join(requirements)}")
            _download(requirements, python, wheels)
        tree = Path(tmp) / "tree"
        used = []
        for piece in pieces:
            wheel = _find_wheel(wheels, piece.requirement)
            if wheel is None:
                raise RuntimeError(f"pip gave no wheel of {piece.requirement}")
            _extract(wheel, piece, tree)
            used.append(wheel.name)
        (tree / "facts.txt").write_text(
            f"cuda={major}\nwheels={' '.join(sorted(set(used)))}\n")
        missing = [rel for rel in NEEDED if not (tree / rel).is_file()]
        if missing:
            raise RuntimeError(f"the wheels lack {', '.join(missing)}")
        # Whole or not at all: an interrupted run leaves no half tree for the next.
        if dest.exists():
            shutil.rmtree(dest)
        tree.rename(dest)
    say(f"CUDA {major} runtime in {dest}")
    return dest


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", type=int, required=True, choices=sorted(RUNTIMES),
                        help="the CUDA major release")
    parser.add_argument("--from", dest="given", type=Path,
                        help="a folder holding the wheels (no download)")
    args = parser.parse_args(argv)
    try:
        print(assemble(args.cuda, sys.executable, args.given))
    except (RuntimeError, ValueError, OSError) as exc:
        say(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
