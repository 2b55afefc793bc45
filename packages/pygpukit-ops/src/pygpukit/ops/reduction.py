"""Reductions (sum, mean, max, min, argmax, argmin, prod, var, std, any, all), cumsum, softmax and
log_softmax, deterministic: the same input gives bitwise the same result on every run.

No kernel uses atomics. Each output is folded in an order fixed by the input's shape, dtype and
layout (native/kernels/reduction/reduce.cu): a reduction over the fastest-varying axis gives each row to a
group of threads, each thread folds a fixed strided subset of the row (16-byte packs when the row is
contiguous) sequentially, and a fixed binary tree joins the threads; a reduction over another axis
gives each output to a column of 8 threads joined the same way. Rows too long to fill the device
otherwise are split into chunks whose results a second pass joins, also in a fixed tree. So a float32
sum is a blocked pairwise sum: short sequential runs (a chunk of at most about 64K elements spread over
256 threads) and trees above them.

Accumulation: fp16, bf16 and fp8 in float32; float32 in float32; float64 in float64; sums and products
of integers and bool in int64 (uint64 for unsigned types), as NumPy's ``sum`` does; mean, var and std of
integers in float64. Result dtypes are NumPy's (``sum(int8)`` is int64, ``mean(int32)`` is float64).
"""

from __future__ import annotations

import builtins
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty, full
from pygpukit.core.dtypes import DType, all_dtypes, bool_, float32, float64, int64, uint8, uint64
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel

from . import _cpu
from ._kernels import (
    NAMESPACE,
    Groups,
    code_param,
    completion_counters,
    grid_for,
    group,
    layout_param,
    pointer,
    register_enumerator,
    size_param,
)
from ._layout import check_devices, collapse, contiguous_strides, dtype_code, is_cuda, normalize_axes, pack_layout
from .elementwise import compute_ctype

__all__ = [
    "all",
    "any",
    "argmax",
    "argmin",
    "cumsum",
    "log_softmax",
    "max",
    "mean",
    "min",
    "prod",
    "softmax",
    "std",
    "sum",
    "sum_axis",
    "var",
]

_REDUCE_FILE = "reduction/reduce.cu"
_SCAN_FILE = "reduction/scan.cu"
_SOFTMAX_FILE = "reduction/softmax.cu"
_MAX_DIMS = 8
_REDUCE_LAYOUT = struct.Struct(f"@ii{4 * _MAX_DIMS}q")
_SCAN_LAYOUT = struct.Struct(f"@i{3 * _MAX_DIMS}qqq")
_SOFTMAX_LAYOUT = struct.Struct(f"@i{3 * _MAX_DIMS}q")
_BLOCK = 256
_SPLIT_BLOCKS = 1024  # blocks of a split reduction over rows (H100 and H200 hold 1056 at once)
_ACCUMULATOR_CODE = -3  # kCodeAccumulator in reduce.cu
_SIZES = {"float": 4, "double": 8, "long long": 8, "unsigned long long": 8, "bool": 1}
_FLOAT_DTYPES = tuple(d for d in all_dtypes() if d.is_floating)


def _sum_accumulator(dtype: DType) -> str:
    if dtype.is_floating:
        return compute_ctype(dtype)
    return "unsigned long long" if dtype.kind == "u" else "long long"


def _order_accumulator(dtype: DType) -> str:
    """max/min/argmax/argmin: floats compare in their compute type, integers widened, bool as bool."""
    if dtype.kind == "b":
        return "bool"
    return _sum_accumulator(dtype)


def _mean_accumulator(dtype: DType) -> str:
    return compute_ctype(dtype) if dtype.is_floating else "double"


def _sum_dtype(dtype: DType) -> DType:
    if dtype.is_floating:
        return dtype
    return uint64 if dtype.kind == "u" else int64


def _mean_dtype(dtype: DType) -> DType:
    return dtype if dtype.is_floating else float64


