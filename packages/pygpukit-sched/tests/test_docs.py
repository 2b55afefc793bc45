"""Every Python example in docs/scheduler.md runs (on the CPU backend in CI, on the GPU there). The
convention of every docs harness is described in packages/pygpukit-core/tests/test_docs.py:
``<!-- skip: <reason> -->`` before a fence skips the block with that reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "scheduler.md"
FENCE = re.compile(r"(?:<!--\s*skip:(?P<reason>[^>]*?)-->[ \t]*\n)?```python\n(?P<code>.*?)```", re.S)


def blocks() -> list[tuple[int, str, str | None]]:
    """(index, code, skip reason or None) of every ```python block of the page, in order."""
    if not DOC.is_file():
        return []
    return [(i, m.group("code"), None if m.group("reason") is None else m.group("reason").strip())
            for i, m in enumerate(FENCE.finditer(DOC.read_text()))]  # fmt: skip


def claimed() -> set[tuple[str, int]]:
    """The (page, block index) pairs this harness runs or skips."""
    return {(DOC.name, i) for i, _, _ in blocks()}


EXAMPLES = [pytest.param(code, marks=[pytest.mark.skip(reason=f"block {i}: {reason}")] if reason else [],
                         id=f"block{i}") for i, code, reason in blocks()]  # fmt: skip


@pytest.mark.parametrize("block", EXAMPLES)
def test_example_runs(block: str) -> None:
    from pygpukit import scheduler

    try:
        exec(compile(block, str(DOC), "exec"), {"__name__": "docs_example"})
    finally:
        scheduler.shutdown()


def test_the_page_has_examples() -> None:
    assert blocks()
