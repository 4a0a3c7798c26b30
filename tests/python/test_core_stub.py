"""The type stub of the compiled core (python/gpukeeper/_core.pyi) carries the core's own
docstrings, written once in csrc/bindings: the docs site's API reference reads the stub
(griffe never imports the core), so a docstring changed in C++ must reach it.
``python3 scripts/sync-core-stub-docs.py`` copies them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from gpukeeper import _core

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sync_core_stub_docs", ROOT / "scripts" / "sync-core-stub-docs.py")
sync = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["sync_core_stub_docs"] = sync
_spec.loader.exec_module(sync)  # type: ignore[union-attr]


def test_stub_carries_the_core_docstrings() -> None:
    source = sync.STUB.read_text()
    assert sync.synced(source, _core) == source, "run: python3 scripts/sync-core-stub-docs.py"


def test_sync_drops_pybind_signature_and_fills_a_bare_stub() -> None:
    class Fake:
        def method(self) -> int:
            """method(self: Fake, x: int) -> int

            Does the thing, carefully."""
            return 0

    module = type(sys)("fake_core")
    module.Fake = Fake  # type: ignore[attr-defined]
    stub = "class Fake:\n    def method(self) -> int: ...\n    def other(self) -> None: ...\n"
    out = sync.synced(stub, module)
    assert out == ('class Fake:\n    def method(self) -> int:\n        """Does the thing, carefully."""\n'
                   "    def other(self) -> None: ...\n")
    assert sync.synced(out, module) == out  # idempotent: a docstring is replaced, not added

