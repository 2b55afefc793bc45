"""Every Python example in docs/scheduler.md runs (on the CPU backend in CI, on the GPU there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "scheduler.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_example_runs(block: str) -> None:
    from pygpukit import scheduler

    try:
        exec(compile(block, str(DOC), "exec"), {"__name__": "docs_example"})
    finally:
        scheduler.shutdown()


def test_the_page_has_examples() -> None:
    assert BLOCKS
