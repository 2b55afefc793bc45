"""NVRTC: finding it and compiling CUDA C++ to CUBIN or PTX.

Compilation needs no GPU and no driver, only NVRTC (the pip wheel is enough) and any installed native
module, which is how CI compiles every built-in kernel for every supported architecture.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import _libraries, _variant
from ._loaded_library import LoadedLibrary
from .errors import ArgumentError, NvrtcError

__all__ = [
    "CompiledProgram",
    "compile_source",
    "cuda_include_dirs",
    "get_nvrtc_path",
    "get_nvrtc_version",
    "is_nvrtc_available",
    "nvrtc_status",
    "parse_arch",
]

_nvrtc = LoadedLibrary(_libraries.NVRTC, "load_nvrtc")


def nvrtc_status() -> dict[str, Any]:
    """Load NVRTC once; return its path, version and supported archs. Raises when it cannot load."""
    return _nvrtc.status()


def is_nvrtc_available() -> bool:
    """True when your own kernels can be compiled *and launched* here (:func:`pygpukit.jit`): NVRTC
    loads and the CUDA backend is in use. On the CPU simulation backend it is False even where the
    NVRTC library is installed, because the simulation cannot launch CUDA kernels, so code guarded by
    ``if gp.is_nvrtc_available():`` falls back to the built-in ops there. Compiling without launching
    (:func:`compile_source`, :meth:`JITKernel.compile`) needs only the library:
    :func:`get_nvrtc_version` and :func:`get_nvrtc_path` report it on either backend."""
    from .backend import backend_state

    return backend_state().name == "cuda" and _nvrtc.available()


def get_nvrtc_path() -> str | None:
    """Absolute path of the loaded NVRTC library, or None when it cannot be loaded (either backend)."""
    return nvrtc_status()["path"] if _nvrtc.available() else None


def get_nvrtc_version() -> tuple[int, int] | None:
    """(major, minor) of the loaded NVRTC, or None when it cannot be loaded (either backend)."""
    if not _nvrtc.available():
        return None
    major, minor = nvrtc_status()["version"]
    return int(major), int(minor)


_CUDA_VERSION = re.compile(rb"^#define CUDA_VERSION (\d+)", re.MULTILINE)
_TOOLKIT_INCLUDES = ("/usr/local/cuda/include",)


def _toolkit_major(include: Path) -> int | None:
    """The CUDA major of a toolkit's headers (``CUDA_VERSION`` in its cuda.h), or None if unreadable."""
    try:
        found = _CUDA_VERSION.search((include / "cuda.h").read_bytes())
    except OSError:
        return None
    return int(found.group(1)) // 1000 if found else None


def cuda_include_dirs(major: int) -> list[str]:
    """Include directories of the CUDA headers (cuda_fp16.h, cuda_bf16.h, ...) for NVRTC of ``major``:
    the matching pip wheel's, then a toolkit's of the same major (the headers of another major do not
    compile with this NVRTC, e.g. CUDA 13 headers under NVRTC 12)."""
    rel = Path("nvidia", "cu13", "include") if major >= 13 else Path("nvidia", "cuda_runtime", "include")
    dirs = [str(Path(entry) / rel) for entry in sys.path if entry and (Path(entry) / rel / "cuda_fp16.h").is_file()]
    for root in _TOOLKIT_INCLUDES:
        if (Path(root) / "cuda_fp16.h").is_file() and _toolkit_major(Path(root)) in (major, None):
            dirs.append(root)
    return list(dict.fromkeys(dirs))


_ARCH = re.compile(r"^(?:sm_|compute_)?(\d{2,3})([af]?)$")


