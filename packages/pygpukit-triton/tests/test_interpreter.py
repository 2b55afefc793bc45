"""Without a GPU: every Triton kernel, through its wrapper, run by Triton's interpreter on the CPU
backend and compared with the built-in op (interpreter_checks.py, in a fresh process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("interpreter_checks.py")


def test_kernels_match_the_builtin_ops_in_the_interpreter() -> None:
    triton = pytest.importorskip("triton")
    if tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 7):
        pytest.skip(f"Triton {triton.__version__}'s interpreter calls int() on 1-element arrays (NumPy 2.4 refuses)")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYGPUKIT_BACKEND": "cpu"}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=900, env=env,
                          check=False)  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "OK interpreter" in done.stdout
