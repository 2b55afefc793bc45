"""pygpukit.core: the runtime layer (backend selection, driver, devices, NVRTC, errors).

Everything here works without a GPU: without a usable driver the CPU simulation backend is selected
and the reason is kept in :func:`backend_state`.
"""

from __future__ import annotations

import pkgutil

# The native modules (_native_cu12, _native_cu13) come from their own distributions; in a development
# install they live in site-packages/pygpukit/core while this file lives in the source tree.
__path__ = pkgutil.extend_path(__path__, __name__)

from .backend import (
    BackendFallbackWarning,
    backend_state,
    current_backend,
    is_cuda_available,
)
from .compiler import (
    CompiledProgram,
    compile_source,
    get_nvrtc_path,
    get_nvrtc_version,
    is_nvrtc_available,
)
from .errors import (
    BackendUnavailableError,
    CublasLtError,
    CudaError,
    DeviceError,
    DriverNotFoundError,
    DTypeError,
    LibraryNotFoundError,
    MissingDistributionError,
    NvrtcError,
    OutOfMemoryError,
    PyGPUkitError,
    QuotaExceededError,
    ShapeError,
    VersionMismatchError,
)

__all__ = [
    "BackendFallbackWarning",
    "BackendUnavailableError",
    "CompiledProgram",
    "CublasLtError",
    "CudaError",
    "DTypeError",
    "DeviceError",
    "DriverNotFoundError",
    "LibraryNotFoundError",
    "MissingDistributionError",
    "NvrtcError",
    "OutOfMemoryError",
    "PyGPUkitError",
    "QuotaExceededError",
    "ShapeError",
    "VersionMismatchError",
    "backend_state",
    "compile_source",
    "current_backend",
    "get_nvrtc_path",
    "get_nvrtc_version",
    "is_cuda_available",
    "is_nvrtc_available",
]
