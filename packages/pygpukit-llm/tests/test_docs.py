"""Every Python example of docs/llm.md, and the README's language model example, runs on whichever
backend is in use (the ones that use the default model need it in the cache: `python -m pygpukit
models pull`). The convention of every docs harness is described in
packages/pygpukit-core/tests/test_docs.py: ``<!-- skip: <reason> -->`` before a fence skips the block
with that reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "llm.md"
README = ROOT / "README.md"
FENCE = re.compile(r"(?:<!--\s*skip:(?P<reason>[^>]*?)-->[ \t]*\n)?```python\n(?P<code>.*?)```", re.S)


def blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """(index, code, skip reason or None) of every ```python block of ``path``, in order."""
    if not path.is_file():
        return []
    return [(i, m.group("code"), None if m.group("reason") is None else m.group("reason").strip())
            for i, m in enumerate(FENCE.finditer(path.read_text()))]  # fmt: skip


def _mine(path: Path, code: str) -> bool:
    return path == PAGE or "pygpukit.llm" in code  # the README's other blocks: the core harness


def claimed() -> set[tuple[str, int]]:
    """The (page, block index) pairs this harness runs or skips."""
    return {(path.name, i) for path in (PAGE, README) for i, code, _ in blocks(path) if _mine(path, code)}


def _param(path: Path, index: int, code: str, reason: str | None) -> object:
    marks = [pytest.mark.skip(reason=f"{path.name} block {index}: {reason}")] if reason is not None else []
    if path == README:
        marks.append(pytest.mark.slow)  # generation on the CPU backend takes minutes
    return pytest.param(path, code, marks=marks, id=f"{path.name}-block{index}")


EXAMPLES = [_param(path, i, code, reason) for path in (PAGE, README) for i, code, reason in blocks(path)
            if _mine(path, code)]  # fmt: skip


@pytest.mark.parametrize(("path", "block"), EXAMPLES)
def test_example_runs(path: Path, block: str, smollm2_gguf: Path) -> None:
    # smollm2_gguf: skips (or, in CI, fails) where the default model is not in the cache.
    exec(compile(block, str(path), "exec"), {"__name__": "docs_example"})


def test_the_page_has_examples() -> None:
    assert len(blocks(PAGE)) >= 6
