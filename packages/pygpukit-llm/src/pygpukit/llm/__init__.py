"""pygpukit.llm: LLM inference on pygpukit (from the pygpukit-llm distribution).

Safetensors/GGUF loading, model specs, CausalTransformerModel, decode strategies and chat land here."""

from __future__ import annotations

try:
    from pygpukit._distributions import check_siblings, distribution_version
except ImportError as exc:  # pygpukit-core (which owns pygpukit/__init__.py) is missing
    raise ImportError(
        "pygpukit-llm needs the pygpukit-core distribution, which is not installed: pip install pygpukit-core"
    ) from exc

check_siblings("pygpukit-llm", required=("pygpukit-core", "pygpukit-ops"))

__version__ = distribution_version("pygpukit-llm") or "0+unknown"

__all__ = ["__version__"]