def parse_arch(arch: str | int | tuple[int, int]) -> str:
    """Normalise ``"sm_90"``, ``"90"``, ``90`` or ``(9, 0)`` to ``"90"`` (suffixes a/f are kept).

    Raises :class:`ArgumentError` (a ``ValueError``) for anything else: a tuple that is not two
    non-negative ints with a one-digit minor, a negative or one-digit int, a malformed string.
    """
    if isinstance(arch, tuple):
        if (
            len(arch) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in arch)
            and 1 <= arch[0] <= 99
            and 0 <= arch[1] <= 9
        ):
            return f"{arch[0]}{arch[1]}"
        raise ArgumentError(
            f"architecture tuple must be (major, minor) with int major 1..99 and minor 0..9, like (9, 0), got {arch!r}"
        )
    if isinstance(arch, bool) or not isinstance(arch, (str, int)):
        raise ArgumentError(
            f"architecture must be a str, an int or a (major, minor) tuple like 'sm_90', 90 or (9, 0), "
            f"got {type(arch).__name__} {arch!r}"
        )
    match = _ARCH.match(str(arch).strip())
    if match is None:
        raise ArgumentError(f"architecture must look like 'sm_90', '90' or (9, 0), got {arch!r}")
    return match.group(1) + match.group(2)


def _strings(value: Any, what: str, *, paths: bool = False) -> list[str]:
    """A list-of-str argument (with ``paths``, path objects too) as a list of str; a single str (or
    path) counts as one item, not as a sequence of characters."""

    def one(item: Any) -> str | None:
        if isinstance(item, str) or (paths and isinstance(item, os.PathLike)):
            return os.fsdecode(item)
        return None

    single = one(value)
    if single is not None:
        return [single]
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise ArgumentError(f"{what} must be a list of str, got {type(value).__name__} {value!r}")
    result = []
    for item in value:
        text = one(item)
        if text is None:
            raise ArgumentError(f"{what} must be a list of str, got the item {item!r} of type {type(item).__name__}")
        result.append(text)
    return result


@dataclass(frozen=True)
class CompiledProgram:
    """The output of one NVRTC compilation."""

    binary: bytes
    target: Literal["cubin", "ptx"]
    arch: str
    options: tuple[str, ...]
    log: str
    lowered_names: dict[str, str] = field(default_factory=dict)


def compile_source(
    source: str,
    *,
    arch: str | int | tuple[int, int],
    target: Literal["cubin", "ptx"] = "cubin",
    name: str = "kernel.cu",
    options: Sequence[str] = (),
    include_dirs: Sequence[str | Path] = (),
    name_expressions: Sequence[str] = (),
) -> CompiledProgram:
    """Compile ``source`` for ``arch`` with NVRTC; needs no GPU.

    CUBIN is machine code for exactly ``sm_<arch>``; PTX (``target="ptx"``) is the portable fallback.
    ``options``, ``include_dirs`` and ``name_expressions`` are lists of str; a single str is taken as
    one item (``options="-lineinfo"``). Malformed arguments raise :class:`ArgumentError`.
    The CUDA headers of the matching pip wheel are on the include path. Raises :class:`NvrtcError`
    with the log, the options and the numbered source when compilation fails.
    """
    if not isinstance(source, str):
        raise ArgumentError(f"source must be a str of CUDA C++, got {type(source).__name__}")
    if target not in ("cubin", "ptx"):
        raise ArgumentError(f"target must be 'cubin' or 'ptx', got {target!r}")
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"name must be a non-empty str, got {name!r}")
    arch_id = parse_arch(arch)
    option_list = _strings(options, "options")
    include_list = _strings(include_dirs, "include_dirs", paths=True)
    expressions = _strings(name_expressions, "name_expressions")
    status = nvrtc_status()
    prefix = "sm" if target == "cubin" else "compute"
    major = int(status["version"][0])
    opts = [f"--gpu-architecture={prefix}_{arch_id}", "--std=c++17"]
    opts += [f"--include-path={d}" for d in [*include_list, *cuda_include_dirs(major)]]
    opts += option_list
    native = _variant.any_native()
    assert native is not None  # nvrtc_status() succeeded, so a native module exists
    try:
        binary, log, lowered = native.nvrtc_compile(source, name, opts, target, expressions)
    except NvrtcError as exc:
        exc.source = source
        raise
    return CompiledProgram(bytes(binary), target, arch_id, tuple(opts), log, dict(lowered))
