"""Embedding gathers and positions: embedding (rows of a table picked by device ids), gather_last (each
sequence's last valid hidden state) and position_ids. Rows are copied bit for bit, so any dtype works.
Kernel: native/kernels/nn/embedding.cu (``gather_rows``, one ``GatherArgs`` by value; ``position_ids``).

Out-of-range indices are never read: their output rows are zero and an optional device ``error_flag``
is set, without a host round trip, so every op is graph-capturable with ``out=``.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, allocate
from pygpukit.core.dtypes import DType, int32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache

from . import _cpu
from ._kernels import (
    BLOCK,
    NAMESPACE,
    Groups,
    c_param,
    grid_for,
    group,
    launch,
    pointer,
    register_enumerator,
    size_param,
)
from ._layout import MAX_DIMS, check_devices, collapse, is_cuda
from ._nn_common import (
    INDEX_DTYPES,
    INT32_MAX,
    array,
    check_overlap,
    index_input,
    output,
    positive,
    pow2_at_least,
    rows,
)

__all__ = ["embedding", "gather_last", "position_ids"]

_FILE = "nn/embedding.cu"
GATHER_ARGS = KernelStruct("pygpukit::ops::GatherArgs", _FILE, [
    ("src", "const void*"), ("ids", "const void*"), ("out", "void*"), ("error", "int*"), ("rows", "long long"),
    ("hidden", "long long"), ("src_outer", "long long"), ("src_row", "long long"), ("out_row", "long long"),
    ("limit", "long long"), ("fixed", "long long"), ("shift", "long long"), ("lanes", "int"), ("vector", "int"),
    ("ids_ndim", "int"), ("ids_shape", f"long long[{MAX_DIMS}]"), ("ids_strides", f"long long[{MAX_DIMS}]"),
])  # fmt: skip
_GATHER_PARAMS = [GATHER_ARGS.param("args")]
_POSITION_PARAMS = [pointer("out"), pointer("start"), c_param("start_value", "int"), size_param("start_stride"),
                    size_param("batch"), size_param("seq"), size_param("out_b"), size_param("out_s")]  # fmt: skip
_UNIT = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
# embedding's repeated calls (no out=, no error_flag): by the layouts of weight and ids, the kernel, the
# result's shape, the struct's fields after its pointers and the grid.
_CALLS: PlanCache[tuple[Any, ...]] = PlanCache("ops.embedding.calls")


def _gather_expression(itemsize: int, index: DType) -> str:
    return f"{NAMESPACE}gather_rows<{_UNIT[itemsize]}, {index.ctype}>"


def _positions_expression(index: DType) -> str:
    return f"{NAMESPACE}position_ids<{index.ctype}>"


def _expressions() -> list[str]:
    gathers = [_gather_expression(size, index) for size in _UNIT for index in INDEX_DTYPES]
    return gathers + [_positions_expression(index) for index in INDEX_DTYPES]


def _error_flag(name: str, flag: Any) -> GPUArray | None:
    if flag is None:
        return None
    a = array(name, "error_flag", flag)
    if a.dtype != int32 or a.size != 1:
        raise DTypeError(f"{name}: error_flag must be a one-element int32 array, got {a.dtype} {a.shape}")
    return a


def _ids_layout(name: str, ids: GPUArray | None) -> tuple[int, list[int], list[int]]:
    """(ndim, shape, strides) of the ids after merging their axes, padded to MAX_DIMS (GatherArgs)."""
    if ids is None:
        return 0, [0] * MAX_DIMS, [0] * MAX_DIMS
    dims, (strides,) = collapse(ids.shape, [ids._strides])
    if len(dims) > MAX_DIMS:
        raise ShapeError(f"{name}: ids of shape {ids.shape} and strides {ids.strides} (bytes) need {len(dims)} "
                         f"dimensions after merging; the kernel takes at most {MAX_DIMS}")  # fmt: skip
    pad = [0] * (MAX_DIMS - len(dims))
    return len(dims), dims + pad, strides + pad


def _gather(name: str, src: GPUArray, out: GPUArray, count: int, hidden: int, src_outer: int, src_row: int,
            out_row: int, limit: int, ids: GPUArray | None, fixed: int, shift: int,
            error: GPUArray | None) -> tuple[JITKernel, tuple[Any, ...], int]:  # fmt: skip
    """Launch gather_rows; returns (kernel, the struct's fields after the four pointers, grid)."""
    itemsize = src.itemsize
    vector = (hidden * itemsize) % 16 == 0 and all(
        a.device_ptr % 16 == 0 and (s * itemsize) % 16 == 0
        for a, s in ((src, src_outer), (src, src_row), (out, out_row))
    )
    chunks = hidden * itemsize // 16 if vector else hidden
    lanes = pow2_at_least(chunks, 1, BLOCK)
    expression = _gather_expression(itemsize, ids.dtype if ids is not None else int32)
    kernel = group(_FILE, _expressions()).kernel(expression, _GATHER_PARAMS, programmatic=True)
    ndim, shape, strides = _ids_layout(name, ids)
    fields = (count, hidden, src_outer, src_row, out_row, limit, fixed, shift, lanes, int(vector), ndim, *shape,
              *strides)  # fmt: skip
    args = GATHER_ARGS.pack_flat(src.device_ptr, ids.device_ptr if ids is not None else 0, out.device_ptr,
                                 error.device_ptr if error is not None else 0, *fields)  # fmt: skip
    grid = grid_for(count, BLOCK // lanes)
    kernel(args, grid=grid, block=BLOCK)
    return kernel, fields, grid


def _cpu_gather(src: np.ndarray[Any, Any], index: np.ndarray[Any, Any], limit: int, out: GPUArray,
                error: GPUArray | None) -> None:  # fmt: skip
    """Rows ``src[i, index[i]]`` (src: rows x limit x hidden), zero where the index is outside [0, limit)."""
    inside = (index >= 0) & (index < limit)
    picked_rows = np.zeros((index.size, src.shape[-1]), dtype=src.dtype)
    picked = np.nonzero(inside)[0]
    picked_rows[picked] = src[picked, index[picked]]
    if error is not None and not inside.all():
        _cpu.store(error, np.ones(error.shape, np.int32))
    _cpu.store(out, picked_rows.reshape(out.shape))


def embedding(
    weight: GPUArray, ids: GPUArray, out: GPUArray | None = None, *, error_flag: GPUArray | None = None
) -> GPUArray:
    """Rows of ``weight`` (vocab, hidden) picked by the int32/int64 device ``ids`` (any shape, any
    layout): the result has shape ``ids.shape + (hidden,)`` and weight's dtype (any dtype: rows are
    copied bit for bit).

    Out-of-range ids (negative or >= vocab) are never read: their output rows are zero, and when
    ``error_flag`` (a one-element int32 device array, which the op never clears) is given it is set to
    1. The check costs nothing on the host, so the op stays graph-capturable."""
    if out is None and error_flag is None and type(weight) is GPUArray and type(ids) is GPUArray:
        key = (weight._dtype, weight._shape, weight._strides, weight.device_ptr % 16, weight._buffer.device,
               ids._dtype, ids._shape, ids._strides, ids._buffer.device)  # fmt: skip
        plan = _CALLS.get(key)
        if plan is not None and is_cuda():
            kernel, shape, fields, grid = plan
            result = allocate(shape, weight._dtype)
            launch(
                kernel, (GATHER_ARGS.pack_flat(weight.device_ptr, ids.device_ptr, result.device_ptr, 0, *fields),), grid
            )
            return result
    else:
        key = None
    name = "embedding"
    weight = array(name, "weight", weight)
    ids = index_input(name, "ids", ids)
    error = _error_flag(name, error_flag)
    if weight.ndim != 2:
        raise ShapeError(f"{name}: weight must be 2-D (vocab, hidden), got shape {weight.shape}")
    vocab, hidden = weight.shape
    _, weight_stride = rows(name, "weight", weight)
    result = output(name, "out", out, (*ids.shape, hidden), weight.dtype)
    check_devices(name, [a for a in (weight, ids, result, error) if a is not None])
    _, out_stride = rows(name, "out", result)
    outputs = [("out", result)] + ([("error_flag", error)] if error is not None else [])
    check_overlap(name, outputs, [("weight", weight), ("ids", ids)], in_place=False)
    if result.size == 0:
        return result
    count = ids.size
    if not is_cuda():
        table = _cpu.host(weight)
        _cpu_gather(np.broadcast_to(table, (count, vocab, hidden)), _cpu.host(ids).reshape(-1).astype(np.int64),
                    vocab, result, error)  # fmt: skip
        return result
    kernel, fields, grid = _gather(name, weight, result, count, hidden, 0, weight_stride, out_stride, vocab, ids, 0, 0,
                                   error)  # fmt: skip
    if key is not None:
        _CALLS.put(key, (kernel, result._shape, fields, grid))
    return result


def gather_last(
    x: GPUArray, lengths: GPUArray | None = None, out: GPUArray | None = None, *, error_flag: GPUArray | None = None
) -> GPUArray:
    """The hidden state of each sequence's last valid token: ``out[b] = x[b, lengths[b] - 1]`` for x
    of shape (batch, seq, hidden); ``lengths``: int32/int64 device array of shape (batch,), default
    ``seq`` for every row. A length outside [1, seq] gives a zero row (and sets ``error_flag`` as in
    :func:`embedding`). Result: (batch, hidden), x's dtype (any dtype)."""
    name = "gather_last"
    x = array(name, "x", x)
    error = _error_flag(name, error_flag)
    if x.ndim != 3:
        raise ShapeError(f"{name}: x must be 3-D (batch, seq, hidden), got shape {x.shape}")
    batch, seq, hidden = x.shape
    if lengths is not None:
        lengths = index_input(name, "lengths", lengths)
        if lengths.shape != (batch,):
            raise ShapeError(f"{name}: lengths must have shape ({batch},), got {lengths.shape}")
    elif seq == 0 and batch * hidden > 0:
        raise ShapeError(f"{name}: x has no tokens (shape {x.shape})")
    if hidden > 1 and x._strides[-1] != 1:
        raise ShapeError(f"{name}: x needs unit stride along its last axis, got strides {x.strides} (bytes)")
    result = output(name, "out", out, (batch, hidden), x.dtype)
    check_devices(name, [a for a in (x, lengths, result, error) if a is not None])
    _, out_stride = rows(name, "out", result)
    outputs = [("out", result)] + ([("error_flag", error)] if error is not None else [])
    check_overlap(name, outputs, [("x", x), ("lengths", lengths)], in_place=False)
    if result.size == 0:
        return result
    if not is_cuda():
        index = _cpu.host(lengths).astype(np.int64) - 1 if lengths is not None else np.full(batch, seq - 1, np.int64)
        _cpu_gather(_cpu.host(x), index, seq, result, error)
        return result
    _gather(name, x, result, batch, hidden, x._strides[0], x._strides[1], out_stride, seq, lengths, seq - 1, -1, error)
    return result


def position_ids(batch: int, seq: int, start: int | GPUArray = 0, out: GPUArray | None = None) -> GPUArray:
    """int32 positions of shape (batch, seq): ``out[b, s] = start + s``, with ``start`` a Python int or
    an int32/int64 device array of shape (batch,) (per-row offsets, e.g. the cached lengths during
    decoding; read on the device, so the op is graph-capturable)."""
    name = "position_ids"
    batch = positive(name, "batch", batch, 0)
    seq = positive(name, "seq", seq, 0)
    starts: GPUArray | None = None
    value = 0
    if isinstance(start, GPUArray):
        starts = index_input(name, "start", start)
        if starts.shape != (batch,):
            raise ShapeError(f"{name}: start must have shape ({batch},), got {starts.shape}")
    else:
        given: Any = start
        if isinstance(given, bool) or not isinstance(given, numbers.Integral):
            raise ArgumentError(f"{name}: start must be an int or a device array, got {type(given).__name__}")
        value = int(given)
        if value < -INT32_MAX - 1 or value + max(seq - 1, 0) > INT32_MAX:
            raise ArgumentError(f"{name}: positions {value}..{value + seq - 1} do not fit in int32")
    result = output(name, "out", out, (batch, seq), int32)
    check_devices(name, [a for a in (starts, result) if a is not None])
    check_overlap(name, [("out", result)], [("start", starts)], in_place=False)
    if result.size == 0:
        return result
    if not is_cuda():
        first = _cpu.host(starts).astype(np.int64) if starts is not None else np.full(batch, value, np.int64)
        _cpu.store(result, (first[:, None] + np.arange(seq)[None, :]).astype(np.int32))
        return result
    expression = _positions_expression(starts.dtype if starts is not None else int32)
    kernel = group(_FILE, _expressions()).kernel(expression, _POSITION_PARAMS)
    kernel(result.device_ptr, starts.device_ptr if starts is not None else 0, value,
           starts._strides[0] if starts is not None else 0, batch, seq, result._strides[0], result._strides[1],
           grid=grid_for(batch * seq), block=BLOCK)  # fmt: skip
    return result


def _enumerate() -> Groups:
    return {_FILE: [tuple(_expressions())]}


register_enumerator(_enumerate)
