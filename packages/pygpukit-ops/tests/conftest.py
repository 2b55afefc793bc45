"""Test configuration of pygpukit-ops: the shared helpers (ops_testing.py) are importable, and on a GPU
every op kernel is compiled once up front, in parallel, instead of one group at a time mid-test
(PYGPUKIT_TEST_PRECOMPILE=0 skips that for a run of a few tests)."""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session", autouse=True)
def _precompiled_kernels() -> None:
    from pygpukit.core.backend import BackendFallbackWarning, backend_state

    if os.environ.get("PYGPUKIT_TEST_PRECOMPILE", "1") == "0":  # a quick run of a few tests
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendFallbackWarning)
        if backend_state().name != "cuda":
            return
    from pygpukit.ops import precompile

    start = time.perf_counter()
    count = precompile()
    print(f"\nprecompiled {count} op kernel groups in {time.perf_counter() - start:.1f} s", file=sys.stderr)
