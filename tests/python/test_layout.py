"""The package's layout: no two modules share a file name; the imports the requirement
documents write work without a warning; the former module paths still import, as the
modules that hold their code now, with a DeprecationWarning naming the new path."""

from __future__ import annotations

import collections
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import gpukeeper

PACKAGE = Path(gpukeeper.__file__).resolve().parent

# Former module paths, kept for one release with a DeprecationWarning (CHANGELOG.md).
FORMER = {
    "gpukeeper.device": "gpukeeper.account.device_utils",
    "gpukeeper.faiss_helpers": "gpukeeper.account.faiss_helpers",
    "gpukeeper.manager": "gpukeeper.account.memory_manager",
    "gpukeeper.memory": "gpukeeper.pool.memory_pool",
    "gpukeeper.oom": "gpukeeper.pool.oom_retry",
}


def test_no_two_modules_share_a_file_name() -> None:
    names = collections.Counter(p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert [n for n, count in names.items() if count > 1] == []


def test_every_module_opens_with_a_docstring() -> None:
    bare = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
            if not p.read_text().lstrip().startswith('"""')]
    assert bare == []


# What the requirement documents import, with the import path changed to gpukeeper (the
# memory guide's Rust `use` lines as the same names in Python): the package's contract.
REQUIREMENT_IMPORTS = [
    "from gpukeeper.cleanup import GPUContext",
    "from gpukeeper.cleanup import cleanup_models",
    "from gpukeeper.cleanup import GPUContext, cleanup_models, cleanup_cuda",
    "from gpukeeper import MemoryPool, Precision, GpuError, InvalidInputError, AllocationError",
    "from gpukeeper import ManagedBuffer, BufferBatch",
    "from gpukeeper import get_device, retry_on_oom",
    "from gpukeeper import get_gpu_memory_manager",
    "from gpukeeper import calculate_faiss_temp_memory",
    "from gpukeeper import create_faiss_gpu_resources",
    "from gpukeeper import create_faiss_index",
    "from gpukeeper import get_device, warmup_cuda, get_gpu_memory_info",
    "from gpukeeper import get_gpu_memory_info, check_memory_leak",
    "from gpukeeper import benchmark_md_trajectory",
    "from gpukeeper import benchmark_function",
    "from gpukeeper import compare_implementations, print_comparison_table",
    "from gpukeeper import get_gpu_info, CUDATimer, BenchmarkResult, ProfilerContext",
]


def _fresh(code: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True,
                          text=True, timeout=120)


def test_requirement_imports_work_without_a_warning() -> None:
    done = _fresh("\n".join(REQUIREMENT_IMPORTS), "-W", "error::DeprecationWarning",
                  "-W", "error::PendingDeprecationWarning", "-W", "error::FutureWarning")
    assert done.returncode == 0, done.stderr


def test_former_paths_name_the_moved_modules() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for old, new in FORMER.items():
            assert importlib.import_module(old) is importlib.import_module(new), old
            assert getattr(gpukeeper, old.rsplit(".", 1)[1]) is importlib.import_module(new), old


def test_former_paths_warn_on_import_and_name_the_new_path() -> None:
    for old, new in FORMER.items():
        code = (f"import {old}, {new}, sys; assert sys.modules[{old!r}] is {new}; "
                f"from {old} import __name__ as name; assert name == {new!r}")
        quiet = _fresh(code, "-W", "ignore::DeprecationWarning")
        assert quiet.returncode == 0, quiet.stderr
        loud = _fresh(code, "-W", "error::DeprecationWarning")
        assert loud.returncode != 0, old
        assert "DeprecationWarning" in loud.stderr and new in loud.stderr, loud.stderr
        assert "next release" in loud.stderr, loud.stderr


def test_former_path_warning_points_at_the_importing_line() -> None:
    done = _fresh("import warnings\nwarnings.simplefilter('always')\nimport gpukeeper.memory\n"
                  "from gpukeeper import oom\n")
    assert done.returncode == 0, done.stderr
    assert "<string>:3: DeprecationWarning: gpukeeper.memory" in done.stderr, done.stderr
    assert "<string>:4: DeprecationWarning: gpukeeper.oom" in done.stderr, done.stderr
