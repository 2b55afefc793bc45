"""Row normalisations: rmsnorm, layernorm, l2norm, add_rmsnorm (the residual add fused with the next
RMSNorm) and group_norm, for float32, float16 and bfloat16 with float32 statistics and arithmetic (one
rounding at the store). Kernel: native/kernels/nn/norm.cu (``norm_rows``, one ``NormArgs`` by value).

Every op takes ``out=`` (add_rmsnorm also ``residual_out=``): given, nothing is allocated, no value
travels to the host and the op is one kernel launch on the current stream (CUDA-graph capturable).
Results are deterministic. A checked call keeps its launch plan in a :class:`PlanCache` keyed by its
call shape (shapes, strides, dtypes, operands present, device and the address bits that decide the
16-byte accesses); a repeated call looks the plan up once, checks what the key cannot (eps, devices,
overlap of the outputs) and launches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core import backend as _backend
from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray
from pygpukit.core.codes import enum_values
from pygpukit.core.dtypes import DType, float32
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.core.memory import DeviceBuffer
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from . import _cpu, _route
from ._kernels import BLOCK, NAMESPACE, Groups, group, register_enumerator
from ._layout import check_devices, is_cuda, same_view
from ._nn_common import (
    FLOATS,
    aligned,
    array,
    check_overlap,
    eps_value,
    float_input,
    host64,
    output,
    positive,
    pow2_at_least,
    rows,
    same_dtype,
    vector_param,
)

__all__ = ["add_rmsnorm", "group_norm", "l2norm", "layernorm", "rmsnorm"]

_FILE = "nn/norm.cu"
NORM_ARGS = KernelStruct("pygpukit::ops::NormArgs", _FILE, [
    ("x", "const void*"), ("residual", "const void*"), ("weight", "const void*"), ("bias", "const void*"),
    ("out", "void*"), ("residual_out", "void*"), ("rows", "long long"), ("count", "long long"),
    ("x_stride", "long long"), ("residual_stride", "long long"), ("out_stride", "long long"),
    ("residual_out_stride", "long long"), ("spatial", "long long"), ("channels_per_group", "int"), ("groups", "int"),
    ("mode", "int"), ("lanes", "int"), ("aligned", "int"), ("eps", "float"),
])  # fmt: skip
_pack_args = NORM_ARGS.struct.pack  # every field in order (the hot path: no per-field work)
_PARAMS = [NORM_ARGS.param("args")]

_MODES = enum_values("NormMode")  # common/codes.cuh
_RMS, _LAYER, _L2, _ADD_RMS, _GROUP = (_MODES[k] for k in ("kNormRms", "kNormLayer", "kNormL2", "kNormAddRms",
                                                            "kNormGroup"))  # fmt: skip

_NORM_PACKS = (1, 2, 3, 4)  # 16-byte packs a thread of norm_rows<T, W, P, Full> holds in registers
_NORM_NARROW_PACKS = (1, 2, 3)  # fp16/bf16: at most 24 values a thread (P = 4 spills at 64 registers)
# Packs a thread holds as raw words (NormHeld of norm.cu), only for aligned rows that exactly fill a
# power-of-two group of at most 32 lanes, which none of the choices above fills (576 bf16: 8 x 9 packs).
_NORM_EXACT_PACKS = (5, 7, 9)
_NORM_MAX_LANES = 1024  # threads of a row (and of a block): kNormMaxThreads of norm.cu
_NORM_FLOATS = 16  # the values a thread should hold (at most 64 registers, no spills: occupancy >= 50%)


def _expression(dtype: DType, weight_dtype: DType, packs: int, full: bool) -> str:
    return f"{NAMESPACE}norm_rows<{dtype.ctype}, {weight_dtype.ctype}, {packs}, {'true' if full else 'false'}>"


def _expressions(dtype: DType, weight_dtype: DType) -> list[str]:
    """Every norm_rows instantiation for one (dtype, weight dtype): the register kernels, then the
    streaming one."""
    choices = _NORM_PACKS if dtype.itemsize == 4 else _NORM_NARROW_PACKS
    found = [_expression(dtype, weight_dtype, p, full) for p in choices for full in (True, False)]
    exact = [_expression(dtype, weight_dtype, p, True) for p in _NORM_EXACT_PACKS]
    return [*found, *exact, _expression(dtype, weight_dtype, 0, False)]


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
        lanes = pow2_at_least(need, 1, 32) if need <= 32 else -(-need // 32) * 32
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


_plans: PlanCache[_NormPlan] = PlanCache("ops.norms")


def _norm_launch(mode: int, x: GPUArray, out: GPUArray, weight: GPUArray | None, bias: GPUArray | None, eps: float,
                 count_rows: int, count: int, strides: Sequence[int], residual: GPUArray | None = None,
                 residual_out: GPUArray | None = None, spatial: int = 1, channels_per_group: int = 1,
                 groups: int = 1) -> _NormPlan:  # fmt: skip
    """Launch norm_rows over ``count_rows`` rows of ``count`` elements; ``strides``: row strides of x,
    residual, out and residual_out. Returns the launch's plan."""
    dtype = x.dtype
    width = 16 // dtype.itemsize
    packs = -(-count // width)
    weight_dtype = weight.dtype if weight is not None else (bias.dtype if bias is not None else dtype)
    operands = [(x, strides[0]), (out, strides[2])]
    if residual is not None and residual_out is not None:
        operands += [(residual, strides[1]), (residual_out, strides[3])]
    vector = count % width == 0 and all(aligned(a, s, count_rows, width) for a, s in operands)
    if mode == _GROUP:
        vector = vector and spatial % width == 0
    else:
        vector = vector and all(p.device_ptr % (width * p.itemsize) == 0 for p in (weight, bias) if p is not None)
    per_thread, lanes = _norm_plan(packs, width, _NORM_PACKS if dtype.itemsize == 4 else _NORM_NARROW_PACKS,
                                   _NORM_EXACT_PACKS if vector else ())  # fmt: skip
    full = per_thread > 0 and vector and per_thread * lanes == packs
    rows_per_block = BLOCK // lanes if lanes <= 32 else 1  # norm_rows: a group of whole warps is the block
    expression = _expression(dtype, weight_dtype, per_thread, full)
    kernel = group(_FILE, [expression]).kernel(expression, _PARAMS, programmatic=True)
    tail = (count_rows, count, strides[0], strides[1], strides[2], strides[3], spatial, channels_per_group, groups,
            mode, lanes, int(vector))  # fmt: skip
    plan = _NormPlan(kernel, -(-count_rows // rows_per_block), rows_per_block * lanes, tail, vector, out.nbytes)
    args = _pack_args(
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
    # Absent operands skip the call (the repeated-call path builds this key on every call).
    return (mode, x._shape, x._strides, x._dtype, device,
            None if residual is None else _norm_meta(residual, device),
            None if weight is None else _norm_meta(weight, device), None if bias is None else _norm_meta(bias, device),
            None if out is None else _norm_meta(out, device),
            None if residual_out is None else _norm_meta(residual_out, device), rows_bits & 15,
            vector_bits & 31)  # fmt: skip


def _output_clear(result: GPUArray, x: GPUArray, residual: GPUArray | None, weight: GPUArray | None,
                  bias: GPUArray | None) -> bool:  # fmt: skip
    """Whether the given output shares no allocation with the inputs, except being the very same view
    of x or residual (in place); otherwise the checked path decides."""
    buffer = result._buffer
    if buffer is x._buffer and not same_view(result, x):
        return False
    if residual is not None and buffer is residual._buffer and not same_view(result, residual):
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
    plan = _plans.get(_norm_key(mode, x, residual, weight, bias, out, residual_out, device, px | pr | po | pro,
                                pw | pb))  # fmt: skip
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
        plan.kernel(_pack_args(px, pr, pw, pb, po, pro, *tail, eps), grid=plan.grid, block=plan.block)
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
    if all(meta is not False for meta in key[5:10]):
        _plans.put(key, plan)


def _cpu_normalize(mode: int, values: np.ndarray[Any, Any], eps: float) -> np.ndarray[Any, Any]:
    """Rows of ``values`` (float64, last axis) normalised, before the affine step."""
    with np.errstate(all="ignore"):
        if mode in (_LAYER, _GROUP):
            centred = values - values.mean(axis=-1, keepdims=True)
            result: np.ndarray[Any, Any] = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
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
    x = float_input(name, "x", x)
    eps = eps_value(name, eps)
    count_rows, x_stride = rows(name, "x", x)
    count = x.shape[-1]
    weight = vector_param(name, "weight", weight, count, _weight_dtypes(x.dtype))
    bias = vector_param(name, "bias", bias, count, _weight_dtypes(x.dtype))
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise DTypeError(f"{name}: weight ({weight.dtype}) and bias ({bias.dtype}) must have the same dtype")
    result = output(name, "out", out, x.shape, x.dtype)
    check_devices(name, [a for a in (x, weight, bias, result) if a is not None])
    _, out_stride = rows(name, "out", result)
    check_overlap(name, [("out", result)], [("x", x)], in_place=True)
    check_overlap(name, [("out", result)], [("weight", weight), ("bias", bias)], in_place=False)
    if result.size == 0:
        return result
    if not is_cuda():
        values = _cpu_normalize(mode, host64(x), eps)
        if weight is not None:
            values = values * host64(weight)
        if bias is not None:
            values = values + host64(bias)
        _cpu.store(result, values)
        return result
    plan = _norm_launch(mode, x, result, weight, bias, eps, count_rows, count, (x_stride, 0, out_stride, 0))
    _norm_remember(plan, mode, x, None, weight, bias, given, None)
    return result


def rmsnorm(x: GPUArray, weight: GPUArray | None, eps: float = 1e-6, out: GPUArray | None = None) -> GPUArray:
    """``x / sqrt(mean(x**2, axis=-1) + eps) * weight`` over the last axis (LLaMA/Qwen RMSNorm).

    ``x``: float32, float16 or bfloat16, any shape with at least one axis; ``weight``: shape
    ``(x.shape[-1],)`` of x's dtype or float32, or None (no scale). Computed in float32 and rounded
    once (Hugging Face rounds the normalised value to the dtype before scaling: within one ulp).
    """
    if (
        _route.hook is not None
        and (routed := _route.hook("rmsnorm", (x, weight), {"eps": eps, "out": out})) is not _route.BUILTIN
    ):
        return routed  # type: ignore[no-any-return]
    return _row_norm("rmsnorm", _RMS, x, weight, None, eps, out)


def layernorm(
    x: GPUArray, weight: GPUArray | None, bias: GPUArray | None = None, eps: float = 1e-5, out: GPUArray | None = None
) -> GPUArray:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (biased variance, as
    torch.nn.functional.layer_norm). ``weight`` and ``bias``: shape ``(x.shape[-1],)``, x's dtype or
    float32 (both the same), each may be None. The variance is taken from the row held in registers
    after the mean (two passes over registers, no cancellation)."""
    if (
        _route.hook is not None
        and (routed := _route.hook("layernorm", (x, weight, bias), {"eps": eps, "out": out})) is not _route.BUILTIN
    ):
        return routed  # type: ignore[no-any-return]
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
    x = float_input(name, "x", x)
    residual = array(name, "residual", residual)
    same_dtype(name, "residual", residual, x.dtype)
    if residual.shape != x.shape:
        raise ShapeError(f"{name}: residual has shape {residual.shape} but x has shape {x.shape}")
    eps = eps_value(name, eps)
    count_rows, x_stride = rows(name, "x", x)
    _, residual_stride = rows(name, "residual", residual)
    count = x.shape[-1]
    weight = vector_param(name, "weight", weight, count, _weight_dtypes(x.dtype))
    result = output(name, "out", out, x.shape, x.dtype)
    new_residual = output(name, "residual_out", residual_out, x.shape, x.dtype)
    check_devices(name, [a for a in (x, residual, weight, result, new_residual) if a is not None])
    _, out_stride = rows(name, "out", result)
    _, residual_out_stride = rows(name, "residual_out", new_residual)
    outputs = [("out", result), ("residual_out", new_residual)]
    check_overlap(name, outputs, [("x", x), ("residual", residual)], in_place=True)
    check_overlap(name, outputs, [("weight", weight)], in_place=False)
    if result.size == 0:
        return result, new_residual
    if not is_cuda():
        with np.errstate(all="ignore"):
            summed = (host64(x) + host64(residual)).astype(x.dtype.numpy)
        values = _cpu_normalize(_RMS, summed.astype(np.float64), eps)
        if weight is not None:
            values = values * host64(weight)
        _cpu.store(new_residual, summed)
        _cpu.store(result, values)
        return result, new_residual
    strides = (x_stride, residual_stride, out_stride, residual_out_stride)
    plan = _norm_launch(_ADD_RMS, x, result, weight, None, eps, count_rows, count, strides, residual, new_residual)
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
    x = float_input(name, "x", x)
    if x.ndim < 2:
        raise ShapeError(f"{name}: x must have shape (N, C, *spatial), got {x.shape}")
    groups = positive(name, "num_groups", num_groups)
    channels = x.shape[1]
    if channels % groups != 0:
        raise ShapeError(f"{name}: num_groups={groups} does not divide the {channels} channels of x {x.shape}")
    eps = eps_value(name, eps)
    weight = vector_param(name, "weight", weight, channels, _weight_dtypes(x.dtype))
    bias = vector_param(name, "bias", bias, channels, _weight_dtypes(x.dtype))
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise DTypeError(f"{name}: weight ({weight.dtype}) and bias ({bias.dtype}) must have the same dtype")
    if not x.is_contiguous:
        raise ShapeError(f"{name}: x must be contiguous, got strides {x.strides} (bytes); call .contiguous() first")
    result = output(name, "out", out, x.shape, x.dtype)
    if not result.is_contiguous:
        raise ShapeError(f"{name}: out must be contiguous, got strides {result.strides} (bytes)")
    check_devices(name, [a for a in (x, weight, bias, result) if a is not None])
    check_overlap(name, [("out", result)], [("x", x)], in_place=True)
    check_overlap(name, [("out", result)], [("weight", weight), ("bias", bias)], in_place=False)
    if result.size == 0:
        return result
    per_group = channels // groups
    spatial = math.prod(x.shape[2:])
    count_rows, count = x.shape[0] * groups, per_group * spatial
    if not is_cuda():
        values = _cpu_normalize(_GROUP, host64(x).reshape(count_rows, count), eps)
        values = values.reshape(x.shape[0], channels, spatial)
        if weight is not None:
            values = values * host64(weight)[:, None]
        if bias is not None:
            values = values + host64(bias)[:, None]
        _cpu.store(result, values.reshape(x.shape))
        return result
    _norm_launch(_GROUP, x, result, weight, bias, eps, count_rows, count, (count, 0, count, 0), spatial=spatial,
                 channels_per_group=per_group, groups=groups)  # fmt: skip
    return result


def _enumerate() -> Groups:
    return {_FILE: [(e,) for d in FLOATS for w in dict.fromkeys(_weight_dtypes(d)) for e in _expressions(d, w)]}


register_enumerator(_enumerate)
