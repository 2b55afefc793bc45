"""Sibling version pins, missing distributions, and subpackage imports in the editable workspace."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import subprocess
import sys

import pytest

from pygpukit import _distributions
from pygpukit.core.errors import MissingDistributionError, VersionMismatchError

SUBPACKAGES = ["pygpukit.core", "pygpukit.ops", "pygpukit.llm", "pygpukit.audio", "pygpukit.asr", "pygpukit.tts",
               "pygpukit.scheduler", "pygpukit.triton"]  # fmt: skip


@pytest.mark.parametrize("module", SUBPACKAGES)
def test_every_subpackage_imports(module: str) -> None:
    assert importlib.import_module(module) is not None


@pytest.mark.parametrize("distribution", sorted(_distributions.DISTRIBUTIONS))
def test_each_distribution_reports_its_own_version(distribution: str) -> None:
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[3]
    declared = tomllib.loads((root / "packages" / distribution / "pyproject.toml").read_text())["project"]["version"]
    assert metadata.version(distribution) == declared


def test_subpackage_versions_match_their_distributions() -> None:
    import pygpukit

    assert pygpukit.__version__ == metadata.version("pygpukit-core")
    for module, (distribution, _extra) in _distributions.SUBPACKAGES.items():
        assert importlib.import_module(f"pygpukit.{module}").__version__ == metadata.version(distribution)


def test_version_mismatch_is_reported_readably(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _distributions.distribution_version
    monkeypatch.setattr(
        _distributions, "distribution_version", lambda name: "0.0.9" if name == "pygpukit-core" else real(name)
    )
    with pytest.raises(VersionMismatchError) as caught:
        _distributions.check_siblings("pygpukit-ops")
    message = str(caught.value)
    assert "pygpukit-ops 0.1.0 needs pygpukit-core==0.1.0, but pygpukit-core 0.0.9 is installed" in message
    assert "pip install 'pygpukit-ops==0.1.0' 'pygpukit-core==0.1.0'" in message
    assert isinstance(caught.value, ImportError)


def test_mismatch_fails_the_import_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version

    def fake_version(name: str) -> str:
        return "2.0.0" if name == "pygpukit-core" else real(name)

    monkeypatch.setattr(metadata, "version", fake_version)
    monkeypatch.delitem(sys.modules, "pygpukit.llm", raising=False)
    with pytest.raises(VersionMismatchError, match=r"pygpukit-llm 0\.1\.0 needs pygpukit-core==0\.1\.0"):
        importlib.import_module("pygpukit.llm")


def test_missing_required_sibling(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _distributions.distribution_version
    monkeypatch.setattr(
        _distributions, "distribution_version", lambda name: None if name == "pygpukit-ops" else real(name)
    )
    with pytest.raises(MissingDistributionError, match=r"pygpukit-llm 0.1.0 needs pygpukit-ops==0.1.0"):
        _distributions.check_siblings("pygpukit-llm", required=("pygpukit-core", "pygpukit-ops"))


def test_uninstalled_subpackage_names_its_distribution() -> None:
    import pygpukit.llm

    if "pygpukit-llm" not in str(pygpukit.llm.__file__):
        pytest.skip("needs the editable workspace layout; wheel installs are covered by nox -s wheel_smoke")
    # Simulate an uninstalled pygpukit-llm in the editable workspace: drop its source directory from
    # sys.path before pygpukit is imported, so no finder can see pygpukit/llm.
    code = (
        "import sys\n"
        "sys.path = [p for p in sys.path if 'pygpukit-llm' not in p]\n"
        "import pygpukit, pygpukit.ops, pygpukit.scheduler\n"
        "try:\n"
        "    import pygpukit.llm\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(type(exc).__name__, exc.name, exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "MissingDistributionError pygpukit.llm pygpukit.llm is provided by the pygpukit-llm"
    )
    assert "pip install pygpukit-llm --find-links" in result.stdout  # never `pygpukit[llm]`: PyPI's is another


def test_unknown_top_level_name_is_an_attribute_error() -> None:
    import pygpukit

    with pytest.raises(AttributeError, match="no attribute 'definitely_not_an_op'"):
        pygpukit.definitely_not_an_op  # noqa: B018


def test_top_level_exposes_subpackages_lazily() -> None:
    import pygpukit

    assert pygpukit.scheduler is importlib.import_module("pygpukit.scheduler")
