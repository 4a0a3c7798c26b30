"""The PyTorch releases the allocator component is built for, how each build is named, and
what an ELF library needs, read from the file without loading it.

This is the one list of supported releases: the wheel build (scripts/torch_headers.py,
which loads this file by path, so it must import nothing outside the standard library),
the wheel check and ``torch_component`` all read it. PyTorch's C++ allocator interface is
stable within a minor release and changes between them, so a build serves one
``major.minor`` and any patch of it.
"""

from __future__ import annotations

import re
import struct
from typing import IO, Dict, List, Optional, Tuple, Union

__all__ = [
    "SUPPORTED",
    "HEADER_PINS",
    "TORCH_LIBRARIES",
    "release_of",
    "file_name",
    "cxx_standard",
    "release_of_file",
    "elf_dynamic",
]

# The releases the wheel carries a component for, oldest first.
SUPPORTED: Tuple[str, ...] = ("2.9", "2.10", "2.11", "2.12", "2.13", "2.14")

# The exact version whose headers each build is compiled against: the newest patch
# release, as a build serves every patch of its minor release.
HEADER_PINS: Dict[str, str] = {
    "2.9": "2.9.1",
    "2.10": "2.10.0",
    "2.11": "2.11.0",
    "2.12": "2.12.1",
    "2.13": "2.13.0",
    "2.14": "2.14.1",
}

# The PyTorch libraries the component calls into (file names in torch/lib; each carries
# its file name as its SONAME, which the build checks in the downloaded wheel).
TORCH_LIBRARIES: Tuple[str, ...] = ("libc10.so", "libc10_cuda.so", "libtorch_cuda.so")

_PREFIX = "libgpukeeper_torch_"


def release_of(version: str) -> str:
    """'2.11' of '2.11.0+cu130' (or of '2.11'): the part that names the C++ interface.
    Raises ValueError for a version that does not start with major.minor."""
    m = re.match(r"^(\d+)\.(\d+)(?:[.+a-z]|$)", version.strip())
    if m is None:
        raise ValueError(f"not a PyTorch version: {version!r}")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def file_name(release: str) -> str:
    """The component's file name for a release: libgpukeeper_torch_2_11.so for '2.11'."""
    return f"{_PREFIX}{release_of(release).replace('.', '_')}.so"


def cxx_standard(release: str) -> int:
    """The C++ standard a build for `release` is compiled as: 2.14's headers need C++20
    (cmake/torch_component.cmake follows the same rule)."""
    major, minor = (int(x) for x in release_of(release).split("."))
    return 20 if (major, minor) >= (2, 14) else 17


def release_of_file(name: str) -> Optional[str]:
    """The release a component file was built for, from its name; None for other names."""
    m = re.fullmatch(re.escape(_PREFIX) + r"(\d+)_(\d+)\.so", name)
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


# ---------------------------------------------------------------- ELF, read as data

_DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 1, 5, 14, 15, 29


def elf_dynamic(source: Union[str, IO[bytes]]) -> Dict[str, List[str]]:
    """The dynamic section of a 64-bit little-endian ELF file (x86-64, aarch64), a path or
    a seekable binary file (a wheel's member, too):
    ``{"needed": [...], "soname": [...], "rpath": [...], "runpath": [...]}``, read without
    loading it (a library built for another PyTorch must never be loaded). Raises
    ValueError for a file that is not such an ELF file."""
    if isinstance(source, str):
        with open(source, "rb") as f:
            return _elf_dynamic(f, source)
    return _elf_dynamic(source, getattr(source, "name", "ELF file"))


def _elf_dynamic(f: IO[bytes], path: str) -> Dict[str, List[str]]:
    ident = f.read(64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", ident, 32)
    phentsize, phnum = struct.unpack_from("<HH", ident, 54)
    f.seek(phoff)
    headers = f.read(phentsize * phnum)
    loads: List[Tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: Optional[Tuple[int, int]] = None
    for i in range(phnum):
        p_type, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from(
            "<IIQQQQ", headers, i * phentsize
        )
        if p_type == 1:
            loads.append((vaddr, offset, filesz))
        elif p_type == 2:
            dynamic = (offset, filesz)
    out: Dict[str, List[str]] = {"needed": [], "soname": [], "rpath": [], "runpath": []}
    if dynamic is None:
        return out
    f.seek(dynamic[0])
    raw = f.read(dynamic[1])
    entries = [struct.unpack_from("<qQ", raw, i) for i in range(0, len(raw) - 15, 16)]
    strtab = next((value for tag, value in entries if tag == _DT_STRTAB), None)
    if strtab is None:
        return out
    base = next((off + strtab - va for va, off, size in loads if va <= strtab < va + size), None)
    if base is None:
        raise ValueError(f"{path}: its string table lies in no loaded segment")
    names = {_DT_NEEDED: "needed", _DT_SONAME: "soname", _DT_RPATH: "rpath", _DT_RUNPATH: "runpath"}
    wanted: List[Tuple[int, int, str]] = []  # (string offset, entry index, key)
    for index, (tag, value) in enumerate(entries):
        if tag == 0:
            break
        if tag in names:
            wanted.append((value, index, names[tag]))
    # Read in file order: a wheel's member seeks forward cheaply and backward by
    # decompressing again from its start.
    texts: Dict[int, str] = {}
    for value, index, _key in sorted(wanted):
        f.seek(base + value)
        texts[index] = f.read(4096).split(b"\0", 1)[0].decode(errors="replace")
    for _value, index, key in sorted(wanted, key=lambda w: w[1]):
        out[key].append(texts[index])
    return out
