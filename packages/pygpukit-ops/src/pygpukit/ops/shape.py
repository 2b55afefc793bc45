"""Shape ops on the device: transpose/permute (materialised), concatenate, stack, split, broadcast_to.

``transpose`` and ``permute`` return new contiguous arrays (``GPUArray.transpose`` and ``.T`` stay
free views): a permutation that moves the input's fastest axis goes through 32x32 shared-memory tiles
so that reads and writes are both coalesced, any other through a strided gather. ``split`` and
``broadcast_to`` return views, as in NumPy. ``concatenate`` and ``stack`` copy up to
16 (``MAX_JOINED``) contiguous inputs of one dtype into their column ranges of the result in one launch
(``concat`` of copy.cu, in 16-byte units where the sizes and addresses allow); other inputs (mixed
dtypes, which promote as in NumPy, strided views, more inputs) are copied one by one.

Every op keeps its launch plan in a :class:`~pygpukit.core.plans.PlanCache` keyed by the caller's own
arguments (exact types: an ``int`` axis, ints in an axes tuple): a repeated call is a lookup, one
allocation and one launch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core import backend as _backend
from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache

from . import _cpu
from ._kernels import BLOCK, NAMESPACE, Groups, grid_for, group, pointer, register_enumerator, size_param
from ._layout import (
    LAYOUT,
    MAX_DIMS,
    broadcast_shapes,
    check_devices,
    collapse,
    contiguous_strides,
    is_cuda,
    pack_layout,
)
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
MAX_JOINED = 16  # kConcatInputs of copy.cu: inputs one concat launch takes
_CONCAT_ARGS = KernelStruct("pygpukit::ops::ConcatArgs", _FILE, [
    ("starts", f"long long[{MAX_JOINED + 1}]"), ("rows", "long long"), ("row_bytes", "long long"),
    ("align_bits", "long long"),
])  # fmt: skip
_CONCAT_PARAMS = [pointer("out"), *(pointer(f"in{i}") for i in range(MAX_JOINED)), _CONCAT_ARGS.param("args")]
# By the caller's own arguments (CUDA backend only): the plan of a repeated call.
_JOINS: PlanCache[_JoinPlan] = PlanCache("ops.shape.join")
_PERMUTES: PlanCache[_PermutePlan] = PlanCache("ops.shape.permute")


def _expressions(itemsize: int) -> tuple[str, str, str]:
    """The kernels of one element size (compiled together): transpose_tiles, gather, concat."""
    element = _ELEMENTS[itemsize]
    return (f"{NAMESPACE}transpose_tiles<{element}>", f"{NAMESPACE}gather<{element}>",
            f"{NAMESPACE}concat<{element}>")  # fmt: skip


def _array(name: str, x: Any) -> GPUArray:
    if not isinstance(x, GPUArray):
        raise DTypeError(f"{name} needs GPUArrays, got {type(x).__name__}")
    return x


class _PermutePlan:
    """A permute call shape: the result's shape and dtype and its launch (``kernel`` None: no launch when
    the result is empty, a plain copy of the view ``x.transpose(order)`` when ``order`` is set)."""

    __slots__ = ("args", "block", "dtype", "grid", "kernel", "order", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: DType, kernel: JITKernel | None = None,
                 args: tuple[Any, ...] = (), grid: Any = 1, block: Any = BLOCK,
                 order: tuple[int, ...] | None = None) -> None:  # fmt: skip
        self.shape = shape
        self.dtype = dtype
        self.kernel = kernel
        self.args = args
        self.grid = grid
        self.block = block
        self.order = order


def _plan_permute(x: GPUArray, order: tuple[int, ...]) -> _PermutePlan:
    """How to write ``x.transpose(order)`` into a new contiguous array: a moved fastest axis through
    32x32 tiles (reads and writes coalesced), anything else through the strided gather."""
    view = x.transpose(order)
    shape, dtype = view.shape, view.dtype
    n = math.prod(shape)
    if n == 0:
        return _PermutePlan(shape, dtype)
    if view.is_contiguous:
        return _PermutePlan(shape, dtype, order=order)
    if dtype.packed:  # int4: two values share a byte; only a contiguous view copies (the typed error)
        view._check_int4()
    out_strides = contiguous_strides(shape)
    dims, (_, in_strides) = collapse(shape, [out_strides, view._strides])
    tiles, gather, _ = expressions = _expressions(dtype.itemsize)
    kernels = group(_FILE, expressions)
    batch = math.prod(dims[:-2])
    tiled = 2 <= len(dims) <= MAX_DIMS + 2 and in_strides[-2] == 1 and in_strides[-1] != 1
    if tiled and batch <= 65535 and -(-dims[-1] // _TILE) <= 65535:
        rows, cols = dims[-1], dims[-2]  # the output's last axis, and the input's fastest one
        layout = _TILE_LAYOUT.pack(dims[:-2], in_strides[:-2], len(dims) - 2, rows, cols, in_strides[-1],
                                   in_strides[-2])  # fmt: skip
        grid = (-(-cols // _TILE), -(-rows // _TILE), batch)
        return _PermutePlan(shape, dtype, kernels.kernel(tiles, _TILE_PARAMS), (layout,), grid, (_TILE, 8))
    layout = pack_layout(shape, [out_strides, view._strides])
    return _PermutePlan(shape, dtype, kernels.kernel(gather, _GATHER_PARAMS), (n, layout), grid_for(n))


def _run_permute(plan: _PermutePlan, x: GPUArray) -> GPUArray:
    out = empty(plan.shape, plan.dtype)
    kernel = plan.kernel
    if kernel is not None:
        if x._contiguous:  # the launcher checks the array (live, on the kernel's device)
            kernel(out, x, *plan.args, grid=plan.grid, block=plan.block)
        else:
            check_devices("permute", [x])
            kernel(out, x.device_ptr, *plan.args, grid=plan.grid, block=plan.block)
    elif plan.order is not None:
        out.copy_(x.transpose(plan.order))
    return out


def _integer(name: str, what: str, value: Any) -> int:
    """``value`` as an int; a float, str, bool, ... raises :class:`ArgumentError` naming ``what``."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{name}: {what} must be an int, got {value!r} of type {type(value).__name__}")
    return int(value)


