"""pygpukit.tts: speech synthesis (Kokoro) on pygpukit (from the pygpukit-audio distribution)."""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-audio needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-audio", required=("pygpukit-core", "pygpukit-ops"))

__version__ = distribution_version("pygpukit-audio") or "0+unknown"

__all__ = ["__version__"]