class _Reducer:
    """One reduction: its accumulator template and mode (reducers.cuh) and the dtype rules around it."""

    __slots__ = ("accumulator", "mode", "name", "numpy", "result", "template", "typed")

    def __init__(
        self, name: str, template: str, mode: int, accumulator: Any, result: Any, numpy_name: str, typed: bool
    ) -> None:
        self.name = name
        self.template = template
        self.mode = mode  # the variant of the template: sum or mean, max or min, ...
        self.accumulator = accumulator  # DType -> the C type A of Template<A>
        self.result = result  # DType -> the result's DType
        self.numpy = numpy_name
        self.typed = typed  # float inputs get a row kernel for their own type (16-byte loads)

    def acc_bytes(self, dtype: DType) -> int:
        """sizeof(Template<A>::acc), for the partial results of a two-pass reduction."""
        size = _SIZES[self.accumulator(dtype)]
        if self.template == "ArgR":
            return 16
        if self.template == "VarianceR":
            return 24 if size == 8 else 16
        if self.template == "LogSumExpR":
            return 2 * size
        return size

    def expressions(self, dtype: DType) -> tuple[str, ...]:
        """(rows kernel for this input dtype, rows kernel over partials, column kernel[, column kernel over
        16-byte packs of rows: sums and extremes of floats])."""
        reducer = f"{NAMESPACE}{self.template}<{self.accumulator(dtype)}>"
        source = dtype.ctype if dtype.is_floating and self.typed else f"{NAMESPACE}Dynamic"
        found: tuple[str, ...] = (
            f"{NAMESPACE}reduce_rows<{reducer}, {source}>",
            f"{NAMESPACE}reduce_rows<{reducer}, {NAMESPACE}Partial>",
            f"{NAMESPACE}reduce_cols<{reducer}, {source}>",
        )
        if dtype.is_floating and self.template in ("SumR", "ExtremeR"):
            found += (f"{NAMESPACE}reduce_cols_packed<{reducer}, {source}>",)
        return found


def _same(dtype: DType) -> DType:
    return dtype


def _int64(dtype: DType) -> DType:
    return int64


def _bool(dtype: DType) -> DType:
    return bool_


def _truth(dtype: DType) -> str:
    return "bool"


_SUM = _Reducer("sum", "SumR", 0, _sum_accumulator, _sum_dtype, "sum", True)
_MEAN = _Reducer("mean", "SumR", 1, _mean_accumulator, _mean_dtype, "mean", True)
_PROD = _Reducer("prod", "ProdR", 0, _sum_accumulator, _sum_dtype, "prod", False)
_MAX = _Reducer("max", "ExtremeR", 0, _order_accumulator, _same, "max", True)
_MIN = _Reducer("min", "ExtremeR", 1, _order_accumulator, _same, "min", True)
_ARGMAX = _Reducer("argmax", "ArgR", 0, _order_accumulator, _int64, "argmax", True)
_ARGMIN = _Reducer("argmin", "ArgR", 1, _order_accumulator, _int64, "argmin", True)
_ANY = _Reducer("any", "TruthR", 0, _truth, _bool, "any", False)
_ALL = _Reducer("all", "TruthR", 1, _truth, _bool, "all", False)
_VAR = _Reducer("var", "VarianceR", 0, _mean_accumulator, _mean_dtype, "var", False)
_STD = _Reducer("std", "VarianceR", 1, _mean_accumulator, _mean_dtype, "std", False)
_LSE = _Reducer("softmax", "LogSumExpR", 0, compute_ctype, _same, "", True)
_REDUCERS = (_SUM, _MEAN, _PROD, _MAX, _MIN, _ARGMAX, _ARGMIN, _ANY, _ALL, _VAR, _STD)

_ROWS_PARAMS = [pointer("x"), code_param("x_code"), pointer("out"), code_param("out_code"), size_param("rows"),
                size_param("count"), size_param("chunk"), code_param("lanes"), size_param("total"),
                size_param("ddof"), code_param("mode"), layout_param("layout", "ReduceLayout"), pointer("partial"),
                pointer("counters")]  # fmt: skip
_COLS_PARAMS = [pointer("x"), code_param("x_code"), pointer("out"), code_param("out_code"), size_param("rows"),
                size_param("count"), size_param("chunk"), size_param("total"), size_param("ddof"), code_param("mode"),
                layout_param("layout", "ReduceLayout")]  # fmt: skip

_PACKED_COLS_PARAMS = [pointer("x"), pointer("out"), code_param("out_code"), size_param("rows"), size_param("count"),
                       size_param("chunk"), size_param("total"), size_param("ddof"), code_param("mode"),
                       size_param("stride")]  # fmt: skip


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_between(value: int, low: int, high: int) -> int:
    result = low
    while result < value and result < high:
        result *= 2
    return result


