#!/usr/bin/env python3
"""Fetches the C++ headers of each supported PyTorch release into a per-user cache, for
building the allocator component against them; prints one header folder per line.

    python3 scripts/torch_headers.py [--release 2.11 ...] [--headers DIR ...] [--missing-ok]

A header folder holds:
    include/    torch/include of the release's wheel (c10/cuda/CUDACachingAllocator.h, ...)
    extra/      headers a CPU build of PyTorch lacks (c10/cuda/impl/cuda_cmake_macros.h)
    facts.txt   version=, release=, cuda=, cxx11_abi=, sonames= (one per line), read by
                cmake/torch_component.cmake

Only the headers are kept: the wheel (500-900 MB) is downloaded with `pip download` into
a temporary folder, and its libraries are only read for their SONAMEs and C++ ABI. The
cache is ${XDG_CACHE_HOME:-~/.cache}/gpukeeper/torch-headers/<version> (GPUKEEPER_CACHE_DIR
replaces ${XDG_CACHE_HOME:-~/.cache}/gpukeeper) and is reused when present. Without
network, --headers points at what is already on the machine: a header folder as above,
an installed torch package folder (site-packages/torch), or a torch wheel file.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import IO, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gk_cache  # noqa: E402  (scripts/gk_cache.py)

ROOT = Path(__file__).resolve().parent.parent


def _load_builds():
    # By path: the build runs before gpukeeper is installed, and importing the package
    # would need its compiled module.
    path = ROOT / "python" / "gpukeeper" / "integrations" / "torch_builds.py"
    spec = importlib.util.spec_from_file_location("gpukeeper_torch_builds", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


builds = _load_builds()

# A CPU build of PyTorch does not generate this header; its CUDA builds define this macro.
CUDA_MACROS = "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"


def say(text: str) -> None:
    print(f"torch-headers: {text}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return gk_cache.cache_root("torch-headers")


def read_facts(folder: Path) -> Dict[str, str]:
    facts: Dict[str, str] = {}
    for line in (folder / "facts.txt").read_text().splitlines():
        key, _, value = line.partition("=")
        facts[key.strip()] = value.strip()
    return facts


def _version_py(text: str) -> Dict[str, str]:
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
    if version is None:
        raise ValueError("torch/version.py names no __version__")
    return {"version": version.group(1), "cuda": cuda.group(1) if cuda else ""}


def _cxx11_abi(libc10: bytes) -> int:
    # A library built with the new libstdc++ ABI names std::__cxx11 types in its symbols.
    return 1 if b"__cxx11" in libc10 else 0


def _write(folder: Path, facts: Dict[str, str], include: Optional[Path]) -> Path:
    """Completes a header folder being made in `folder` (include/ already there unless
    `include` is given, which include/ then links to)."""
    if include is not None:
        (folder / "include").symlink_to(include.resolve(), target_is_directory=True)
    inc = folder / "include"
    if not (inc / "c10" / "cuda" / "CUDACachingAllocator.h").exists():
        raise ValueError("its headers lack c10/cuda/CUDACachingAllocator.h")
    if not (inc / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists():
        macros = folder / "extra" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
        macros.parent.mkdir(parents=True, exist_ok=True)
        macros.write_text(CUDA_MACROS)
    else:
        (folder / "extra").mkdir(exist_ok=True)
    facts["release"] = builds.release_of(facts["version"])
    lines = [f"{k}={facts[k]}" for k in ("version", "release", "cuda", "cxx11_abi", "sonames")]
    (folder / "facts.txt").write_text(
        "# The PyTorch release these headers come from (scripts/torch_headers.py).\n"
        + "\n".join(lines)
        + "\n"
    )
    return folder


def _sonames(open_lib) -> str:
    """The SONAMEs of PyTorch's libraries the component links, each by its file name where
    the build lacks it (a CPU build has no libc10_cuda.so): every release names each
    library by its file name."""
    names = []
    for lib in builds.TORCH_LIBRARIES:
        f = open_lib(lib)
        if f is None:
            names.append(lib)
            continue
        with f:
            soname = builds.elf_dynamic(f)["soname"]
        names.append(soname[0] if soname else lib)
    return ",".join(names)


def from_wheel(wheel: Path, dest: Path) -> Path:
    """A header folder at `dest` from a torch wheel file."""
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        with zipfile.ZipFile(wheel) as z:
            facts = _version_py(z.read("torch/version.py").decode())
            members = [n for n in z.namelist() if n.startswith("torch/include/") and not n.endswith("/")]
            for name in members:
                target = tmp / "include" / name[len("torch/include/"):]
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(name) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
            facts["cxx11_abi"] = str(_cxx11_abi(z.read("torch/lib/libc10.so")))
            present = set(z.namelist())

            def open_lib(lib: str) -> Optional[IO[bytes]]:
                if f"torch/lib/{lib}" not in present:
                    return None
                # Read from a copy: a member seeks backward by decompressing again from
                # its start, and libtorch_cuda.so is 400 MB and more.
                copy = tempfile.TemporaryFile(dir=tmp)
                with z.open(f"torch/lib/{lib}") as src:
                    shutil.copyfileobj(src, copy, 1 << 20)
                copy.seek(0)
                return copy

            facts["sonames"] = _sonames(open_lib)
        _write(tmp, facts, None)
        return _publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def from_package(package: Path, dest: Path) -> Path:
    """A header folder at `dest` from an installed torch package folder; include/ links to
    the package's own headers."""
    facts = _version_py((package / "version.py").read_text())
    facts["cxx11_abi"] = str(_cxx11_abi((package / "lib" / "libc10.so").read_bytes()))

    def open_lib(lib: str) -> Optional[IO[bytes]]:
        path = package / "lib" / lib
        return open(path, "rb") if path.exists() else None

    facts["sonames"] = _sonames(open_lib)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        _write(tmp, facts, package / "include")
        return _publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish(tmp: Path, dest: Path) -> Path:
    # Whole or not at all: an interrupted fetch leaves no half folder for the next run.
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def download(version: str, python: str, into: Path) -> Path:
    """The torch==version wheel, downloaded by pip into `into`."""
    base = [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            f"torch=={version}", "-d", str(into)]
    # This interpreter may be one no torch wheel is made for: any CPython wheel for Linux
    # holds the same headers.
    machine = os.uname().machine
    tries = [base, base + ["--python-version", "3.12", "--implementation", "cp",
                           "--platform", f"manylinux_2_28_{machine}"]]
    errors = ""
    for command in tries:
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = sorted(into.glob("torch-*.whl"))
        if done.returncode == 0 and wheels:
            return wheels[0]
        errors = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
        errors = errors[0]
    raise RuntimeError(f"pip could not download torch=={version}: {errors}")


