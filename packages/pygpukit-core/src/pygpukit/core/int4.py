"""Arrays of the packed ``int4`` dtype: two signed 4-bit values per byte of device memory.

:class:`~pygpukit.core.array.GPUArray` calls in here for what int4 arrays support: uploads and
downloads (``from_numpy`` packs an ``ml_dtypes.int4`` array on the host, ``to_numpy`` unpacks into one),
fills, device copies (always whole packed buffers: an int4 array is contiguous and starts at element
0, so its bytes are ``buffer.ptr .. + ceil(size / 2)``) and ``astype`` to and from int8 and the float
types, which runs ``native/kernels/core/int4.cu`` on the device (the CPU backend computes the same with
:func:`pygpukit.core.dtypes.int4_values`). Everything else refuses int4 with :class:`DTypeError`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from .dtypes import INT4_PARTNERS, DType, cast_values, int4, int4_values, pack_int4, unpack_int4
from .errors import DTypeError
from .jit import JITKernel, Param

if TYPE_CHECKING:
    from .array import GPUArray
    from .stream import Stream

__all__ = ["astype_int4", "check_int4_view", "fill_byte", "int4_kernel", "unsupported"]

_FILE = "core/int4.cu"
_BLOCK = 256


def unsupported(what: str) -> DTypeError:
    """The error for ``what`` (an operation) applied to an int4 array."""
    partners = ", ".join(d.name for d in INT4_PARTNERS)
    return DTypeError(
        f"{what} does not support the packed int4 dtype; int4 arrays support copies, reshape and "
        f"astype to and from {partners} (convert with .astype(gp.int8) first)"
    )


def check_int4_view(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, contiguous: bool) -> None:
    """int4 views must be contiguous from element 0 (two elements share a byte: other views have no
    byte address)."""
    if offset != 0 or not contiguous:
        raise DTypeError(
            f"int4 arrays support only contiguous views that start at element 0 (two values share a byte); "
            f"this view (shape {shape}, element strides {strides}, offset {offset}) is not one: convert with "
            f".astype(gp.int8) first"
        )


def nbytes(count: int) -> int:
    """Bytes of ``count`` packed int4 values."""
    return (count + 1) // 2


def fill_byte(value: Any) -> int:
    """The byte that fills an int4 array with ``value`` (the value in both nibbles). Integers must be
    in [-8, 7]; other numbers convert by the int4 rule (:func:`pygpukit.core.dtypes.int4_values`)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and not -8 <= int(value) <= 7:
        raise DTypeError(f"fill value {value!r} cannot be represented as int4 (-8..7)")
    try:
        nibble = int(int4_values(np.asarray(value)).reshape(-1)[0]) & 15
    except (TypeError, ValueError) as exc:
        raise DTypeError(f"fill value {value!r} cannot be represented as int4: {exc}") from None
    return nibble | (nibble << 4)


@functools.cache
def int4_kernel(direction: str, partner: DType) -> JITKernel:
    """``int4_<direction>_<suffix>`` of core/int4.cu: ``"pack"`` (partner -> int4) or ``"unpack"``."""
    from .builtins import SOURCES

    if partner not in INT4_PARTNERS or direction not in ("pack", "unpack"):
        raise unsupported(f"astype between int4 and {partner.name}")
    params = [Param("src", "void*", "pointer", "Q"), Param("dst", "void*", "pointer", "Q"),
              Param("n", "long long", "scalar", "q")]  # fmt: skip
    return JITKernel(SOURCES.source(_FILE), f"int4_{direction}_{partner.suffix}",
                     include_dirs=SOURCES.include_dirs(_FILE), cache_salt=SOURCES.headers_digest(),
                     params=params)  # fmt: skip


def _grid(count: int) -> int:
    return max(1, min(-(-nbytes(count) // _BLOCK), 65535 * 32))


def packed_host(array: GPUArray) -> np.ndarray[Any, Any]:
    """CPU backend: the packed bytes of an int4 array (a view of its host memory)."""
    raw: np.ndarray[Any, Any] = array.buffer.host_view()[: nbytes(array.size)]
    return raw


def to_numpy(array: GPUArray, native: Any, stream: Stream | None) -> np.ndarray[Any, Any]:
    """Download and unpack: an ``ml_dtypes.int4`` array of the array's shape."""
    from .stream import current_stream

    count = array.size
    if native is None:
        raw = packed_host(array).copy()
    else:
        raw = np.empty(nbytes(count), np.uint8)
        if raw.size:
            handle = (stream or current_stream()).handle
            native.memcpy_pageable_dtoh(raw.ctypes.data, array.buffer.ptr, raw.size, handle)
    return unpack_int4(raw, count).astype(int4.numpy).reshape(array.shape)


def upload(out: GPUArray, host: np.ndarray[Any, Any], native: Any, stream: Stream | None) -> None:
    """Pack ``host`` (int4 values, or numbers converted by the int4 rule) into ``out``'s memory."""
    from .stream import current_stream

    packed = np.ascontiguousarray(pack_int4(host))
    if not packed.size:
        return
    if native is None:
        packed_host(out)[...] = packed
        return
    native.memcpy_pageable_htod(out.buffer.ptr, packed.ctypes.data, packed.size, (stream or current_stream()).handle)


def copy(dst: GPUArray, src: GPUArray, native: Any, stream: Stream | None) -> None:
    """Copy one int4 array into another of the same shape (both contiguous from element 0)."""
    from .stream import current_stream

    size = nbytes(dst.size)
    if not size:
        return
    if native is None:
        packed_host(dst)[...] = packed_host(src)
        return
    native.memcpy_dtod(dst.buffer.ptr, src.buffer.ptr, size, (stream or current_stream()).handle, True)


def fill(out: GPUArray, value: Any, native: Any, stream: Stream | None) -> None:
    """Fill ``out`` with ``value`` (one memset of the doubled nibble)."""
    from .stream import current_stream

    byte = fill_byte(value)
    size = nbytes(out.size)
    if not size:
        return
    if native is None:
        packed_host(out)[...] = byte
        return
    native.memset_d8(out.buffer.ptr, byte, size, (stream or current_stream()).handle)


def astype_int4(source: GPUArray, out: GPUArray, native: Any, stream: Stream | None) -> None:
    """``out[...] = source`` converted, where exactly one of the two is int4 and the other one of
    INT4_PARTNERS (contiguous: the caller compacts ``source`` first)."""
    count = out.size
    if source.dtype.packed:
        partner, direction = out.dtype, "unpack"
    else:
        partner, direction = source.dtype, "pack"
    if partner not in INT4_PARTNERS:
        raise unsupported(f"astype from {source.dtype.name} to {out.dtype.name}")
    if count == 0:
        return
    if native is None:
        if direction == "unpack":
            out._host_view()[...] = cast_values(unpack_int4(packed_host(source), count).reshape(out.shape), partner)
        else:
            packed_host(out)[...] = pack_int4(source._host_view())
        return
    src = source.buffer.ptr if direction == "unpack" else source.device_ptr
    dst = out.device_ptr if direction == "unpack" else out.buffer.ptr
    int4_kernel(direction, partner)(src, dst, count, grid=_grid(count), block=_BLOCK, stream=stream)
