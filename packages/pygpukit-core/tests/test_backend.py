"""Backend selection: forced backends, the one-time fallback announcement, errors for bad values."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from pygpukit.core import backend
from pygpukit.core.errors import BackendUnavailableError, PyGPUkitError


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, check=False
    )


@pytest.fixture
def fresh_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "_state", None)


def test_forced_cpu_backend_is_used_and_explained(fresh_backend: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYGPUKIT_BACKEND", "cpu")
    state = backend.backend_state()
    assert state.name == "cpu"
    assert "PYGPUKIT_BACKEND=cpu" in state.reason
    assert backend.is_cuda_available() is False


def test_invalid_backend_value_is_rejected_by_name(fresh_backend: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYGPUKIT_BACKEND", "rocm")
    with pytest.raises(PyGPUkitError, match=r"PYGPUKIT_BACKEND must be .* got 'rocm'"):
        backend.backend_state()
    monkeypatch.setenv("PYGPUKIT_BACKEND", "cpu")
    assert backend.backend_state().name == "cpu"  # nothing was cached by the failed call


def test_fallback_is_announced_once_in_plain_words() -> None:
    code = (
        "import warnings, pygpukit\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    for _ in range(3):\n"
        "        pygpukit.is_cuda_available()\n"
        "msgs = [str(w.message) for w in caught if w.category is pygpukit.BackendFallbackWarning]\n"
        "print(pygpukit.current_backend(), len(msgs)); print(*msgs, sep='\\n')\n"
    )
    result = run_python(code, PYGPUKIT_BACKEND="auto")
    assert result.returncode == 0, result.stderr
    first, *messages = result.stdout.splitlines()
    if first.startswith("cuda"):
        assert first == "cuda 0"
        return
    assert first == "cpu 1"
    assert messages[0].endswith("falling back to CPU simulation backend")


def test_cuda_backend_demanded_without_gpu_fails_with_reason() -> None:
    result = run_python("import pygpukit; print(pygpukit.current_backend())", PYGPUKIT_BACKEND="cuda")
    if result.returncode == 0:
        assert result.stdout.strip() == "cuda"  # a machine with a GPU
        return
    assert BackendUnavailableError.__name__ in result.stderr
    assert "PYGPUKIT_BACKEND=cuda but the CUDA backend is unavailable" in result.stderr


def test_no_message_suggests_installing_other_gpu_libraries() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    forbidden = ("cuda-python", "cupy", "numba", "torch")
    offenders = []
    for path in root.glob("packages/*/src/**/*.py"):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            lowered = line.lower()
            if "install" in lowered and any(name in lowered for name in forbidden):
                offenders.append(f"{path}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# -- PYGPUKIT_* on/off flags ------------------------------------------------------------------------------


@pytest.fixture
def no_warnings_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.core import _env

    monkeypatch.setattr(_env, "_warned", set())


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("TRUE", True), (" yes ", True), ("On", True), ("0", False), ("false", False), ("NO", False),
     ("off", False)],
)  # fmt: skip
def test_env_flag_accepts_the_usual_spellings(
    no_warnings_yet: None, monkeypatch: pytest.MonkeyPatch, value: str, expected: bool
) -> None:
    import warnings

    monkeypatch.setenv("PYGPUKIT_TEST_FLAG", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backend.env_flag("PYGPUKIT_TEST_FLAG", not expected) is expected


def test_env_flag_unset_or_empty_is_the_default(no_warnings_yet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYGPUKIT_TEST_FLAG", raising=False)
    assert backend.env_flag("PYGPUKIT_TEST_FLAG", True) is True
    monkeypatch.setenv("PYGPUKIT_TEST_FLAG", "  ")
    assert backend.env_flag("PYGPUKIT_TEST_FLAG", False) is False


def test_env_flag_junk_warns_once_by_name_and_falls_back(
    no_warnings_yet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import warnings

    monkeypatch.setenv("PYGPUKIT_TEST_FLAG", "maybe")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert backend.env_flag("PYGPUKIT_TEST_FLAG", False) is False
        assert backend.env_flag("PYGPUKIT_TEST_FLAG", False) is False  # announced once
        assert backend.env_flag("PYGPUKIT_TEST_FLAG", True) is True
    (warning,) = caught
    assert issubclass(warning.category, backend.EnvironmentVariableWarning)
    assert issubclass(warning.category, RuntimeWarning)
    message = str(warning.message)
    assert "PYGPUKIT_TEST_FLAG='maybe'" in message
    assert "1, true, yes, on, 0, false, no, off" in message
    assert message.endswith("using the default, off")
    assert warning.message.variable == "PYGPUKIT_TEST_FLAG"  # type: ignore[union-attr]
    assert warning.message.value == "maybe"  # type: ignore[union-attr]
    assert warning.filename == __file__  # points at the caller


def test_kernel_cache_switch_reads_every_off_spelling(no_warnings_yet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.core import kernel_cache

    monkeypatch.setenv("PYGPUKIT_CACHE_DIR", "/tmp/pygpukit-test-kernels")
    for off in ("0", "false", "OFF", "no"):
        monkeypatch.setenv("PYGPUKIT_KERNEL_CACHE", off)
        assert kernel_cache._default_directory() is None
    monkeypatch.setenv("PYGPUKIT_KERNEL_CACHE", "disabled")
    with pytest.warns(backend.EnvironmentVariableWarning, match="PYGPUKIT_KERNEL_CACHE='disabled'.*default, on"):
        assert kernel_cache._default_directory() is not None


def test_invalid_cuda_variant_is_rejected_through_the_backend(
    fresh_backend: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYGPUKIT_BACKEND", "auto")
    monkeypatch.setenv("PYGPUKIT_CUDA_VARIANT", "cu11")
    with pytest.raises(PyGPUkitError, match=r"PYGPUKIT_CUDA_VARIANT must be 'cu12' or 'cu13' \(or unset\), got 'cu11'"):
        backend.backend_state()


# -- the fallback warning points at the user's line ------------------------------------------------------
def _first_use_warning(use: Callable[[], object]) -> warnings.WarningMessage | None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        use()
    found = [w for w in caught if w.category is backend.BackendFallbackWarning]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize("how", ["array", "op", "nested op", "nvrtc query", "capabilities"])
def test_fallback_warning_names_the_callers_line(
    fresh_backend: None, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """However deep inside pygpukit the backend is first used (a constructor, an op reached through
    pygpukit.__getattr__, an op calling other ops, a query), the warning's file and line are the
    caller's: here the line of the lambda that makes the call."""
    import numpy as np

    import pygpukit as gp

    monkeypatch.delenv("PYGPUKIT_BACKEND", raising=False)
    uses: dict[str, Callable[[], object]] = {
        "array": lambda: gp.from_numpy(np.ones(3, np.float32)),
        "op": lambda: gp.rope_cos_sin(64, 16),  # through pygpukit.__getattr__; the op uploads its tables
        "nested op": lambda: gp.linear(gp.ones((2, 4)), gp.ones((3, 4)), activation="relu"),
        "nvrtc query": lambda: gp.is_nvrtc_available(),
        "capabilities": lambda: gp.get_device_capabilities(),
    }
    use = uses[how]
    warning = _first_use_warning(use)
    if gp.is_cuda_available():
        assert warning is None
        return
    assert warning is not None
    assert warning.filename == __file__
    assert warning.lineno == use.__code__.co_firstlineno


