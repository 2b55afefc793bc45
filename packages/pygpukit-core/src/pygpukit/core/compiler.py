"""NVRTC: finding it and compiling CUDA C++ to CUBIN or PTX.

Compilation needs no GPU and no driver, only NVRTC (the pip wheel is enough) and any installed native
module, which is how CI compiles every built-in kernel for every supported architecture.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import _libraries, _variant
from ._loaded_library import LoadedLibrary
from .errors import NvrtcError

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
    """True when NVRTC can be loaded."""
    return _nvrtc.available()


def get_nvrtc_path() -> str | None:
    """Absolute path of the loaded NVRTC library, or None."""
    return nvrtc_status()["path"] if is_nvrtc_available() else None


def get_nvrtc_version() -> tuple[int, int] | None:
    """(major, minor) of the loaded NVRTC, or None."""
    if not is_nvrtc_available():
        return None
    major, minor = nvrtc_status()["version"]
    return int(major), int(minor)


def cuda_include_dirs(major: int) -> list[str]:
    """Include directories of the CUDA headers (cuda_fp16.h, cuda_bf16.h, ...) for NVRTC of ``major``."""
    rel = Path("nvidia", "cu13", "include") if major >= 13 else Path("nvidia", "cuda_runtime", "include")
    dirs = [str(Path(entry) / rel) for entry in sys.path if entry and (Path(entry) / rel / "cuda_fp16.h").is_file()]
    for root in ("/usr/local/cuda/include",):
        if (Path(root) / "cuda_fp16.h").is_file():
            dirs.append(root)
    return list(dict.fromkeys(dirs))


_ARCH = re.compile(r"^(?:sm_|compute_)?(\d{2,3})([af]?)$")


def parse_arch(arch: str | int | tuple[int, int]) -> str:
    """Normalise ``"sm_90"``, ``"90"``, ``90`` or ``(9, 0)`` to ``"90"`` (suffixes a/f are kept)."""
    if isinstance(arch, tuple):
        return f"{arch[0]}{arch[1]}"
    match = _ARCH.match(str(arch).strip())
    if match is None:
        raise ValueError(f"architecture must look like 'sm_90', '90' or (9, 0), got {arch!r}")
    return match.group(1) + match.group(2)


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
    The CUDA headers of the matching pip wheel are on the include path. Raises :class:`NvrtcError`
    with the log, the options and the numbered source when compilation fails.
    """
    if target not in ("cubin", "ptx"):
        raise ValueError(f"target must be 'cubin' or 'ptx', got {target!r}")
    status = nvrtc_status()
    arch_id = parse_arch(arch)
    prefix = "sm" if target == "cubin" else "compute"
    major = int(status["version"][0])
    opts = [f"--gpu-architecture={prefix}_{arch_id}", "--std=c++17"]
    opts += [f"--include-path={d}" for d in [*map(str, include_dirs), *cuda_include_dirs(major)]]
    opts += list(options)
    native = _variant.any_native()
    assert native is not None  # nvrtc_status() succeeded, so a native module exists
    try:
        binary, log, lowered = native.nvrtc_compile(source, name, opts, target, list(name_expressions))
    except NvrtcError as exc:
        exc.source = source
        raise
    return CompiledProgram(bytes(binary), target, arch_id, tuple(opts), log, dict(lowered))
