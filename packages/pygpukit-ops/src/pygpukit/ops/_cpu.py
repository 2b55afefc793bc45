"""The CPU simulation backend of the op library: the same ops computed with NumPy on host memory.

The op modules validate arguments, promote types and allocate results exactly as on the GPU, then
call in here with operands already converted to the kernels' compute type (float32 for fp16, bf16 and
fp8; float64; integers; bool), so both backends round once, at the store, and give the same dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray
from pygpukit.core.dtypes import cast_values

__all__ = ["BINARY", "UNARY", "compute_numpy", "host", "store"]

Array = np.ndarray[Any, Any]

_COMPUTE = {"double": np.float64, "float": np.float32, "bool": np.bool_, "signed char": np.int8, "short": np.int16,
            "int": np.int32, "long long": np.int64, "unsigned char": np.uint8, "unsigned short": np.uint16,
            "unsigned int": np.uint32, "unsigned long long": np.uint64}  # fmt: skip


def compute_numpy(ctype: str) -> np.dtype[Any]:
    """The NumPy dtype of a kernel compute type (``"float"`` -> float32)."""
    return np.dtype(_COMPUTE[ctype])


def host(array: GPUArray) -> Array:
    """The NumPy view of a CPU-backend array's memory (its own strides)."""
    return array._host_view()


def store(out: GPUArray, values: Any) -> None:
    """Write ``values`` (any NumPy dtype) into ``out`` with the conversion the kernels make
    (:func:`pygpukit.core.dtypes.cast_values`): float8_e4m3fn, which has no infinity, saturates
    out-of-range values and infinities to +-448 instead of NaN."""
    view = host(out)
    if view.size:
        view[...] = cast_values(values, out.dtype)


def _power(a: Array, b: Array) -> Array:
    if a.dtype.kind != "i":
        result: Array = np.power(a, b)
        return result
    a, b = np.broadcast_arrays(a, b)
    negative = b < 0
    result = np.power(a, np.where(negative, 0, b).astype(b.dtype))
    one = np.ones((), a.dtype)
    odd = (b & 1).astype(bool)
    truncated = np.where(a == 1, one, np.where(a == -1, np.where(odd, -one, one), np.zeros((), a.dtype)))
    return np.where(negative, truncated, result)


def _add(a: Array, b: Array) -> Array:
    result: Array = np.logical_or(a, b) if a.dtype == np.bool_ else np.add(a, b)
    return result


def _mul(a: Array, b: Array) -> Array:
    result: Array = np.logical_and(a, b) if a.dtype == np.bool_ else np.multiply(a, b)
    return result


BINARY: dict[str, Callable[[Array, Array], Array]] = {
    "add": _add,
    "sub": np.subtract,
    "mul": _mul,
    "div": np.true_divide,
    "floor_divide": np.floor_divide,
    "mod": np.remainder,
    "pow": _power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}


def _vectorized_erf() -> Callable[[Array], Array]:
    """erf over a float64 array: SciPy's (vectorized, within an ulp or two of math.erf) where SciPy is
    installed, else math.erf element by element (about 100x slower on the CPU simulation's GELUs)."""
    try:
        from scipy.special import erf  # type: ignore[import-untyped]
    except ImportError:
        return np.vectorize(math.erf, otypes=[np.float64])
    return lambda x: np.asarray(erf(np.asarray(x, dtype=np.float64)), dtype=np.float64)


erf = _vectorized_erf()


def _typed(x: Array, value: Any) -> Array:
    return np.asarray(value, dtype=x.dtype)


def _abs(x: Array) -> Array:
    result: Array = x if x.dtype == np.bool_ else np.abs(x)
    return result


def _gelu(x: Array) -> Array:  # the exact GELU (erf form)
    values: Array = erf(x * _typed(x, 0.7071067811865476)).astype(x.dtype)
    result: Array = _typed(x, 0.5) * x * (_typed(x, 1.0) + values)
    return result


def _gelu_tanh(x: Array) -> Array:  # its tanh approximation
    inner = _typed(x, 0.7978845608028654) * (x + _typed(x, 0.044715) * x * x * x)
    result: Array = _typed(x, 0.5) * x * (_typed(x, 1.0) + np.tanh(inner))
    return result


UNARY: dict[str, Callable[[Array], Array]] = {
    "identity": lambda x: x,
    "neg": np.negative,
    "abs": _abs,
    "sign": np.sign,
    "relu": lambda x: np.where(x < 0, np.zeros((), x.dtype), x),
    "logical_not": np.logical_not,
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "log2": np.log2,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: _typed(x, 1.0) / np.sqrt(x),
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": lambda x: _typed(x, 1.0) / (_typed(x, 1.0) + np.exp(-x)),
    "silu": lambda x: x / (_typed(x, 1.0) + np.exp(-x)),
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
}
