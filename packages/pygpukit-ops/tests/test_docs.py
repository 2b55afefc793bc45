"""Every Python example in the op library's pages (docs/api.md and the nn pages) runs, on whichever
backend is in use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[3] / "docs"
PAGES = ["api.md", "nn.md", "rope.md", "kv-cache.md", "moe.md", "attention.md", "sampling.md"]


def _blocks(page: str) -> list[str]:
    path = DOCS / page
    if not path.is_file():
        return []
    return [b for b in re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S) if "import pygpukit" in b]


EXAMPLES = [pytest.param(page, b, id=f"{page}-block{i}") for page in PAGES for i, b in enumerate(_blocks(page))]


@pytest.mark.parametrize(("page", "block"), EXAMPLES)
def test_example_runs(page: str, block: str) -> None:
    exec(compile(block, str(DOCS / page), "exec"), {"__name__": "docs_example"})


def test_the_api_page_has_examples() -> None:
    assert len(_blocks("api.md")) >= 5
