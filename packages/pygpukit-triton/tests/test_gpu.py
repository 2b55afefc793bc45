"""GPU tests of pygpukit.triton: every check of gpu_checks.py in a fresh process where torch cannot be
imported, which asserts at the end that torch was never imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("gpu_checks.py")
CHECKS = [
    "user_kernel_every_dtype",
    "stream_order_and_context",
    "graph_capture_replay_bitwise",
    "user_kernel_in_graph",
    "typed_errors",
    "norms",
    "softmax",
    "rotary",
    "swiglu",
    "matmul",
    "routing_auto_on_gpu",
    "builtin_ops_follow_routes",
    "triton_failure_is_typed",
]


def test_the_list_names_every_check() -> None:
    lines = SCRIPT.read_text().splitlines()
    defined = sorted(line[len("def check_") :].split("(")[0] for line in lines if line.startswith("def check_"))
    assert defined == sorted(CHECKS)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CHECKS)
def test_gpu_check(name: str) -> None:
    pytest.importorskip("triton")
    done = subprocess.run([sys.executable, str(SCRIPT), name], capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    assert f"OK {name}" in done.stdout
