"""Transformer and signal building blocks: normalisations, gated activations, embedding gathers and
conv1d, for float32, float16 and bfloat16 with float32 arithmetic (one rounding at the store).

Every op takes ``out=`` (and add_rmsnorm ``residual_out=``): given, nothing is allocated, no value
travels to the host and the op is a fixed sequence of kernel launches on the current stream, so it can
be captured in a :class:`pygpukit.CudaGraph`. Results are deterministic (no atomics; each sum is folded
in an order fixed by the shape). Kernels: native/kernels/nn/{norm,gated,embedding,conv1d}.cu.

Layouts: row ops (the norms, the gated activations, embedding outputs) need unit stride along the last
axis and leading axes that merge into one row stride (contiguous arrays, row slices, column slices such
as ``x[..., :k]``); other layouts raise :class:`ShapeError` (call ``.contiguous()`` first). conv1d
reads and writes any strides. An output may be the very same view as an input of a row op (in place);
any other overlap between an output and an input raises :class:`ArgumentError`.
"""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core import backend as _backend
from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType, bfloat16, float16, float32, int32, int64
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.memory import DeviceBuffer
from pygpukit.core.stream import thread_device

from . import _cpu
from ._kernels import (
    BLOCK,
    NAMESPACE,
    Groups,
    c_param,
    grid_for,
    group,
    layout_param,
    pointer,
    register_enumerator,
    size_param,
)
from ._layout import check_devices, collapse, is_cuda, pack_layout, same_view

__all__ = [
    "add_rmsnorm",
    "conv1d",
    "embedding",
    "gather_last",
    "geglu",
    "group_norm",
    "l2norm",
    "layernorm",
    "position_ids",
    "relu2",
    "rmsnorm",
    "swiglu",
]

_NORM_FILE = "nn/norm.cu"
_GATED_FILE = "nn/gated.cu"
_EMBEDDING_FILE = "nn/embedding.cu"
_CONV_FILE = "nn/conv1d.cu"
_FLOATS = (float32, float16, bfloat16)
_INDEX_DTYPES = (int32, int64)
Array = np.ndarray[Any, Any]


# -- argument checks --------------------------------------------------------------------------------
def _array(name: str, what: str, value: Any) -> GPUArray:
    if not isinstance(value, GPUArray):
        raise DTypeError(f"{name}: {what} must be a GPUArray, got {type(value).__name__}")
    return value


def _float_input(name: str, what: str, value: Any) -> GPUArray:
    array = _array(name, what, value)
    if array.dtype not in _FLOATS:
        raise DTypeError(f"{name}: {what} must be float32, float16 or bfloat16, got {array.dtype}")
    return array


def _index_input(name: str, what: str, value: Any) -> GPUArray:
    array = _array(name, what, value)
    if array.dtype not in _INDEX_DTYPES:
        raise DTypeError(f"{name}: {what} must be int32 or int64, got {array.dtype}")
    return array


def _same_dtype(name: str, what: str, value: GPUArray, dtype: DType) -> None:
    if value.dtype != dtype:
        raise DTypeError(f"{name}: {what} has dtype {value.dtype} but must be {dtype}")


def _vector_param(name: str, what: str, value: Any, size: int, dtypes: Sequence[DType]) -> GPUArray | None:
    """An optional 1-D per-feature parameter (weight, bias) of ``size`` elements and one of ``dtypes``."""
    if value is None:
        return None
    array = _array(name, what, value)
    if array.shape != (size,):
        raise ShapeError(f"{name}: {what} must have shape ({size},), got {array.shape}")
    if array.dtype not in dtypes:
        listed = " or ".join(str(d) for d in dict.fromkeys(dtypes))
        raise DTypeError(f"{name}: {what} must be {listed}, got {array.dtype}")
    if size > 1 and array._strides[0] != 1:
        raise ShapeError(f"{name}: {what} must be contiguous, got strides {array.strides}")
    return array


