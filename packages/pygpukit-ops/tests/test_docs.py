"""Every Python example in docs/api.md runs (on whichever backend is in use)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "api.md"
BLOCKS = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S) if "import pygpukit" in b]


@pytest.mark.parametrize("block", [pytest.param(b, id=f"block{i}") for i, b in enumerate(BLOCKS)])
def test_example_runs(block: str) -> None:
    exec(compile(block, str(DOC), "exec"), {"__name__": "docs_example"})


def test_the_page_has_examples() -> None:
    assert len(BLOCKS) >= 5