def fetch(release: str, python: str, given: Dict[str, Path]) -> Path:
    pin = builds.HEADER_PINS[release]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    source = given.get(release)
    if source is not None:
        if (source / "facts.txt").exists():
            return source
        dest = root / f"local-{release}"
        if source.is_file():
            return from_wheel(source, dest)
        if (source / "version.py").exists() and (source / "include").is_dir():
            return from_package(source, dest)
        raise ValueError(f"{source}: not a header folder, a torch package folder or a wheel")
    dest = root / pin
    if (dest / "facts.txt").exists():
        return dest
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpukeeper-torch-wheel.") as tmp:
        say(f"downloading torch {pin} for its headers")
        wheel = download(pin, python, Path(tmp))
        folder = from_wheel(wheel, dest)
    say(f"torch {read_facts(folder)['version']}: headers in {folder} ({time.monotonic() - start:.0f} s)")
    return folder


def _given(items: List[str]) -> Dict[str, Path]:
    """--headers values: DIR or RELEASE=DIR; the release of a bare DIR is read from it."""
    out: Dict[str, Path] = {}
    for item in items:
        release, sep, path = item.partition("=")
        if not sep:
            path, release = item, ""
        folder = Path(path).expanduser()
        if not release:
            if (folder / "facts.txt").exists():
                release = read_facts(folder)["release"]
            elif (folder / "version.py").exists():
                release = builds.release_of(_version_py((folder / "version.py").read_text())["version"])
            elif folder.is_file() and folder.name.startswith("torch-"):
                release = builds.release_of(folder.name.split("-")[1])
            else:
                raise SystemExit(f"torch-headers: cannot tell which release {folder} holds; "
                                 "name it as RELEASE=DIR")
        out[builds.release_of(release)] = folder
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--release", action="append", default=[],
                   help="a release to fetch (default: every supported one); repeatable")
    p.add_argument("--headers", action="append", default=[], metavar="[RELEASE=]DIR",
                   help="use what is on this machine for a release: a header folder, an "
                        "installed torch package folder or a torch wheel; repeatable")
    p.add_argument("--missing-ok", action="store_true",
                   help="leave out, with a warning, releases whose headers cannot be had")
    p.add_argument("--python", default=sys.executable, help="the Python whose pip downloads")
    args = p.parse_args(argv)
    given = _given(args.headers)
    releases = [builds.release_of(r) for r in args.release] or list(builds.SUPPORTED)
    unknown = [r for r in releases if r not in builds.HEADER_PINS]
    if unknown:
        p.error(f"not a supported release: {', '.join(unknown)} (supported: {', '.join(builds.SUPPORTED)})")
    failed = []
    for release in releases:
        try:
            print(fetch(release, args.python, given), flush=True)
        except (OSError, RuntimeError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            failed.append(release)
            say(f"torch {release}: {exc}")
    if failed and not args.missing_ok:
        say(f"no headers for torch {', '.join(failed)}; --missing-ok builds without them")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
