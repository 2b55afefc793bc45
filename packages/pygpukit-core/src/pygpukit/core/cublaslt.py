"""Finding cuBLASLt at run time (pip wheel, system, ``PYGPUKIT_CUBLASLT_PATH``)."""

from __future__ import annotations

import threading
from typing import Any

from . import _libraries, _variant
from .errors import LibraryNotFoundError, PyGPUkitError

__all__ = ["cublaslt_status", "is_cublaslt_available"]

_lock = threading.Lock()
_status: dict[str, Any] | None = None
_error: PyGPUkitError | None = None


def cublaslt_status() -> dict[str, Any]:
    """Load cuBLASLt once; return its path and version. Raises :class:`LibraryNotFoundError`."""
    global _status, _error
    with _lock:
        if _status is not None:
            return _status
        if _error is not None:
            raise _error
        native = _variant.any_native()
        if native is None:
            _error = LibraryNotFoundError(
                "cuBLASLt cannot be used without a pygpukit native module (pygpukit-core-cu13 or -cu12)",
                library="cuBLASLt",
            )
            raise _error
        try:
            _status = dict(
                native.load_cublaslt(_libraries.candidates(_libraries.CUBLASLT, _variant.preferred_major(native)))
            )
        except LibraryNotFoundError as exc:
            _error = exc
            raise
        return _status


def is_cublaslt_available() -> bool:
    """True when cuBLASLt can be loaded."""
    try:
        cublaslt_status()
    except PyGPUkitError:
        return False
    return True