def _dims_bytes(dims: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[int]]:
    if len(dims) > _MAX_DIMS:
        raise ShapeError(f"reductions support up to {_MAX_DIMS} dimensions that cannot be merged, got {len(dims)}")
    pad = [0] * (_MAX_DIMS - len(dims))
    return list(dims) + pad, list(strides) + pad


def _reduce_layout(outer: tuple[list[int], list[int]], inner: tuple[list[int], list[int]]) -> bytes:
    outer_shape, outer_strides = _dims_bytes(*outer)
    inner_shape, inner_strides = _dims_bytes(*inner)
    return _REDUCE_LAYOUT.pack(len(outer[0]), len(inner[0]), *outer_shape, *outer_strides, *inner_shape,
                               *inner_strides)  # fmt: skip


def _split(x: GPUArray, axes: tuple[int, ...]) -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]:
    """(kept dims, reduced dims) of ``x``, each as collapsed (shape, element strides) in C order."""
    kept = [a for a in range(x.ndim) if a not in axes]
    dims_out, (strides_out,) = collapse([x._shape[a] for a in kept], [[x._strides[a] for a in kept]])
    dims_in, (strides_in,) = collapse([x._shape[a] for a in axes], [[x._strides[a] for a in axes]])
    return (dims_out, strides_out), (dims_in, strides_in)


