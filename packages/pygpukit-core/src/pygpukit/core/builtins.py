"""The runtime's own kernels (native/kernels/core), compiled on first use like any JIT kernel.

The sources ship inside the pygpukit-core wheel (pygpukit/core/_kernels); in a source checkout they
are read from native/kernels. Their cache key includes every shared header, so editing one recompiles.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from .dtypes import DType
from .errors import PyGPUkitError
from .jit import JITKernel, Param

__all__ = ["builtin_kernel", "cast_kernel", "kernel_root", "name_expressions"]


@functools.cache
def kernel_root() -> Path:
    """Directory holding common/ and core/ kernel sources."""
    here = Path(__file__).resolve().parent
    candidates = [here / "_kernels"]  # a wheel
    if len(here.parents) > 4:  # a checkout: packages/pygpukit-core/src/pygpukit/core
        candidates.append(here.parents[4] / "native" / "kernels")
    for candidate in candidates:
        if (candidate / "common" / "element_types.cuh").is_file():
            return candidate
    raise PyGPUkitError(f"built-in kernel sources not found (looked in {here / '_kernels'})")


@functools.cache
def _headers_digest() -> str:
    h = hashlib.sha256()
    for path in sorted((kernel_root() / "common").rglob("*.cuh")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _pointer(name: str) -> Param:
    return Param(name, "void*", "pointer", "Q")


def _scalar(name: str, ctype: str, fmt: str) -> Param:
    return Param(name, ctype, "scalar", fmt)


_SIGNATURES: dict[str, list[Param]] = {
    "fill": [_pointer("out"), _scalar("bits", "unsigned long long", "Q"), _scalar("n", "long long", "q")],
    "strided_copy": [
        _pointer("dst"),
        _pointer("src"),
        _scalar("n", "long long", "q"),
        Param("layout", "StridedLayout", "opaque", ""),
    ],
    "arange_float": [
        _pointer("out"),
        _scalar("start", "double", "d"),
        _scalar("step", "double", "d"),
        _scalar("n", "long long", "q"),
    ],
    "arange_int": [
        _pointer("out"),
        _scalar("start", "long long", "q"),
        _scalar("step", "long long", "q"),
        _scalar("n", "long long", "q"),
    ],
}
_FILES = {
    "fill": "core/fill.cu",
    "strided_copy": "core/strided_copy.cu",
    "arange": "core/arange.cu",
    "cast": "core/cast.cu",
}


def _cast_expression(src: DType, dst: DType) -> str:
    return f"pygpukit::cast<{src.ctype}, {dst.ctype}>"


def name_expressions(relative_path: str) -> list[str]:
    """Template instantiations a kernel file needs (for compile checks of every instantiation)."""
    if relative_path == _FILES["cast"]:
        from .dtypes import all_dtypes

        return [_cast_expression(a, b) for a in all_dtypes() for b in all_dtypes()]
    return []


@functools.cache
def cast_kernel(src: DType, dst: DType) -> JITKernel:
    """The conversion kernel from ``src`` to ``dst`` elements, compiled for this one pair on first use."""
    path = kernel_root() / _FILES["cast"]
    expression = _cast_expression(src, dst)
    params = [_pointer("src"), _pointer("dst"), _scalar("n", "long long", "q")]
    return JITKernel(path.read_text(), expression, name_expressions=[expression], include_dirs=[str(path.parent)],
                     cache_salt=_headers_digest(), params=params)  # fmt: skip


@functools.cache
def builtin_kernel(family: str, dtype: DType) -> JITKernel:
    """The ``<family>_<suffix>`` entry point for ``dtype`` (e.g. ``fill_bf16``)."""
    path = kernel_root() / _FILES[family]
    signature = family
    if family == "arange":
        signature = "arange_float" if dtype.is_floating else "arange_int"
    return JITKernel(
        path.read_text(),
        f"{family}_{dtype.suffix}",
        include_dirs=[str(path.parent)],
        cache_salt=_headers_digest(),
        params=_SIGNATURES[signature],
    )
