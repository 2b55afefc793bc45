"""A run-time library (NVRTC, cuBLASLt) loaded once per process through the native module.

The outcome, the library's status or the error explaining why it could not load, is remembered, so
every later call answers the same way without searching again.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _install, _libraries, _variant
from .errors import LibraryNotFoundError, PyGPUkitError

if TYPE_CHECKING:
    from ._native import NativeModule

__all__ = ["LoadedLibrary"]

# The native loader of each library, by the name its LoadedLibrary is given.
_LOADERS: dict[str, Callable[[NativeModule, list[str]], dict[str, Any]]] = {
    "load_nvrtc": lambda native, candidates: native.load_nvrtc(candidates),
    "load_cublaslt": lambda native, candidates: native.load_cublaslt(candidates),
}


class LoadedLibrary:
    """``status()`` loads ``spec`` with the native module's ``load_<name>`` on first use."""

    def __init__(self, spec: _libraries.LibrarySpec, native_loader: str) -> None:
        if native_loader not in _LOADERS:
            raise ValueError(f"no native loader {native_loader!r} (known: {', '.join(sorted(_LOADERS))})")
        self._spec = spec
        self._loader = _LOADERS[native_loader]
        self._lock = threading.Lock()
        self._status: dict[str, Any] | None = None
        self._error: PyGPUkitError | None = None

    def status(self) -> dict[str, Any]:
        """Path, version and library-specific facts; raises :class:`LibraryNotFoundError`."""
        with self._lock:
            if self._status is not None:
                return self._status
            if self._error is not None:
                raise self._error
            native = _variant.any_native()
            if native is None:
                self._error = LibraryNotFoundError(
                    f"{self._spec.name} cannot be used without a pygpukit native module (pygpukit-core-cu13 or -cu12)",
                    library=self._spec.name,
                )
                raise self._error
            candidates = _libraries.candidates(self._spec, _variant.preferred_major(native))
            try:
                self._status = dict(self._loader(native, candidates))
            except LibraryNotFoundError as exc:
                # Name the command that installs the library for the driver's CUDA major (or the module's).
                fix = _install.library_fix(_variant.preferred_major(native))
                self._error = LibraryNotFoundError(f"{exc}\n{fix}", library=exc.library, attempts=exc.attempts)
                raise self._error from exc
            # A library newer than the driver loads, but what it makes does not: say so once, with the fix.
            problem = _install.driver_mismatch(
                self._spec.name, str(self._status.get("path", "")), _variant.probe_driver_version().version
            )
            if problem is not None:
                warnings.warn(problem, _install.DriverMismatchWarning, stacklevel=3)
            return self._status

    def available(self) -> bool:
        try:
            self.status()
        except PyGPUkitError:
            return False
        return True
