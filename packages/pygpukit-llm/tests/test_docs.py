"""Every Python example of docs/llm.md runs, on whichever backend is in use (the ones that use the
default model need it in the cache: `python -m pygpukit models pull`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[3] / "docs" / "llm.md"
BLOCKS = [b for b in re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S) if "import pygpukit" in b]


@pytest.mark.parametrize("block", [pytest.param(b, id=f"block{i}") for i, b in enumerate(BLOCKS)])
def test_example_runs(block: str, smollm2_gguf: Path) -> None:
    # smollm2_gguf: skips (or, in CI, fails) where the default model is not in the cache.
    exec(compile(block, str(PAGE), "exec"), {"__name__": "docs_example"})


def test_the_page_has_examples() -> None:
    assert len(BLOCKS) >= 6
