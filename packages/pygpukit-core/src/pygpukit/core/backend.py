"""Backend selection: the CUDA runtime when a usable driver and GPU exist, else the CPU simulation.

``PYGPUKIT_BACKEND=cuda`` insists on the GPU (and fails with the reason when there is none);
``PYGPUKIT_BACKEND=cpu`` forces the NumPy simulation. The fallback is announced once with a
:class:`BackendFallbackWarning`. Any other value of ``PYGPUKIT_BACKEND`` raises :class:`PyGPUkitError`.

:func:`env_flag` reads the on/off ``PYGPUKIT_*`` variables (``1/0``, ``true/false``, ``yes/no``,
``on/off``); any other value is announced once with an :class:`EnvironmentVariableWarning`.

The fallback warning names the user's line, not pygpukit's: its ``stacklevel`` is computed by walking
out of the pygpukit frames that led to the first use of the backend.
"""

from __future__ import annotations

import sys
import threading
import warnings
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

from . import _libraries, _variant
from ._env import EnvironmentVariableWarning, env_choice, env_flag
from .errors import BackendUnavailableError, DeviceError, LibraryNotFoundError

if TYPE_CHECKING:
    from ._native import NativeModule

__all__ = [
    "MIN_COMPUTE_CAPABILITY",
    "BackendFallbackWarning",
    "BackendState",
    "EnvironmentVariableWarning",
    "backend_state",
    "c_api_capsule",
    "current_backend",
    "env_flag",
    "is_cuda_available",
    "native_module",
]

MIN_COMPUTE_CAPABILITY = (8, 0)


class BackendFallbackWarning(RuntimeWarning):
    """Emitted once when pygpukit falls back to the CPU simulation backend."""


@dataclass
class BackendState:
    """Which backend is in use and why, plus what was learned about the driver on the way."""

    name: Literal["cuda", "cpu"]
    reason: str
    variant: str | None = None
    native: NativeModule | None = None  # the typed seam to C++ (core/_native.py)
    driver: dict[str, Any] | None = None
    driver_probe: _variant.DriverProbe | None = None


_lock = threading.Lock()
_state: BackendState | None = None


def _requested() -> str:
    return env_choice("PYGPUKIT_BACKEND", ("auto", "cuda", "cpu"), "auto")


def _detect() -> BackendState:
    requested = _requested()
    if requested == "cpu":
        return BackendState("cpu", "forced by PYGPUKIT_BACKEND=cpu")
    choice = _variant.choose_variant()
    if choice.module is None:
        return BackendState("cpu", choice.reason, driver_probe=choice.driver)
    native = choice.module
    try:
        driver = dict(native.load_driver(_libraries.candidates(_libraries.CUDA_DRIVER)))
    except LibraryNotFoundError as exc:
        return BackendState("cpu", f"CUDA driver not usable: {exc}", choice.variant, native, driver_probe=choice.driver)
    if driver["init_result"] != 0:
        return BackendState(
            "cpu", f"CUDA driver present but cuInit failed: {driver['init_error']}", choice.variant, native, driver
        )
    count = native.device_count()
    if count == 0:
        return BackendState("cpu", "CUDA driver present but no GPU found", choice.variant, native, driver)
    capable = [
        i for i in range(count) if tuple(native.device_properties(i)["compute_capability"]) >= MIN_COMPUTE_CAPABILITY
    ]
    if not capable:
        names = ", ".join(
            f"{p['name']} (sm_{p['compute_capability'][0]}{p['compute_capability'][1]})"
            for p in (native.device_properties(i) for i in range(count))
        )
        return BackendState(
            "cpu", f"no GPU with compute capability >= 8.0 (found {names})", choice.variant, native, driver
        )
    return BackendState(
        "cuda", f"{choice.variant} native module: {choice.reason}", choice.variant, native, driver, choice.driver
    )


def _in_pygpukit(frame: FrameType) -> bool:
    name = frame.f_globals.get("__name__", "")
    return isinstance(name, str) and (name == "pygpukit" or name.startswith("pygpukit."))


def _import_machinery(frame: FrameType) -> bool:
    """The frames ``warnings`` skips without counting them (importlib's bootstrap)."""
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename


def _user_stacklevel() -> int:
    """The ``stacklevel`` for a warning raised in :func:`backend_state` that points at the first frame
    outside the pygpukit package (the user's line), however deep inside pygpukit the first use of the
    backend happened: 1 is backend_state itself, each pygpukit frame above it adds one; importlib's
    frames (a first use during an import) are skipped without counting, as ``warnings`` does."""
    frame = sys._getframe(2)  # 0: this function, 1: backend_state, 2: its caller
    level = 2
    while frame is not None and (_in_pygpukit(frame) or _import_machinery(frame)):
        if not _import_machinery(frame):
            level += 1
        frame = frame.f_back  # type: ignore[assignment]
    return level


def backend_state() -> BackendState:
    """Detect (once) and return the backend in use. Thread-safe."""
    global _state
    state = _state
    if state is not None:  # the common case, without taking the lock
        return state
    with _lock:
        if _state is None:
            state = _detect()
            if state.name == "cpu" and _requested() == "cuda":
                raise BackendUnavailableError(
                    f"PYGPUKIT_BACKEND=cuda but the CUDA backend is unavailable: {state.reason}"
                )
            if state.name == "cpu" and _requested() == "auto":
                warnings.warn(
                    f"{state.reason}; falling back to CPU simulation backend",
                    BackendFallbackWarning,
                    stacklevel=_user_stacklevel(),
                )
            _state = state
        return _state


def current_backend() -> Literal["cuda", "cpu"]:
    """``"cuda"`` or ``"cpu"``."""
    return backend_state().name


def is_cuda_available() -> bool:
    """True when a driver, a native module for it and a GPU with compute capability >= 8.0 are present."""
    return backend_state().name == "cuda"


def c_api_capsule() -> Any:
    """The native C API capsule (``pygpukit.core._native_cu<MAJOR>._C_API``, see native/runtime/c_api.h)
    of the native module in use, or of any installed one on the CPU backend (its calls then report
    PYGPUKIT_E_NOT_INITIALIZED)."""
    state = backend_state()
    native = state.native if state.native is not None else _variant.any_native()
    if native is None:
        raise DeviceError("no pygpukit native module is installed")
    return native._C_API


def native_module() -> NativeModule:
    """The native module of the CUDA backend; raises when the CPU backend is in use."""
    state = backend_state()
    if state.native is None or state.name != "cuda":
        raise DeviceError(f"the CUDA backend is not in use: {state.reason}")
    return state.native
