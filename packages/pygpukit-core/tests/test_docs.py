"""Every Python example of docs/core.md, docs/getting-started.md and README.md (the README's language
model example aside: packages/pygpukit-llm/tests/test_docs.py) runs on whichever backend is in use.

The convention every docs harness follows (packages/*/tests/test_docs.py): each ```python block of
docs/*.md and README.md is executed by exactly one harness, unless the line before its fence is
``<!-- skip: <reason> -->`` (then it is reported as skipped with that reason). A block whose first line
is ``# needs: gpu`` is marked gpu: it runs where the CUDA backend is available and is skipped, with the
reason, elsewhere. test_every_block_has_a_harness checks that no block is left out.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
PAGES = ["core.md", "getting-started.md", "README.md"]
FENCE = re.compile(r"(?:<!--\s*skip:(?P<reason>[^>]*?)-->[ \t]*\n)?```python\n(?P<code>.*?)```", re.S)


def page_path(page: str) -> Path:
    return ROOT / page if page == "README.md" else DOCS / page


def blocks(page: str) -> list[tuple[int, str, str | None]]:
    """(index, code, skip reason or None) of every ```python block of ``page``, in order."""
    path = page_path(page)
    if not path.is_file():
        return []
    return [(i, m.group("code"), None if m.group("reason") is None else m.group("reason").strip())
            for i, m in enumerate(FENCE.finditer(path.read_text()))]  # fmt: skip


def _mine(page: str, code: str) -> bool:
    return page != "README.md" or "pygpukit.llm" not in code  # the README's model example: the llm harness


def claimed() -> set[tuple[str, int]]:
    """The (page, block index) pairs this harness runs or skips."""
    return {(page, i) for page in PAGES for i, code, _ in blocks(page) if _mine(page, code)}


def _param(page: str, index: int, code: str, reason: str | None) -> object:
    marks: list[pytest.MarkDecorator] = []
    if reason is not None:
        marks.append(pytest.mark.skip(reason=f"{page} block {index}: {reason}"))
    elif code.startswith("# needs: gpu"):
        marks.append(pytest.mark.gpu)
    return pytest.param(page, code, marks=marks, id=f"{page}-block{index}")


EXAMPLES = [_param(page, i, code, reason) for page in PAGES for i, code, reason in blocks(page) if _mine(page, code)]


@pytest.mark.parametrize(("page", "block"), EXAMPLES)
def test_example_runs(page: str, block: str) -> None:
    if "import torch" in block:
        pytest.importorskip("torch")
    exec(compile(block, str(page_path(page)), "exec"), {"__name__": "docs_example"})


def test_the_pages_have_examples() -> None:
    assert len(blocks("core.md")) >= 10
    assert blocks("getting-started.md")


def test_skip_markers_give_a_reason() -> None:
    for path in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        for match in re.finditer(r"<!--\s*skip:(?P<reason>[^>]*?)-->", path.read_text()):
            assert match.group("reason").strip(), f"{path.name}: a skip marker without a reason"


def _harness(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_docs_harness_{path.parents[1].name.replace('-', '_')}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_block_has_a_harness() -> None:
    """Each ```python block of docs/*.md and README.md is claimed (run, or skipped with a reason) by
    exactly one of the packages' docs harnesses."""
    owners: dict[tuple[str, int], list[str]] = {}
    for path in sorted(ROOT.glob("packages/*/tests/test_docs.py")):
        module = _harness(path) if path != Path(__file__).resolve() else None
        for key in module.claimed() if module is not None else claimed():
            owners.setdefault(key, []).append(path.parents[1].name)
    pages = [p.name for p in sorted(DOCS.glob("*.md"))] + ["README.md"]
    every = {(page, i) for page in pages for i, _, _ in blocks(page)}
    missing = sorted(every - owners.keys())
    assert not missing, f"python blocks no docs harness runs or skips: {missing}"
    shared = {key: names for key, names in owners.items() if len(names) > 1}
    assert not shared, f"python blocks claimed by more than one harness: {shared}"
    assert not owners.keys() - every, "a harness claims a block that does not exist"
