"""Type promotion of the op library: NumPy 2's rules, extended to bfloat16 and the float8 types.

- Between NumPy's own types (bool, int*, uint*, float16/32/64) the result is ``numpy.promote_types``:
  int64 with uint64 gives float64, int16 with float16 gives float32, and so on.
- Floats form the order float8 < float16, bfloat16 < float32 < float64 with these joins:
  float16 with bfloat16 gives float32; float8_e4m3fn with float8_e5m2 gives float16; a float8 with
  float16 or bfloat16 gives that 16-bit type.
- An integer with a float gives the first of (that float, float16, float32, float64) that holds
  every value of the integer type exactly, counting float16 and bfloat16 as holding 8-bit integers and
  float8 as holding none: int8 with bfloat16 is bfloat16, int8 with float8 is float16, int16 with
  bfloat16 is float32, int32 or int64 with any 16-bit or 8-bit float is float64. bool joins anything.
- Python scalars are weak (NEP 50): ``bool`` takes the other operand's type; ``int`` takes it unless
  that is bool (then int64), and must fit an integer type; ``float`` takes a float type and makes
  integers and bool float64. NumPy scalars (``np.float32(2)``) are strong, like 0-d arrays.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from pygpukit.core.dtypes import (
    DType,
    all_dtypes,
    as_dtype,
    bfloat16,
    bool_,
    float8_e4m3fn,
    float8_e5m2,
    float16,
    float32,
    float64,
    int64,
)
from pygpukit.core.errors import DTypeError

__all__ = ["can_cast", "promote_types", "result_type"]

_FLOAT8 = (float8_e4m3fn, float8_e5m2)
_EXTENDED = (bfloat16, *_FLOAT8)
_FLOAT_RANK = {float8_e4m3fn: 0, float8_e5m2: 0, float16: 1, bfloat16: 1, float32: 2, float64: 3}
_BY_NUMPY = {d.numpy: d for d in all_dtypes()}


def _integer_bits(dtype: DType) -> int:
    """Significand bits a float needs to hold every value of the integer type ``dtype``."""
    return dtype.itemsize * 8


def _float_holds(floating: DType, bits: int) -> bool:
    if floating in _FLOAT8:
        return False
    if floating in (float16, bfloat16):
        return bits <= 8
    if floating == float32:
        return bits <= 16
    return True


@functools.cache
def _promote(a: DType, b: DType) -> DType:
    if a == b:
        return a
    if a.kind == "b":
        return b
    if b.kind == "b":
        return a
    if a not in _EXTENDED and b not in _EXTENDED:
        return _BY_NUMPY[np.promote_types(a.numpy, b.numpy)]
    if a.is_floating and b.is_floating:
        if {a, b} == {float16, bfloat16}:
            return float32
        if {a, b} == set(_FLOAT8):
            return float16
        return a if _FLOAT_RANK[a] > _FLOAT_RANK[b] else b
    floating, integer = (a, b) if a.is_floating else (b, a)
    bits = _integer_bits(integer)
    for candidate in (floating, float16, float32, float64):
        if _FLOAT_RANK[candidate] >= _FLOAT_RANK[floating] and _float_holds(candidate, bits):
            return candidate
    return float64  # pragma: no cover - float64 always holds


def promote_types(a: Any, b: Any) -> DType:
    """The dtype both ``a`` and ``b`` convert to in a binary op (dtypes, names or NumPy dtypes)."""
    return _promote(as_dtype(a), as_dtype(b))


def scalar_kind(value: Any) -> str | None:
    """ "b", "i" or "f" for a Python bool/int/float (weak scalars), else None."""
    kind = type(value)
    if kind is bool:
        return "b"
    if kind is int:
        return "i"
    if kind is float:
        return "f"
    return None


def apply_weak(strong: DType | None, weak_kinds: str) -> DType:
    """The result of promoting ``strong`` (None when there is no array operand) with weak scalars."""
    result = strong
    for kind in weak_kinds:
        if result is None:
            result = {"b": bool_, "i": int64, "f": float64}[kind]
        elif kind == "i" and result.kind == "b":
            result = int64
        elif kind == "f" and not result.is_floating:
            result = float64
    if result is None:
        raise DTypeError("result_type needs at least one operand")
    return result


def result_type(*operands: Any) -> DType:
    """The dtype NumPy-style promotion gives ``operands``: GPUArrays, NumPy arrays, dtypes and NumPy
    scalars are strong; Python bool, int and float are weak (see the module documentation)."""
    strong: DType | None = None
    weak = ""
    for operand in operands:
        kind = scalar_kind(operand)
        if kind is not None:
            weak += kind
            continue
        if isinstance(operand, complex):
            raise DTypeError("complex numbers are not supported")
        dtype = getattr(operand, "dtype", operand)
        dt = as_dtype(dtype)
        strong = dt if strong is None else _promote(strong, dt)
    return apply_weak(strong, weak)


_KIND_ORDER = {"b": 0, "u": 1, "i": 1, "f": 2}


def can_cast(source: Any, target: Any) -> bool:
    """NumPy's "same_kind" rule: bool to anything, integers to integers and floats, floats to floats."""
    src, dst = as_dtype(source), as_dtype(target)
    if src.kind in "ui" and dst.kind in "ui":
        return bool(np.can_cast(src.numpy, dst.numpy, "same_kind"))
    return _KIND_ORDER[src.kind] <= _KIND_ORDER[dst.kind]
