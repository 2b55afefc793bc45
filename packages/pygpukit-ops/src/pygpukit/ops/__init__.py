"""pygpukit.ops: the NumPy-like op library (from the pygpukit-ops distribution).

Elementwise ops, reductions, GEMM/GEMV through cuBLASLt, nn ops and attention land here; their names are
also reachable as ``pygpukit.<op>``. Kernels live in native/kernels and are compiled by NVRTC."""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-ops needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-ops", required=("pygpukit-core",))

__version__ = distribution_version("pygpukit-ops") or "0+unknown"

__all__ = ["__version__"]