def _axes(axes: Sequence[Any], ndim: int, name: str) -> tuple[int, ...]:
    order = []
    if not isinstance(axes, (list, tuple)):
        raise ArgumentError(f"{name}: axes must be a sequence of ints, got {axes!r} of type {type(axes).__name__}")
    for a in axes:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise ArgumentError(f"{name}: axes must be integers, got {axes!r}")
        if not -ndim <= int(a) < ndim:
            raise ShapeError(f"{name}: axis {a} is out of bounds for an array of {ndim} dimensions")
        order.append(int(a) % ndim)
    if sorted(order) != list(range(ndim)):
        raise ShapeError(f"{name}: axes {tuple(axes)} are not a permutation of {ndim} dimensions")
    return tuple(order)


def _exact_axes(axes: Any) -> tuple[int, ...] | None:
    """``axes`` as a cache key: a tuple or list of exact ints, else None (the call is not cached)."""
    kind = type(axes)
    if kind is not tuple and kind is not list:
        return None
    for a in axes:
        if type(a) is not int:
            return None
    return axes if kind is tuple else tuple(axes)


def _permute(name: str, x: Any, axes: Any, key: Any) -> GPUArray:
    x = _array(name, x)
    check_devices(name, [x])
    if axes is None and name == "transpose":
        axes = tuple(range(x.ndim))[::-1]
    elif not isinstance(axes, (list, tuple)):
        try:  # any iterable of ints (a range, a NumPy array)
            axes = tuple(axes)
        except TypeError:
            raise ArgumentError(f"{name}: axes must be a sequence of ints, got {axes!r} of type "
                                f"{type(axes).__name__}") from None  # fmt: skip
    order = _axes(axes, x.ndim, name)
    if not is_cuda():
        out = empty(tuple(x.shape[a] for a in order), x.dtype)
        if out.size:
            _cpu.store(out, _cpu.host(x.transpose(order)))
        return out
    plan = _plan_permute(x, order)
    if key is not None:
        _PERMUTES.put(key, plan)
    return _run_permute(plan, x)


def permute(x: GPUArray, axes: Sequence[int]) -> GPUArray:
    """A new contiguous array whose axis ``i`` is axis ``axes[i]`` of ``x`` (a device copy)."""
    state = _backend._state
    key = None
    if type(x) is GPUArray and state is not None and state.name == "cuda":
        exact = _exact_axes(axes)
        if exact is not None:
            key = (x._dtype, x._shape, x._strides, exact, x._buffer.device)
            plan = _PERMUTES.get(key)
            if plan is not None:
                return _run_permute(plan, x)
    return _permute("permute", x, axes, key)


