"""Gated activations of MLP blocks: swiglu, geglu (erf GELU, or its tanh approximation) and relu2, for
float32, float16 and bfloat16, computed in float32 and rounded once. Kernel: native/kernels/nn/gated.cu
(``gated_rows``, one ``GatedArgs`` by value; the op is a GatedMode code of common/codes.cuh).

Two inputs (gate, up) or one concatenated input ``[gate | up]`` along the last axis (the output of a
fused gate_up_proj GEMM). Row layouts as for every row op (see :mod:`pygpukit.ops._nn_common`);
``out=`` may be the very same view as an input (in place).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, allocate
from pygpukit.core.codes import enum_values
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.core.plans import PlanCache

from . import _cpu, _route
from ._kernels import BLOCK, NAMESPACE, Groups, grid_for, group, launch, register_enumerator
from ._layout import check_devices, is_cuda
from ._nn_common import FLOATS, aligned, array, check_overlap, float_input, host64, output, rows, same_dtype

__all__ = ["geglu", "relu2", "swiglu"]

_FILE = "nn/gated.cu"
GATED_ARGS = KernelStruct("pygpukit::ops::GatedArgs", _FILE, [
    ("gate", "const void*"), ("up", "const void*"), ("out", "void*"), ("rows", "long long"), ("cols", "long long"),
    ("gate_stride", "long long"), ("up_stride", "long long"), ("out_stride", "long long"), ("mode", "int"),
    ("aligned", "int"),
])  # fmt: skip
_PARAMS = [GATED_ARGS.param("args")]

_MODES = enum_values("GatedMode")  # common/codes.cuh
_SWIGLU, _GEGLU, _GEGLU_TANH, _RELU2 = (_MODES[k] for k in ("kGatedSwiglu", "kGatedGeglu", "kGatedGegluTanh",
                                                             "kGatedRelu2"))  # fmt: skip
_GEGLU_FORMS = {"none": _GEGLU, "tanh": _GEGLU_TANH}  # geglu's approximate=


def _expression(dtype: DType) -> str:
    return f"{NAMESPACE}gated_rows<{dtype.ctype}>"


def _cpu_gated(mode: int, gate: np.ndarray[Any, Any], up: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
    with np.errstate(all="ignore"):
        if mode == _RELU2:
            result: np.ndarray[Any, Any] = np.where(gate > 0, gate * gate, np.where(np.isnan(gate), gate, 0.0))
            return result
        if mode == _SWIGLU:
            activated = _cpu.UNARY["silu"](gate)
        elif mode == _GEGLU:
            activated = _cpu.UNARY["gelu"](gate)
        else:
            activated = _cpu.UNARY["gelu_tanh"](gate)
        assert up is not None
        result = activated * up
        return result


# Repeated calls without out=: by the inputs' layouts (and pointer alignment), the kernel, the result's
# shape, the struct's fields after the pointers, the grid and where ``up`` sits relative to ``gate``.
_CALLS: PlanCache[tuple[Any, ...]] = PlanCache("ops.gated.calls")


def _gated(name: str, mode: int, gate: Any, up: Any, out: Any) -> GPUArray:
    if out is None and type(gate) is GPUArray and (up is None or type(up) is GPUArray):
        key = (mode, gate._dtype, gate._shape, gate._strides, gate.device_ptr % 16, gate._buffer.device,
               None if up is None else (up._dtype, up._shape, up._strides, up.device_ptr % 16,
                                        up._buffer.device))  # fmt: skip
        plan = _CALLS.get(key)
        if plan is not None and is_cuda():
            kernel, shape, fields, grid, up_delta = plan
            result = allocate(shape, gate._dtype)
            g = gate.device_ptr
            u = up.device_ptr if up is not None else 0 if up_delta is None else g + up_delta
            launch(kernel, (GATED_ARGS.pack_flat(g, u, result.device_ptr, *fields),), grid)
            return result
    else:
        key = None
    gate = float_input(name, "gate" if mode != _RELU2 else "x", gate)
    given_up = up
    if mode != _RELU2 and up is None:  # one concatenated input: [gate | up] along the last axis
        if gate.ndim == 0 or gate.shape[-1] % 2:
            raise ShapeError(f"{name}: a single input needs an even last axis (gate and up halves), got {gate.shape}")
        half = gate.shape[-1] // 2
        whole = gate
        gate, up = whole[..., :half], whole[..., half:]
        inputs: list[tuple[str, GPUArray | None]] = [("x", whole)]
    elif mode != _RELU2:
        up = array(name, "up", up)
        same_dtype(name, "up", up, gate.dtype)
        if up.shape != gate.shape:
            raise ShapeError(f"{name}: gate has shape {gate.shape} but up has shape {up.shape}")
        inputs = [("gate", gate), ("up", up)]
    else:
        inputs = [("x", gate)]
    count_rows, gate_stride = rows(name, "gate" if mode != _RELU2 else "x", gate)
    up_stride = rows(name, "up", up)[1] if up is not None else 0
    result = output(name, "out", out, gate.shape, gate.dtype)
    check_devices(name, [a for _, a in inputs if a is not None] + [result])
    _, out_stride = rows(name, "out", result)
    check_overlap(name, [("out", result)], inputs, in_place=True)
    if result.size == 0:
        return result
    if not is_cuda():
        _cpu.store(result, _cpu_gated(mode, host64(gate), host64(up) if up is not None else None))
        return result
    cols = gate.shape[-1]
    operands = [(gate, gate_stride), (result, out_stride)] + ([(up, up_stride)] if up is not None else [])
    if count_rows > 1 and all(stride == cols for _, stride in operands):  # packed rows: one long row
        cols, count_rows = cols * count_rows, 1
    width = 16 // gate.itemsize
    vector = cols % width == 0 and all(aligned(a, s, count_rows, width) for a, s in operands)
    expression = _expression(gate.dtype)
    kernel = group(_FILE, [expression]).kernel(expression, _PARAMS, programmatic=True)
    fields = (count_rows, cols, gate_stride, up_stride, out_stride, mode, int(vector))
    args = GATED_ARGS.pack_flat(gate.device_ptr, up.device_ptr if up is not None else 0, result.device_ptr, *fields)
    work = count_rows * cols // width if vector else count_rows * cols
    grid = grid_for(work)
    kernel(args, grid=grid, block=BLOCK)
    if key is not None:
        up_delta = None if up is None or given_up is not None else up.device_ptr - gate.device_ptr
        _CALLS.put(key, (kernel, result._shape, fields, grid, up_delta))
    return result


def swiglu(gate: GPUArray, up: GPUArray | None = None, out: GPUArray | None = None) -> GPUArray:
    """``silu(gate) * up`` (the SwiGLU MLP of LLaMA, Qwen, Mistral), fused: one read of each input.

    With ``up`` None, ``gate`` is one concatenated input whose last axis has 2*I elements: the first
    I are the gate and the last I the up projection (a fused gate_up_proj GEMM output), and the result
    has I. float32, float16, bfloat16; computed in float32."""
    if _route.hook is not None and (routed := _route.hook("swiglu", (gate, up), {"out": out})) is not _route.BUILTIN:
        return routed  # type: ignore[no-any-return]
    return _gated("swiglu", _SWIGLU, gate, up, out)


def geglu(
    gate: GPUArray, up: GPUArray | None = None, approximate: str = "none", out: GPUArray | None = None
) -> GPUArray:
    """``gelu(gate) * up`` (GeGLU, Gemma) with the exact erf GELU; ``approximate="tanh"`` takes the
    tanh approximation ("gelu_tanh", Gemma's ``gelu_pytorch_tanh``) instead. A single concatenated
    input as for :func:`swiglu`."""
    mode = _GEGLU_FORMS.get(approximate) if isinstance(approximate, str) else None
    if mode is None:
        raise ArgumentError(f"geglu: approximate must be 'none' (erf) or 'tanh', got {approximate!r}")
    return _gated("geglu", mode, gate, up, out)


def relu2(x: GPUArray, out: GPUArray | None = None) -> GPUArray:
    """``relu(x) ** 2`` (squared ReLU); NaN stays NaN."""
    return _gated("relu2", _RELU2, x, None, out)


def _enumerate() -> Groups:
    return {_FILE: [(_expression(d),) for d in FLOATS]}


register_enumerator(_enumerate)
