"""Finding cuBLASLt at run time (``PYGPUKIT_CUBLASLT_PATH``, the pip wheels, the system)."""

from __future__ import annotations

from typing import Any

from . import _libraries
from ._loaded_library import LoadedLibrary

__all__ = ["cublaslt_status", "is_cublaslt_available"]

_cublaslt = LoadedLibrary(_libraries.CUBLASLT, "load_cublaslt")


def cublaslt_status() -> dict[str, Any]:
    """Load cuBLASLt once; return its path and version. Raises :class:`LibraryNotFoundError`."""
    return _cublaslt.status()


def is_cublaslt_available() -> bool:
    """True when cuBLASLt can be loaded."""
    return _cublaslt.available()
