"""Where libcuda, NVRTC and cuBLASLt are looked for, and how the search explains itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pygpukit.core import _libraries
from pygpukit.core.errors import DriverNotFoundError, LibraryNotFoundError


def test_explicit_path_is_the_only_candidate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lib = tmp_path / "libnvrtc.so.13"
    lib.write_bytes(b"")
    monkeypatch.setenv("PYGPUKIT_NVRTC_PATH", str(lib))
    assert _libraries.candidates(_libraries.NVRTC) == [str(lib)]


@pytest.mark.parametrize("spec", [_libraries.NVRTC, _libraries.CUBLASLT, _libraries.CUDA_DRIVER])
def test_explicit_path_that_does_not_exist_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec: _libraries.LibrarySpec
) -> None:
    missing = tmp_path / "nope" / "lib.so"
    monkeypatch.setenv(spec.env_var, str(missing))
    expected = DriverNotFoundError if spec is _libraries.CUDA_DRIVER else LibraryNotFoundError
    with pytest.raises(expected) as caught:
        _libraries.candidates(spec)
    message = str(caught.value)
    assert message.startswith(f"{spec.name} could not be loaded: {spec.env_var} is set, but {missing} does not exist")
    assert "unset it" in message
    assert caught.value.library == spec.name
    assert caught.value.attempts == [f"{spec.env_var}={missing}: {missing} does not exist"]
    assert _libraries.explicit_problem(spec) == f"{missing} does not exist"


def test_explicit_directory_without_the_library_names_the_sonames(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYGPUKIT_CUBLASLT_PATH", str(tmp_path))
    with pytest.raises(LibraryNotFoundError, match=r"PYGPUKIT_CUBLASLT_PATH is set, but the directory .* holds none of "
                       r"libcublasLt\.so\.13, libcublasLt\.so\.12"):  # fmt: skip
        _libraries.candidates(_libraries.CUBLASLT)
    (tmp_path / "libcublasLt.so.12").write_bytes(b"")
    assert _libraries.explicit_problem(_libraries.CUBLASLT) is None
    monkeypatch.delenv("PYGPUKIT_CUBLASLT_PATH")
    assert _libraries.explicit_problem(_libraries.CUBLASLT) is None


def test_missing_nvrtc_path_is_reported_by_the_loader(tmp_path: Path) -> None:
    missing = str(tmp_path / "libnvrtc.so.13")
    code = (
        "import pygpukit as gp\n"
        "from pygpukit.core.errors import LibraryNotFoundError\n"
        "print(gp.is_nvrtc_available())\n"
        "try:\n"
        "    gp.compile_source('', arch=90)\n"
        "except LibraryNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "PYGPUKIT_NVRTC_PATH": missing}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    available, message = result.stdout.splitlines()
    assert available == "False"
    assert f"PYGPUKIT_NVRTC_PATH is set, but {missing} does not exist" in message


@pytest.mark.parametrize(("value", "warns"), [("1", False), ("0", False), ("", False), ("yes", False),
                                              ("false", False), (" OFF ", False), ("loud", True)])  # fmt: skip
def test_debug_flag_that_is_not_an_on_off_value_warns(monkeypatch: pytest.MonkeyPatch, value: str, warns: bool) -> None:
    import warnings

    from pygpukit.core import _env

    monkeypatch.setattr(_env, "_warned", set())
    monkeypatch.setenv("PYGPUKIT_DEBUG_LIBRARY_LOAD", value)
    monkeypatch.delenv("PYGPUKIT_NVRTC_PATH", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _libraries.candidates(_libraries.NVRTC)
        _libraries.candidates(_libraries.NVRTC)
    assert len(caught) == int(warns)
    if warns:
        assert issubclass(caught[0].category, _env.EnvironmentVariableWarning)
        assert f"PYGPUKIT_DEBUG_LIBRARY_LOAD={value!r} is not an on/off value" in str(caught[0].message)
        assert "using the default, off" in str(caught[0].message)


@pytest.mark.parametrize(("value", "traced"), [("1", True), ("true", True), (" Yes ", True), ("ON", True),
                                               ("0", False), ("false", False), ("off", False), ("no", False),
                                               ("", False), ("loud", False)])  # fmt: skip
def test_native_loader_reads_the_debug_flag_like_env_flag(tmp_path: Path, value: str, traced: bool) -> None:
    """native/runtime/shared_library.cpp: only 1/true/yes/on (any case, blanks ignored) print the trace."""
    from pygpukit.core import _variant

    if _variant.any_native() is None:
        pytest.skip("no native module installed")
    missing = str(tmp_path / "libnvrtc.so.99")
    code = (
        "from pygpukit.core import _variant\n"
        "from pygpukit.core.errors import LibraryNotFoundError\n"
        "try:\n"
        f"    _variant.any_native().load_nvrtc([{missing!r}])\n"
        "except LibraryNotFoundError:\n"
        "    pass\n"
    )
    env = {**os.environ, "PYGPUKIT_DEBUG_LIBRARY_LOAD": value}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert (f"[pygpukit] NVRTC: {missing}" in result.stderr) is traced, result.stderr


def test_explicit_directory_expands_to_sonames(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "libcublasLt.so.12").write_bytes(b"")  # one of them is enough to search the directory
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
