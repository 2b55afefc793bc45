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

Launches are planned once per call shape (dtype, shape, strides, axes and options): the kernels, grids,
chunking and packed layout structs (KernelStructs checked against reduction/*.cu) are kept in a
:class:`~pygpukit.core.plans.PlanCache`, so a repeated call is one lookup and its launches. The module
is over 600 lines because the reductions, cumsum and softmax share that launch machinery (softmax
along a strided axis is a reduction followed by an elementwise pass, cumsum of long rows a reduction
followed by two scans).
"""

from __future__ import annotations

import builtins
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core import backend as _backend
from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, allocate, empty, full
from pygpukit.core.codes import enum_values
from pygpukit.core.device import get_device_info
from pygpukit.core.dtypes import DType, all_dtypes, bool_, float32, float64, int64, uint8, uint64
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from . import _cpu, _route
from ._kernels import (
    NAMESPACE,
    Groups,
    code_param,
    completion_counters,
    grid_for,
    group,
    launch,
    pointer,
    register_enumerator,
    size_param,
)
from ._layout import (
    LAYOUT,
    MAX_DIMS,
    check_devices,
    collapse,
    contiguous_strides,
    dtype_code,
    is_cuda,
    normalize_axes,
    pack_layout,
)
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
_MAX_DIMS = MAX_DIMS  # kMaxDims of common/layout.cuh
_DIMS = f"long long[{_MAX_DIMS}]"
# The layout structs of the kernels, declared once (the kernel compile check asserts them).
_REDUCE_LAYOUT = KernelStruct(f"{NAMESPACE}ReduceLayout", _REDUCE_FILE, [
    ("outer_ndim", "int"), ("inner_ndim", "int"), ("outer_shape", _DIMS), ("outer_strides", _DIMS),
    ("inner_shape", _DIMS), ("inner_strides", _DIMS),
])  # fmt: skip
_SCAN_LAYOUT = KernelStruct(f"{NAMESPACE}ScanLayout", _SCAN_FILE, [
    ("outer_ndim", "int"), ("outer_shape", _DIMS), ("in_outer_strides", _DIMS), ("out_outer_strides", _DIMS),
    ("in_stride", "long long"), ("out_stride", "long long"),
])  # fmt: skip
_SOFTMAX_LAYOUT = KernelStruct(f"{NAMESPACE}SoftmaxLayout", _SOFTMAX_FILE, [
    ("outer_ndim", "int"), ("outer_shape", _DIMS), ("in_outer_strides", _DIMS), ("out_outer_strides", _DIMS),
])  # fmt: skip
_BLOCK = 256
# Blocks of a split reduction over rows. Fixed, so results are the same on every GPU. (An H100 or H200
# holds 1056 blocks of 256 threads at 32 registers, but NVRTC 13.5 gives reduce_rows<SumR<float>, float>
# 48 for sm_90: 5 blocks an SM, 660 at once, so the 1024 run in about 1.6 waves.)
_SPLIT_BLOCKS = 1024
_MODES = enum_values("ReduceMode")  # common/codes.cuh
_ACCUMULATOR_CODE = enum_values("ReduceOut")["kReduceOutAccumulator"]  # out_code: store the accumulator
_PLANS: PlanCache[Any] = PlanCache("ops.reduction")
# By the caller's own arguments (before any normalisation), what a repeated call needs: the result's
# shape and dtype and the plan (reductions), or the plan (softmax). Filled only on the CUDA backend.
_CALLS: PlanCache[Any] = PlanCache("ops.reduction.calls")
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


_SUM = _Reducer("sum", "SumR", _MODES["kReduceSum"], _sum_accumulator, _sum_dtype, "sum", True)
_MEAN = _Reducer("mean", "SumR", _MODES["kReduceMean"], _mean_accumulator, _mean_dtype, "mean", True)
_PROD = _Reducer("prod", "ProdR", 0, _sum_accumulator, _sum_dtype, "prod", False)  # ProdR has one form
_MAX = _Reducer("max", "ExtremeR", _MODES["kReduceMax"], _order_accumulator, _same, "max", True)
_MIN = _Reducer("min", "ExtremeR", _MODES["kReduceMin"], _order_accumulator, _same, "min", True)
_ARGMAX = _Reducer("argmax", "ArgR", _MODES["kReduceArgmax"], _order_accumulator, _int64, "argmax", True)
_ARGMIN = _Reducer("argmin", "ArgR", _MODES["kReduceArgmin"], _order_accumulator, _int64, "argmin", True)
_ANY = _Reducer("any", "TruthR", _MODES["kReduceAny"], _truth, _bool, "any", False)
_ALL = _Reducer("all", "TruthR", _MODES["kReduceAll"], _truth, _bool, "all", False)
_VAR = _Reducer("var", "VarianceR", _MODES["kReduceVar"], _mean_accumulator, _mean_dtype, "var", False)
_STD = _Reducer("std", "VarianceR", _MODES["kReduceStd"], _mean_accumulator, _mean_dtype, "std", False)
_LSE = _Reducer("softmax", "LogSumExpR", _MODES["kReduceLogSumExp"], compute_ctype, _same, "", True)
_REDUCERS = (_SUM, _MEAN, _PROD, _MAX, _MIN, _ARGMAX, _ARGMIN, _ANY, _ALL, _VAR, _STD)

_ROWS_PARAMS = [pointer("x"), code_param("x_code"), pointer("out"), code_param("out_code"), size_param("rows"),
                size_param("count"), size_param("chunk"), code_param("lanes"), size_param("total"),
                size_param("ddof"), code_param("mode"), _REDUCE_LAYOUT.param("layout"), pointer("partial"),
                pointer("counters")]  # fmt: skip
_COLS_PARAMS = [pointer("x"), code_param("x_code"), pointer("out"), code_param("out_code"), size_param("rows"),
                size_param("count"), size_param("chunk"), size_param("total"), size_param("ddof"), code_param("mode"),
                _REDUCE_LAYOUT.param("layout")]  # fmt: skip

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


def _check_dims(dims: Sequence[int]) -> None:
    if len(dims) > _MAX_DIMS:
        raise ShapeError(f"reductions support up to {_MAX_DIMS} dimensions that cannot be merged, got {len(dims)}")


def _reduce_layout(outer: tuple[list[int], list[int]], inner: tuple[list[int], list[int]]) -> bytes:
    _check_dims(outer[0])
    _check_dims(inner[0])
    return _REDUCE_LAYOUT.pack(len(outer[0]), len(inner[0]), *outer, *inner)


def _split(x: GPUArray, axes: tuple[int, ...]) -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]:
    """(kept dims, reduced dims) of ``x``, each as collapsed (shape, element strides) in C order."""
    kept = [a for a in range(x.ndim) if a not in axes]
    dims_out, (strides_out,) = collapse([x._shape[a] for a in kept], [[x._strides[a] for a in kept]])
    dims_in, (strides_in,) = collapse([x._shape[a] for a in axes], [[x._strides[a] for a in axes]])
    return (dims_out, strides_out), (dims_in, strides_in)


class _ReducePlan:
    """The launches of one reduction for one call shape (:func:`_plan_reduce`): ``kind`` is "rows"
    (reduce_rows, split rows finished by their last block or, without counters, by a second pass),
    "packed" or "cols" (one pass, then a second over the partials when split). ``args`` are the
    kernel's arguments after the input and output pointers, without the partial/counters pointers."""

    __slots__ = ("args", "block", "chunks", "finish", "finish_args", "finish_grid", "grid", "kernel", "kind",
                 "partial_bytes")  # fmt: skip

    def __init__(self, kind: str, kernel: JITKernel, args: tuple[Any, ...], grid: tuple[int, int],
                 block: int | tuple[int, int], chunks: int, partial_bytes: int, finish: JITKernel,
                 finish_args: tuple[Any, ...], finish_grid: int) -> None:  # fmt: skip
        self.kind = kind
        self.kernel = kernel
        self.args = args
        self.grid = grid
        self.block = block
        self.chunks = chunks
        self.partial_bytes = partial_bytes
        self.finish = finish
        self.finish_args = finish_args
        self.finish_grid = finish_grid

    def run(self, x: GPUArray, out: GPUArray) -> None:
        x_ptr, out_ptr = x.device_ptr, out.device_ptr
        if self.kind == "rows":
            if self.chunks == 1:
                launch(self.kernel, (x_ptr, self.args[0], out_ptr, *self.args[1:], 0, 0), self.grid, self.block)
                return
            partial = empty(self.partial_bytes, uint8)
            counters = completion_counters(x._buffer.device, None, in_capture=False)
            self.kernel(x_ptr, self.args[0], out_ptr, *self.args[1:], partial.device_ptr,
                        0 if counters is None else counters.device_ptr, grid=self.grid, block=self.block)  # fmt: skip
            if counters is None:  # a capture before the stream had counters: a second pass finishes
                self._finish(partial, out_ptr)
            return
        target = None if self.chunks == 1 else empty(self.partial_bytes, uint8)
        target_ptr = out_ptr if target is None else target.device_ptr
        if self.kind == "packed":
            self.kernel(x_ptr, target_ptr, *self.args, grid=self.grid, block=self.block)
        else:
            self.kernel(x_ptr, self.args[0], target_ptr, *self.args[1:], grid=self.grid, block=self.block)
        if target is not None:
            self._finish(target, out_ptr)

    def _finish(self, partial: GPUArray, out_ptr: int) -> None:
        """The second pass over split rows: fold each row's accumulators in ``partial`` into ``out``."""
        self.finish(partial.device_ptr, 0, out_ptr, *self.finish_args, 0, 0, grid=self.finish_grid, block=_BLOCK)


def _finish_args(reducer: _Reducer, out_code: int, rows: int, chunks: int, lanes: int, count: int,
                 ddof: int) -> tuple[Any, ...]:  # fmt: skip
    """reduce_rows<R, Partial>'s arguments after out: with lanes = _BLOCK it folds each row's
    ``chunks`` partials in the order of reduce_rows' own last-block finish."""
    layout = _reduce_layout(([rows], [chunks]), ([chunks], [1]))
    return (out_code, rows, chunks, chunks, lanes, count, ddof, reducer.mode, layout)


def _plan_reduce(reducer: _Reducer, x: GPUArray, axes: tuple[int, ...], out_code: int, ddof: int) -> _ReducePlan:
    """How to run ``reducer`` over ``axes`` of ``x`` into a contiguous output (rows in C order of the
    kept axes), in one pass or two. ``out_code`` is the dtype code of the output, or the accumulator
    code."""
    dtype = x.dtype
    outer, inner = _split(x, axes)
    rows = math.prod(outer[0])
    count = math.prod(inner[0])
    expressions = reducer.expressions(dtype)
    rows_kernel, partial_kernel, cols_kernel = expressions[:3]
    kernels = group(_REDUCE_FILE, expressions)
    finish = kernels.kernel(partial_kernel, _ROWS_PARAMS)
    layout = _reduce_layout(outer, inner)
    code = dtype_code(dtype)
    acc_bytes = reducer.acc_bytes(dtype)
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
        # Split: one row per block, the row's blocks sweeping it together (chunk 0); the last block of a
        # row finishes it (reduce.cu).
        return _ReducePlan("rows", kernels.kernel(rows_kernel, _ROWS_PARAMS),
                           (code, out_code, rows, count, 0 if chunks > 1 else chunk, lanes, count, ddof, reducer.mode,
                            layout),
                           (row_blocks, chunks), _BLOCK, chunks, rows * chunks * acc_bytes, finish,
                           _finish_args(reducer, out_code, rows, chunks, _BLOCK, count, ddof),
                           rows)  # fmt: skip
    packed = _packed_columns(expressions, x, outer, inner)
    width = 16 // dtype.itemsize if packed else 1
    col_blocks = -(-rows // (32 * width))
    chunks = 1
    if col_blocks < 1024:
        chunks = builtins.max(1, builtins.min(_ceil(count, 64), _ceil(2048, col_blocks), 4096))
    chunk = _ceil(_ceil(count, chunks), 8) * 8
    chunks = _ceil(count, chunk)
    lanes = _pow2_between(-(-chunks // 4), 4, _BLOCK)
    finish_args = _finish_args(reducer, out_code, rows, chunks, lanes, count, ddof)
    finish_grid = -(-rows // (_BLOCK // lanes))
    if packed:
        return _ReducePlan("packed", kernels.kernel(expressions[3], _PACKED_COLS_PARAMS),
                           (out_code, rows, count, chunk, count, ddof, reducer.mode, inner[1][0]), (col_blocks, chunks),
                           (32, 8), chunks, rows * chunks * acc_bytes, finish, finish_args, finish_grid)  # fmt: skip
    return _ReducePlan("cols", kernels.kernel(cols_kernel, _COLS_PARAMS),
                       (code, out_code, rows, count, chunk, count, ddof, reducer.mode, layout), (col_blocks, chunks),
                       (32, 8), chunks, rows * chunks * acc_bytes, finish, finish_args, finish_grid)  # fmt: skip


def _launch_reduce(
    reducer: _Reducer,
    x: GPUArray,
    axes: tuple[int, ...],
    out: GPUArray,
    out_code: int,
    ddof: int,
) -> _ReducePlan:
    """Run ``reducer`` over ``axes`` of ``x`` into the contiguous ``out``: one plan lookup (per call
    shape, input alignment and the split setting) and its launches. Returns the plan."""
    key = (reducer.name, x._dtype, x._shape, x._strides, axes, out_code, ddof, x.device_ptr % 16 == 0, _SPLIT_BLOCKS)
    plan: _ReducePlan | None = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, _plan_reduce(reducer, x, axes, out_code, ddof))
    plan.run(x, out)
    return plan


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
    # A repeated call (same array layout, axis and options) is one lookup, an allocation and the launches.
    state = _backend._state
    if type(x) is GPUArray and (axis is None or type(axis) is int) and state is not None and state.name == "cuda":
        key = (reducer, x._dtype, x._shape, x._strides, axis, bool(keepdims), ddof, x._buffer.device,
               x.device_ptr % 16 == 0, _SPLIT_BLOCKS)  # fmt: skip
        known = _CALLS.get(key)
        if known is not None:
            out = allocate(known[0], known[1])
            known[2].run(x, out)
            return out
    else:
        key = None
    return _reduce_general(reducer, x, axis, keepdims, ddof, key)


def _reduce_general(reducer: _Reducer, x: Any, axis: Any, keepdims: bool, ddof: int, key: Any) -> GPUArray:
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
    plan = _launch_reduce(reducer, x, axes, out, dtype_code(result_dtype), ddof)
    if key is not None:
        _CALLS.put(key, (shape, result_dtype, plan))
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
    return _reduce(_VAR, x, axis, keepdims, _check_ddof("var", ddof))


def std(x: GPUArray, axis: Any = None, ddof: int = 0, keepdims: bool = False) -> GPUArray:
    """Standard deviation: the square root of :func:`var`."""
    return _reduce(_STD, x, axis, keepdims, _check_ddof("std", ddof))


def _check_ddof(name: str, ddof: Any) -> int:
    if not isinstance(ddof, (int, np.integer)) or isinstance(ddof, bool) or ddof < 0:
        raise ArgumentError(f"{name}: ddof must be a non-negative integer, got {ddof!r}")
    return int(ddof)


# -- cumsum -----------------------------------------------------------------------------------------
def _scan_expression(accumulator: str) -> str:
    return f"{NAMESPACE}scan_rows<{accumulator}>"


_SCAN_PARAMS = [pointer("x"), code_param("x_code"), pointer("out"), code_param("out_code"), size_param("rows"),
                size_param("count"), size_param("chunk"), pointer("carry"), code_param("exclusive"),
                _SCAN_LAYOUT.param("layout")]  # fmt: skip
_ACCUMULATOR_DTYPES = {"float": float32, "double": float64, "long long": int64, "unsigned long long": uint64}
_SCAN_CHUNK = 8192


def _scan_layout(outer: Sequence[int], in_outer: Sequence[int], out_outer: Sequence[int], in_stride: int,
                 out_stride: int) -> bytes:  # fmt: skip
    _check_dims(outer)
    return _SCAN_LAYOUT.pack(len(outer), outer, in_outer, out_outer, in_stride, out_stride)


class _ScanPlan:
    """The launches of one cumsum call shape: scan_rows over ``chunks`` chunks per row; with more than
    one, first reduce_rows sums every chunk into ``totals`` and scan_rows scans those exclusively into
    the chunks' carries."""

    __slots__ = ("acc_dtype", "args", "block", "carry_args", "carry_block", "chunks", "grid", "kernel", "shape",
                 "sum_args", "sum_grid", "sum_kernel")  # fmt: skip

    def __init__(self, kernel: JITKernel, args: tuple[Any, ...], grid: tuple[int, int], block: int) -> None:
        self.kernel = kernel
        self.args = args  # x_code, out_code, rows, count, chunk; then carry, exclusive = 0, layout
        self.grid = grid
        self.block = block
        self.chunks = grid[1]
        self.sum_kernel: JITKernel | None = None
        self.sum_args: tuple[Any, ...] = ()
        self.sum_grid = (0, 0)
        self.carry_args: tuple[Any, ...] = ()
        self.carry_block = 0
        self.acc_dtype = int64
        self.shape = (0, 0)

    def run(self, x: GPUArray, out: GPUArray) -> None:
        x_ptr = x.device_ptr
        carry = 0
        if self.sum_kernel is not None:
            # Sum each chunk, scan those sums exclusively per row, then scan the chunks from them.
            totals = empty(self.shape, self.acc_dtype)
            self.sum_kernel(x_ptr, self.args[0], totals.device_ptr, *self.sum_args, totals.device_ptr, 0,
                            grid=self.sum_grid, block=_BLOCK)  # fmt: skip
            carries = empty(self.shape, self.acc_dtype)
            code, rows, chunks, layout = self.carry_args
            self.kernel(totals.device_ptr, code, carries.device_ptr, code, rows, chunks, chunks, 0, 1, layout,
                        grid=(rows, 1), block=self.carry_block)  # fmt: skip
            carry = carries.device_ptr
        code, out_code, rows, count, chunk, layout = self.args
        self.kernel(x_ptr, code, out.device_ptr, out_code, rows, count, chunk, carry, 0, layout, grid=self.grid,
                    block=self.block)  # fmt: skip


def _plan_scan(x: GPUArray, ax: int, result_dtype: DType, accumulator: str) -> _ScanPlan:
    kept = [a for a in range(x.ndim) if a != ax]
    out_strides = contiguous_strides(x.shape)
    dims, (in_outer, out_outer) = collapse([x._shape[a] for a in kept],
                                           [[x._strides[a] for a in kept], [out_strides[a] for a in kept]])  # fmt: skip
    rows, count = math.prod(dims), x._shape[ax]
    layout = _scan_layout(dims, in_outer, out_outer, x._strides[ax], out_strides[ax])
    scan = _scan_expression(accumulator)
    kernel = group(_SCAN_FILE, [scan]).kernel(scan, _SCAN_PARAMS)
    block = _pow2_between(-(-count // 4), 32, _BLOCK)
    chunks = -(-count // _SCAN_CHUNK) if rows < 1024 else 1
    chunk = -(-count // chunks) if chunks == 1 else _SCAN_CHUNK
    chunks = -(-count // chunk)
    code = dtype_code(x.dtype)
    plan = _ScanPlan(kernel, (code, dtype_code(result_dtype), rows, count, chunk, layout), (rows, chunks), block)
    if chunks > 1:
        plan.acc_dtype = _ACCUMULATOR_DTYPES[accumulator]
        plan.shape = (rows, chunks)
        sum_expressions = _SUM.expressions(x.dtype)
        plan.sum_kernel = group(_REDUCE_FILE, sum_expressions).kernel(sum_expressions[0], _ROWS_PARAMS)
        inner = ([count], [x._strides[ax]])
        width = 16 // x.dtype.itemsize if x._strides[ax] == 1 and x.dtype.is_floating else 1
        lanes = _pow2_between(-(-chunk // (4 * width)), 4, _BLOCK)
        plan.sum_args = (_ACCUMULATOR_CODE, rows, count, chunk, lanes, count, 0, _SUM.mode,
                         _reduce_layout((dims, in_outer), inner))  # fmt: skip
        plan.sum_grid = (-(-rows // (_BLOCK // lanes)), chunks)
        plan.carry_args = (dtype_code(plan.acc_dtype), rows, chunks, _scan_layout([rows], [chunks], [chunks], 1, 1))
        plan.carry_block = _pow2_between(-(-chunks // 4), 32, _BLOCK)
    return plan


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
    key = ("cumsum", x._dtype, x._shape, x._strides, ax)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, _plan_scan(x, ax, result_dtype, accumulator))
    plan.run(x, out)
    return out


def _copy_convert(out: GPUArray, x: GPUArray) -> GPUArray:
    from .elementwise import copy_into

    copy_into(out, x)
    return out


# -- softmax ----------------------------------------------------------------------------------------
_SOFTMAX_PARAMS = [pointer("x"), pointer("out"), size_param("rows"), size_param("count"), code_param("lanes"),
                   code_param("log"), _SOFTMAX_LAYOUT.param("layout")]  # fmt: skip
_APPLY_PARAMS = [pointer("out"), pointer("x"), pointer("stats"), size_param("n"), LAYOUT.param("layout"),
                 code_param("log")]  # fmt: skip


_HELD_PACKS = (1, 2, 4, 8)  # softmax_rows_held's P: 16-byte packs of its row each thread holds
_HELD_VALUES = 32  # at most this many values held per thread (P * elements per pack): registers
_HELD_LANES = 256  # threads per row at most: one block of softmax_rows_held (its launch bounds)
# softmax_rows_shared: rows of up to _SHARED_ROW_BYTES (and the device's opt-in shared memory per
# block) kept in shared memory, one per block of a power of two of threads aiming at _SHARED_PACKS
# 16-byte packs each (32768 bf16: 512 threads, 64 KiB, three blocks on an H100 SM). Plans made before
# a change of these keep theirs until clear_plan_caches().
_SHARED_ROW_BYTES = 128 * 1024
_SHARED_PACKS = 8
_SHARED_LANES = (128, 512)  # threads per row: at least, at most (its launch bounds)


def _softmax_expressions(dtype: DType) -> tuple[str, ...]:
    ctype = compute_ctype(dtype)
    width = 16 // dtype.itemsize
    held = [
        f"{NAMESPACE}softmax_rows_held<{dtype.ctype}, {ctype}, {p}>" for p in _HELD_PACKS if p * width <= _HELD_VALUES
    ]
    return (f"{NAMESPACE}softmax_rows<{dtype.ctype}, {ctype}>",
            f"{NAMESPACE}softmax_apply<{dtype.ctype}, {ctype}>", *held,
            f"{NAMESPACE}softmax_rows_shared<{dtype.ctype}, {ctype}>")  # fmt: skip


def _held_plan(count: int, width: int) -> tuple[int, int] | None:
    """(lanes, packs per thread) of softmax_rows_held for rows of ``count`` elements, or None when a
    row does not fit in the registers of one block."""
    most = builtins.max(p for p in _HELD_PACKS if p * width <= _HELD_VALUES)
    if count > _HELD_LANES * most * width:
        return None
    lanes = _pow2_between(-(-count // (most * width)), 4, _HELD_LANES)
    packs = next(p for p in _HELD_PACKS if lanes * p * width >= count)
    return lanes, packs


def _shared_plan(count: int, width: int) -> tuple[int, int] | None:
    """(lanes, dynamic shared memory bytes) of softmax_rows_shared for rows of ``count`` elements, or
    None when a row does not fit (then softmax_rows reads it twice)."""
    row_bytes = -(-count // width) * 16
    if row_bytes > builtins.min(_SHARED_ROW_BYTES, _shared_limit(thread_device())):
        return None
    lanes = _pow2_between(-(-count // (_SHARED_PACKS * width)), *_SHARED_LANES)
    return lanes, row_bytes


@functools.cache
def _shared_limit(device: int) -> int:
    """Dynamic shared memory a block of ``device`` may opt in to, less softmax_rows_shared's static
    scratch (32 doubles)."""
    return int(get_device_info(device).max_shared_memory_per_block_optin) - 256


class _SoftmaxPlan:
    """The launches of one softmax call shape: a row kernel (``stats`` None), or the statistics of
    every row by a reduction plan, then softmax_apply."""

    __slots__ = ("args", "block", "grid", "kernel", "shared_mem", "stats", "stats_bytes")

    def __init__(self, kernel: JITKernel, args: tuple[Any, ...], grid: int, block: int,
                 stats: _ReducePlan | None = None, stats_bytes: int = 0, shared_mem: int = 0) -> None:  # fmt: skip
        self.kernel = kernel
        self.args = args
        self.grid = grid
        self.block = block
        self.stats = stats
        self.stats_bytes = stats_bytes
        self.shared_mem = shared_mem

    def run(self, x: GPUArray, out: GPUArray) -> None:
        if self.stats is None:
            launch(self.kernel, (x.device_ptr, out.device_ptr, *self.args), self.grid, self.block, self.shared_mem)
            return
        stats = empty(self.stats_bytes, uint8)
        self.stats.run(x, stats)
        self.kernel(out.device_ptr, x.device_ptr, stats.device_ptr, *self.args, grid=self.grid, block=self.block)


def _plan_softmax(x: GPUArray, out_strides: tuple[int, ...], ax: int, log: bool) -> _SoftmaxPlan:
    kept = [a for a in range(x.ndim) if a != ax]
    rows, count = math.prod(x._shape[a] for a in kept), x._shape[ax]
    expressions = _softmax_expressions(x.dtype)
    rows_expr, apply_expr = expressions[:2]
    kernels = group(_SOFTMAX_FILE, expressions)
    rows_along_axis = (x._strides[ax] == 1 and out_strides[ax] == 1) or count == 1
    if rows_along_axis and (rows >= 256 or count <= 16384):
        kept_strides = [[x._strides[a] for a in kept], [out_strides[a] for a in kept]]
        dims, (in_outer, out_outer) = collapse([x._shape[a] for a in kept], kept_strides)
        _check_dims(dims)
        layout = _SOFTMAX_LAYOUT.pack(len(dims), dims, in_outer, out_outer)
        width = 16 // x.dtype.itemsize
        held = _held_plan(count, width)
        if held is not None:
            lanes, packs = held
            block = builtins.max(_BLOCK, lanes)
            expression = f"{NAMESPACE}softmax_rows_held<{x.dtype.ctype}, {compute_ctype(x.dtype)}, {packs}>"
            return _SoftmaxPlan(kernels.kernel(expression, _SOFTMAX_PARAMS), (rows, count, lanes, int(log), layout),
                                -(-rows // (block // lanes)), block)  # fmt: skip
        shared = _shared_plan(count, width)
        if shared is not None:  # one row per block
            lanes, row_bytes = shared
            kernel = kernels.kernel(f"{NAMESPACE}softmax_rows_shared<{x.dtype.ctype}, {compute_ctype(x.dtype)}>",
                                    _SOFTMAX_PARAMS)  # fmt: skip
            if row_bytes > 48 * 1024:
                # On the current device (in the plan's key); always the same allowance, so that plans of
                # other row lengths sharing this kernel keep theirs.
                kernel.set_max_dynamic_shared_memory(builtins.min(_SHARED_ROW_BYTES, _shared_limit(thread_device())))
            return _SoftmaxPlan(kernel, (rows, count, lanes, int(log), layout), rows, lanes, shared_mem=row_bytes)
        lanes = _pow2_between(-(-count // (8 * width)), 4, _BLOCK)  # about 8 packs per thread
        return _SoftmaxPlan(kernels.kernel(rows_expr, _SOFTMAX_PARAMS), (rows, count, lanes, int(log), layout),
                            -(-rows // (_BLOCK // lanes)), _BLOCK)  # fmt: skip
    # Statistics per row by the reduction kernels (one or two passes), then an elementwise pass.
    stats = _plan_reduce(_LSE, x, (ax,), _ACCUMULATOR_CODE, 0)
    stats_strides = list(contiguous_strides([x._shape[a] for a in kept]))
    for_axes = [*stats_strides[:ax], 0, *stats_strides[ax:]]
    layout_bytes = pack_layout(x.shape, [out_strides, x._strides, for_axes])
    size = math.prod(x._shape)
    return _SoftmaxPlan(kernels.kernel(apply_expr, _APPLY_PARAMS), (size, layout_bytes, int(log)), grid_for(size),
                        _BLOCK, stats, rows * _LSE.acc_bytes(x.dtype))  # fmt: skip


def _softmax(name: str, x: Any, axis: int, log: bool) -> GPUArray:
    state = _backend._state
    if type(x) is GPUArray and type(axis) is int and state is not None and state.name == "cuda":
        # A repeated call: the plan by the caller's own axis value, then one allocation and the launch.
        call = (x._dtype, x._shape, x._strides, axis, log, x._buffer.device, x.device_ptr % 16 == 0, _SPLIT_BLOCKS)
        plan = _CALLS.get(call)
        if plan is not None:
            out = allocate(x._shape, x._dtype)
            plan.run(x, out)
            return out
    else:
        call = None
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
    # The input's alignment picks reduce_cols_packed for the statistics of some strided layouts.
    # The device: a plan may allow its kernel more shared memory there (softmax_rows_shared).
    key = ("softmax", x._dtype, x._shape, x._strides, ax, log, x.device_ptr % 16 == 0, _SPLIT_BLOCKS, x._buffer.device)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, _plan_softmax(x, out._strides, ax, log))
    plan.run(x, out)
    if call is not None:
        _CALLS.put(call, plan)
    return out


def softmax(x: GPUArray, axis: int = -1) -> GPUArray:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``; floating dtypes only (computed in float32
    for fp16/bf16/fp8, float64 for float64). Deterministic."""
    if (
        _route.hook is not None
        and (routed := _route.hook("softmax", (x,), {"axis": axis, "out": None})) is not _route.BUILTIN
    ):
        return routed  # type: ignore[no-any-return]
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
