"""Every Python example in docs/core.md runs (GPU-only ones, marked `# needs: gpu`, on a GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "core.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def _marks(block: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.gpu] if block.startswith("# needs: gpu") else []


@pytest.mark.parametrize("block", [pytest.param(b, marks=_marks(b), id=f"block{i}") for i, b in enumerate(BLOCKS)])
def test_example_runs(block: str) -> None:
    if "import torch" in block:
        pytest.importorskip("torch")
    exec(compile(block, str(DOC), "exec"), {"__name__": "docs_example"})


def test_the_page_has_examples() -> None:
    assert len(BLOCKS) >= 10
