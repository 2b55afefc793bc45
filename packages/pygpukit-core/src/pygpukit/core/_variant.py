"""Choosing the native module variant (``_native_cu12`` or ``_native_cu13``) that matches the driver.

Each variant ships in its own distribution (``pygpukit-core-cu12`` / ``pygpukit-core-cu13``) and asks
the driver for entry points at its CUDA major's ABI, so it needs a driver for that major or newer.
The driver version is read with ctypes before any variant is imported; the newest installed variant
the driver supports wins. ``PYGPUKIT_CUDA_VARIANT=cu12|cu13`` forces one.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from . import _install, _libraries
from ._env import env_choice
from .errors import LibraryNotFoundError, PyGPUkitError, VersionMismatchError

if TYPE_CHECKING:
    from ._native import NativeModule

__all__ = [
    "VARIANTS",
    "VariantChoice",
    "any_native",
    "choose_variant",
    "installed_variants",
    "preferred_major",
    "probe_driver_version",
]

VARIANTS: dict[str, int] = {"cu13": 13, "cu12": 12}  # newest first


def _module_name(variant: str) -> str:
    return f"pygpukit.core._native_{variant}"


def installed_variants() -> list[str]:
    """Variants whose native module can be found, newest first."""
    found = []
    for variant in VARIANTS:
        try:
            if importlib.util.find_spec(_module_name(variant)) is not None:
                found.append(variant)
        except (ImportError, ValueError):
            continue
    return found


@dataclass
class DriverProbe:
    """What ctypes could learn about the driver without any native module."""

    version: int | None = None  # e.g. 13000; None if libcuda did not load
    path: str | None = None
    attempts: list[str] = field(default_factory=list)
    error: str | None = None  # why no candidate was tried (a PYGPUKIT_LIBCUDA_PATH that cannot work)


def probe_driver_version() -> DriverProbe:
    """Load libcuda with ctypes and call cuDriverGetVersion (which needs no cuInit)."""
    probe = DriverProbe()
    try:
        candidates = _libraries.candidates(_libraries.CUDA_DRIVER)
    except LibraryNotFoundError as exc:
        probe.attempts = list(exc.attempts)
        probe.error = str(exc)
        return probe
    for candidate in candidates:
        try:
            lib = ctypes.CDLL(candidate, mode=ctypes.RTLD_LOCAL)
        except OSError as exc:
            probe.attempts.append(f"{candidate}: {exc}")
            continue
        version = ctypes.c_int(0)
        try:
            result = lib.cuDriverGetVersion(ctypes.byref(version))
        except AttributeError:
            probe.attempts.append(f"{candidate}: has no cuDriverGetVersion")
            continue
        if result != 0:
            probe.attempts.append(f"{candidate}: cuDriverGetVersion returned {result}")
            continue
        probe.version = version.value
        probe.path = candidate
        return probe
    return probe


def format_cuda_version(version: int) -> str:
    return f"{version // 1000}.{(version % 1000) // 10}"


@dataclass
class VariantChoice:
    """The outcome of choosing a variant: the module, or ``None`` with the reason."""

    variant: str | None
    module: NativeModule | None
    reason: str
    driver: DriverProbe


def _import_variant(variant: str) -> NativeModule:
    """The native module of ``variant``, typed as the :class:`~pygpukit.core._native.NativeModule`
    seam (tests/test_native_seam.py checks that the two list the same names)."""
    module = cast("NativeModule", importlib.import_module(_module_name(variant)))
    from .. import __version__ as core_version

    native_version = getattr(module, "__version__", "?")
    if native_version != core_version:
        raise VersionMismatchError(
            f"pygpukit-core {core_version} found the native module of pygpukit-core-{variant} {native_version}; "
            f"the two must have the same version; {_install.variant_fix(variant)}"
        )
    return module


def choose_variant() -> VariantChoice:
    """Pick the native module for this machine's driver, explaining the choice either way."""
    installed = installed_variants()
    driver = probe_driver_version()
    forced = env_choice("PYGPUKIT_CUDA_VARIANT", sorted(VARIANTS), "")
    if forced:
        if forced not in installed:
            why = f"PYGPUKIT_CUDA_VARIANT={forced} but pygpukit-core-{forced} is not installed; "
            return VariantChoice(None, None, why + _install.variant_fix(forced), driver)
        return VariantChoice(forced, _import_variant(forced), f"forced by PYGPUKIT_CUDA_VARIANT={forced}", driver)
    if not installed:
        fix = _install.variant_fix(_install.variant_for_driver(driver.version))
        return VariantChoice(None, None, f"no native module is installed (pygpukit-core-cu13 or -cu12); {fix}", driver)
    if driver.version is None:
        why = "CUDA driver not detected" if driver.error is None else f"CUDA driver not detected: {driver.error}"
        return VariantChoice(None, None, why, driver)
    usable = [v for v in installed if driver.version >= VARIANTS[v] * 1000]
    if not usable:
        have = ", ".join(f"{v} (needs CUDA >= {VARIANTS[v]}.0)" for v in installed)
        fix = (
            f"pygpukit-core-cu12 works with CUDA 12 drivers; {_install.variant_fix('cu12')}"
            if driver.version >= 12000
            else "pygpukit needs a driver for CUDA 12.0 or newer: update the NVIDIA driver"
        )
        return VariantChoice(
            None,
            None,
            f"the driver supports CUDA {format_cuda_version(driver.version)} but the installed native variants "
            f"need a newer one: {have}; {fix}",
            driver,
        )
    variant = usable[0]
    why = f"newest installed variant supported by the driver (CUDA {format_cuda_version(driver.version)})"
    return VariantChoice(variant, _import_variant(variant), why, driver)


def preferred_major(native: NativeModule) -> int:
    """The CUDA major whose NVRTC/cuBLASLt to try first: the driver's, so code NVRTC emits can load.

    Without a driver (compile-only use) it is the native module's own major.
    """
    version = probe_driver_version().version
    if version is not None:
        return min(version // 1000, max(VARIANTS.values()))
    return int(getattr(native, "CUDA_MAJOR", max(VARIANTS.values())))


def any_native() -> NativeModule | None:
    """The native module that loads NVRTC and cuBLASLt for this process (driver or not; enough for
    NVRTC compile-only work): the one :func:`choose_variant` picks when it picks one, so the libraries
    are loaded into the module the CUDA backend launches with (each module keeps its own handles);
    otherwise any installed one."""
    installed = installed_variants()
    order: list[str] = []
    try:
        forced = env_choice("PYGPUKIT_CUDA_VARIANT", sorted(VARIANTS), "")
    except PyGPUkitError:
        forced = ""  # choose_variant raises it where the backend starts
    if forced in installed:
        order.append(forced)
    driver = probe_driver_version().version
    if driver is not None:
        order += [v for v in installed if driver >= VARIANTS[v] * 1000]
    for variant in dict.fromkeys([*order, *installed]):
        try:
            return _import_variant(variant)
        except ImportError:
            continue
    return None
