"""conv1d like torch.nn.functional.conv1d, with an optional fused activation ("gelu" is the exact erf
form, "gelu_tanh" the tanh approximation, codes of common/codes.cuh). float16/bfloat16 run as an
implicit GEMM on tensor cores, float32 in float32 on CUDA cores. Kernel: native/kernels/nn/conv1d.cu
(``conv1d_mma`` / ``conv1d_simt``, one ``ConvArgs`` by value). x and out may have any strides.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, allocate
from pygpukit.core.codes import ACTIVATION_CODES
from pygpukit.core.dtypes import DType, float32
from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.core.plans import PlanCache

from . import _cpu
from ._kernels import NAMESPACE, Groups, group, launch, register_enumerator
from ._layout import check_devices, is_cuda
from ._nn_common import (
    FLOATS,
    INT32_MAX,
    array,
    check_overlap,
    float_input,
    host64,
    output,
    positive,
    same_dtype,
    vector_param,
)

__all__ = ["conv1d"]

_FILE = "nn/conv1d.cu"
CONV_ARGS = KernelStruct("pygpukit::ops::conv::ConvArgs", _FILE, [
    ("x", "const void*"), ("weight", "const void*"), ("bias", "const void*"), ("out", "void*"),
    ("x_n", "long long"), ("x_c", "long long"), ("x_l", "long long"), ("w_o", "long long"), ("w_c", "long long"),
    ("w_k", "long long"), ("o_n", "long long"), ("o_c", "long long"), ("o_l", "long long"), ("batch", "int"),
    ("c_in_group", "int"), ("c_out_group", "int"), ("groups", "int"), ("l_in", "int"), ("l_out", "int"),
    ("ksize", "int"), ("stride", "int"), ("padding", "int"), ("dilation", "int"), ("activation", "int"),
    ("vector_w", "int"),
])  # fmt: skip
_PARAMS = [CONV_ARGS.param("args")]
_ACTIVATIONS = {name: code for name, code in ACTIVATION_CODES.items() if name != "none"}
_GRID_LIMIT = 65535
_TILE = 64  # output channels and positions of a block (kBM, kBN of conv1d.cu)
# Repeated calls without out=: by the operands' layouts and the options (with their types), the kernel,
# the result's shape, the struct's fields after its pointers, the grid and the block.
_CALLS: PlanCache[tuple[Any, ...]] = PlanCache("ops.conv1d.calls")


def _expression(dtype: DType) -> str:
    kind = "conv1d_simt" if dtype == float32 else "conv1d_mma"
    return f"{NAMESPACE}conv::{kind}<{dtype.ctype}>"


def _padding(name: str, padding: Any, ksize: int, dilation: int, stride: int) -> tuple[int, int]:
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
    value = positive(name, "padding", padding, 0)
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
    torch). ``activation``: None, "gelu" (exact, erf), "gelu_tanh" (tanh approximation), "relu" or
    "silu", applied in float after the bias (Whisper's front end is ``gelu(conv1d(...))``).

    float16/bfloat16 run as an implicit GEMM on tensor cores (mma.sync, float accumulation); float32
    in float32 on CUDA cores. All three operands share one dtype. x and out may have any strides."""
    key: Any = None
    if out is None and type(x) is GPUArray and type(weight) is GPUArray and (bias is None or type(bias) is GPUArray):
        key = (x._dtype, x._shape, x._strides, x._buffer.device, weight._dtype, weight._shape, weight._strides,
               weight.device_ptr % 16, weight._buffer.device,
               None if bias is None else (bias._dtype, bias._shape, bias._strides, bias._buffer.device),
               stride, padding, dilation, groups, activation, type(stride), type(padding), type(dilation),
               type(groups))  # fmt: skip
        try:
            plan = _CALLS.get(key)
        except TypeError:  # an unhashable argument: the general path explains it
            plan = key = None
        if plan is not None and is_cuda():
            kernel, shape, fields, grid, block = plan
            result = allocate(shape, x._dtype)
            args = CONV_ARGS.pack_flat(x.device_ptr, weight.device_ptr, 0 if bias is None else bias.device_ptr,
                                       result.device_ptr, *fields)  # fmt: skip
            launch(kernel, (args,), grid, block)
            return result
    name = "conv1d"
    x = float_input(name, "x", x)
    weight = array(name, "weight", weight)
    same_dtype(name, "weight", weight, x.dtype)
    if x.ndim not in (2, 3):
        raise ShapeError(f"{name}: x must be (N, C_in, L) or (C_in, L), got shape {x.shape}")
    if weight.ndim != 3:
        raise ShapeError(f"{name}: weight must be (C_out, C_in // groups, K), got shape {weight.shape}")
    unbatched = x.ndim == 2
    x3 = x[None] if unbatched else x
    batch, c_in, length = x3.shape
    c_out, c_in_group, ksize = weight.shape
    stride = positive(name, "stride", stride)
    dilation = positive(name, "dilation", dilation)
    groups = positive(name, "groups", groups)
    if activation is not None and (not isinstance(activation, str) or activation not in _ACTIVATIONS):
        choices = ", ".join(repr(a) for a in _ACTIVATIONS)
        raise ArgumentError(f"{name}: activation must be None or one of {choices}, got {activation!r}")
    if ksize == 0:
        raise ShapeError(f"{name}: weight {weight.shape} has kernel size 0")
    if c_in % groups or c_out % groups:
        raise ShapeError(f"{name}: groups={groups} must divide C_in={c_in} and C_out={c_out}")
    if c_in_group != c_in // groups:
        raise ShapeError(f"{name}: weight {weight.shape} needs C_in // groups = {c_in // groups} input channels "
                         f"(x {x.shape}, groups={groups})")  # fmt: skip
    bias = vector_param(name, "bias", bias, c_out, (x.dtype,))
    left, right = _padding(name, padding, ksize, dilation, stride)
    span = dilation * (ksize - 1) + 1
    if length + left + right < span:
        raise ShapeError(f"{name}: input length {length} with padding ({left}, {right}) is shorter than the "
                         f"dilated kernel ({span})")  # fmt: skip
    l_out = (length + left + right - span) // stride + 1
    shape = (c_out, l_out) if unbatched else (batch, c_out, l_out)
    result = output(name, "out", out, shape, x.dtype)
    check_devices(name, [a for a in (x, weight, bias, result) if a is not None])
    check_overlap(name, [("out", result)], [("x", x), ("weight", weight), ("bias", bias)], in_place=False)
    if result.size == 0:
        return result
    out3 = result[None] if unbatched else result
    if not is_cuda():
        _cpu_conv1d(x3, weight, bias, stride, left, right, dilation, groups, l_out, activation, out3)
        return result
    limits = {"C_in": c_in, "C_out": c_out, "L": length + left + right, "kernel size": ksize * dilation}
    for what, size in limits.items():
        if size > INT32_MAX // max(stride, 1):
            raise ShapeError(f"{name}: {what} = {size} is too large for the int32 indices of the kernel")
    grid = (-(-l_out // _TILE), groups * -(-(c_out // groups) // _TILE), batch)
    if grid[1] > _GRID_LIMIT or grid[2] > _GRID_LIMIT:
        raise ShapeError(f"{name}: batch {batch} or {c_out} output channels need a grid of {grid}, beyond CUDA's "
                         f"{_GRID_LIMIT}")  # fmt: skip
    contiguous_weight = weight._strides == (c_in_group * ksize, ksize, 1) or weight.size == 0
    vector_w = contiguous_weight and weight.device_ptr % 16 == 0 and (c_in_group * ksize) % 8 == 0
    expression = _expression(x.dtype)
    kernel = group(_FILE, [expression]).kernel(expression, _PARAMS)
    code = _ACTIVATIONS[activation] if activation is not None else ACTIVATION_CODES["none"]
    fields = (*x3._strides, *weight._strides, *out3._strides, batch, c_in_group, c_out // groups, groups, length,
              l_out, ksize, stride, left, dilation, code, int(vector_w))  # fmt: skip
    args = CONV_ARGS.pack_flat(x3.device_ptr, weight.device_ptr, bias.device_ptr if bias is not None else 0,
                               out3.device_ptr, *fields)  # fmt: skip
    block = 256 if x.dtype == float32 else 128
    kernel(args, grid=grid, block=block)
    if key is not None:
        _CALLS.put(key, (kernel, shape, fields, grid, block))
    return result


def _cpu_conv1d(x: GPUArray, weight: GPUArray, bias: GPUArray | None, stride: int, left: int, right: int,
                dilation: int, groups: int, l_out: int, activation: str | None, out: GPUArray) -> None:  # fmt: skip
    values = np.pad(host64(x), ((0, 0), (0, 0), (left, right)))
    kernel = host64(weight)
    c_out, c_in_group, ksize = kernel.shape
    per_out = c_out // groups
    positions = np.arange(l_out)[:, None] * stride + np.arange(ksize)[None, :] * dilation  # (l_out, K)
    result = np.empty((values.shape[0], c_out, l_out))
    for g in range(groups):
        windows = values[:, g * c_in_group : (g + 1) * c_in_group][:, :, positions]  # (N, Cg, l_out, K)
        w = kernel[g * per_out : (g + 1) * per_out].reshape(per_out, c_in_group * ksize)
        rows = windows.transpose(0, 2, 1, 3).reshape(values.shape[0], l_out, c_in_group * ksize)
        result[:, g * per_out : (g + 1) * per_out] = (rows @ w.T).transpose(0, 2, 1)  # BLAS
    if bias is not None:
        result += host64(bias)[None, :, None]
    if activation is not None:
        with np.errstate(all="ignore"):
            result = _cpu.UNARY[activation](result)
    _cpu.store(out, result)


def _enumerate() -> Groups:
    return {_FILE: [(_expression(d),) for d in FLOATS]}


register_enumerator(_enumerate)
