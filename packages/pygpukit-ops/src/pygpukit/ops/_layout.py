"""Shapes, strides and devices of op operands: broadcasting, the strided Layout argument of the kernels
(native/kernels/common/layout.cuh, declared once here as :data:`LAYOUT`), dtype codes, and the checks
every op makes before touching memory."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from pygpukit.core import backend as _backend
from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray
from pygpukit.core.codes import DTYPE_CODES
from pygpukit.core.dtypes import DType, all_dtypes
from pygpukit.core.errors import ArgumentError, DeviceError, ShapeError
from pygpukit.core.stream import thread_device

__all__ = [
    "LAYOUT",
    "MAX_DIMS",
    "broadcast_shapes",
    "broadcast_strides",
    "check_devices",
    "collapse",
    "dtype_code",
    "is_cuda",
    "normalize_axes",
    "pack_layout",
    "same_view",
]

MAX_DIMS = 8  # kMaxDims in layout.cuh
MAX_OPERANDS = 4  # kMaxOperands
# Passed by value to the strided kernels of these files (strides: [operand][dimension], row-major).
LAYOUT = KernelStruct(
    "pygpukit::ops::Layout",
    (
        "elementwise/unary.cu",
        "elementwise/binary.cu",
        "elementwise/ternary.cu",
        "shape/copy.cu",
        "reduction/softmax.cu",
    ),
    [("ndim", "int"), ("shape", f"long long[{MAX_DIMS}]"), ("strides", f"long long[{MAX_OPERANDS * MAX_DIMS}]")],
)
_pack_layout = LAYOUT.struct.pack  # every field in order, arrays flattened
_CODES = {dtype: DTYPE_CODES[dtype.name] for dtype in all_dtypes()}  # enum DType of common/codes.cuh


def dtype_code(dtype: DType) -> int:
    """The run-time dtype code of ``dtype`` in the kernels (pygpukit::codes::DType; load_as in types.cuh)."""
    return _CODES[dtype]


def is_cuda() -> bool:
    state = _backend._state
    if state is None:
        state = _backend.backend_state()
    return state.name == "cuda"


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy broadcasting of ``shapes``; :class:`ShapeError` naming every shape when they do not fit."""
    if len(shapes) == 1:
        return tuple(shapes[0])
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for shape in shapes:
        offset = ndim - len(shape)
        for axis, size in enumerate(shape):
            current = result[offset + axis]
            if size == current or size == 1:
                continue
            if current == 1:
                result[offset + axis] = size
                continue
            listed = ", ".join(str(tuple(s)) for s in shapes)
            raise ShapeError(f"shapes {listed} cannot be broadcast together (axis {axis - len(shape)}: {current} "
                             f"vs {size})")  # fmt: skip
    return tuple(result)


def broadcast_strides(array: GPUArray, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of ``array`` viewed in the broadcast ``shape`` (0 along broadcast axes)."""
    own_shape, own_strides = array._shape, array._strides
    if own_shape == shape:
        return own_strides
    lead = len(shape) - len(own_shape)
    return (0,) * lead + tuple(0 if size == 1 else stride for size, stride in zip(own_shape, own_strides, strict=True))


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def collapse(shape: Sequence[int], stride_sets: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 axes and merge neighbours that are contiguous for every operand (fewer index steps)."""
    dims: list[int] = []
    strides: list[list[int]] = [[] for _ in stride_sets]
    for axis, size in enumerate(shape):
        if size == 1:
            continue
        if dims and all(s[-1] == st[axis] * size for s, st in zip(strides, stride_sets, strict=True)):
            dims[-1] *= size
            for s, st in zip(strides, stride_sets, strict=True):
                s[-1] = st[axis]
            continue
        dims.append(size)
        for s, st in zip(strides, stride_sets, strict=True):
            s.append(st[axis])
    return dims, strides


def pack_layout(shape: Sequence[int], stride_sets: Sequence[Sequence[int]]) -> bytes:
    """The Layout kernel argument for ``shape`` and per-operand strides (output first), collapsed."""
    dims, strides = collapse(shape, stride_sets)
    if len(dims) > MAX_DIMS:
        raise ShapeError(f"the op kernels support up to {MAX_DIMS} dimensions that cannot be merged; shape "
                         f"{tuple(shape)} with these strides needs {len(dims)}")  # fmt: skip
    pad = [0] * (MAX_DIMS - len(dims))
    flat: list[int] = []
    for k in range(MAX_OPERANDS):
        flat += (strides[k] + pad) if k < len(strides) else [0] * MAX_DIMS
    return _pack_layout(len(dims), *(dims + pad), *flat)


def check_devices(op: str, arrays: Iterable[GPUArray]) -> int:
    """The device every array lives on (-1 for the CPU backend); :class:`DeviceError` when they differ
    or when it is not the current device."""
    device: int | None = None
    for array in arrays:
        here = array._buffer.device
        if device is None:
            device = here
        elif here != device:
            names = ", ".join(f"{a.device} {a.shape} {a.dtype}" for a in arrays)
            raise DeviceError(f"{op}: operands live on different devices ({names})")
    if device is None:
        return -1
    if device >= 0 and device != thread_device():
        raise DeviceError(f"{op}: the operands live on cuda:{device} but the current device is "
                          f"cuda:{thread_device()}; use gp.set_device({device})")  # fmt: skip
    return device


def same_view(a: GPUArray, b: GPUArray) -> bool:
    return a._buffer is b._buffer and a._offset == b._offset and a._shape == b._shape and a._strides == b._strides


def overlaps(a: GPUArray, b: GPUArray) -> bool:
    """Whether two arrays may share memory (same allocation); exact same views do not count."""
    return a._buffer is b._buffer and not same_view(a, b)


def normalize_axes(axis: Any, ndim: int, op: str) -> tuple[int, ...]:
    """``axis`` (None, an int or a sequence of ints, negative counting from the end) as sorted axes."""
    if axis is None:
        return tuple(range(ndim))
    items = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    result = []
    for item in items:
        if not isinstance(item, (int, np.integer)) or isinstance(item, bool):
            raise ArgumentError(f"{op}: axis must be an int or a tuple of ints, got {axis!r}")
        value = int(item)
        if not -ndim <= value < ndim:
            raise ShapeError(f"{op}: axis {value} is out of bounds for an array of {ndim} dimensions")
        result.append(value % ndim)
    if len(set(result)) != len(result):
        raise ShapeError(f"{op}: repeated axis in {axis!r}")
    return tuple(sorted(result))
