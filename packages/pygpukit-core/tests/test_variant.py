"""Choosing the native variant for the driver, and the explanation when none fits."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from pygpukit.core import _variant
from pygpukit.core.errors import PyGPUkitError, VersionMismatchError


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Pretend which variants are installed and which driver version ctypes reads."""

    def configure(installed: list[str], driver: int | None) -> None:
        monkeypatch.delenv("PYGPUKIT_CUDA_VARIANT", raising=False)
        monkeypatch.setattr(_variant, "installed_variants", lambda: list(installed))
        monkeypatch.setattr(_variant, "probe_driver_version", lambda: _variant.DriverProbe(driver, "libcuda.so.1"))
        monkeypatch.setattr(_variant, "_import_variant", lambda v: types.SimpleNamespace(CUDA_MAJOR=int(v[2:])))

    return configure


def test_newest_supported_variant_wins(fake) -> None:  # type: ignore[no-untyped-def]
    fake(["cu13", "cu12"], 13000)
    assert _variant.choose_variant().variant == "cu13"
    fake(["cu13", "cu12"], 12080)
    assert _variant.choose_variant().variant == "cu12"


def test_cu12_variant_serves_a_cuda13_driver(fake) -> None:  # type: ignore[no-untyped-def]
    fake(["cu12"], 13000)
    assert _variant.choose_variant().variant == "cu12"


def test_too_old_driver_is_explained(fake) -> None:  # type: ignore[no-untyped-def]
    fake(["cu13"], 12040)
    choice = _variant.choose_variant()
    assert choice.module is None
    assert "driver supports CUDA 12.4" in choice.reason
    assert "cu13 (needs CUDA >= 13.0)" in choice.reason
    assert "pygpukit-core-cu12" in choice.reason


def test_missing_driver_and_missing_modules_are_explained(fake) -> None:  # type: ignore[no-untyped-def]
    fake(["cu13"], None)
    assert _variant.choose_variant().reason == "CUDA driver not detected"
    fake([], 13000)
    assert "no native module is installed" in _variant.choose_variant().reason


def test_forced_variant(fake, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake(["cu13", "cu12"], 13000)
    monkeypatch.setenv("PYGPUKIT_CUDA_VARIANT", "cu12")
    choice = _variant.choose_variant()
    assert choice.variant == "cu12"
    assert "PYGPUKIT_CUDA_VARIANT" in choice.reason
    monkeypatch.setenv("PYGPUKIT_CUDA_VARIANT", "cu11")
    with pytest.raises(PyGPUkitError, match=r"PYGPUKIT_CUDA_VARIANT must be 'cu12' or 'cu13' \(or unset\), got 'cu11'"):
        _variant.choose_variant()
    monkeypatch.setenv("PYGPUKIT_CUDA_VARIANT", " CU13 ")  # case and blanks do not matter
    assert _variant.choose_variant().variant == "cu13"
    monkeypatch.setenv("PYGPUKIT_CUDA_VARIANT", "")  # empty is unset
    assert "forced" not in _variant.choose_variant().reason


def test_libcuda_path_that_does_not_exist_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "libcuda.so.1"
    monkeypatch.setenv("PYGPUKIT_LIBCUDA_PATH", str(missing))
    probe = _variant.probe_driver_version()  # no exception: the probe reports it
    assert probe.version is None
    assert probe.error is not None
    assert "PYGPUKIT_LIBCUDA_PATH" in probe.error
    assert probe.attempts == [f"PYGPUKIT_LIBCUDA_PATH={missing}: {missing} does not exist"]
    monkeypatch.delenv("PYGPUKIT_CUDA_VARIANT", raising=False)
    monkeypatch.setattr(_variant, "installed_variants", lambda: ["cu13"])
    reason = _variant.choose_variant().reason
    assert reason.startswith("CUDA driver not detected: libcuda could not be loaded: PYGPUKIT_LIBCUDA_PATH is set")
    assert f"{missing} does not exist" in reason


def test_native_module_version_must_match_core(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = _variant.installed_variants()
    if not installed:
        pytest.skip("no native module installed")
    module = _variant._import_variant(installed[0])
    monkeypatch.setattr(module, "__version__", "9.9.9")
    with pytest.raises(VersionMismatchError, match=r"pygpukit-core .* found the native module .* 9\.9\.9"):
        _variant._import_variant(installed[0])


def test_installed_native_modules_describe_themselves() -> None:
    import pygpukit

    for variant in _variant.installed_variants():
        module = _variant._import_variant(variant)
        assert _variant.VARIANTS[variant] == module.CUDA_MAJOR
        assert module.CUDA_HEADER_VERSION // 1000 == module.CUDA_MAJOR
        assert module.__version__ == pygpukit.__version__


def test_libraries_load_into_the_module_the_backend_picks(fake, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """NVRTC and cuBLASLt handles live in each native module: any_native() must give the module
    choose_variant() gives, or the backend's module launches GEMMs with a cuBLASLt it never loaded
    (seen on an H100 with PYGPUKIT_CUDA_VARIANT=cu12 and both variants installed)."""
    fake(["cu13", "cu12"], 13000)
    assert _variant.any_native().CUDA_MAJOR == 13  # type: ignore[union-attr]
    monkeypatch.setenv("PYGPUKIT_CUDA_VARIANT", "cu12")
    assert _variant.choose_variant().variant == "cu12"
    assert _variant.any_native().CUDA_MAJOR == 12  # type: ignore[union-attr]
    monkeypatch.setenv("PYGPUKIT_CUDA_VARIANT", "cu11")  # a bad value: choose_variant raises, this does not
    assert _variant.any_native().CUDA_MAJOR == 13  # type: ignore[union-attr]
    monkeypatch.delenv("PYGPUKIT_CUDA_VARIANT")
    fake(["cu13", "cu12"], 12080)  # a CUDA 12 driver: the backend takes cu12, so do the libraries
    assert _variant.choose_variant().variant == "cu12"
    assert _variant.any_native().CUDA_MAJOR == 12  # type: ignore[union-attr]
    fake(["cu13", "cu12"], None)  # no driver (compile-only): the first installed
    assert _variant.any_native().CUDA_MAJOR == 13  # type: ignore[union-attr]
