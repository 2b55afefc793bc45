"""pygpukit.triton: Triton interop (from the pygpukit-triton distribution).

Triton is imported lazily, on first use, so importing this package stays fast."""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-triton needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-triton", required=("pygpukit-core",))

__version__ = distribution_version("pygpukit-triton") or "0+unknown"

__all__ = ["__version__"]
