"""The Rust module _pygpukit_rust builds, imports and agrees with its distribution."""

from __future__ import annotations

import importlib.metadata as metadata

import _pygpukit_rust as rust
import pygpukit.scheduler as scheduler


def test_versions_agree() -> None:
    assert rust.__version__ == metadata.version("pygpukit-sched") == scheduler.__version__


def test_build_info_describes_the_module() -> None:
    info = rust.build_info()
    assert info["version"] == rust.__version__
    assert info["abi3_min_python"] == "3.10"
    assert info["profile"] in ("debug", "release")
    assert info["target_os"] == "linux"


def test_native_submodule_is_abi3() -> None:
    assert rust._native.__file__.endswith(".abi3.so")