def _eps(name: str, eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps < 0:
        raise ArgumentError(f"{name}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _positive(name: str, what: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ArgumentError(f"{name}: {what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _rows(name: str, what: str, a: GPUArray) -> tuple[int, int]:
    """(rows, row stride in elements) of ``a`` seen as a rows x last-axis matrix; ShapeError when the
    last axis is strided or the leading axes do not merge into one stride."""
    if a.ndim == 0:
        raise ShapeError(f"{name}: {what} needs at least one dimension, got a 0-d array")
    last = a._shape[-1]
    if last > 1 and a._strides[-1] != 1:
        raise ShapeError(f"{name}: {what} needs unit stride along its last axis, got shape {a.shape} and strides "
                         f"{a.strides} (bytes); call .contiguous() first")  # fmt: skip
    if a.size == 0:
        return math.prod(a._shape[:-1]), max(last, 1)
    dims, (strides,) = collapse(a._shape[:-1], [a._strides[:-1]])
    if len(dims) > 1:
        raise ShapeError(f"{name}: the leading axes of {what} (shape {a.shape}, strides {a.strides} bytes) do not "
                         "merge into one row stride; call .contiguous() first")  # fmt: skip
    if not dims:
        return 1, max(last, 1)
    return dims[0], strides[0]


def _output(name: str, what: str, out: Any, shape: tuple[int, ...], dtype: DType) -> GPUArray:
    if out is None:
        return empty(shape, dtype)
    array = _array(name, what, out)
    if array.shape != shape:
        raise ShapeError(f"{name}: {what} has shape {array.shape} but the result has shape {shape}")
    if array.dtype != dtype:
        raise DTypeError(f"{name}: {what} has dtype {array.dtype} but the result is {dtype}")
    return array


def _extent(a: GPUArray) -> tuple[int, int]:
    """[first, last] element offsets ``a`` touches in its allocation."""
    low = high = a._offset
    for size, stride in zip(a._shape, a._strides, strict=True):
        if size > 1:
            if stride > 0:
                high += (size - 1) * stride
            else:
                low += (size - 1) * stride
    return low * a.itemsize, (high + 1) * a.itemsize - 1


def _check_overlap(name: str, outputs: Sequence[tuple[str, GPUArray]], inputs: Sequence[tuple[str, GPUArray | None]],
                   in_place: bool) -> None:  # fmt: skip
    """ArgumentError when an output shares memory with an input (or another output), except an output
    that is exactly the same view as an input when ``in_place`` is allowed."""
    for index, (out_name, out) in enumerate(outputs):
        if out.size == 0:
            continue
        others: list[tuple[str, GPUArray | None, bool]] = [(n, a, in_place) for n, a in inputs]
        others += [(n, a, False) for n, a in outputs[index + 1 :]]
        for in_name, array, allowed in others:
            if array is None or array._buffer is not out._buffer or array.size == 0:
                continue
            if allowed and same_view(array, out):
                continue
            (a0, a1), (b0, b1) = _extent(array), _extent(out)
            if a0 <= b1 and b0 <= a1:
                raise ArgumentError(
                    f"{name}: {out_name} overlaps {in_name} in memory"
                    + (" (only the very same view is allowed, for in-place use)" if allowed else "")
                )


def _aligned(a: GPUArray, stride: int, rows: int, width: int) -> bool:
    """Whether every row start of ``a`` is aligned to ``width`` elements (16 bytes for packs)."""
    return a.device_ptr % (width * a.itemsize) == 0 and (rows <= 1 or stride % width == 0)


def _pow2_at_least(value: int, low: int, high: int) -> int:
    result = low
    while result < value and result < high:
        result *= 2
    return result


# -- normalisations ---------------------------------------------------------------------------------
_NORM_ARGS = struct.Struct("@6Q7q5if")
_NORM_PACKS = (1, 2, 3, 4)  # 16-byte packs a thread of norm_rows<T, W, P, Full> holds in registers
_NORM_NARROW_PACKS = (1, 2, 3)  # fp16/bf16: at most 24 values a thread (P = 4 spills at 64 registers)
# Packs a thread holds as raw words (NormHeld of norm.cu), only for aligned rows that exactly fill a
# power-of-two group of at most 32 lanes, which none of the choices above fills (576 bf16: 8 x 9 packs).
_NORM_EXACT_PACKS = (5, 7, 9)
_NORM_MAX_LANES = 1024  # threads of a row (and of a block): kNormMaxThreads of norm.cu
_NORM_FLOATS = 16  # the values a thread should hold (at most 64 registers, no spills: occupancy >= 50%)
_RMS, _LAYER, _L2, _ADD_RMS, _GROUP = 0, 1, 2, 3, 4


def _norm_expression(dtype: DType, weight_dtype: DType, packs: int, full: bool) -> str:
    return f"{NAMESPACE}norm_rows<{dtype.ctype}, {weight_dtype.ctype}, {packs}, {'true' if full else 'false'}>"


def _norm_expressions(dtype: DType, weight_dtype: DType) -> list[str]:
    """Every norm_rows instantiation for one (dtype, weight dtype): the register kernels, then the
    streaming one."""
    choices = _NORM_PACKS if dtype.itemsize == 4 else _NORM_NARROW_PACKS
    found = [_norm_expression(dtype, weight_dtype, p, full) for p in choices for full in (True, False)]
    exact = [_norm_expression(dtype, weight_dtype, p, True) for p in _NORM_EXACT_PACKS]
    return [*found, *exact, _norm_expression(dtype, weight_dtype, 0, False)]


def _norm_plan(packs: int, width: int, choices: Sequence[int], exact: Sequence[int] = ()) -> tuple[int, int]:
    """(packs per thread, lanes) for rows of ``packs`` 16-byte packs of ``width`` elements: lanes a
    power of two up to 32 or whole warps up to _NORM_MAX_LANES. Least slots (lanes * packs per
    thread) first, so a row that can exactly fill its group does; then about _NORM_FLOATS values a
    thread; then fewer lanes. When no choice fills its group exactly, the first of ``exact`` (packs
    per thread) that does with a power of two of at most 32 lanes. (0, _NORM_MAX_LANES): too long for
    registers, the streaming kernel."""
    best: tuple[tuple[int, int, int], int, int] | None = None
    for per_thread in choices:
        need = -(-packs // per_thread)
        lanes = _pow2_at_least(need, 1, 32) if need <= 32 else -(-need // 32) * 32
        if lanes > _NORM_MAX_LANES:
            continue
        key = (per_thread * lanes, abs(per_thread * width - _NORM_FLOATS), lanes)
        if best is None or key < best[0]:
            best = (key, per_thread, lanes)
    if best is None or best[0][0] != packs:
        for per_thread in exact:
            lanes = packs // per_thread
            if lanes * per_thread == packs and 0 < lanes <= 32 and lanes & (lanes - 1) == 0:
                return per_thread, lanes
    if best is None:
        return 0, _NORM_MAX_LANES
    return best[1], best[2]


def _weight_dtypes(dtype: DType) -> tuple[DType, ...]:
    return (dtype, float32)


class _NormPlan:
    """The launch a checked norm call chose (kernel, grid, block and the NormArgs fields after the
    pointers, eps aside), kept for the calls that repeat its key (see _norm_cached)."""

    __slots__ = ("aligned", "block", "grid", "kernel", "nbytes", "state", "tail")

    def __init__(self, kernel: Any, grid: int, block: int, tail: tuple[int, ...], aligned: bool, nbytes: int) -> None:
        self.kernel = kernel
        self.grid = grid
        self.block = block
        self.tail = tail
        self.aligned = aligned
        self.nbytes = nbytes  # of a fresh output
        self.state = _backend._state


_norm_plans: dict[tuple[Any, ...], _NormPlan] = {}
_NORM_PLAN_LIMIT = 4096  # keys kept before the cache starts over


def _norm_launch(mode: int, x: GPUArray, out: GPUArray, weight: GPUArray | None, bias: GPUArray | None, eps: float,
                 rows: int, count: int, strides: Sequence[int], residual: GPUArray | None = None,
                 residual_out: GPUArray | None = None, spatial: int = 1, channels_per_group: int = 1,
                 groups: int = 1) -> _NormPlan:  # fmt: skip
    """Launch norm_rows over ``rows`` rows of ``count`` elements; ``strides``: row strides of x, residual,
    out and residual_out. Returns the launch's plan."""
    dtype = x.dtype
    width = 16 // dtype.itemsize
    packs = -(-count // width)
    weight_dtype = weight.dtype if weight is not None else (bias.dtype if bias is not None else dtype)
    operands = [(x, strides[0]), (out, strides[2])]
    if residual is not None and residual_out is not None:
        operands += [(residual, strides[1]), (residual_out, strides[3])]
    aligned = count % width == 0 and all(_aligned(a, s, rows, width) for a, s in operands)
    if mode == _GROUP:
        aligned = aligned and spatial % width == 0
    else:
        aligned = aligned and all(p.device_ptr % (width * p.itemsize) == 0 for p in (weight, bias) if p is not None)
    per_thread, lanes = _norm_plan(packs, width, _NORM_PACKS if dtype.itemsize == 4 else _NORM_NARROW_PACKS,
                                   _NORM_EXACT_PACKS if aligned else ())  # fmt: skip
    full = per_thread > 0 and aligned and per_thread * lanes == packs
    rows_per_block = BLOCK // lanes if lanes <= 32 else 1  # norm_rows: a group of whole warps is the block
    expression = _norm_expression(dtype, weight_dtype, per_thread, full)
    kernel = group(_NORM_FILE, [expression]).kernel(expression, [layout_param("args", "NormArgs")])
    tail = (rows, count, strides[0], strides[1], strides[2], strides[3], spatial, channels_per_group, groups, mode,
            lanes, int(aligned))  # fmt: skip
    plan = _NormPlan(kernel, -(-rows // rows_per_block), rows_per_block * lanes, tail, aligned, out.nbytes)
    args = _NORM_ARGS.pack(
        x.device_ptr, residual.device_ptr if residual is not None else 0,
        weight.device_ptr if weight is not None else 0, bias.device_ptr if bias is not None else 0,
        out.device_ptr, residual_out.device_ptr if residual_out is not None else 0, *tail, eps,
    )  # fmt: skip
    kernel(args, grid=plan.grid, block=plan.block)
    return plan


def _norm_meta(a: GPUArray | None, device: int) -> tuple[Any, ...] | bool | None:
    """An optional operand's part of a norm cache key; False (never a key) when it is not a plain
    GPUArray on ``device``."""
    if a is None:
        return None
    if type(a) is not GPUArray or a._buffer.device != device:
        return False
    return (a._shape, a._strides, a._dtype)


def _norm_key(mode: int, x: GPUArray, residual: GPUArray | None, weight: GPUArray | None, bias: GPUArray | None,
              out: GPUArray | None, residual_out: GPUArray | None, device: int, rows_bits: int,
              vector_bits: int) -> tuple[Any, ...]:  # fmt: skip
    """Everything a norm call's checks and plan depend on, but the addresses: of those only the low bits
    that decide the 16-byte accesses (``rows_bits``: of x, residual and the given outputs; ``vector_bits``:
    of weight and bias). ``out``/``residual_out`` None: a fresh output."""
    return (mode, x._shape, x._strides, x._dtype, device, _norm_meta(residual, device), _norm_meta(weight, device),
            _norm_meta(bias, device), _norm_meta(out, device), _norm_meta(residual_out, device), rows_bits & 15,
            vector_bits & 31)  # fmt: skip


def _output_clear(output: GPUArray, x: GPUArray, residual: GPUArray | None, weight: GPUArray | None,
                  bias: GPUArray | None) -> bool:  # fmt: skip
    """Whether the given ``output`` shares no allocation with the inputs, except being the very same view
    of x or residual (in place); otherwise the checked path decides."""
    buffer = output._buffer
    if buffer is x._buffer and not same_view(output, x):
        return False
    if residual is not None and buffer is residual._buffer and not same_view(output, residual):
        return False
    return (weight is None or buffer is not weight._buffer) and (bias is None or buffer is not bias._buffer)


def _norm_cached(mode: int, x: Any, residual: Any, weight: Any, bias: Any, eps: Any, out: Any,
                 residual_out: Any) -> tuple[GPUArray, GPUArray | None] | None:  # fmt: skip
    """The launch of a call that repeats the key of an earlier checked one (same op, shapes, strides,
    dtypes, operands present, device, alignment): only the checks that do not follow from the key run
    here (eps, the devices, the memory the outputs share with the inputs). Returns (out, residual_out),
    given or fresh; None: the call takes the checked path (first call, unusual operands, an error)."""
    if type(x) is not GPUArray or type(eps) is not float or not 0.0 <= eps < math.inf:
        return None
    for a in (residual, weight, bias, out, residual_out):
        if a is not None and type(a) is not GPUArray:
            return None
    device = x._buffer.device
    if device != thread_device():
        return None
    if out is not None and not _output_clear(out, x, residual, weight, bias):
        return None
    if residual_out is not None:
        if not _output_clear(residual_out, x, residual, weight, None):
            return None
        if out is not None and out._buffer is residual_out._buffer:
            return None
    px = x.device_ptr
    pr = residual.device_ptr if residual is not None else 0
    pw = weight.device_ptr if weight is not None else 0
    pb = bias.device_ptr if bias is not None else 0
    po = out.device_ptr if out is not None else 0
    pro = residual_out.device_ptr if residual_out is not None else 0
    plan = _norm_plans.get(_norm_key(mode, x, residual, weight, bias, out, residual_out, device,
                                     px | pr | po | pro, pw | pb))  # fmt: skip
    if plan is None or plan.state is not _backend._state:
        return None
    if out is None:
        out = GPUArray(DeviceBuffer(plan.nbytes), x._shape, x._dtype)
        po = out.device_ptr
    if residual_out is None and mode == _ADD_RMS:
        residual_out = GPUArray(DeviceBuffer(plan.nbytes), x._shape, x._dtype)
        pro = residual_out.device_ptr
    tail = plan.tail
    if plan.aligned and (po | pro) & 15:  # fresh outputs the plan cannot store by 16 bytes: plan again
        _norm_launch(mode, x, out, weight, bias, eps, tail[0], tail[1], tail[2:6], residual, residual_out)
    else:
        plan.kernel(_NORM_ARGS.pack(px, pr, pw, pb, po, pro, *tail, eps), grid=plan.grid, block=plan.block)
    return out, residual_out


def _norm_remember(plan: _NormPlan, mode: int, x: GPUArray, residual: GPUArray | None, weight: GPUArray | None,
                   bias: GPUArray | None, out: GPUArray | None, residual_out: GPUArray | None) -> None:  # fmt: skip
    """Keep ``plan`` (of a checked call that launched it) for calls with the same key (see _norm_cached);
    ``out``/``residual_out``: as the caller gave them (None: fresh)."""
    device = x._buffer.device
    bits = [0, 0]
    for a, slot in ((x, 0), (residual, 0), (out, 0), (residual_out, 0), (weight, 1), (bias, 1)):
        if a is not None:
            bits[slot] |= a.device_ptr
    key = _norm_key(mode, x, residual, weight, bias, out, residual_out, device, bits[0], bits[1])
    for meta in key[5:10]:
        if meta is False:
            return
    if len(_norm_plans) >= _NORM_PLAN_LIMIT:
        _norm_plans.clear()
    _norm_plans[key] = plan


def _host64(a: GPUArray) -> Array:
    return _cpu.host(a).astype(np.float64)


def _cpu_normalize(mode: int, values: Array, eps: float) -> Array:
    """Rows of ``values`` (float64, last axis) normalised, before the affine step."""
    with np.errstate(all="ignore"):
        if mode in (_LAYER, _GROUP):
            mean = values.mean(axis=-1, keepdims=True)
            centred = values - mean
            result: Array = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
            return result
        squares = (values * values).sum(axis=-1, keepdims=True)
        if mode == _L2:
            result = values / np.maximum(np.sqrt(squares), eps)
            return result
        result = values / np.sqrt(squares / values.shape[-1] + eps)
        return result


def _row_norm(name: str, mode: int, x: Any, weight: Any, bias: Any, eps: Any, out: Any) -> GPUArray:
    cached = _norm_cached(mode, x, None, weight, bias, eps, out, None)
    if cached is not None:
        return cached[0]
    given = out
    x = _float_input(name, "x", x)
    eps = _eps(name, eps)
    rows, x_stride = _rows(name, "x", x)
    count = x.shape[-1]
    weight = _vector_param(name, "weight", weight, count, _weight_dtypes(x.dtype))
    bias = _vector_param(name, "bias", bias, count, _weight_dtypes(x.dtype))
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise DTypeError(f"{name}: weight ({weight.dtype}) and bias ({bias.dtype}) must have the same dtype")
    result = _output(name, "out", out, x.shape, x.dtype)
    check_devices(name, [a for a in (x, weight, bias, result) if a is not None])
    _, out_stride = _rows(name, "out", result)
    _check_overlap(name, [("out", result)], [("x", x)], in_place=True)
    _check_overlap(name, [("out", result)], [("weight", weight), ("bias", bias)], in_place=False)
    if result.size == 0:
        return result
    if not is_cuda():
        values = _cpu_normalize(mode, _host64(x), eps)
        if weight is not None:
            values = values * _host64(weight)
        if bias is not None:
            values = values + _host64(bias)
        _cpu.store(result, values)
        return result
    plan = _norm_launch(mode, x, result, weight, bias, eps, rows, count, (x_stride, 0, out_stride, 0))
    _norm_remember(plan, mode, x, None, weight, bias, given, None)
    return result


def rmsnorm(x: GPUArray, weight: GPUArray | None, eps: float = 1e-6, out: GPUArray | None = None) -> GPUArray:
    """``x / sqrt(mean(x**2, axis=-1) + eps) * weight`` over the last axis (LLaMA/Qwen RMSNorm).

    ``x``: float32, float16 or bfloat16, any shape with at least one axis; ``weight``: shape
    ``(x.shape[-1],)`` of x's dtype or float32, or None (no scale). Computed in float32 and rounded
    once (Hugging Face rounds the normalised value to the dtype before scaling: within one ulp).
    """
    return _row_norm("rmsnorm", _RMS, x, weight, None, eps, out)


def layernorm(
    x: GPUArray, weight: GPUArray | None, bias: GPUArray | None = None, eps: float = 1e-5, out: GPUArray | None = None
) -> GPUArray:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance, as
    torch.nn.functional.layer_norm). ``weight`` and ``bias``: shape ``(x.shape[-1],)``, x's dtype or
    float32 (both the same), each may be None. The variance is taken from the row held in registers
    after the mean (two passes over registers, no cancellation)."""
    return _row_norm("layernorm", _LAYER, x, weight, bias, eps, out)


def l2norm(x: GPUArray, eps: float = 1e-12, out: GPUArray | None = None) -> GPUArray:
    """``x / max(sqrt(sum(x**2, axis=-1)), eps)`` over the last axis
    (torch.nn.functional.normalize with p=2, dim=-1)."""
    return _row_norm("l2norm", _L2, x, None, None, eps, out)


def add_rmsnorm(
    x: GPUArray,
    residual: GPUArray,
    weight: GPUArray | None,
    eps: float = 1e-6,
    out: GPUArray | None = None,
    residual_out: GPUArray | None = None,
) -> tuple[GPUArray, GPUArray]:
    """The residual add of a transformer layer fused with the next RMSNorm; returns
    ``(normed, new_residual)`` with ``new_residual = x + residual`` rounded to the input dtype (as
    Hugging Face models add in that dtype) and ``normed = rmsnorm(new_residual, weight, eps)``. One
    read of each input and one write of each output.

    ``x`` and ``residual``: same shape and dtype. ``residual_out`` may be ``residual`` (or ``x``)
    itself: the residual stream is then updated in place. ``out`` may be ``x``."""
    cached = _norm_cached(_ADD_RMS, x, residual, weight, None, eps, out, residual_out)
    if cached is not None and cached[1] is not None:
        return cached[0], cached[1]
    name = "add_rmsnorm"
    given, given_residual = out, residual_out
    x = _float_input(name, "x", x)
    residual = _array(name, "residual", residual)
    _same_dtype(name, "residual", residual, x.dtype)
    if residual.shape != x.shape:
        raise ShapeError(f"{name}: residual has shape {residual.shape} but x has shape {x.shape}")
    eps = _eps(name, eps)
    rows, x_stride = _rows(name, "x", x)
    _, residual_stride = _rows(name, "residual", residual)
    count = x.shape[-1]
    weight = _vector_param(name, "weight", weight, count, _weight_dtypes(x.dtype))
    result = _output(name, "out", out, x.shape, x.dtype)
    new_residual = _output(name, "residual_out", residual_out, x.shape, x.dtype)
    check_devices(name, [a for a in (x, residual, weight, result, new_residual) if a is not None])
    _, out_stride = _rows(name, "out", result)
    _, residual_out_stride = _rows(name, "residual_out", new_residual)
    outputs = [("out", result), ("residual_out", new_residual)]
    _check_overlap(name, outputs, [("x", x), ("residual", residual)], in_place=True)
    _check_overlap(name, outputs, [("weight", weight)], in_place=False)
    if result.size == 0:
        return result, new_residual
    if not is_cuda():
        with np.errstate(all="ignore"):
            summed = (_host64(x) + _host64(residual)).astype(x.dtype.numpy)
        values = _cpu_normalize(_RMS, summed.astype(np.float64), eps)
        if weight is not None:
            values = values * _host64(weight)
        _cpu.store(new_residual, summed)
        _cpu.store(result, values)
        return result, new_residual
    strides = (x_stride, residual_stride, out_stride, residual_out_stride)
    plan = _norm_launch(_ADD_RMS, x, result, weight, None, eps, rows, count, strides, residual, new_residual)
    _norm_remember(plan, _ADD_RMS, x, residual, weight, None, given, given_residual)
    return result, new_residual


def group_norm(
    x: GPUArray,
    num_groups: int,
    weight: GPUArray | None = None,
    bias: GPUArray | None = None,
    eps: float = 1e-5,
    out: GPUArray | None = None,
) -> GPUArray:
    """GroupNorm of a contiguous ``(N, C, *spatial)`` input: each sample's C channels in ``num_groups``
    groups of ``C // num_groups``, normalised over the group's channels and spatial positions, then
    ``* weight[c] + bias[c]`` (shape ``(C,)``, x's dtype or float32; each may be None), as
    torch.nn.functional.group_norm. ``num_groups`` must divide C."""
    name = "group_norm"
    x = _float_input(name, "x", x)
    if x.ndim < 2:
        raise ShapeError(f"{name}: x must have shape (N, C, *spatial), got {x.shape}")
    groups = _positive(name, "num_groups", num_groups)
    channels = x.shape[1]
    if channels % groups != 0:
        raise ShapeError(f"{name}: num_groups={groups} does not divide the {channels} channels of x {x.shape}")
    eps = _eps(name, eps)
    weight = _vector_param(name, "weight", weight, channels, _weight_dtypes(x.dtype))
    bias = _vector_param(name, "bias", bias, channels, _weight_dtypes(x.dtype))
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise DTypeError(f"{name}: weight ({weight.dtype}) and bias ({bias.dtype}) must have the same dtype")
    if not x.is_contiguous:
        raise ShapeError(f"{name}: x must be contiguous, got strides {x.strides} (bytes); call .contiguous() first")
    result = _output(name, "out", out, x.shape, x.dtype)
    if not result.is_contiguous:
        raise ShapeError(f"{name}: out must be contiguous, got strides {result.strides} (bytes)")
    check_devices(name, [a for a in (x, weight, bias, result) if a is not None])
    _check_overlap(name, [("out", result)], [("x", x)], in_place=True)
    _check_overlap(name, [("out", result)], [("weight", weight), ("bias", bias)], in_place=False)
    if result.size == 0:
        return result
    per_group = channels // groups
    spatial = math.prod(x.shape[2:])
    rows, count = x.shape[0] * groups, per_group * spatial
    if not is_cuda():
        values = _cpu_normalize(_GROUP, _host64(x).reshape(rows, count), eps).reshape(x.shape[0], channels, spatial)
        if weight is not None:
            values = values * _host64(weight)[:, None]
        if bias is not None:
            values = values + _host64(bias)[:, None]
        _cpu.store(result, values.reshape(x.shape))
        return result
    _norm_launch(_GROUP, x, result, weight, bias, eps, rows, count, (count, 0, count, 0), spatial=spatial,
                 channels_per_group=per_group, groups=groups)  # fmt: skip
    return result


# -- gated activations -------------------------------------------------------------------------------
_GATED_ARGS = struct.Struct("@3Q5q2i")
_SWIGLU, _GEGLU_ERF, _GEGLU_TANH, _RELU2 = 0, 1, 2, 3


def _gated_expression(dtype: DType) -> str:
    return f"{NAMESPACE}gated_rows<{dtype.ctype}>"


def _cpu_gated(mode: int, gate: Array, up: Array | None) -> Array:
    with np.errstate(all="ignore"):
        if mode == _RELU2:
            result: Array = np.where(gate > 0, gate * gate, np.where(np.isnan(gate), gate, 0.0))
            return result
        if mode == _SWIGLU:
            activated = gate / (1.0 + np.exp(-gate))
        elif mode == _GEGLU_ERF:
            activated = _cpu.UNARY["gelu_erf"](gate)
        else:
            activated = _cpu.UNARY["gelu_tanh"](gate)
        assert up is not None
        result = activated * up
        return result


def _gated(name: str, mode: int, gate: Any, up: Any, out: Any) -> GPUArray:
    gate = _float_input(name, "gate" if mode != _RELU2 else "x", gate)
    if mode != _RELU2 and up is None:  # one concatenated input: [gate | up] along the last axis
        if gate.ndim == 0 or gate.shape[-1] % 2:
            raise ShapeError(f"{name}: a single input needs an even last axis (gate and up halves), got {gate.shape}")
        half = gate.shape[-1] // 2
        whole = gate
        gate, up = whole[..., :half], whole[..., half:]
        inputs: list[tuple[str, GPUArray | None]] = [("x", whole)]
    elif mode != _RELU2:
        up = _array(name, "up", up)
        _same_dtype(name, "up", up, gate.dtype)
        if up.shape != gate.shape:
            raise ShapeError(f"{name}: gate has shape {gate.shape} but up has shape {up.shape}")
        inputs = [("gate", gate), ("up", up)]
    else:
        inputs = [("x", gate)]
    rows, gate_stride = _rows(name, "gate" if mode != _RELU2 else "x", gate)
    up_stride = _rows(name, "up", up)[1] if up is not None else 0
    result = _output(name, "out", out, gate.shape, gate.dtype)
    check_devices(name, [a for _, a in inputs if a is not None] + [result])
    _, out_stride = _rows(name, "out", result)
    _check_overlap(name, [("out", result)], inputs, in_place=True)
    if result.size == 0:
        return result
    if not is_cuda():
        values = _cpu_gated(mode, _host64(gate), _host64(up) if up is not None else None)
        _cpu.store(result, values)
        return result
    cols = gate.shape[-1]
    operands = [(gate, gate_stride), (result, out_stride)] + ([(up, up_stride)] if up is not None else [])
    if rows > 1 and all(stride == cols for _, stride in operands):  # packed rows: one long row
        cols, rows = cols * rows, 1
    width = 16 // gate.itemsize
    aligned = cols % width == 0 and all(_aligned(a, s, rows, width) for a, s in operands)
    expression = _gated_expression(gate.dtype)
    kernel = group(_GATED_FILE, [expression]).kernel(expression, [layout_param("args", "GatedArgs")])
    args = _GATED_ARGS.pack(gate.device_ptr, up.device_ptr if up is not None else 0, result.device_ptr, rows, cols,
                            gate_stride, up_stride, out_stride, mode, int(aligned))  # fmt: skip
    work = rows * cols // width if aligned else rows * cols
    kernel(args, grid=grid_for(work), block=BLOCK)
    return result


def swiglu(gate: GPUArray, up: GPUArray | None = None, out: GPUArray | None = None) -> GPUArray:
    """``silu(gate) * up`` (the SwiGLU MLP of LLaMA, Qwen, Mistral), fused: one read of each input.

    With ``up`` None, ``gate`` is one concatenated input whose last axis has 2*I elements: the first
    I are the gate and the last I the up projection (a fused gate_up_proj GEMM output), and the result
    has I. float32, float16, bfloat16; computed in float32."""
    return _gated("swiglu", _SWIGLU, gate, up, out)


def geglu(
    gate: GPUArray, up: GPUArray | None = None, approximate: str = "none", out: GPUArray | None = None
) -> GPUArray:
    """``gelu(gate) * up`` (GeGLU, Gemma), erf form or with ``approximate="tanh"`` the tanh form; a
    single concatenated input as for :func:`swiglu`."""
    modes = {"none": _GEGLU_ERF, "tanh": _GEGLU_TANH}
    if approximate not in modes:
        raise ArgumentError(f"geglu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _gated("geglu", modes[approximate], gate, up, out)


def relu2(x: GPUArray, out: GPUArray | None = None) -> GPUArray:
    """``relu(x) ** 2`` (squared ReLU); NaN stays NaN."""
    return _gated("relu2", _RELU2, x, None, out)


# -- embedding gathers ------------------------------------------------------------------------------
_GATHER_ARGS = struct.Struct("@4Q8q2i")
_UNIT = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


def _gather_expression(itemsize: int, index: DType) -> str:
    return f"{NAMESPACE}gather_rows<{_UNIT[itemsize]}, {index.ctype}>"


def _positions_expression(index: DType) -> str:
    return f"{NAMESPACE}position_ids<{index.ctype}>"


def _embedding_expressions() -> list[str]:
    gathers = [_gather_expression(size, index) for size in _UNIT for index in _INDEX_DTYPES]
    return gathers + [_positions_expression(index) for index in _INDEX_DTYPES]


def _error_flag(name: str, flag: Any) -> GPUArray | None:
    if flag is None:
        return None
    array = _array(name, "error_flag", flag)
    if array.dtype != int32 or array.size != 1:
        raise DTypeError(f"{name}: error_flag must be a one-element int32 array, got {array.dtype} {array.shape}")
    return array


def _gather(name: str, src: GPUArray, out: GPUArray, rows: int, hidden: int, src_outer: int, src_row: int,
            out_row: int, limit: int, ids: GPUArray | None, fixed: int, shift: int,
            error: GPUArray | None) -> None:  # fmt: skip
    itemsize = src.itemsize
    vector = (hidden * itemsize) % 16 == 0 and all(
        a.device_ptr % 16 == 0 and (s * itemsize) % 16 == 0
        for a, s in ((src, src_outer), (src, src_row), (out, out_row))
    )
    chunks = hidden * itemsize // 16 if vector else hidden
    lanes = _pow2_at_least(chunks, 1, BLOCK)
    index_dtype = ids.dtype if ids is not None else int32
    expression = _gather_expression(itemsize, index_dtype)
    kernel = group(_EMBEDDING_FILE, _embedding_expressions()).kernel(expression, [layout_param("args", "GatherArgs")])
    layout = pack_layout(ids.shape, [ids._strides]) if ids is not None else pack_layout((), [()])
    args = _GATHER_ARGS.pack(src.device_ptr, ids.device_ptr if ids is not None else 0, out.device_ptr,
                             error.device_ptr if error is not None else 0, rows, hidden, src_outer, src_row, out_row,
                             limit, fixed, shift, lanes, int(vector)) + layout  # fmt: skip
    kernel(args, grid=grid_for(rows, BLOCK // lanes), block=BLOCK)


def _cpu_gather(src: Array, index: Array, limit: int, out: GPUArray, error: GPUArray | None) -> None:
    """Rows ``src[i, index[i]]`` (src: rows x limit x hidden), zero where the index is outside [0, limit)."""
    inside = (index >= 0) & (index < limit)
    rows = np.zeros((index.size, src.shape[-1]), dtype=src.dtype)
    picked = np.nonzero(inside)[0]
    rows[picked] = src[picked, index[picked]]
    if error is not None and not inside.all():
        _cpu.store(error, np.ones(error.shape, np.int32))
    _cpu.store(out, rows.reshape(out.shape))


def embedding(
    weight: GPUArray, ids: GPUArray, out: GPUArray | None = None, *, error_flag: GPUArray | None = None
) -> GPUArray:
    """Rows of ``weight`` (vocab, hidden) picked by the int32/int64 device ``ids`` (any shape, any
    layout): the result has shape ``ids.shape + (hidden,)`` and weight's dtype (any dtype: rows are
    copied bit for bit).

    Out-of-range ids (negative or >= vocab) are never read: their output rows are zero, and when
    ``error_flag`` (a one-element int32 device array, which the op never clears) is given it is set to
    1. The check costs nothing on the host, so the op stays graph-capturable."""
    name = "embedding"
    weight = _array(name, "weight", weight)
    ids = _index_input(name, "ids", ids)
    error = _error_flag(name, error_flag)
    if weight.ndim != 2:
        raise ShapeError(f"{name}: weight must be 2-D (vocab, hidden), got shape {weight.shape}")
    vocab, hidden = weight.shape
    _, weight_stride = _rows(name, "weight", weight)
    result = _output(name, "out", out, (*ids.shape, hidden), weight.dtype)
    check_devices(name, [a for a in (weight, ids, result, error) if a is not None])
    _, out_stride = _rows(name, "out", result)
    outputs = [("out", result)] + ([("error_flag", error)] if error is not None else [])
    _check_overlap(name, outputs, [("weight", weight), ("ids", ids)], in_place=False)
    if result.size == 0:
        return result
    rows = ids.size
    if not is_cuda():
        table = _cpu.host(weight)
        _cpu_gather(np.broadcast_to(table, (rows, vocab, hidden)), _cpu.host(ids).reshape(-1).astype(np.int64), vocab,
                    result, error)  # fmt: skip
        return result
    _gather(name, weight, result, rows, hidden, 0, weight_stride, out_stride, vocab, ids, 0, 0, error)
    return result


def gather_last(
    x: GPUArray, lengths: GPUArray | None = None, out: GPUArray | None = None, *, error_flag: GPUArray | None = None
) -> GPUArray:
    """The hidden state of each sequence's last valid token: ``out[b] = x[b, lengths[b] - 1]`` for x
    of shape (batch, seq, hidden); ``lengths``: int32/int64 device array of shape (batch,), default
    ``seq`` for every row. A length outside [1, seq] gives a zero row (and sets ``error_flag`` as in
    :func:`embedding`). Result: (batch, hidden), x's dtype (any dtype)."""
    name = "gather_last"
    x = _array(name, "x", x)
    error = _error_flag(name, error_flag)
    if x.ndim != 3:
        raise ShapeError(f"{name}: x must be 3-D (batch, seq, hidden), got shape {x.shape}")
    batch, seq, hidden = x.shape
    if lengths is not None:
        lengths = _index_input(name, "lengths", lengths)
        if lengths.shape != (batch,):
            raise ShapeError(f"{name}: lengths must have shape ({batch},), got {lengths.shape}")
    elif seq == 0 and batch * hidden > 0:
        raise ShapeError(f"{name}: x has no tokens (shape {x.shape})")
    if hidden > 1 and x._strides[-1] != 1:
        raise ShapeError(f"{name}: x needs unit stride along its last axis, got strides {x.strides} (bytes)")
    result = _output(name, "out", out, (batch, hidden), x.dtype)
    check_devices(name, [a for a in (x, lengths, result, error) if a is not None])
    _, out_stride = _rows(name, "out", result)
    outputs = [("out", result)] + ([("error_flag", error)] if error is not None else [])
    _check_overlap(name, outputs, [("x", x), ("lengths", lengths)], in_place=False)
    if result.size == 0:
        return result
    if not is_cuda():
        index = _cpu.host(lengths).astype(np.int64) - 1 if lengths is not None else np.full(batch, seq - 1, np.int64)
        _cpu_gather(_cpu.host(x), index, seq, result, error)
        return result
    _gather(name, x, result, batch, hidden, x._strides[0], x._strides[1], out_stride, seq, lengths, seq - 1, -1, error)
    return result


_INT32_MAX = 2**31 - 1


def position_ids(batch: int, seq: int, start: int | GPUArray = 0, out: GPUArray | None = None) -> GPUArray:
    """int32 positions of shape (batch, seq): ``out[b, s] = start + s``, with ``start`` a Python int or
    an int32/int64 device array of shape (batch,) (per-row offsets, e.g. the cached lengths during
    decoding; read on the device, so the op is graph-capturable)."""
    name = "position_ids"
    batch = _positive(name, "batch", batch, 0)
    seq = _positive(name, "seq", seq, 0)
    starts: GPUArray | None = None
    value = 0
    if isinstance(start, GPUArray):
        starts = _index_input(name, "start", start)
        if starts.shape != (batch,):
            raise ShapeError(f"{name}: start must have shape ({batch},), got {starts.shape}")
    else:
        given: Any = start
        if isinstance(given, bool) or not isinstance(given, numbers.Integral):
            raise ArgumentError(f"{name}: start must be an int or a device array, got {type(given).__name__}")
        value = int(given)
        if value < -_INT32_MAX - 1 or value + max(seq - 1, 0) > _INT32_MAX:
            raise ArgumentError(f"{name}: positions {value}..{value + seq - 1} do not fit in int32")
    result = _output(name, "out", out, (batch, seq), int32)
    check_devices(name, [a for a in (starts, result) if a is not None])
    _check_overlap(name, [("out", result)], [("start", starts)], in_place=False)
    if result.size == 0:
        return result
    if not is_cuda():
        first = _cpu.host(starts).astype(np.int64) if starts is not None else np.full(batch, value, np.int64)
        _cpu.store(result, (first[:, None] + np.arange(seq)[None, :]).astype(np.int32))
        return result
    index = starts.dtype if starts is not None else int32
    expression = _positions_expression(index)
    params = [pointer("out"), pointer("start"), c_param("start_value", "int"), size_param("start_stride"),
              size_param("batch"), size_param("seq"), size_param("out_b"), size_param("out_s")]  # fmt: skip
    kernel = group(_EMBEDDING_FILE, _embedding_expressions()).kernel(expression, params)
    kernel(result.device_ptr, starts.device_ptr if starts is not None else 0, value,
           starts._strides[0] if starts is not None else 0, batch, seq, result._strides[0], result._strides[1],
           grid=grid_for(batch * seq), block=BLOCK)  # fmt: skip
    return result


# -- conv1d -----------------------------------------------------------------------------------------
_CONV_ARGS = struct.Struct("@4Q9q12i")
_ACTIVATIONS = {None: 0, "relu": 1, "gelu_tanh": 2, "silu": 3, "gelu": 4}  # matmul_common.cuh codes
_CPU_ACTIVATIONS = {"relu": "relu", "gelu_tanh": "gelu_tanh", "silu": "silu", "gelu": "gelu_erf"}
_GRID_LIMIT = 65535


def _conv_expression(dtype: DType) -> str:
    kind = "conv1d_simt" if dtype == float32 else "conv1d_mma"
    return f"{NAMESPACE}conv::{kind}<{dtype.ctype}>"


def _conv_padding(name: str, padding: Any, ksize: int, dilation: int, stride: int) -> tuple[int, int]:
    """(left, right) padding."""
    if padding == "valid":
        return 0, 0
    if padding == "same":
        if stride != 1:
            raise ArgumentError(f"{name}: padding='same' needs stride 1, got stride {stride}")
        total = dilation * (ksize - 1)
        return total // 2, total - total // 2
    if isinstance(padding, str):
        raise ArgumentError(f"{name}: padding must be an int >= 0, 'valid' or 'same', got {padding!r}")
    value = _positive(name, "padding", padding, 0)
    return value, value


def conv1d(
    x: GPUArray,
    weight: GPUArray,
    bias: GPUArray | None = None,
    stride: int = 1,
    padding: int | str = 0,
    dilation: int = 1,
    groups: int = 1,
    *,
    activation: str | None = None,
    out: GPUArray | None = None,
) -> GPUArray:
    """1-D convolution like torch.nn.functional.conv1d: ``x`` (N, C_in, L) or unbatched (C_in, L),
    ``weight`` (C_out, C_in // groups, K), ``bias`` (C_out,) or None; result (N, C_out, L_out) with
    ``L_out = (L + pad_left + pad_right - dilation * (K - 1) - 1) // stride + 1``. ``padding``: an int
    (both sides), "valid" or "same" (stride 1; an odd total puts the extra column on the right, as
    torch). ``activation``: None, "gelu" (erf), "gelu_tanh", "relu" or "silu", applied in float after
    the bias (Whisper's front end is ``gelu(conv1d(...))``).

    float16/bfloat16 run as an implicit GEMM on tensor cores (mma.sync, float accumulation); float32
    in float32 on CUDA cores. All three operands share one dtype. x and out may have any strides."""
    name = "conv1d"
    x = _float_input(name, "x", x)
    weight = _array(name, "weight", weight)
    _same_dtype(name, "weight", weight, x.dtype)
    if x.ndim not in (2, 3):
        raise ShapeError(f"{name}: x must be (N, C_in, L) or (C_in, L), got shape {x.shape}")
    if weight.ndim != 3:
        raise ShapeError(f"{name}: weight must be (C_out, C_in // groups, K), got shape {weight.shape}")
    unbatched = x.ndim == 2
    x3 = x[None] if unbatched else x
    batch, c_in, length = x3.shape
    c_out, c_in_group, ksize = weight.shape
    stride = _positive(name, "stride", stride)
    dilation = _positive(name, "dilation", dilation)
    groups = _positive(name, "groups", groups)
    if activation not in _ACTIVATIONS:
        raise ArgumentError(f"{name}: activation must be None, 'gelu', 'gelu_tanh', 'relu' or 'silu', got "
                            f"{activation!r}")  # fmt: skip
    if ksize == 0:
        raise ShapeError(f"{name}: weight {weight.shape} has kernel size 0")
    if c_in % groups or c_out % groups:
        raise ShapeError(f"{name}: groups={groups} must divide C_in={c_in} and C_out={c_out}")
    if c_in_group != c_in // groups:
        raise ShapeError(f"{name}: weight {weight.shape} needs C_in // groups = {c_in // groups} input channels "
                         f"(x {x.shape}, groups={groups})")  # fmt: skip
    bias = _vector_param(name, "bias", bias, c_out, (x.dtype,))
    left, right = _conv_padding(name, padding, ksize, dilation, stride)
    span = dilation * (ksize - 1) + 1
    if length + left + right < span:
        raise ShapeError(f"{name}: input length {length} with padding ({left}, {right}) is shorter than the "
                         f"dilated kernel ({span})")  # fmt: skip
    l_out = (length + left + right - span) // stride + 1
    shape = (c_out, l_out) if unbatched else (batch, c_out, l_out)
    result = _output(name, "out", out, shape, x.dtype)
    check_devices(name, [a for a in (x, weight, bias, result) if a is not None])
    _check_overlap(name, [("out", result)], [("x", x), ("weight", weight), ("bias", bias)], in_place=False)
    if result.size == 0:
        return result
    out3 = result[None] if unbatched else result
    if not is_cuda():
        _cpu_conv1d(x3, weight, bias, stride, left, right, dilation, groups, l_out, activation, out3)
        return result
    limits = {"C_in": c_in, "C_out": c_out, "L": length + left + right, "kernel size": ksize * dilation}
    for what, size in limits.items():
        if size > _INT32_MAX // max(stride, 1):
            raise ShapeError(f"{name}: {what} = {size} is too large for the int32 indices of the kernel")
    tile = 64
    grid = (-(-l_out // tile), groups * -(-(c_out // groups) // tile), batch)
    if grid[1] > _GRID_LIMIT or grid[2] > _GRID_LIMIT:
        raise ShapeError(f"{name}: batch {batch} or {c_out} output channels need a grid of {grid}, beyond CUDA's "
                         f"{_GRID_LIMIT}")  # fmt: skip
    contiguous_weight = weight._strides == (c_in_group * ksize, ksize, 1) or weight.size == 0
    vector_w = contiguous_weight and weight.device_ptr % 16 == 0 and (c_in_group * ksize) % 8 == 0
    expression = _conv_expression(x.dtype)
    kernel = group(_CONV_FILE, [expression]).kernel(expression, [layout_param("args", "ConvArgs")])
    args = _CONV_ARGS.pack(x3.device_ptr, weight.device_ptr, bias.device_ptr if bias is not None else 0,
                           out3.device_ptr, *x3._strides, *weight._strides, *out3._strides, batch, c_in_group,
                           c_out // groups, groups, length, l_out, ksize, stride, left, dilation,
                           _ACTIVATIONS[activation], int(vector_w))  # fmt: skip
    kernel(args, grid=grid, block=256 if x.dtype == float32 else 128)
    return result


def _cpu_conv1d(x: GPUArray, weight: GPUArray, bias: GPUArray | None, stride: int, left: int, right: int,
                dilation: int, groups: int, l_out: int, activation: str | None, out: GPUArray) -> None:  # fmt: skip
    values = np.pad(_host64(x), ((0, 0), (0, 0), (left, right)))
    kernel = _host64(weight)
    c_out, c_in_group, ksize = kernel.shape
    per_out = c_out // groups
    positions = np.arange(l_out)[:, None] * stride + np.arange(ksize)[None, :] * dilation  # (l_out, K)
    result = np.empty((values.shape[0], c_out, l_out))
    for g in range(groups):
        windows = values[:, g * c_in_group : (g + 1) * c_in_group][:, :, positions]  # (N, Cg, l_out, K)
        w = kernel[g * per_out : (g + 1) * per_out]
        result[:, g * per_out : (g + 1) * per_out] = np.einsum("nclk,ock->nol", windows, w)
    if bias is not None:
        result += _host64(bias)[None, :, None]
    if activation is not None:
        with np.errstate(all="ignore"):
            result = _cpu.UNARY[_CPU_ACTIVATIONS[activation]](result)
    _cpu.store(out, result)


# -- compile-check enumeration ----------------------------------------------------------------------
def _enumerate() -> Groups:
    norms: list[tuple[str, ...]] = [
        (e,) for d in _FLOATS for w in dict.fromkeys(_weight_dtypes(d)) for e in _norm_expressions(d, w)
    ]
    return {
        _NORM_FILE: norms,
        _GATED_FILE: [(_gated_expression(d),) for d in _FLOATS],
        _EMBEDDING_FILE: [tuple(_embedding_expressions())],
        _CONV_FILE: [(_conv_expression(d),) for d in _FLOATS],
    }


register_enumerator(_enumerate)
