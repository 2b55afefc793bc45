"""Helpers shared by the pygpukit-llm tests (conftest.py puts this directory on sys.path)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any


def sibling(name: str) -> Any:
    """The test module ``name``.py of this directory, loaded afresh under a private name (pytest imports
    test files in importlib mode, so they cannot import each other): its random checkpoints, float64
    references and helpers."""
    spec = importlib.util.spec_from_file_location(f"_llm_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
