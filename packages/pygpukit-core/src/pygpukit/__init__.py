"""pygpukit: a small, explicit and fast GPU runtime for Python.

This package (from the ``pygpukit-core`` distribution) holds the runtime. The other distributions add
subpackages to it: ``pygpukit.ops``, ``.llm``, ``.audio``, ``.scheduler``, ``.triton``. Importing one
that is not installed raises :class:`MissingDistributionError` naming what to install.

Every op of ``pygpukit.ops`` is also a top-level name (``pygpukit.add``, ``pygpukit.gemv``, ...),
loaded on first use; ``pygpukit.__all__`` lists the runtime's names and, when pygpukit-ops is
installed, the op library's (computed on first access, which imports the op library).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
from typing import Any

# Editable installs put each distribution's src/pygpukit in its own directory; extend_path makes them
# one package. In a wheel installation they share site-packages/pygpukit and this is a no-op.
__path__ = pkgutil.extend_path(__path__, __name__)

try:
    __version__ = importlib.metadata.version("pygpukit-core")
except importlib.metadata.PackageNotFoundError:  # a bare source tree
    __version__ = "0+unknown"

from ._distributions import check_siblings, install_missing_subpackage_hook

check_siblings("pygpukit-core")
install_missing_subpackage_hook()

from .core import *  # noqa: E402,F403
from .core import __all__ as _core_all  # noqa: E402
from .info import collect_info as info  # noqa: E402,F401  (in __all__, which __getattr__ computes)

_RUNTIME_ALL = [*_core_all, "__version__", "info"]

_SUBPACKAGES = ("ops", "llm", "audio", "asr", "tts", "scheduler", "triton")


def _all_names() -> list[str]:
    """``__all__``: the runtime's names, then the op library's (when pygpukit-ops is installed)."""
    names = list(_RUNTIME_ALL)
    try:
        ops = importlib.import_module(f"{__name__}.ops")
    except ModuleNotFoundError:  # MissingDistributionError included: the runtime alone
        return names
    known = set(names)
    names += [name for name in getattr(ops, "__all__", ()) if name not in known and not name.startswith("_")]
    return names


def __getattr__(name: str) -> Any:
    # Subpackages load on first access, and the op library's names are reachable as pygpukit.<op>.
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "__all__":
        value = globals()["__all__"] = _all_names()
        return value
    if name.startswith("_"):
        raise AttributeError(name)
    try:
        ops = importlib.import_module(f"{__name__}.ops")
    except ModuleNotFoundError as exc:
        raise AttributeError(
            f"module 'pygpukit' has no attribute {name!r} (op names come from the pygpukit-ops distribution, "
            f"which is not installed)"
        ) from exc
    if name in getattr(ops, "__all__", ()):
        value = getattr(ops, name)
        globals()[name] = value  # later lookups are plain module attributes (tiny ops pay per call)
        return value
    raise AttributeError(f"module 'pygpukit' has no attribute {name!r}")
