"""Where the run-time libraries are looked for, in order.

For each library: an explicit ``PYGPUKIT_<LIB>_PATH`` first (a file, or a directory holding it; when
set it is the only candidate, so a wrong value fails loudly instead of silently picking another copy;
a path that does not exist, or a directory holding none of the library's sonames, raises
:class:`LibraryNotFoundError` naming the variable before anything is loaded),
then the NVIDIA pip wheels on ``sys.path`` (CUDA 13 layout ``nvidia/cu13/lib``, CUDA 12 layout
``nvidia/<lib>/lib``), then the system loader and the usual toolkit prefixes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ._env import env_flag
from .errors import DriverNotFoundError, LibraryNotFoundError

__all__ = ["CUBLASLT", "CUDA_DRIVER", "NVRTC", "LibrarySpec", "candidates", "explicit_problem"]

DEBUG_VARIABLE = "PYGPUKIT_DEBUG_LIBRARY_LOAD"  # read by the native loader (native/runtime/shared_library.cpp)


@dataclass(frozen=True)
class LibrarySpec:
    """How to find one library: its env override, sonames per CUDA major and wheel locations."""

    name: str
    env_var: str
    sonames: dict[int, tuple[str, ...]]
    wheel_dirs: dict[int, tuple[str, ...]]


CUDA_DRIVER = LibrarySpec(
    name="libcuda",
    env_var="PYGPUKIT_LIBCUDA_PATH",
    sonames={0: ("libcuda.so.1", "libcuda.so")},
    wheel_dirs={},
)
NVRTC = LibrarySpec(
    name="NVRTC",
    env_var="PYGPUKIT_NVRTC_PATH",
    sonames={13: ("libnvrtc.so.13",), 12: ("libnvrtc.so.12",)},
    wheel_dirs={13: ("nvidia/cu13/lib",), 12: ("nvidia/cuda_nvrtc/lib",)},
)
CUBLASLT = LibrarySpec(
    name="cuBLASLt",
    env_var="PYGPUKIT_CUBLASLT_PATH",
    sonames={13: ("libcublasLt.so.13",), 12: ("libcublasLt.so.12",)},
    wheel_dirs={13: ("nvidia/cu13/lib",), 12: ("nvidia/cublas/lib",)},
)

_SYSTEM_DIRS = (
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/cuda/targets/sbsa-linux/lib",
    "/usr/lib/wsl/lib",
)


def _all_sonames(spec: LibrarySpec) -> list[str]:
    return [soname for major in sorted(spec.sonames, reverse=True) for soname in spec.sonames[major]]


def explicit_problem(spec: LibrarySpec) -> str | None:
    """Why ``spec``'s ``PYGPUKIT_<LIB>_PATH`` cannot work (it does not exist, or is a directory holding
    none of the library's sonames), or None when it is unset or plausible."""
    value = os.environ.get(spec.env_var, "").strip()
    if not value:
        return None
    path = Path(value)
    if path.is_dir():
        if any((path / soname).exists() for soname in _all_sonames(spec)):
            return None
        return f"the directory {value} holds none of {', '.join(_all_sonames(spec))}"
    if not path.exists():
        return f"{value} does not exist"
    return None


def _explicit(spec: LibrarySpec) -> list[str] | None:
    value = os.environ.get(spec.env_var, "").strip()
    if not value:
        return None
    problem = explicit_problem(spec)
    if problem is not None:
        error = DriverNotFoundError if spec is CUDA_DRIVER else LibraryNotFoundError
        raise error(
            f"{spec.name} could not be loaded: {spec.env_var} is set, but {problem}; point it at the library "
            "file or a directory holding it, or unset it to search the usual places",
            library=spec.name,
            attempts=[f"{spec.env_var}={value}: {problem}"],
        )
    path = Path(value)
    if path.is_dir():
        return [str(path / soname) for soname in _all_sonames(spec)]
    return [str(path)]


def _check_debug_flag() -> None:
    """Check PYGPUKIT_DEBUG_LIBRARY_LOAD before the native loader reads it (it reads it unchecked, with
    the rule of :func:`env_flag`: on for 1/true/yes/on, off for anything else), so that a value that is
    not an on/off value is announced once."""
    env_flag(DEBUG_VARIABLE)


def _majors(spec: LibrarySpec, preferred_major: int | None) -> list[int]:
    majors = sorted(spec.sonames, reverse=True)
    if preferred_major in majors:
        majors.remove(preferred_major)
        majors.insert(0, preferred_major)
    return majors


def _toolkit_dirs() -> Iterable[str]:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            yield str(Path(root) / "lib64")
            yield str(Path(root) / "lib")
    yield from _SYSTEM_DIRS


def candidates(spec: LibrarySpec, preferred_major: int | None = None) -> list[str]:
    """Ordered, de-duplicated paths or sonames to try for ``spec``. A ``PYGPUKIT_<LIB>_PATH`` that
    cannot work raises :class:`LibraryNotFoundError` (:class:`DriverNotFoundError` for libcuda)."""
    _check_debug_flag()
    explicit = _explicit(spec)
    if explicit is not None:
        return explicit
    found: list[str] = []
    majors = _majors(spec, preferred_major)
    for major in majors:
        for entry in sys.path:
            if not entry:
                continue
            for rel in spec.wheel_dirs.get(major, ()):
                for soname in spec.sonames[major]:
                    path = Path(entry) / rel / soname
                    if path.is_file():
                        found.append(str(path))
    for major in majors:
        found.extend(spec.sonames[major])  # whatever the system loader resolves
        for directory in _toolkit_dirs():
            for soname in spec.sonames[major]:
                path = Path(directory) / soname
                if path.is_file():
                    found.append(str(path))
    return list(dict.fromkeys(found))
