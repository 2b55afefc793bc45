"""Shape ops on the device: transpose/permute (materialised), concatenate, stack, split, broadcast_to.

``transpose`` and ``permute`` return new contiguous arrays (``GPUArray.transpose`` and ``.T`` stay
free views): a permutation that moves the input's fastest axis goes through 32x32 shared-memory tiles
so that reads and writes are both coalesced, any other through a strided gather. ``split`` and
``broadcast_to`` return views, as in NumPy. ``concatenate`` and ``stack`` copy each input into its
slice of the result on the device, converting dtypes when the inputs differ (NumPy's promotion).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, empty
from pygpukit.core.errors import DTypeError, ShapeError

from . import _cpu
from ._kernels import BLOCK, NAMESPACE, Groups, grid_for, group, pointer, register_enumerator, size_param
from ._layout import LAYOUT, MAX_DIMS, broadcast_shapes, check_devices, collapse, is_cuda, pack_layout
from .elementwise import copy_into
from .promotion import result_type

__all__ = [
    "broadcast_shapes",
    "broadcast_to",
    "concatenate",
    "permute",
    "split",
    "stack",
    "transpose",
]

_FILE = "shape/copy.cu"
_ELEMENTS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
_TILE_LAYOUT = KernelStruct("pygpukit::ops::TileLayout", _FILE, [
    ("batch_shape", f"long long[{MAX_DIMS}]"), ("batch_strides", f"long long[{MAX_DIMS}]"), ("batch_ndim", "int"),
    ("rows", "long long"), ("cols", "long long"), ("row_stride", "long long"), ("col_stride", "long long"),
])  # fmt: skip
_TILE_PARAMS = [pointer("out"), pointer("x"), _TILE_LAYOUT.param("layout")]
_GATHER_PARAMS = [pointer("out"), pointer("x"), size_param("n"), LAYOUT.param("layout")]
_TILE = 32  # kTile of copy.cu


def _expressions(itemsize: int) -> tuple[str, str]:
    element = _ELEMENTS[itemsize]
    return f"{NAMESPACE}transpose_tiles<{element}>", f"{NAMESPACE}gather<{element}>"


def _array(name: str, x: Any) -> GPUArray:
    if not isinstance(x, GPUArray):
        raise DTypeError(f"{name} needs GPUArrays, got {type(x).__name__}")
    return x


def _materialize(view: GPUArray) -> GPUArray:
    """A new contiguous array with the contents of ``view`` (any strides), copied on the device."""
    out = empty(view.shape, view.dtype)
    n = out.size
    if n == 0:
        return out
    if not is_cuda():
        _cpu.store(out, _cpu.host(view))
        return out
    if view.is_contiguous:
        out.copy_(view)
        return out
    dims, (_, in_strides) = collapse(view.shape, [out._strides, view._strides])
    tiles, gather = _expressions(view.dtype.itemsize)
    kernels = group(_FILE, [tiles, gather])
    batch = math.prod(dims[:-2])
    tiled = 2 <= len(dims) <= MAX_DIMS + 2 and in_strides[-2] == 1 and in_strides[-1] != 1
    if tiled and batch <= 65535 and -(-dims[-1] // _TILE) <= 65535:
        rows, cols = dims[-1], dims[-2]  # the output's last axis, and the input's fastest one
        layout = _TILE_LAYOUT.pack(dims[:-2], in_strides[:-2], len(dims) - 2, rows, cols, in_strides[-1],
                                   in_strides[-2])  # fmt: skip
        grid = (-(-cols // _TILE), -(-rows // _TILE), batch)
        kernels.kernel(tiles, _TILE_PARAMS)(out.device_ptr, view.device_ptr, layout, grid=grid, block=(_TILE, 8))
        return out
    layout = pack_layout(view.shape, [out._strides, view._strides])
    kernels.kernel(gather, _GATHER_PARAMS)(out.device_ptr, view.device_ptr, n, layout, grid=grid_for(n), block=BLOCK)
    return out


def _axes(axes: Sequence[Any], ndim: int, name: str) -> tuple[int, ...]:
    order = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError(f"{name}: axes must be integers, got {axes!r}")
        if not -ndim <= int(a) < ndim:
            raise ShapeError(f"{name}: axis {a} is out of bounds for an array of {ndim} dimensions")
        order.append(int(a) % ndim)
    if sorted(order) != list(range(ndim)):
        raise ShapeError(f"{name}: axes {tuple(axes)} are not a permutation of {ndim} dimensions")
    return tuple(order)


def permute(x: GPUArray, axes: Sequence[int]) -> GPUArray:
    """A new contiguous array whose axis ``i`` is axis ``axes[i]`` of ``x`` (a device copy)."""
    x = _array("permute", x)
    check_devices("permute", [x])
    order = _axes(tuple(axes), x.ndim, "permute")
    return _materialize(x.transpose(order))


def transpose(x: GPUArray, axes: Sequence[int] | None = None) -> GPUArray:
    """``permute(x, axes)``; without ``axes`` the axes are reversed (a 2-D transpose). The result is a
    new contiguous array; ``x.T`` is the free view."""
    x = _array("transpose", x)
    return permute(x, tuple(range(x.ndim))[::-1] if axes is None else axes)


def _check_inputs(name: str, arrays: Any) -> list[GPUArray]:
    if isinstance(arrays, GPUArray) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{name} needs a sequence of GPUArrays")
    items = [_array(name, a) for a in arrays]
    if not items:
        raise ShapeError(f"{name} needs at least one array")
    check_devices(name, items)
    return items


def concatenate(arrays: Sequence[GPUArray], axis: int = 0) -> GPUArray:
    """Join ``arrays`` along an existing ``axis``. Shapes must match except along ``axis``; the
    result has their promoted dtype (:func:`pygpukit.result_type`)."""
    items = _check_inputs("concatenate", arrays)
    ndim = items[0].ndim
    if ndim == 0:
        raise ShapeError("concatenate: zero-dimensional arrays cannot be concatenated")
    if not -ndim <= int(axis) < ndim:
        raise ShapeError(f"concatenate: axis {axis} is out of bounds for arrays of {ndim} dimensions")
    ax = int(axis) % ndim
    for item in items:
        if item.ndim != ndim or any(a != b for i, (a, b) in enumerate(zip(item.shape, items[0].shape, strict=True))
                                    if i != ax):  # fmt: skip
            shapes = ", ".join(str(a.shape) for a in items)
            raise ShapeError(f"concatenate: shapes {shapes} differ outside axis {ax}")
    dtype = result_type(*items)
    shape = list(items[0].shape)
    shape[ax] = sum(a.shape[ax] for a in items)
    out = empty(tuple(shape), dtype)
    start = 0
    for item in items:
        size = item.shape[ax]
        if size:
            index = (slice(None),) * ax + (slice(start, start + size),)
            copy_into(out[index], item)
        start += size
    return out


def stack(arrays: Sequence[GPUArray], axis: int = 0) -> GPUArray:
    """Join arrays of one shape along a new ``axis``; dtypes promote as in :func:`concatenate`."""
    items = _check_inputs("stack", arrays)
    shape = items[0].shape
    if any(a.shape != shape for a in items):
        shapes = ", ".join(str(a.shape) for a in items)
        raise ShapeError(f"stack: all arrays need one shape, got {shapes}")
    ndim = len(shape) + 1
    if not -ndim <= int(axis) < ndim:
        raise ShapeError(f"stack: axis {axis} is out of bounds for results of {ndim} dimensions")
    ax = int(axis) % ndim
    index = (slice(None),) * ax + (None,)
    return concatenate([a[index] for a in items], axis=ax)


def split(x: GPUArray, indices_or_sections: int | Sequence[int], axis: int = 0) -> list[GPUArray]:
    """Views of ``x`` cut along ``axis``: into ``n`` equal parts (an int, which must divide the axis),
    or at the given indices (NumPy's ``split``). No data moves."""
    x = _array("split", x)
    if x.ndim == 0:
        raise ShapeError("split: zero-dimensional arrays cannot be split")
    if not -x.ndim <= int(axis) < x.ndim:
        raise ShapeError(f"split: axis {axis} is out of bounds for an array of {x.ndim} dimensions")
    ax = int(axis) % x.ndim
    size = x.shape[ax]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0 or size % sections:
            raise ShapeError(f"split: axis {ax} of length {size} does not divide into {sections} equal parts")
        bounds = [i * (size // sections) for i in range(sections + 1)]
    else:
        bounds = [0, *(int(i) for i in indices_or_sections), size]
    parts = []
    for low, high in itertools.pairwise(bounds):
        low_c = max(0, min(low if low >= 0 else low + size, size))
        high_c = max(low_c, min(high if high >= 0 else high + size, size))
        parts.append(x[(slice(None),) * ax + (slice(low_c, high_c),)])
    return parts


def broadcast_to(x: GPUArray, shape: int | Sequence[int]) -> GPUArray:
    """A read-only-by-convention view of ``x`` broadcast to ``shape`` (stride 0 along new axes)."""
    x = _array("broadcast_to", x)
    target = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if broadcast_shapes(x.shape, target) != target:
        raise ShapeError(f"broadcast_to: shape {x.shape} cannot be broadcast to {target}")
    lead = len(target) - x.ndim
    strides = (0,) * lead + tuple(0 if s == 1 and t != 1 else st for s, t, st in
                                  zip(x.shape, target[lead:], x._strides, strict=True))  # fmt: skip
    return GPUArray(x.buffer, target, x.dtype, strides, x._offset)


def _enumerate() -> Groups:
    return {_FILE: [_expressions(size) for size in sorted(_ELEMENTS)]}


register_enumerator(_enumerate)
