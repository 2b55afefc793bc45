"""Backend selection: forced backends, the one-time fallback announcement, errors for bad values."""

from __future__ import annotations

import subprocess
import sys

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