def test_fallback_warning_from_a_subprocess_script(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(
        "import warnings\nimport numpy as np\nimport pygpukit as gp\nwarnings.simplefilter('always')\n"
        "x = gp.zeros(4)\nprint(gp.current_backend())\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False,
                            env={**__import__("os").environ, "PYGPUKIT_BACKEND": "auto"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    if result.stdout.strip() == "cuda":
        return
    assert f"{script}:5: BackendFallbackWarning" in result.stderr
    assert "x = gp.zeros(4)" in result.stderr


# -- PYGPUKIT_NO_TF32 ---------------------------------------------------------------------------------------
def test_no_tf32_is_a_known_flag() -> None:
    from pygpukit.core._env import RUNTIME_VARIABLES, environment_report

    assert "PYGPUKIT_NO_TF32" in RUNTIME_VARIABLES
    report = {s.variable: s.problem for s in environment_report({"PYGPUKIT_NO_TF32": "1"})}
    assert report == {"PYGPUKIT_NO_TF32": None}
    (bad,) = environment_report({"PYGPUKIT_NO_TF32": "sometimes"})
    assert bad.problem is not None
    assert "not an on/off value" in bad.problem
    (typo,) = environment_report({"PYGPUKIT_NO_TF3": "1"})
    assert typo.problem == "not a pygpukit variable; did you mean PYGPUKIT_NO_TF32?"


# -- PYGPUKIT_TRITON_ROUTE ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("triton", None),
        ("rmsnorm=triton, matmul=auto,*=builtin", None),
        ("", None),
        ("fast", "'fast' is not a mode"),
        ("attention=triton", "'attention' is not a routed op"),
        ("rmsnorm=gpu", "'gpu' is not a mode"),
    ],
)
def test_triton_route_is_checked_by_info(value: str, problem: str | None) -> None:
    from pygpukit.core._env import RUNTIME_VARIABLES, environment_report

    assert "PYGPUKIT_TRITON_ROUTE" in RUNTIME_VARIABLES
    (setting,) = environment_report({"PYGPUKIT_TRITON_ROUTE": value})
    if problem is None:
        assert setting.problem is None
    else:
        assert setting.problem is not None
        assert setting.problem.startswith(problem)
