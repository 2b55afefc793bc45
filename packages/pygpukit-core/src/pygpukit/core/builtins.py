"""The runtime's own kernels (native/kernels/core), compiled on first use like any JIT kernel.

The sources ship inside the pygpukit-core wheel (pygpukit/core/_kernels: common/ and core/); in a
source checkout they are read from native/kernels (:class:`~pygpukit.core.kernel_sources.KernelSources`).
Their cache key includes every shared header, so editing one recompiles.
"""

from __future__ import annotations

import functools
from pathlib import Path

from .abi import KernelStruct
from .dtypes import DType
from .jit import JITKernel, Param
from .kernel_sources import KernelSources

__all__ = ["SOURCES", "STRIDED_LAYOUT", "builtin_kernel", "cast_kernel", "kernel_root", "name_expressions"]

SOURCES = KernelSources(Path(__file__).parent, ("common/element_types.cuh", "core/fill.cu"), "built-in")

MAX_DIMS = 8  # kMaxDims of core/strided_copy.cu

# The layout argument of strided_copy_<suffix> (core/strided_copy.cu).
STRIDED_LAYOUT = KernelStruct("pygpukit::StridedLayout", "core/strided_copy.cu", [
    ("ndim", "int"), ("shape", f"long long[{MAX_DIMS}]"), ("src_strides", f"long long[{MAX_DIMS}]"),
    ("dst_strides", f"long long[{MAX_DIMS}]"),
])  # fmt: skip


def kernel_root() -> Path:
    """Directory holding common/ and core/ kernel sources."""
    return SOURCES.root


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
        STRIDED_LAYOUT.param("layout"),
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
    file = _FILES["cast"]
    expression = _cast_expression(src, dst)
    params = [_pointer("src"), _pointer("dst"), _scalar("n", "long long", "q")]
    return JITKernel(SOURCES.source(file), expression, name_expressions=[expression],
                     include_dirs=SOURCES.include_dirs(file), cache_salt=SOURCES.headers_digest(),
                     params=params)  # fmt: skip


@functools.cache
def builtin_kernel(family: str, dtype: DType) -> JITKernel:
    """The ``<family>_<suffix>`` entry point for ``dtype`` (e.g. ``fill_bf16``)."""
    file = _FILES[family]
    signature = family
    if family == "arange":
        signature = "arange_float" if dtype.is_floating else "arange_int"
    return JITKernel(
        SOURCES.source(file),
        f"{family}_{dtype.suffix}",
        include_dirs=SOURCES.include_dirs(file),
        cache_salt=SOURCES.headers_digest(),
        params=_SIGNATURES[signature],
    )
