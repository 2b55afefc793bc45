"""Element types. NumPy dtypes on the host side; bfloat16, float8 and int4 come from ml_dtypes.

``uint16`` is always uint16: bfloat16 has its own dtype and is never guessed from raw 16-bit data.
``DataType`` is another name of :class:`DType` (the name the product description uses).

``int4`` is packed: device memory holds two signed 4-bit values per byte (element ``2i`` in the low
nibble of byte ``i``, element ``2i + 1`` in the high nibble; an odd count leaves the last high nibble
zero), so an int4 array of ``n`` elements takes ``ceil(n / 2)`` bytes. Its ``itemsize`` is 1, as for
``ml_dtypes.int4`` on the host, where NumPy keeps one value per byte (``to_numpy`` unpacks into such an
array, ``from_numpy`` packs one); ``bits`` is 4. int4 is not one of :func:`all_dtypes` (the element
types the kernels compute in): arrays of it support copies, reshapes and ``astype`` to and from int8
and the float types only (:func:`packed_dtypes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .errors import DTypeError

__all__ = [
    "DType",
    "DataType",
    "all_dtypes",
    "as_dtype",
    "bfloat16",
    "bool_",
    "float8_e4m3fn",
    "float8_e5m2",
    "float16",
    "float32",
    "float64",
    "int4",
    "int8",
    "int16",
    "int32",
    "int64",
    "packed_dtypes",
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
    ctype: str  # the CUDA C++ type (int4: unsigned char, the packed bytes a JIT kernel receives)
    kind: str  # "f" float, "i" signed, "u" unsigned, "b" bool
    packed: bool = False  # int4: two values per byte in device memory
    itemsize: int = field(init=False)  # bytes per element on the host (int4: 1, as ml_dtypes.int4)
    bits: int = field(init=False)  # bits per element in device memory (int4: 4)
    _hash: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "itemsize", int(self.numpy.itemsize))
        object.__setattr__(self, "bits", 4 if self.packed else 8 * int(self.numpy.itemsize))
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
int4 = DType("int4", np.dtype(ml_dtypes.int4), "i4", "unsigned char", "i", packed=True)

DataType = DType  # the product description's name of the element type class

_ALL = (float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, int8, int16, int32, int64, uint8, uint16,
        uint32, uint64, bool_)  # fmt: skip
_PACKED = (int4,)
_BY_NAME = {d.name: d for d in (*_ALL, *_PACKED)} | {"bool_": bool_, "float8_e4m3": float8_e4m3fn}
_BY_NUMPY = {d.numpy: d for d in (*_ALL, *_PACKED)}
# What int4 arrays convert to and from (astype): int8 and the float types.
INT4_PARTNERS = (int8, float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2)


FLOAT8_E4M3FN_MAX = 448.0  # the largest finite float8_e4m3fn


def cast_values(values: Any, dtype: DType) -> np.ndarray[Any, Any]:
    """``values`` (a NumPy array, a scalar or anything ``np.asarray`` takes) converted to ``dtype`` on
    the host the way the kernels convert: NumPy's (ml_dtypes') conversion, except that float8_e4m3fn,
    which has no infinity, saturates like CUDA's ``__NV_SATFINITE`` conversion: every value beyond
    +-448, infinities included, becomes +-448, where ml_dtypes gives NaN. NaN stays NaN. Returns
    ``values`` itself when it already is an array of ``dtype``.
    """
    array = np.asarray(values)
    if dtype.packed:
        return array if array.dtype == dtype.numpy else int4_values(array).astype(dtype.numpy)
    if dtype == float8_e4m3fn and array.dtype != dtype.numpy and array.dtype != np.bool_:
        if array.dtype not in (np.float32, np.float64):
            array = array.astype(np.float64)  # exact for every narrower float; integers round, then clip
        array = np.asarray(np.clip(array, -FLOAT8_E4M3FN_MAX, FLOAT8_E4M3FN_MAX))  # NaN stays NaN
    return array.astype(dtype.numpy, copy=False)


def all_dtypes() -> tuple[DType, ...]:
    """Every element type the kernels compute in (the packed int4 is not one: :func:`packed_dtypes`)."""
    return _ALL


def packed_dtypes() -> tuple[DType, ...]:
    """The packed sub-byte types (int4): storage, copies and ``astype`` to and from :data:`INT4_PARTNERS`."""
    return _PACKED


# -- int4 on the host ------------------------------------------------------------------------------------
_INT32_LIMIT = 2.0**31


def int4_values(values: Any) -> np.ndarray[Any, Any]:
    """``values`` converted to int4 as int8 values in [-8, 7], by the rule the int4 kernels use
    (native/kernels/core/int4.cu): integers and bools keep their low four bits (two's complement
    wrapping, as NumPy narrows integers and ml_dtypes converts to int4); floats are truncated toward
    zero first, and NaN, infinities and values whose truncation lies outside int32 (where ml_dtypes'
    conversion on x86 gives 0 as well) give 0."""
    array = np.asarray(values)
    if array.dtype == np.dtype(ml_dtypes.int4):
        return array.astype(np.int8)
    if array.dtype.kind in "iub":
        low = array.astype(np.int64) & 15
    elif array.dtype.kind == "f" or array.dtype in (bfloat16.numpy, float8_e4m3fn.numpy, float8_e5m2.numpy):
        with np.errstate(invalid="ignore"):
            truncated = np.trunc(array.astype(np.float64))
            inside = np.abs(truncated) < _INT32_LIMIT  # False for NaN and infinities
        low = np.where(inside, truncated, 0.0).astype(np.int64) & 15
    else:
        raise DTypeError(f"cannot convert {array.dtype} values to int4")
    return (np.where(low >= 8, low - 16, low)).astype(np.int8)


def pack_int4(values: Any) -> np.ndarray[Any, Any]:
    """int4 values (ml_dtypes.int4, or numbers converted by :func:`int4_values`), flattened in C
    order, packed two per byte: element ``2i`` in the low nibble of byte ``i``, ``2i + 1`` in the high
    one (zero past the end). Returns ``ceil(n / 2)`` uint8."""
    nibbles = (int4_values(values).reshape(-1).astype(np.int16) & 15).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.concatenate([nibbles, np.zeros(1, np.uint8)])
    packed: np.ndarray[Any, Any] = nibbles[0::2] | (nibbles[1::2] << 4)
    return packed


def unpack_int4(packed: Any, count: int) -> np.ndarray[Any, Any]:
    """The first ``count`` int4 values of the packed bytes ``packed`` (uint8), as int8 in [-8, 7]."""
    raw = np.asarray(packed, dtype=np.uint8).reshape(-1)
    if raw.size * 2 < count:
        raise DTypeError(f"{raw.size} packed bytes hold {raw.size * 2} int4 values, not {count}")
    nibbles = np.empty(raw.size * 2, np.int8)
    nibbles[0::2] = (raw & 15).astype(np.int8)
    nibbles[1::2] = (raw >> 4).astype(np.int8)
    values: np.ndarray[Any, Any] = np.where(nibbles >= 8, nibbles - 16, nibbles).astype(np.int8)[:count]
    return values


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
    names = ", ".join(d.name for d in (*_ALL, *_PACKED))
    raise DTypeError(f"unsupported dtype {value!r}; supported: {names}")