def transpose(x: GPUArray, axes: Sequence[int] | None = None) -> GPUArray:
    """``permute(x, axes)``; without ``axes`` the axes are reversed (a 2-D transpose). The result is a
    new contiguous array; ``x.T`` is the free view."""
    state = _backend._state
    key = None
    if type(x) is GPUArray and state is not None and state.name == "cuda":
        exact = None if axes is None else _exact_axes(axes)
        if axes is None or exact is not None:
            key = (x._dtype, x._shape, x._strides, exact, x._buffer.device)  # exact None: reversed axes
            plan = _PERMUTES.get(key)
            if plan is not None:
                return _run_permute(plan, x)
    return _permute("transpose", x, axes, key)


def _check_inputs(name: str, arrays: Any) -> list[GPUArray]:
    if isinstance(arrays, GPUArray) or not isinstance(arrays, (list, tuple)):
        raise DTypeError(f"{name} needs a sequence (list or tuple) of GPUArrays, got {type(arrays).__name__}")
    items = [_array(name, a) for a in arrays]
    if not items:
        raise ShapeError(f"{name} needs at least one array")
    check_devices(name, items)
    return items


class _JoinPlan:
    """A concatenate/stack call shape: the result's shape and dtype, the concat kernel (None: nothing
    to copy), its grid and ConcatArgs bytes, and None pointers for the unused inputs."""

    __slots__ = ("args", "dtype", "grid", "kernel", "pad", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: DType, kernel: JITKernel | None, args: bytes,
                 grid: tuple[int, int], pad: tuple[None, ...]) -> None:  # fmt: skip
        self.shape = shape
        self.dtype = dtype
        self.kernel = kernel
        self.args = args
        self.grid = grid
        self.pad = pad


