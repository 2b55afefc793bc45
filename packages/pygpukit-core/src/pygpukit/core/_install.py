"""The exact pip command that installs missing or mismatched pygpukit pieces, for error messages.

The name ``pygpukit`` on PyPI belongs to an unrelated, earlier project (releases 0.1.0 to 0.2.19), so
``pip install pygpukit`` or ``pip install 'pygpukit[cu12]'`` from PyPI fetches that code. The commands
built here therefore never name the meta package: they name the distributions themselves at the
installed core's version (``pygpukit-core-cu12==0.1.0``) and the NVIDIA wheels, and read pygpukit's
wheels with ``--find-links`` from the wheelhouse they came from:

1. ``PIP_FIND_LINKS`` when it is set (pip reads it too);
2. the directory of the wheel file an installed pygpukit distribution was installed from (pip records
   it in ``direct_url.json`` when a wheel is installed by path), or ``dist/wheelhouse`` of the
   checkout an editable install points at;
3. otherwise the placeholder ``WHEELHOUSE``, explained in the message (docs/packaging.md).

The NVIDIA requirements equal the ``cu12`` / ``cu13`` extras of the meta package
(tests/test_packaging.py checks that).
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import shlex
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = [
    "CUDA_REQUIREMENTS",
    "DriverMismatchWarning",
    "driver_mismatch",
    "install_command",
    "install_hint",
    "library_fix",
    "variant_fix",
    "variant_for_driver",
    "wheelhouse",
]

# The NVIDIA wheels of each CUDA variant: NVRTC, cuBLAS (cuBLASLt) and the runtime headers NVRTC needs.
CUDA_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "cu13": ("nvidia-cuda-nvrtc>=13.0,<14", "nvidia-cublas>=13.0,<14", "nvidia-cuda-runtime>=13.0,<14"),
    "cu12": ("nvidia-cuda-nvrtc-cu12>=12.8,<13", "nvidia-cublas-cu12>=12.8,<13", "nvidia-cuda-runtime-cu12>=12.8,<13"),
}
PLACEHOLDER = "WHEELHOUSE"
_OURS = ("pygpukit-core", "pygpukit-core-cu13", "pygpukit-core-cu12", "pygpukit", "pygpukit-ops")


def _installed_from(distribution: str) -> str | None:
    """The wheelhouse `distribution` was installed from, per its direct_url.json, or None."""
    try:
        text = metadata.distribution(distribution).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        url = str(json.loads(text).get("url", ""))
    except (ValueError, AttributeError):
        return None
    parsed = urlparse(url)
    if parsed.scheme != "file":
        return None
    path = Path(unquote(parsed.path))
    if path.suffix == ".whl":
        return str(path.parent)
    checkout = path.parent.parent / "dist" / "wheelhouse"  # an editable packages/<name> of a checkout
    return str(checkout) if path.parent.name == "packages" and checkout.is_dir() else None


def wheelhouse() -> str | None:
    """Where pygpukit's wheels can be read from (see the module docstring), or None when unknown."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if links:
        return links[0]
    for distribution in _OURS:
        found = _installed_from(distribution)
        if found is not None:
            return found
    return None


def install_command(*requirements: str) -> str:
    """``<this python> -m pip install <requirements> --find-links <wheelhouse>``, shell-quoted."""
    where = wheelhouse() or PLACEHOLDER
    words = [sys.executable or "python3", "-m", "pip", "install", *requirements, "--find-links", where]
    return " ".join(w if w == PLACEHOLDER else shlex.quote(w) for w in words)


def install_hint(*requirements: str) -> str:
    """:func:`install_command`, followed by what ``WHEELHOUSE`` means when the wheelhouse is unknown."""
    hint = install_command(*requirements)
    if wheelhouse() is None:
        hint += (f" ({PLACEHOLDER}: the directory holding the pygpukit wheels, e.g. dist/wheelhouse of "
                 "`nox -s release`; `pip install pygpukit` from PyPI installs an unrelated project)")  # fmt: skip
    return hint


def _fix(*requirements: str) -> str:
    return f"fix: {install_hint(*requirements)}"


def _core_version() -> str:
    try:
        return metadata.version("pygpukit-core")
    except metadata.PackageNotFoundError:
        from .. import __version__

        return __version__


def variant_fix(variant: str) -> str:
    """``fix: <command>`` installing pygpukit-core-<variant> at core's version and its NVIDIA wheels."""
    return _fix(f"pygpukit-core-{variant}=={_core_version()}", *CUDA_REQUIREMENTS[variant])


def library_fix(major: int) -> str:
    """``fix: <command>`` installing the NVRTC, cuBLAS and header wheels of CUDA ``major``."""
    variant = f"cu{major}" if f"cu{major}" in CUDA_REQUIREMENTS else "cu13"
    return _fix(*CUDA_REQUIREMENTS[variant])


def variant_for_driver(driver_version: int | None) -> str:
    """The variant a driver of ``driver_version`` (e.g. 12080) runs: cu12 for CUDA 12 drivers, else cu13."""
    return "cu12" if driver_version is not None and 12000 <= driver_version < 13000 else "cu13"


class DriverMismatchWarning(RuntimeWarning):
    """NVRTC or cuBLASLt of a newer CUDA major than the driver supports was loaded."""


def driver_mismatch(library: str, path: str, driver_version: int | None) -> str | None:
    """Why `library` loaded from `path` (``...libnvrtc.so.13``) cannot serve a driver of
    ``driver_version`` (e.g. 12080), with the fix, or None when it can (or no driver is known).
    Code NVRTC 13 compiles does not load on a CUDA 12 driver, and cuBLASLt 13 needs a CUDA 13 driver."""
    match = re.search(r"\.so\.(\d+)", path)
    if driver_version is None or match is None:
        return None
    major = int(match.group(1))
    if major * 1000 <= driver_version:
        return None
    driver = f"{driver_version // 1000}.{(driver_version % 1000) // 10}"
    return (f"{library} {path} is from CUDA {major} but the driver supports CUDA {driver}; "
            f"{library_fix(driver_version // 1000)}")  # fmt: skip
