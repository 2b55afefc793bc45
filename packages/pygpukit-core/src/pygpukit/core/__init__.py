"""pygpukit.core: the runtime layer (backend selection, driver, devices, NVRTC, errors).

Everything here works without a GPU: without a usable driver the CPU simulation backend is selected
and the reason is kept in :func:`backend_state`.
"""

from __future__ import annotations

import pkgutil

# The native modules (_native_cu12, _native_cu13) come from their own distributions; in a development
# install they live in site-packages/pygpukit/core while this file lives in the source tree.
__path__ = pkgutil.extend_path(__path__, __name__)

from . import dtypes
from .array import (
    GPUArray,
    arange,
    asarray,
    empty,
    empty_like,
    from_numpy,
    full,
    full_like,
    ones,
    ones_like,
    zeros,
    zeros_like,
)
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
from .device import DeviceInfo, device_count, get_device, get_device_info, get_driver_version, set_device
from .dlpack import from_dlpack
from .dtypes import (
    DType,
    as_dtype,
    bfloat16,
    bool_,
    float8_e4m3fn,
    float8_e5m2,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
    uint16,
    uint32,
    uint64,
)
from .errors import (
    BackendUnavailableError,
    CublasLtError,
    CudaError,
    DeviceError,
    DriverNotFoundError,
    DTypeError,
    InvalidPointerError,
    LibraryNotFoundError,
    MissingDistributionError,
    NvrtcError,
    OutOfMemoryError,
    PyGPUkitError,
    QuotaExceededError,
    ShapeError,
    VersionMismatchError,
)
from .graph import CudaGraph
from .jit import JITKernel, jit
from .memory import (
    DeviceBuffer,
    PinnedBuffer,
    empty_cache,
    get_memory_info,
    memcpy_device_to_device_async,
    memcpy_device_to_host_async,
    memcpy_host_to_device_async,
    memory_stats,
    pinned_free,
    pinned_malloc,
    set_memory_limit,
)
from .stream import Event, Stream, current_stream, synchronize

__all__ = [
    "BackendFallbackWarning",
    "BackendUnavailableError",
    "CompiledProgram",
    "CublasLtError",
    "CudaError",
    "CudaGraph",
    "DType",
    "DTypeError",
    "DeviceBuffer",
    "DeviceError",
    "DeviceInfo",
    "DriverNotFoundError",
    "Event",
    "GPUArray",
    "InvalidPointerError",
    "JITKernel",
    "LibraryNotFoundError",
    "MissingDistributionError",
    "NvrtcError",
    "OutOfMemoryError",
    "PinnedBuffer",
    "PyGPUkitError",
    "QuotaExceededError",
    "ShapeError",
    "Stream",
    "VersionMismatchError",
    "arange",
    "as_dtype",
    "asarray",
    "backend_state",
    "bfloat16",
    "bool_",
    "compile_source",
    "current_backend",
    "current_stream",
    "device_count",
    "dtypes",
    "empty",
    "empty_cache",
    "empty_like",
    "float8_e4m3fn",
    "float8_e5m2",
    "float16",
    "float32",
    "float64",
    "from_dlpack",
    "from_numpy",
    "full",
    "full_like",
    "get_device",
    "get_device_info",
    "get_driver_version",
    "get_memory_info",
    "get_nvrtc_path",
    "get_nvrtc_version",
    "int8",
    "int16",
    "int32",
    "int64",
    "is_cuda_available",
    "is_nvrtc_available",
    "jit",
    "memcpy_device_to_device_async",
    "memcpy_device_to_host_async",
    "memcpy_host_to_device_async",
    "memory_stats",
    "ones",
    "ones_like",
    "pinned_free",
    "pinned_malloc",
    "set_device",
    "set_memory_limit",
    "synchronize",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "zeros",
    "zeros_like",
]
