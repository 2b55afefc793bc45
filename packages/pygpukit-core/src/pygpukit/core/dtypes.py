"""Element types. NumPy dtypes on the host side; bfloat16 and float8 come from ml_dtypes.

``uint16`` is always uint16: bfloat16 has its own dtype and is never guessed from raw 16-bit data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .errors import DTypeError

__all__ = [
    "DType",
    "all_dtypes",
    "as_dtype",
    "bfloat16",
    "bool_",
    "float8_e4m3fn",
    "float8_e5m2",
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
]


@dataclass(frozen=True, eq=False)
class DType:
    """One element type: its name, NumPy dtype, size, kernel suffix and CUDA C++ type. Equal by name;
    hashing and ``itemsize`` are precomputed, since every op call looks dtypes up."""

    name: str
    numpy: np.dtype[Any]
    suffix: str  # entry-point suffix of the built-in kernels (native/kernels/common/element_types.cuh)
    ctype: str  # the CUDA C++ type
    kind: str  # "f" float, "i" signed, "u" unsigned, "b" bool
    itemsize: int = field(init=False)
    _hash: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "itemsize", int(self.numpy.itemsize))
        object.__setattr__(self, "_hash", hash(self.name))

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, DType):
            return self.name == other.name
        return NotImplemented

    def __hash__(self) -> int:
        return self._hash

    @property
    def is_floating(self) -> bool:
        return self.kind == "f"

    def __repr__(self) -> str:
        return f"pygpukit.{self.name}"

    def __str__(self) -> str:
        return self.name


float64 = DType("float64", np.dtype(np.float64), "f64", "double", "f")
float32 = DType("float32", np.dtype(np.float32), "f32", "float", "f")
float16 = DType("float16", np.dtype(np.float16), "f16", "__half", "f")
bfloat16 = DType("bfloat16", np.dtype(ml_dtypes.bfloat16), "bf16", "__nv_bfloat16", "f")
float8_e4m3fn = DType("float8_e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn), "f8e4m3", "__nv_fp8_e4m3", "f")
float8_e5m2 = DType("float8_e5m2", np.dtype(ml_dtypes.float8_e5m2), "f8e5m2", "__nv_fp8_e5m2", "f")
int8 = DType("int8", np.dtype(np.int8), "i8", "signed char", "i")
int16 = DType("int16", np.dtype(np.int16), "i16", "short", "i")
int32 = DType("int32", np.dtype(np.int32), "i32", "int", "i")
int64 = DType("int64", np.dtype(np.int64), "i64", "long long", "i")
uint8 = DType("uint8", np.dtype(np.uint8), "u8", "unsigned char", "u")
uint16 = DType("uint16", np.dtype(np.uint16), "u16", "unsigned short", "u")
uint32 = DType("uint32", np.dtype(np.uint32), "u32", "unsigned int", "u")
uint64 = DType("uint64", np.dtype(np.uint64), "u64", "unsigned long long", "u")
bool_ = DType("bool", np.dtype(np.bool_), "b8", "bool", "b")

_ALL = (float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, int8, int16, int32, int64, uint8, uint16,
        uint32, uint64, bool_)  # fmt: skip
_BY_NAME = {d.name: d for d in _ALL} | {"bool_": bool_, "float8_e4m3": float8_e4m3fn}
_BY_NUMPY = {d.numpy: d for d in _ALL}


FLOAT8_E4M3FN_MAX = 448.0  # the largest finite float8_e4m3fn


def cast_values(values: Any, dtype: DType) -> np.ndarray[Any, Any]:
    """``values`` (a NumPy array, a scalar or anything ``np.asarray`` takes) converted to ``dtype`` on
    the host the way the kernels convert: NumPy's (ml_dtypes') conversion, except that float8_e4m3fn,
    which has no infinity, saturates like CUDA's ``__NV_SATFINITE`` conversion: every value beyond
    +-448, infinities included, becomes +-448, where ml_dtypes gives NaN. NaN stays NaN. Returns
    ``values`` itself when it already is an array of ``dtype``.
    """
    array = np.asarray(values)
    if dtype == float8_e4m3fn and array.dtype != dtype.numpy and array.dtype != np.bool_:
        if array.dtype not in (np.float32, np.float64):
            array = array.astype(np.float64)  # exact for every narrower float; integers round, then clip
        array = np.asarray(np.clip(array, -FLOAT8_E4M3FN_MAX, FLOAT8_E4M3FN_MAX))  # NaN stays NaN
    return array.astype(dtype.numpy, copy=False)


def all_dtypes() -> tuple[DType, ...]:
    """Every supported element type."""
    return _ALL


def as_dtype(value: Any) -> DType:
    """Normalise a DType, a name (``"bfloat16"``), a NumPy dtype or type, or ``bool``/``int``/``float``.

    Python ``float`` means float64 and ``int`` int64, as in NumPy. Raises :class:`DTypeError` naming
    the supported types otherwise.
    """
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    try:
        np_dtype = np.dtype(value)
    except TypeError:
        np_dtype = None
    if np_dtype is not None and np_dtype in _BY_NUMPY:
        return _BY_NUMPY[np_dtype]
    names = ", ".join(d.name for d in _ALL)
    raise DTypeError(f"unsupported dtype {value!r}; supported: {names}")