def _plan_join(shape: tuple[int, ...], dtype: DType, rows: int, parts: Sequence[int]) -> _JoinPlan:
    """The one launch writing contiguous inputs of ``parts`` elements per row into their column ranges
    of ``rows`` rows of the result ``shape`` (in 16-byte units where every range allows)."""
    itemsize = dtype.itemsize
    starts = list(itertools.accumulate((p * itemsize for p in parts), initial=0))
    row_bytes = starts[-1]
    pad = (None,) * (MAX_JOINED - len(parts))
    if rows == 0 or row_bytes == 0:
        return _JoinPlan(shape, dtype, None, b"", (1, 1), pad)
    bits = 0
    for start in starts:
        bits |= start
    unit = min(16, bits & -bits)  # the kernel may take a smaller one where an address is less aligned
    expressions = _expressions(itemsize)
    kernel = group(_FILE, expressions).kernel(expressions[2], _CONCAT_PARAMS)
    args = _CONCAT_ARGS.pack(starts + [row_bytes] * (MAX_JOINED + 1 - len(starts)), rows, row_bytes, bits)
    return _JoinPlan(shape, dtype, kernel, args, (grid_for(rows * max(parts) * itemsize // unit), len(parts)), pad)


def _run_join(plan: _JoinPlan, arrays: Sequence[GPUArray]) -> GPUArray:
    out = empty(plan.shape, plan.dtype)
    kernel = plan.kernel
    if kernel is not None:  # the launcher checks every input (live, contiguous, on the kernel's device)
        kernel(out, *arrays, *plan.pad, plan.args, grid=plan.grid, block=BLOCK)
    return out


def _joinable(items: list[GPUArray], dtype: DType) -> bool:
    """Whether one concat launch applies: the CUDA backend, at most MAX_JOINED contiguous inputs, all
    of the result dtype."""
    return (len(items) <= MAX_JOINED and dtype.itemsize in _ELEMENTS and not dtype.packed and is_cuda()
            and all(a._dtype == dtype and a._contiguous for a in items))  # fmt: skip


def _join_key(op: str, arrays: Any, axis: int) -> tuple[Any, ...] | None:
    """The cache key of a concatenate/stack call by its own arguments; None when it cannot be cached."""
    if not 0 < len(arrays) <= MAX_JOINED or type(arrays[0]) is not GPUArray:
        return None
    key: tuple[Any, ...] = (op, axis, arrays[0]._buffer.device)
    for a in arrays:
        if type(a) is not GPUArray:
            return None
        key += (a._dtype, a._shape, a._contiguous)
    return key


def concatenate(arrays: Sequence[GPUArray], axis: int = 0) -> GPUArray:
    """Join ``arrays`` along an existing ``axis``. Shapes must match except along ``axis``; the
    result has their promoted dtype (:func:`pygpukit.result_type`)."""
    state = _backend._state
    key = None
    if type(axis) is int and state is not None and state.name == "cuda" and type(arrays) in (list, tuple):
        key = _join_key("concatenate", arrays, axis)
        plan = None if key is None else _JOINS.get(key)
        if plan is not None:
            return _run_join(plan, arrays)
    items = _check_inputs("concatenate", arrays)
    ndim = items[0].ndim
    if ndim == 0:
        raise ShapeError("concatenate: zero-dimensional arrays cannot be concatenated")
    axis = _integer("concatenate", "axis", axis)
    if not -ndim <= axis < ndim:
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
    if _joinable(items, dtype):
        inner = math.prod(shape[ax + 1 :])
        plan = _plan_join(tuple(shape), dtype, math.prod(shape[:ax]), [a.shape[ax] * inner for a in items])
        if key is not None:
            _JOINS.put(key, plan)
        return _run_join(plan, items)
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
    state = _backend._state
    key = None
    if type(axis) is int and state is not None and state.name == "cuda" and type(arrays) in (list, tuple):
        key = _join_key("stack", arrays, axis)
        plan = None if key is None else _JOINS.get(key)
        if plan is not None:
            return _run_join(plan, arrays)
    items = _check_inputs("stack", arrays)
    shape = items[0].shape
    if any(a.shape != shape for a in items):
        shapes = ", ".join(str(a.shape) for a in items)
        raise ShapeError(f"stack: all arrays need one shape, got {shapes}")
    ndim = len(shape) + 1
    axis = _integer("stack", "axis", axis)
    if not -ndim <= axis < ndim:
        raise ShapeError(f"stack: axis {axis} is out of bounds for results of {ndim} dimensions")
    ax = int(axis) % ndim
    dtype = result_type(*items)
    if _joinable(items, dtype):  # input i fills columns [i * part, (i + 1) * part) of each outer row
        part = math.prod(shape[ax:])
        plan = _plan_join((*shape[:ax], len(items), *shape[ax:]), dtype, math.prod(shape[:ax]), [part] * len(items))
        if key is not None:
            _JOINS.put(key, plan)
        return _run_join(plan, items)
    index = (slice(None),) * ax + (None,)
    return concatenate([a[index] for a in items], axis=ax)


def split(x: GPUArray, indices_or_sections: int | Sequence[int], axis: int = 0) -> list[GPUArray]:
    """Views of ``x`` cut along ``axis``: into ``n`` equal parts (an int, which must divide the axis),
    or at the given indices (NumPy's ``split``). No data moves."""
    x = _array("split", x)
    if x.ndim == 0:
        raise ShapeError("split: zero-dimensional arrays cannot be split")
    axis = _integer("split", "axis", axis)
    if not -x.ndim <= axis < x.ndim:
        raise ShapeError(f"split: axis {axis} is out of bounds for an array of {x.ndim} dimensions")
    ax = int(axis) % x.ndim
    size = x.shape[ax]
    if not isinstance(indices_or_sections, (int, np.integer, list, tuple)) or isinstance(indices_or_sections, bool):
        raise ArgumentError(
            f"split: indices_or_sections must be an int or a sequence of ints, got {indices_or_sections!r}"
        )
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0 or size % sections:
            raise ShapeError(f"split: axis {ax} of length {size} does not divide into {sections} equal parts")
        bounds = [i * (size // sections) for i in range(sections + 1)]
    else:
        bounds = [0, *(_integer("split", "each index", i) for i in indices_or_sections), size]
    parts = []
    for low, high in itertools.pairwise(bounds):
        low_c = max(0, min(low if low >= 0 else low + size, size))
        high_c = max(low_c, min(high if high >= 0 else high + size, size))
        parts.append(x[(slice(None),) * ax + (slice(low_c, high_c),)])
    return parts


def broadcast_to(x: GPUArray, shape: int | Sequence[int]) -> GPUArray:
    """A read-only-by-convention view of ``x`` broadcast to ``shape`` (stride 0 along new axes)."""
    x = _array("broadcast_to", x)
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if not isinstance(shape, (list, tuple)):
        raise ArgumentError(f"broadcast_to: shape must be an int or a sequence of ints, got {shape!r}")
    target = tuple(_integer("broadcast_to", "each dimension of shape", s) for s in shape)
    if broadcast_shapes(x.shape, target) != target:
        raise ShapeError(f"broadcast_to: shape {x.shape} cannot be broadcast to {target}")
    lead = len(target) - x.ndim
    strides = (0,) * lead + tuple(0 if s == 1 and t != 1 else st for s, t, st in
                                  zip(x.shape, target[lead:], x._strides, strict=True))  # fmt: skip
    return GPUArray(x.buffer, target, x.dtype, strides, x._offset)


def _enumerate() -> Groups:
    return {_FILE: [_expressions(size) for size in sorted(_ELEMENTS)]}


register_enumerator(_enumerate)