def _launch_reduce(
    reducer: _Reducer,
    x: GPUArray,
    axes: tuple[int, ...],
    out: GPUArray,
    out_code: int,
    ddof: int,
) -> None:
    """Run ``reducer`` over ``axes`` of ``x`` into the contiguous ``out`` (rows in C order of the kept
    axes), in one pass or two. ``out_code`` is the dtype code of ``out``, or the accumulator code."""
    dtype = x.dtype
    outer, inner = _split(x, axes)
    rows = math.prod(outer[0])
    count = math.prod(inner[0])
    expressions = reducer.expressions(dtype)
    rows_kernel, partial_kernel, cols_kernel = expressions[:3]
    kernels = group(_REDUCE_FILE, expressions)
    layout = _reduce_layout(outer, inner)
    code = dtype_code(dtype)
    # This module's max/min/sum shadow the builtins.
    smallest_kept = builtins.min((builtins.abs(s) for s in outer[1]), default=None)
    smallest_reduced = builtins.min((builtins.abs(s) for s in inner[1]), default=0)
    if smallest_kept is None or smallest_reduced <= smallest_kept:
        contiguous = len(inner[0]) == 1 and inner[1][0] == 1 and dtype.is_floating and reducer.typed
        width = 16 // dtype.itemsize if contiguous else 1
        lanes = _pow2_between(-(-count // (8 * width)), 4, _BLOCK)  # about 8 packs per thread
        row_blocks = -(-rows // (_BLOCK // lanes))
        chunks = 1
        if lanes == _BLOCK and row_blocks < 1024:
            # At most _SPLIT_BLOCKS blocks in all: about one wave of resident blocks on the GPUs we target,
            # so each waits on its completion counter once, at the end (the count is the same on every GPU,
            # and so are the results).
            chunks = builtins.max(1, builtins.min(_ceil(count, _BLOCK * width * 8), _ceil(_SPLIT_BLOCKS, row_blocks),
                                                  4096))  # fmt: skip
        step = _BLOCK * width
        chunk = _ceil(_ceil(count, chunks), step) * step
        chunks = _ceil(count, chunk)
        partial = counters = None
        if chunks > 1:  # one row per block; the last block of a row finishes it (reduce.cu)
            partial = empty(rows * chunks * reducer.acc_bytes(dtype), uint8)
            counters = completion_counters(x._buffer.device, None, in_capture=False)
        kernels.kernel(rows_kernel, _ROWS_PARAMS)(
            x.device_ptr, code, out.device_ptr, out_code, rows, count, chunk, lanes, count, ddof, reducer.mode,
            layout, 0 if partial is None else partial.device_ptr, 0 if counters is None else counters.device_ptr,
            grid=(row_blocks, chunks), block=_BLOCK,
        )  # fmt: skip
        if partial is not None and counters is None:  # a capture before the stream had counters
            _finish_partials(kernels.kernel(partial_kernel, _ROWS_PARAMS), reducer, partial, out, out_code, rows,
                             chunks, _BLOCK, count, ddof)  # fmt: skip
        return
    if _packed_columns(expressions, x, outer, inner):
        width = 16 // dtype.itemsize
        col_blocks = -(-rows // (32 * width))
        chunks = 1
        if col_blocks < 1024:
            chunks = builtins.max(1, builtins.min(_ceil(count, 64), _ceil(2048, col_blocks), 4096))
        chunk = _ceil(_ceil(count, chunks), 8) * 8
        chunks = _ceil(count, chunk)
        target = out if chunks == 1 else empty(rows * chunks * reducer.acc_bytes(dtype), uint8)
        kernels.kernel(expressions[3], _PACKED_COLS_PARAMS)(
            x.device_ptr, target.device_ptr, out_code, rows, count, chunk, count, ddof, reducer.mode, inner[1][0],
            grid=(col_blocks, chunks), block=(32, 8),
        )  # fmt: skip
    else:
        col_blocks = -(-rows // 32)
        chunks = 1
        if col_blocks < 1024:
            chunks = builtins.max(1, builtins.min(_ceil(count, 64), _ceil(2048, col_blocks), 4096))
        chunk = _ceil(_ceil(count, chunks), 8) * 8
        chunks = _ceil(count, chunk)
        target = out if chunks == 1 else empty(rows * chunks * reducer.acc_bytes(dtype), uint8)
        kernels.kernel(cols_kernel, _COLS_PARAMS)(
            x.device_ptr, code, target.device_ptr, out_code, rows, count, chunk, count, ddof, reducer.mode, layout,
            grid=(col_blocks, chunks), block=(32, 8),
        )  # fmt: skip
    if chunks > 1:
        _finish_partials(kernels.kernel(partial_kernel, _ROWS_PARAMS), reducer, target, out, out_code, rows, chunks,
                         _pow2_between(-(-chunks // 4), 4, _BLOCK), count, ddof)  # fmt: skip


def _finish_partials(kernel: JITKernel, reducer: _Reducer, partial: GPUArray, out: GPUArray, out_code: int, rows: int,
                     chunks: int, lanes: int, count: int, ddof: int) -> None:  # fmt: skip
    """The second pass over split rows: fold each row's ``chunks`` accumulators in ``partial`` into
    ``out``. With lanes = _BLOCK it folds in the order of reduce_rows' own last-block finish."""
    layout = _reduce_layout(([rows], [chunks]), ([chunks], [1]))
    kernel(partial.device_ptr, 0, out.device_ptr, out_code, rows, chunks, chunks, lanes, count, ddof, reducer.mode,
           layout, 0, 0, grid=-(-rows // (_BLOCK // lanes)), block=_BLOCK)  # fmt: skip


def _packed_columns(
    expressions: tuple[str, ...], x: GPUArray, outer: tuple[list[int], list[int]], inner: tuple[list[int], list[int]]
) -> bool:
    """Whether reduce_cols_packed applies: kept rows side by side (one kept dimension of stride 1, a
    whole number of 16-byte packs) and one reduced dimension whose stride keeps the packs aligned."""
    width = 16 // x.dtype.itemsize
    return (
        len(expressions) == 4
        and len(outer[0]) == 1
        and outer[1][0] == 1
        and outer[0][0] % width == 0
        and len(inner[0]) == 1
        and inner[1][0] % width == 0
        and x.device_ptr % 16 == 0
    )


def _check_array(name: str, x: Any) -> GPUArray:
    if not isinstance(x, GPUArray):
        raise DTypeError(f"{name} needs a GPUArray, got {type(x).__name__}")
    check_devices(name, [x])
    return x


def _is_axis_index(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _axes(axis: Any, ndim: int, name: str, *, single: bool = False) -> tuple[int, ...]:
    """``axis`` as sorted non-negative axes. Its type is checked here (:class:`ArgumentError`: an int,
    None or, unless ``single``, a tuple or list of ints; bool is not an int here, as in NumPy); an
    axis out of range or repeated is a :class:`ShapeError` (from ``normalize_axes``)."""
    if axis is None and not single:
        return normalize_axes(None, ndim, name)
    if _is_axis_index(axis) or (
        not single and isinstance(axis, (tuple, list)) and builtins.all(_is_axis_index(a) for a in axis)
    ):
        return normalize_axes(axis, ndim, name)
    expected = "an int" if single else "None, an int or a tuple of ints"
    raise ArgumentError(f"{name}: axis must be {expected}, got {axis!r} of type {type(axis).__name__}")


def _empty_value(reducer: _Reducer) -> Any:
    """The result of reducing zero elements (NumPy's): the identity, or NaN for mean/var/std."""
    return {"sum": 0, "prod": 1, "any": False, "all": True}.get(reducer.name, math.nan)


def _reduce(reducer: _Reducer, x: Any, axis: Any, keepdims: bool, ddof: int = 0) -> GPUArray:
    x = _check_array(reducer.name, x)
    if reducer.template == "ArgR" and axis is not None and not _is_axis_index(axis):
        raise ArgumentError(f"{reducer.name}: axis must be an int or None, got {axis!r} of type {type(axis).__name__}")
    axes = _axes(axis, x.ndim, reducer.name)
    result_dtype = reducer.result(x.dtype)
    if keepdims:
        shape = tuple(1 if a in axes else s for a, s in enumerate(x.shape))
    else:
        shape = tuple(s for a, s in enumerate(x.shape) if a not in axes)
    count = math.prod(x.shape[a] for a in axes)
    if count == 0 and reducer in (_MAX, _MIN, _ARGMAX, _ARGMIN):
        raise ShapeError(f"{reducer.name} of an empty selection (shape {x.shape}, axis {axis!r}) has no identity")
    if count == 0 or math.prod(shape) == 0:
        return full(shape, _empty_value(reducer), result_dtype)
    out = empty(shape, result_dtype)
    if not is_cuda():
        _cpu_reduce(reducer, x, axes, out, ddof)
        return out
    _launch_reduce(reducer, x, axes, out, dtype_code(result_dtype), ddof)
    return out


def _cpu_numbers(x: GPUArray, accumulator: str) -> np.ndarray[Any, Any]:
    """The CPU backend's values to reduce: float accumulation in float64 (NumPy's sums along
    non-contiguous axes are plain loops, which float32 would make visibly less accurate than the GPU)."""
    wide = "double" if accumulator == "float" else accumulator
    return _cpu.host(x).astype(_cpu.compute_numpy(wide))


def _cpu_reduce(reducer: _Reducer, x: GPUArray, axes: tuple[int, ...], out: GPUArray, ddof: int) -> None:
    values = _cpu_numbers(x, reducer.accumulator(x.dtype))
    with np.errstate(all="ignore"):
        if reducer.template == "ArgR":
            flat = values.reshape(-1) if len(axes) == x.ndim else None
            axis_ = None if flat is not None else axes[0]
            result = getattr(np, reducer.numpy)(flat if flat is not None else values, axis=axis_)
        elif reducer in (_VAR, _STD):
            result = getattr(np, reducer.numpy)(values, axis=axes, ddof=ddof)
        else:
            result = getattr(np, reducer.numpy)(values, axis=axes)
    _cpu.store(out, np.reshape(result, out.shape))


def sum(x: GPUArray, axis: Any = None, keepdims: bool = False) -> GPUArray:
    """Sum over ``axis`` (None: all; an int or a tuple). bool and signed integers give int64, unsigned
    integers uint64, floats their own dtype (accumulated in float32 for fp16/bf16/fp8)."""
    return _reduce(_SUM, x, axis, keepdims)


def sum_axis(x: GPUArray, axis: int) -> GPUArray:
    """``sum(x, axis=axis)`` (the name of earlier pygpukit releases)."""
    return _reduce(_SUM, x, axis, False)


def prod(x: GPUArray, axis: Any = None, keepdims: bool = False) -> GPUArray:
    """Product over ``axis``; dtypes as for :func:`sum`. Integer products wrap."""
    return _reduce(_PROD, x, axis, keepdims)


def max(x: GPUArray, axis: Any = None, keepdims: bool = False) -> GPUArray:
    """Maximum over ``axis`` (NaN propagates; bool: any). An empty selection raises ShapeError."""
    return _reduce(_MAX, x, axis, keepdims)


def min(x: GPUArray, axis: Any = None, keepdims: bool = False) -> GPUArray:
    """Minimum over ``axis`` (NaN propagates; bool: all). An empty selection raises ShapeError."""
    return _reduce(_MIN, x, axis, keepdims)


def argmax(x: GPUArray, axis: int | None = None, keepdims: bool = False) -> GPUArray:
    """int64 index of the first maximum along ``axis`` (None: into the flattened array); a NaN counts
    as the maximum."""
    return _reduce(_ARGMAX, x, axis, keepdims)


def argmin(x: GPUArray, axis: int | None = None, keepdims: bool = False) -> GPUArray:
    """int64 index of the first minimum along ``axis``; a NaN counts as the minimum."""
    return _reduce(_ARGMIN, x, axis, keepdims)


def any(x: GPUArray, axis: Any = None, keepdims: bool = False) -> GPUArray:
    """Whether any element over ``axis`` is non-zero (bool)."""
    return _reduce(_ANY, x, axis, keepdims)


def all(x: GPUArray, axis: Any = None, keepdims: bool = False) -> GPUArray:
    """Whether every element over ``axis`` is non-zero (bool)."""
    return _reduce(_ALL, x, axis, keepdims)


def mean(x: GPUArray, axis: Any = None, keepdims: bool = False) -> GPUArray:
    """Arithmetic mean over ``axis``: floats keep their dtype, integers and bool give float64."""
    return _reduce(_MEAN, x, axis, keepdims)


def var(x: GPUArray, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> GPUArray:
    """Variance ``sum((x - mean)**2) / (n - ddof)`` over ``axis`` (Welford's method; dtypes as mean)."""
    return _reduce(_VAR, x, axis, keepdims, _check_ddof(ddof))


def std(x: GPUArray, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> GPUArray:
    """Standard deviation: the square root of :func:`var`."""
    return _reduce(_STD, x, axis, keepdims, _check_ddof(ddof))


def _check_ddof(ddof: Any) -> int:
    if not isinstance(ddof, (int, np.integer)) or isinstance(ddof, bool) or ddof < 0:
        raise ValueError(f"ddof must be a non-negative integer, got {ddof!r}")
    return int(ddof)


# -- cumsum -----------------------------------------------------------------------------------------
def _scan_expression(accumulator: str) -> str:
    return f"{NAMESPACE}scan_rows<{accumulator}>"


_SCAN_PARAMS = [pointer("x"), code_param("x_code"), pointer("out"), code_param("out_code"), size_param("rows"),
                size_param("count"), size_param("chunk"), pointer("carry"), code_param("exclusive"),
                layout_param("layout", "ScanLayout")]  # fmt: skip
_ACCUMULATOR_DTYPES = {"float": float32, "double": float64, "long long": int64, "unsigned long long": uint64}
_SCAN_CHUNK = 8192


def _scan_layout(outer: Sequence[int], in_outer: Sequence[int], out_outer: Sequence[int], in_stride: int,
                 out_stride: int) -> bytes:  # fmt: skip
    shape, in_strides = _dims_bytes(outer, in_outer)
    _, out_strides = _dims_bytes(outer, out_outer)
    return _SCAN_LAYOUT.pack(len(outer), *shape, *in_strides, *out_strides, in_stride, out_stride)


def cumsum(x: GPUArray, axis: int | None = None) -> GPUArray:
    """Inclusive cumulative sum along ``axis`` (None: over the flattened array, compacting a
    non-contiguous ``x`` first). Dtypes as :func:`sum`; fp16/bf16/fp8 accumulate in float32."""
    x = _check_array("cumsum", x)
    if axis is None:
        x = x.reshape(-1)
        axis = 0
    (ax,) = _axes(axis, builtins.max(x.ndim, 1), "cumsum", single=True)  # a 0-d x scans as one element
    result_dtype = _sum_dtype(x.dtype)
    out = empty(x.shape, result_dtype)
    if out.size == 0:
        return out
    if x.ndim == 0:
        return _copy_convert(out, x)
    accumulator = _sum_accumulator(x.dtype)
    if not is_cuda():
        _cpu.store(out, np.cumsum(_cpu_numbers(x, accumulator), axis=ax))
        return out
    kept = [a for a in range(x.ndim) if a != ax]
    out_strides = contiguous_strides(x.shape)
    dims, (in_outer, out_outer) = collapse([x._shape[a] for a in kept],
                                           [[x._strides[a] for a in kept], [out_strides[a] for a in kept]])  # fmt: skip
    rows, count = math.prod(dims), x._shape[ax]
    layout = _scan_layout(dims, in_outer, out_outer, x._strides[ax], out_strides[ax])
    scan = _scan_expression(accumulator)
    scan_group = group(_SCAN_FILE, [scan])
    kernel = scan_group.kernel(scan, _SCAN_PARAMS)
    block = _pow2_between(-(-count // 4), 32, _BLOCK)
    chunks = -(-count // _SCAN_CHUNK) if rows < 1024 else 1
    chunk = -(-count // chunks) if chunks == 1 else _SCAN_CHUNK
    chunks = -(-count // chunk)
    carry = 0
    if chunks > 1:
        # Sum each chunk, scan those sums exclusively per row, then scan the chunks from them.
        acc_dtype = _ACCUMULATOR_DTYPES[accumulator]
        totals = empty((rows, chunks), acc_dtype)
        sum_expressions = _SUM.expressions(x.dtype)
        rows_kernel = sum_expressions[0]
        kernels = group(_REDUCE_FILE, sum_expressions)
        inner = ([count], [x._strides[ax]])
        width = 16 // x.dtype.itemsize if x._strides[ax] == 1 and x.dtype.is_floating else 1
        lanes = _pow2_between(-(-chunk // (4 * width)), 4, _BLOCK)
        kernels.kernel(rows_kernel, _ROWS_PARAMS)(
            x.device_ptr, dtype_code(x.dtype), totals.device_ptr, _ACCUMULATOR_CODE, rows, count, chunk, lanes, count,
            0, 0, _reduce_layout((dims, in_outer), inner), totals.device_ptr, 0,
            grid=(-(-rows // (_BLOCK // lanes)), chunks), block=_BLOCK,
        )  # fmt: skip
        carries = empty((rows, chunks), acc_dtype)
        code = dtype_code(acc_dtype)
        kernel(totals.device_ptr, code, carries.device_ptr, code, rows, chunks, chunks, 0, 1,
               _scan_layout([rows], [chunks], [chunks], 1, 1), grid=(rows, 1), block=_pow2_between(-(-chunks // 4), 32,
               _BLOCK))  # fmt: skip
        carry = carries.device_ptr
    kernel(x.device_ptr, dtype_code(x.dtype), out.device_ptr, dtype_code(result_dtype), rows, count, chunk, carry, 0,
           layout, grid=(rows, chunks), block=block)  # fmt: skip
    return out


def _copy_convert(out: GPUArray, x: GPUArray) -> GPUArray:
    from .elementwise import copy_into

    copy_into(out, x)
    return out


# -- softmax ----------------------------------------------------------------------------------------
_SOFTMAX_PARAMS = [pointer("x"), pointer("out"), size_param("rows"), size_param("count"), code_param("lanes"),
                   code_param("log"), layout_param("layout", "SoftmaxLayout")]  # fmt: skip
_APPLY_PARAMS = [pointer("out"), pointer("x"), pointer("stats"), size_param("n"), layout_param(), code_param("log")]


_HELD_PACKS = (1, 2, 4, 8)  # softmax_rows_held's P: 16-byte packs of its row each thread holds
_HELD_VALUES = 32  # at most this many values held per thread (P * elements per pack): registers
_HELD_LANES = 256  # threads per row at most: one block of softmax_rows_held (its launch bounds)


def _softmax_expressions(dtype: DType) -> tuple[str, ...]:
    ctype = compute_ctype(dtype)
    width = 16 // dtype.itemsize
    held = [
        f"{NAMESPACE}softmax_rows_held<{dtype.ctype}, {ctype}, {p}>" for p in _HELD_PACKS if p * width <= _HELD_VALUES
    ]
    return (f"{NAMESPACE}softmax_rows<{dtype.ctype}, {ctype}>",
            f"{NAMESPACE}softmax_apply<{dtype.ctype}, {ctype}>", *held)  # fmt: skip


def _held_plan(count: int, width: int) -> tuple[int, int] | None:
    """(lanes, packs per thread) of softmax_rows_held for rows of ``count`` elements, or None when a
    row does not fit in the registers of one block."""
    most = builtins.max(p for p in _HELD_PACKS if p * width <= _HELD_VALUES)
    if count > _HELD_LANES * most * width:
        return None
    lanes = _pow2_between(-(-count // (most * width)), 4, _HELD_LANES)
    packs = next(p for p in _HELD_PACKS if lanes * p * width >= count)
    return lanes, packs


def _softmax(name: str, x: Any, axis: int, log: bool) -> GPUArray:
    x = _check_array(name, x)
    if not x.dtype.is_floating:
        raise DTypeError(f"{name} needs a floating-point array, got {x.dtype} (convert it with astype first)")
    if x.ndim == 0:
        raise ShapeError(f"{name} needs at least one dimension")
    (ax,) = _axes(axis, x.ndim, name, single=True)
    out = empty(x.shape, x.dtype)
    if out.size == 0:
        return out
    if not is_cuda():
        values = _cpu_numbers(x, compute_ctype(x.dtype))
        with np.errstate(all="ignore"):
            shifted = values - values.max(axis=ax, keepdims=True)
            exp = np.exp(shifted)
            total = exp.sum(axis=ax, keepdims=True)
            _cpu.store(out, shifted - np.log(total) if log else exp / total)
        return out
    kept = [a for a in range(x.ndim) if a != ax]
    rows, count = math.prod(x._shape[a] for a in kept), x._shape[ax]
    expressions = _softmax_expressions(x.dtype)
    rows_expr, apply_expr = expressions[:2]
    kernels = group(_SOFTMAX_FILE, expressions)
    out_strides = out._strides
    rows_along_axis = (x._strides[ax] == 1 and out_strides[ax] == 1) or count == 1
    if rows_along_axis and (rows >= 256 or count <= 16384):
        kept_strides = [[x._strides[a] for a in kept], [out_strides[a] for a in kept]]
        dims, (in_outer, out_outer) = collapse([x._shape[a] for a in kept], kept_strides)
        shape, in_strides = _dims_bytes(dims, in_outer)
        _, outs = _dims_bytes(dims, out_outer)
        layout = _SOFTMAX_LAYOUT.pack(len(dims), *shape, *in_strides, *outs)
        width = 16 // x.dtype.itemsize
        held = _held_plan(count, width)
        if held is not None:
            lanes, packs = held
            block = builtins.max(_BLOCK, lanes)
            expression = f"{NAMESPACE}softmax_rows_held<{x.dtype.ctype}, {compute_ctype(x.dtype)}, {packs}>"
            held_kernel = kernels.kernel(expression, _SOFTMAX_PARAMS)
            held_kernel(x.device_ptr, out.device_ptr, rows, count, lanes, int(log), layout,
                        grid=-(-rows // (block // lanes)), block=block)  # fmt: skip
            return out
        lanes = _pow2_between(-(-count // (8 * width)), 4, _BLOCK)  # about 8 packs per thread
        kernels.kernel(rows_expr, _SOFTMAX_PARAMS)(x.device_ptr, out.device_ptr, rows, count, lanes, int(log), layout,
                                                   grid=-(-rows // (_BLOCK // lanes)), block=_BLOCK)  # fmt: skip
        return out
    # Statistics per row by the reduction kernels (one or two passes), then an elementwise pass.
    stats = empty(rows * _LSE.acc_bytes(x.dtype), uint8)
    _launch_reduce(_LSE, x, (ax,), stats, _ACCUMULATOR_CODE, 0)
    stats_strides = list(contiguous_strides([x._shape[a] for a in kept]))
    for_axes = [*stats_strides[:ax], 0, *stats_strides[ax:]]
    layout_bytes = pack_layout(x.shape, [out_strides, x._strides, for_axes])
    kernels.kernel(apply_expr, _APPLY_PARAMS)(out.device_ptr, x.device_ptr, stats.device_ptr, out.size, layout_bytes,
                                              int(log), grid=grid_for(out.size), block=_BLOCK)  # fmt: skip
    return out


def softmax(x: GPUArray, axis: int = -1) -> GPUArray:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``; floating dtypes only (computed in float32
    for fp16/bf16/fp8, float64 for float64). Deterministic."""
    return _softmax("softmax", x, axis, False)


def log_softmax(x: GPUArray, axis: int = -1) -> GPUArray:
    """``x - max - log(sum(exp(x - max)))`` along ``axis``; floating dtypes only."""
    return _softmax("log_softmax", x, axis, True)


# -- compile-check enumeration ----------------------------------------------------------------------
def _enumerate() -> Groups:
    reduce_groups: list[tuple[str, ...]] = [reducer.expressions(d) for reducer in _REDUCERS for d in all_dtypes()]
    reduce_groups += [_LSE.expressions(dtype) for dtype in _FLOAT_DTYPES]
    return {
        _REDUCE_FILE: reduce_groups,
        _SCAN_FILE: [(_scan_expression(_sum_accumulator(d)),) for d in all_dtypes()],
        _SOFTMAX_FILE: [_softmax_expressions(d) for d in _FLOAT_DTYPES],
    }


register_enumerator(_enumerate)
