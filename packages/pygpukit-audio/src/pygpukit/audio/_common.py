"""Argument checks and array helpers shared by the pygpukit.audio modules.

Signals are GPUArrays (NumPy arrays are copied to the device first) of float32 or float64, the dtypes the
audio kernels compute in. Complex arrays have no dtype of their own in pygpukit: a complex array is a
float32 (complex64) or float64 (complex128) GPUArray whose last dimension has size 2, (real, imaginary),
the memory layout of NumPy's complex types (:func:`complex_from_numpy`, :func:`complex_to_numpy`).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from pygpukit.core import backend as _backend
from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import DType, float32, float64
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

__all__ = [
    "Array",
    "as_complex",
    "as_signal",
    "complex_from_numpy",
    "complex_to_numpy",
    "host",
    "is_cuda",
    "number",
    "positive_int",
]

Array = np.ndarray[Any, Any]
FLOATS = (float32, float64)


def is_cuda() -> bool:
    state = _backend._state
    if state is None:
        state = _backend.backend_state()
    return state.name == "cuda"


def host(x: GPUArray) -> Array:
    """The CPU backend's NumPy view of ``x`` (its memory)."""
    return x._host_view()


def _as_array(name: str, what: str, x: Any) -> GPUArray:
    if isinstance(x, GPUArray):
        return x
    if isinstance(x, np.ndarray):
        if x.dtype.kind == "c":
            raise DTypeError(f"{name}: {what} is a complex NumPy array; pass complex_from_numpy({what}) (a float array "
                             f"with a trailing dimension of 2)")  # fmt: skip
        if x.dtype not in (np.float32, np.float64):
            raise DTypeError(f"{name}: {what} must be float32 or float64, got a NumPy array of {x.dtype}; convert it "
                             f"with astype first")  # fmt: skip
        return from_numpy(x)
    raise DTypeError(f"{name}: {what} must be a GPUArray or a NumPy array, got {type(x).__name__}")


def _float_dtype(name: str, what: str, x: GPUArray) -> DType:
    if x.dtype not in FLOATS:
        raise DTypeError(f"{name}: {what} must be float32 or float64, got {x.dtype.name}; convert it with astype first")
    return x.dtype


def as_signal(name: str, what: str, x: Any, *, min_ndim: int = 1) -> GPUArray:
    """``x`` as a real float32/float64 GPUArray with at least ``min_ndim`` dimensions."""
    array = _as_array(name, what, x)
    _float_dtype(name, what, array)
    if array.ndim < min_ndim:
        raise ShapeError(f"{name}: {what} must have at least {min_ndim} dimension(s), got shape {array.shape}")
    return array


def as_complex(name: str, what: str, x: Any) -> GPUArray:
    """``x`` as a complex array: a float32/float64 GPUArray whose last dimension is 2 (real, imaginary), with at
    least one complex dimension; made contiguous on the device when it is not."""
    array = _as_array(name, what, x)
    _float_dtype(name, what, array)
    if array.ndim < 2 or array.shape[-1] != 2:
        raise ShapeError(f"{name}: {what} must be a complex array (a trailing dimension of 2: real, imaginary), got "
                         f"shape {array.shape}")  # fmt: skip
    return array if array.is_contiguous else array.contiguous()


def complex_from_numpy(values: Any, dtype: Any = None) -> GPUArray:
    """A NumPy array (complex or real) as a complex GPUArray: float32 for complex64 and float32 input, float64
    otherwise (or ``dtype``), with a trailing dimension of 2."""
    array = np.asarray(values)
    if dtype is None:
        target = float32 if array.dtype in (np.complex64, np.float32) else float64
    else:
        wanted = np.dtype(dtype.numpy if isinstance(dtype, DType) else dtype)
        if wanted not in (np.float32, np.float64, np.complex64, np.complex128):
            raise DTypeError(f"complex_from_numpy: dtype must be float32/complex64 or float64/complex128, got {wanted}")
        target = float32 if wanted in (np.float32, np.complex64) else float64
    pairs = np.stack([array.real, array.imag if array.dtype.kind == "c" else np.zeros_like(array.real)], axis=-1)
    return from_numpy(np.ascontiguousarray(pairs, dtype=target.numpy))


def complex_to_numpy(x: GPUArray) -> Array:
    """A complex GPUArray (trailing dimension of 2) as a NumPy complex64 (float32) or complex128 (float64) array."""
    if not isinstance(x, GPUArray) or x.ndim < 1 or x.shape[-1] != 2 or x.dtype not in FLOATS:
        raise ShapeError(f"complex_to_numpy: expected a float32/float64 GPUArray with a trailing dimension of 2, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")  # fmt: skip
    pairs = np.ascontiguousarray(x.to_numpy())
    result: Array = pairs.view(np.complex64 if x.dtype == float32 else np.complex128)[..., 0]
    return result


def positive_int(name: str, what: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum`` (bools and floats refused) or :class:`ArgumentError`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral,)):
        raise ArgumentError(f"{name}: {what} must be an int >= {minimum}, got {value!r}")
    result = int(value)
    if result < minimum:
        raise ArgumentError(f"{name}: {what} must be >= {minimum}, got {result}")
    return result


def number(name: str, what: str, value: Any, *, minimum: float | None = None, exclusive: bool = False) -> float:
    """``value`` as a finite float (above ``minimum``) or :class:`ArgumentError`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ArgumentError(f"{name}: {what} must be a real number, got {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise ArgumentError(f"{name}: {what} must be finite, got {result}")
    if minimum is not None and (result < minimum or (exclusive and result == minimum)):
        bound = ">" if exclusive else ">="
        raise ArgumentError(f"{name}: {what} must be {bound} {minimum}, got {result}")
    return result


def normalize_axis(name: str, axis: Any, ndim: int) -> int:
    """``axis`` in [-ndim, ndim) as a non-negative index, or :class:`ArgumentError`."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
        raise ArgumentError(f"{name}: axis must be an int, got {axis!r}")
    if not -ndim <= int(axis) < ndim:
        raise ArgumentError(f"{name}: axis {axis} is out of bounds for {ndim} dimension(s)")
    return int(axis) % ndim
