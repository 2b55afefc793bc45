"""The pygpukit-audio distribution: its subpackages import, report its version and check their siblings."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata

import pytest

from pygpukit import _distributions

MODULES = ["pygpukit.audio", "pygpukit.asr", "pygpukit.tts"]


@pytest.mark.parametrize("name", MODULES)
def test_imports_and_reports_the_distribution_version(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__version__ == metadata.version("pygpukit-audio")
    for exported in module.__all__:
        assert hasattr(module, exported), exported


def test_sibling_pins_hold_in_this_installation() -> None:
    _distributions.check_siblings("pygpukit-audio")
    pins = [r for r in metadata.requires("pygpukit-audio") or [] if r.startswith("pygpukit")]
    assert pins
    assert all("==" in pin for pin in pins)
