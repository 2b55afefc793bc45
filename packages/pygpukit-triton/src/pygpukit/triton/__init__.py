"""pygpukit.triton: Triton kernels on pygpukit arrays, streams and CUDA graphs, without torch (from the
pygpukit-triton distribution).

- A GPUArray is a pointer argument of a ``@triton.jit`` kernel as it is (``data_ptr()`` and
  ``dtype``); :class:`TritonArray` (:func:`from_gpuarray`, :func:`from_numpy`) adds torch-like helpers.
- :func:`use_triton_backend` makes Triton launch on pygpukit's current device, context and stream.
- :mod:`pygpukit.triton.kernels`: rmsnorm, layernorm, softmax, rotary, swiglu and matmul in Triton.
- :mod:`pygpukit.triton.routing`: per op and per call site, built-in or Triton (or ``auto``).

Triton is imported lazily, on first use, so importing this package stays fast."""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-triton needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-triton", required=("pygpukit-core", "pygpukit-ops"))

from . import kernels, routing  # noqa: E402
from ._interop import (  # noqa: E402
    TritonArray,
    TritonKernelError,
    from_gpuarray,
    from_numpy,
    scratch_allocator,
    triton_available,
    triton_version,
    use_triton_backend,
)
from .routing import get_route, route, set_route  # noqa: E402

__version__ = distribution_version("pygpukit-triton") or "0+unknown"

__all__ = [
    "TritonArray",
    "TritonKernelError",
    "__version__",
    "from_gpuarray",
    "from_numpy",
    "get_route",
    "kernels",
    "route",
    "routing",
    "scratch_allocator",
    "set_route",
    "triton_available",
    "triton_version",
    "use_triton_backend",
]
