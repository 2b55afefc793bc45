"""Argument checks shared by the nn op families (norms, gated activations, embedding gathers, conv1d):
operand types and dtypes, per-feature parameters, row layouts, outputs and the overlap rule.

Row ops need unit stride along the last axis and leading axes that merge into one row stride
(:func:`rows`); an output may be the very same view as an input of a row op (in place), any other
overlap between an output and an input raises :class:`ArgumentError` (:func:`check_overlap`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType, bfloat16, float16, float32, int32, int64
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

from . import _cpu
from ._layout import collapse, same_view

__all__ = [
    "FLOATS",
    "INDEX_DTYPES",
    "INT32_MAX",
    "aligned",
    "array",
    "check_overlap",
    "eps_value",
    "float_input",
    "host64",
    "index_input",
    "output",
    "positive",
    "pow2_at_least",
    "rows",
    "same_dtype",
    "vector_param",
]

FLOATS = (float32, float16, bfloat16)
INDEX_DTYPES = (int32, int64)
INT32_MAX = 2**31 - 1
Array = np.ndarray[Any, Any]


def array(name: str, what: str, value: Any) -> GPUArray:
    if not isinstance(value, GPUArray):
        raise DTypeError(f"{name}: {what} must be a GPUArray, got {type(value).__name__}")
    return value


def float_input(name: str, what: str, value: Any) -> GPUArray:
    a = array(name, what, value)
    if a.dtype not in FLOATS:
        raise DTypeError(f"{name}: {what} must be float32, float16 or bfloat16, got {a.dtype}")
    return a


def index_input(name: str, what: str, value: Any) -> GPUArray:
    a = array(name, what, value)
    if a.dtype not in INDEX_DTYPES:
        raise DTypeError(f"{name}: {what} must be int32 or int64, got {a.dtype}")
    return a


def same_dtype(name: str, what: str, value: GPUArray, dtype: DType) -> None:
    if value.dtype != dtype:
        raise DTypeError(f"{name}: {what} has dtype {value.dtype} but must be {dtype}")


def vector_param(name: str, what: str, value: Any, size: int, dtypes: Sequence[DType]) -> GPUArray | None:
    """An optional 1-D per-feature parameter (weight, bias) of ``size`` elements and one of ``dtypes``."""
    if value is None:
        return None
    a = array(name, what, value)
    if a.shape != (size,):
        raise ShapeError(f"{name}: {what} must have shape ({size},), got {a.shape}")
    if a.dtype not in dtypes:
        listed = " or ".join(str(d) for d in dict.fromkeys(dtypes))
        raise DTypeError(f"{name}: {what} must be {listed}, got {a.dtype}")
    if size > 1 and a._strides[0] != 1:
        raise ShapeError(f"{name}: {what} must be contiguous, got strides {a.strides}")
    return a


def eps_value(name: str, eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps < 0:
        raise ArgumentError(f"{name}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def positive(name: str, what: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ArgumentError(f"{name}: {what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def rows(name: str, what: str, a: GPUArray) -> tuple[int, int]:
    """(rows, row stride in elements) of ``a`` seen as a rows x last-axis matrix; ShapeError when the
    last axis is strided or the leading axes do not merge into one stride."""
    if a.ndim == 0:
        raise ShapeError(f"{name}: {what} needs at least one dimension, got a 0-d array")
    last = a._shape[-1]
    if last > 1 and a._strides[-1] != 1:
        raise ShapeError(f"{name}: {what} needs unit stride along its last axis, got shape {a.shape} and strides "
                         f"{a.strides} (bytes); call .contiguous() first")  # fmt: skip
    if a.size == 0:
        return math.prod(a._shape[:-1]), max(last, 1)
    dims, (strides,) = collapse(a._shape[:-1], [a._strides[:-1]])
    if len(dims) > 1:
        raise ShapeError(f"{name}: the leading axes of {what} (shape {a.shape}, strides {a.strides} bytes) do not "
                         "merge into one row stride; call .contiguous() first")  # fmt: skip
    if not dims:
        return 1, max(last, 1)
    return dims[0], strides[0]


def output(name: str, what: str, out: Any, shape: tuple[int, ...], dtype: DType) -> GPUArray:
    """``out`` checked against the result's shape and dtype, or a fresh array when it is None."""
    if out is None:
        return empty(shape, dtype)
    a = array(name, what, out)
    if a.shape != shape:
        raise ShapeError(f"{name}: {what} has shape {a.shape} but the result has shape {shape}")
    if a.dtype != dtype:
        raise DTypeError(f"{name}: {what} has dtype {a.dtype} but the result is {dtype}")
    return a


def _extent(a: GPUArray) -> tuple[int, int]:
    """[first, last] byte offsets ``a`` touches in its allocation."""
    low = high = a._offset
    for size, stride in zip(a._shape, a._strides, strict=True):
        if size > 1:
            if stride > 0:
                high += (size - 1) * stride
            else:
                low += (size - 1) * stride
    return low * a.itemsize, (high + 1) * a.itemsize - 1


def check_overlap(name: str, outputs: Sequence[tuple[str, GPUArray]], inputs: Sequence[tuple[str, GPUArray | None]],
                  in_place: bool) -> None:  # fmt: skip
    """ArgumentError when an output shares memory with an input (or another output), except an output
    that is exactly the same view as an input when ``in_place`` is allowed."""
    for index, (out_name, out) in enumerate(outputs):
        if out.size == 0:
            continue
        others: list[tuple[str, GPUArray | None, bool]] = [(n, a, in_place) for n, a in inputs]
        others += [(n, a, False) for n, a in outputs[index + 1 :]]
        for in_name, other, allowed in others:
            if other is None or other._buffer is not out._buffer or other.size == 0:
                continue
            if allowed and same_view(other, out):
                continue
            (a0, a1), (b0, b1) = _extent(other), _extent(out)
            if a0 <= b1 and b0 <= a1:
                raise ArgumentError(
                    f"{name}: {out_name} overlaps {in_name} in memory"
                    + (" (only the very same view is allowed, for in-place use)" if allowed else "")
                )


def aligned(a: GPUArray, stride: int, count: int, width: int) -> bool:
    """Whether every one of ``count`` row starts of ``a`` is aligned to ``width`` elements (16 bytes
    for packs)."""
    return a.device_ptr % (width * a.itemsize) == 0 and (count <= 1 or stride % width == 0)


def pow2_at_least(value: int, low: int, high: int) -> int:
    result = low
    while result < value and result < high:
        result *= 2
    return result


def host64(a: GPUArray) -> Array:
    """A CPU-backend array's values as float64 (the CPU references compute in float64)."""
    return _cpu.host(a).astype(np.float64)
