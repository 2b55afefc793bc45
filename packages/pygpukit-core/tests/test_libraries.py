"""Where libcuda, NVRTC and cuBLASLt are looked for, and how the search explains itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pygpukit.core import _libraries


def test_explicit_path_is_the_only_candidate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lib = tmp_path / "libnvrtc.so.13"
    monkeypatch.setenv("PYGPUKIT_NVRTC_PATH", str(lib))
    assert _libraries.candidates(_libraries.NVRTC) == [str(lib)]


def test_explicit_directory_expands_to_sonames(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYGPUKIT_CUBLASLT_PATH", str(tmp_path))
    assert _libraries.candidates(_libraries.CUBLASLT) == [
        str(tmp_path / "libcublasLt.so.13"),
        str(tmp_path / "libcublasLt.so.12"),
    ]


def test_pip_wheel_layouts_come_before_the_system(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PYGPUKIT_NVRTC_PATH", raising=False)
    cu13 = tmp_path / "site13" / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
    cu12 = tmp_path / "site12" / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    for path in (cu13, cu12):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site12"), str(tmp_path / "site13")])
    found = _libraries.candidates(_libraries.NVRTC)
    assert found[:2] == [str(cu13), str(cu12)]  # the newest major first by default
    assert found.index("libnvrtc.so.13") > 1  # the system loader only after the wheels
    preferring_12 = _libraries.candidates(_libraries.NVRTC, preferred_major=12)
    assert preferring_12[:2] == [str(cu12), str(cu13)]


def test_failed_search_names_every_attempt(tmp_path: Path) -> None:
    from pygpukit.core import _variant

    native = _variant.any_native()
    if native is None:
        pytest.skip("no native module installed")
    from pygpukit.core.errors import LibraryNotFoundError

    missing = [str(tmp_path / "nope" / "libnvrtc.so.13"), str(tmp_path / "libnvrtc.so.99")]
    code = (
        "import sys, pygpukit\n"
        "from pygpukit.core import _variant\n"
        f"native = _variant.any_native()\n"
        f"native.load_nvrtc({missing!r})\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYGPUKIT_DEBUG_LIBRARY_LOAD": "1"},
        check=False,
    )
    assert result.returncode != 0
    assert LibraryNotFoundError.__name__ in result.stderr
    for candidate in missing:
        assert candidate in result.stderr  # in the exception text
        assert f"[pygpukit] NVRTC: {candidate}" in result.stderr  # and in the debug trace


def test_driver_search_failure_is_a_driver_not_found_error(tmp_path: Path) -> None:
    code = (
        "from pygpukit.core import _variant\n"
        "from pygpukit.core.errors import DriverNotFoundError\n"
        "native = _variant.any_native()\n"
        "try:\n"
        f"    native.load_driver([{str(tmp_path / 'libcuda.so.1')!r}])\n"
        "except DriverNotFoundError as exc:\n"
        "    print('attempts', len(exc.attempts), exc.library)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if "NoneType" in result.stderr:
        pytest.skip("no native module installed")
    assert result.stdout.strip() == "attempts 1 libcuda", result.stderr
