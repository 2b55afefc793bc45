"""Every Python example of the op library's pages runs, on whichever backend is in use: every page of
docs/ that no other harness owns (docs/api.md, the nn pages, and any page added later).

The convention of every docs harness (see packages/pygpukit-core/tests/test_docs.py, which also checks
that each block has exactly one harness): a block right after ``<!-- skip: <reason> -->`` is skipped
with that reason; a block whose first line is ``# needs: gpu`` runs only where the CUDA backend is
(``# needs: gpu, triton``: and is skipped where Triton is not installed).
Also checks that every ``gp.<name>`` the pages use is in ``pygpukit.__all__`` (or a subpackage).
"""

from __future__ import annotations

import importlib.util
import re
import types
from pathlib import Path

import pytest

import pygpukit as gp

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
OTHER_HARNESSES = {"core.md", "getting-started.md", "llm.md", "scheduler.md"}  # core, llm and sched tests
PAGES = [p.name for p in sorted(DOCS.glob("*.md")) if p.name not in OTHER_HARNESSES]
FENCE = re.compile(r"(?:<!--\s*skip:(?P<reason>[^>]*?)-->[ \t]*\n)?```python\n(?P<code>.*?)```", re.S)


def blocks(page: str) -> list[tuple[int, str, str | None]]:
    """(index, code, skip reason or None) of every ```python block of ``page``, in order."""
    path = DOCS / page
    if not path.is_file():
        return []
    return [(i, m.group("code"), None if m.group("reason") is None else m.group("reason").strip())
            for i, m in enumerate(FENCE.finditer(path.read_text()))]  # fmt: skip


def claimed() -> set[tuple[str, int]]:
    """The (page, block index) pairs this harness runs or skips."""
    return {(page, i) for page in PAGES for i, _, _ in blocks(page)}


def _param(page: str, index: int, code: str, reason: str | None) -> object:
    marks: list[pytest.MarkDecorator] = []
    needs = (
        code.partition("\n")[0].removeprefix("# needs:").replace(" ", "").split(",")
        if code.startswith("# needs:")
        else []
    )
    if reason is None and "triton" in needs and importlib.util.find_spec("triton") is None:
        reason = "needs Triton, which is not installed here (pygpukit-triton's `triton` extra)"
    if reason is not None:
        marks.append(pytest.mark.skip(reason=f"{page} block {index}: {reason}"))
    elif "gpu" in needs:
        marks.append(pytest.mark.gpu)
    return pytest.param(page, code, marks=marks, id=f"{page}-block{index}")


EXAMPLES = [_param(page, i, code, reason) for page in PAGES for i, code, reason in blocks(page)]


@pytest.mark.parametrize(("page", "block"), EXAMPLES)
def test_example_runs(page: str, block: str) -> None:
    exec(compile(block, str(DOCS / page), "exec"), {"__name__": "docs_example"})


def test_the_api_page_has_examples() -> None:
    assert len(blocks("api.md")) >= 5


def test_every_top_level_name_the_docs_use_is_exported() -> None:
    """``gp.<name>`` in any Python block of docs/*.md or README.md is in ``gp.__all__`` (the runtime's
    names and the op library's) or is a subpackage (``gp.ops``, ``gp.core``, ...)."""
    used: dict[str, str] = {}
    for path in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        for match in FENCE.finditer(path.read_text()):
            for name in re.findall(r"\bgp\.([A-Za-z_]\w*)", match.group("code")):
                used.setdefault(name, path.name)
    assert len(used) > 50
    exported = set(gp.__all__)
    missing = {name: page for name, page in used.items()
               if name not in exported and not isinstance(getattr(gp, name, None), types.ModuleType)}  # fmt: skip
    assert not missing, f"gp.<name> used in the docs but not in gp.__all__: {missing}"


def test_all_lists_the_runtime_and_the_op_library() -> None:
    names = gp.__all__
    assert len(names) == len(set(names))
    for name in ("GPUArray", "jit", "DataType", "DeviceCapabilities", "KernelType", "int4", "add", "matmul",
                 "gemv", "rope_inplace", "sdpa_causal"):  # fmt: skip
        assert name in names, name
        assert getattr(gp, name) is not None
    assert gp.gemv is gp.ops.gemv
    assert gp.rope_inplace is gp.ops.rope_inplace
    namespace: dict[str, object] = {}
    exec("from pygpukit import *", namespace)
    assert namespace["softmax"] is gp.ops.softmax
    assert namespace["get_device_capabilities"] is gp.get_device_capabilities
