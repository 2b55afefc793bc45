"""Ops of speech synthesis decoders (Kokoro / StyleTTS2 / iSTFTNet): conv_transpose1d, instance_norm,
adain, snake and leaky_relu. Kernel: native/kernels/nn/tts.cu (``conv_transpose1d``, ``instance_norm``,
``snake``, one argument struct by value each); float32, float16 and bfloat16 computed in float32 and
rounded once at the store; the CPU backend computes the same in float64 with NumPy.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray
from pygpukit.core.errors import ArgumentError, ShapeError

from . import _cpu
from ._kernels import NAMESPACE, Groups, grid_for, group, register_enumerator
from ._layout import check_devices, is_cuda
from ._nn_common import (
    FLOATS,
    INT32_MAX,
    array,
    check_overlap,
    eps_value,
    float_input,
    host64,
    output,
    positive,
    same_dtype,
    vector_param,
)

__all__ = ["adain", "conv_transpose1d", "instance_norm", "leaky_relu", "snake"]

_FILE = "nn/tts.cu"
CONVT_ARGS = KernelStruct("pygpukit::ops::tts::ConvTArgs", _FILE, [
    ("x", "const void*"), ("weight", "const void*"), ("bias", "const void*"), ("out", "void*"),
    ("x_n", "long long"), ("x_c", "long long"), ("x_l", "long long"), ("w_i", "long long"), ("w_o", "long long"),
    ("w_k", "long long"), ("total", "long long"), ("c_out", "int"), ("c_in_group", "int"), ("c_out_group", "int"),
    ("l_in", "int"), ("l_out", "int"), ("ksize", "int"), ("stride", "int"), ("padding", "int"), ("dilation", "int"),
    ("pad_", "int"),
])  # fmt: skip
NORM_ARGS = KernelStruct("pygpukit::ops::tts::InstanceNormArgs", _FILE, [
    ("x", "const void*"), ("scale", "const void*"), ("shift", "const void*"), ("out", "void*"),
    ("x_n", "long long"), ("x_c", "long long"), ("x_l", "long long"), ("o_n", "long long"), ("o_c", "long long"),
    ("o_l", "long long"), ("s_n", "long long"), ("s_c", "long long"), ("channels", "int"), ("length", "int"),
    ("eps", "float"), ("scale_offset", "float"),
])  # fmt: skip
SNAKE_ARGS = KernelStruct("pygpukit::ops::tts::SnakeArgs", _FILE, [
    ("x", "const void*"), ("alpha", "const void*"), ("out", "void*"), ("total", "long long"), ("channels", "int"),
    ("length", "int"), ("mode", "int"), ("slope", "float"),
])  # fmt: skip
_KINDS = ("conv_transpose1d", "instance_norm", "snake")
_PARAMS = {
    "conv_transpose1d": [CONVT_ARGS.param("args")],
    "instance_norm": [NORM_ARGS.param("args")],
    "snake": [SNAKE_ARGS.param("args")],
}
_NORM_THREADS = 256  # kNormThreads of tts.cu


def _expressions(dtype: Any) -> list[str]:
    return [f"{NAMESPACE}tts::{kind}<{dtype.ctype}>" for kind in _KINDS]


def _kernel(kind: str, dtype: Any) -> Any:
    expressions = _expressions(dtype)
    expression = expressions[_KINDS.index(kind)]
    return group(_FILE, expressions).kernel(expression, _PARAMS[kind])


def _ncl(name: str, x: GPUArray) -> tuple[GPUArray, bool]:
    """x as (N, C, L) and whether it was unbatched (C, L)."""
    if x.ndim not in (2, 3):
        raise ShapeError(f"{name}: x must be (N, C, L) or (C, L), got shape {x.shape}")
    return (x[None], True) if x.ndim == 2 else (x, False)


def conv_transpose1d(
    x: GPUArray,
    weight: GPUArray,
    bias: GPUArray | None = None,
    stride: int = 1,
    padding: int = 0,
    output_padding: int = 0,
    groups: int = 1,
    dilation: int = 1,
    *,
    out: GPUArray | None = None,
) -> GPUArray:
    """Transposed 1-D convolution like torch.nn.functional.conv_transpose1d (same argument order):
    ``x`` (N, C_in, L) or (C_in, L), ``weight`` (C_in, C_out // groups, K), ``bias`` (C_out,) or None;
    result (N, C_out, L_out) with ``L_out = (L - 1) * stride - 2 * padding + dilation * (K - 1) +
    output_padding + 1``. x may have any strides; the weight too."""
    name = "conv_transpose1d"
    x = float_input(name, "x", x)
    weight = array(name, "weight", weight)
    same_dtype(name, "weight", weight, x.dtype)
    x3, unbatched = _ncl(name, x)
    if weight.ndim != 3:
        raise ShapeError(f"{name}: weight must be (C_in, C_out // groups, K), got shape {weight.shape}")
    batch, c_in, length = x3.shape
    stride = positive(name, "stride", stride)
    dilation = positive(name, "dilation", dilation)
    groups = positive(name, "groups", groups)
    padding = positive(name, "padding", padding, 0)
    output_padding = positive(name, "output_padding", output_padding, 0)
    if output_padding >= max(stride, dilation):
        raise ArgumentError(f"{name}: output_padding {output_padding} must be smaller than stride {stride} or "
                            f"dilation {dilation}")  # fmt: skip
    if weight.shape[0] != c_in:
        raise ShapeError(f"{name}: weight {weight.shape} needs C_in = {c_in} rows (x {x.shape})")
    if c_in % groups:
        raise ShapeError(f"{name}: groups={groups} must divide C_in={c_in}")
    c_out_group, ksize = weight.shape[1], weight.shape[2]
    if ksize == 0:
        raise ShapeError(f"{name}: weight {weight.shape} has kernel size 0")
    c_out = c_out_group * groups
    bias = vector_param(name, "bias", bias, c_out, (x.dtype,))
    l_out = (length - 1) * stride - 2 * padding + dilation * (ksize - 1) + output_padding + 1
    if length == 0 or l_out <= 0:
        raise ShapeError(f"{name}: input length {length} with stride {stride}, padding {padding}, kernel {ksize} "
                         f"gives output length {l_out}")  # fmt: skip
    shape = (c_out, l_out) if unbatched else (batch, c_out, l_out)
    result = output(name, "out", out, shape, x.dtype)
    check_devices(name, [a for a in (x, weight, bias, result) if a is not None])
    check_overlap(name, [("out", result)], [("x", x), ("weight", weight), ("bias", bias)], in_place=False)
    if result.size == 0:
        return result
    out3 = result[None] if unbatched else result
    if not is_cuda():
        _cpu.store(out3, _conv_transpose_ref(host64(x3), host64(weight), None if bias is None else host64(bias),
                                             stride, padding, output_padding, groups, dilation))  # fmt: skip
        return result
    if not result.is_contiguous:
        raise ShapeError(f"{name}: out must be contiguous, got strides {result.strides}")
    for what, size in {"C_out": c_out, "L_out": l_out, "L": length, "span": dilation * ksize + padding}.items():
        if size > INT32_MAX // max(stride, 1):
            raise ShapeError(f"{name}: {what} = {size} is too large for the int32 indices of the kernel")
    total = batch * c_out * l_out
    args = CONVT_ARGS.pack_flat(x3.device_ptr, weight.device_ptr, 0 if bias is None else bias.device_ptr,
                                out3.device_ptr, *x3._strides, *weight._strides, total, c_out, c_in // groups,
                                c_out_group, length, l_out, ksize, stride, padding, dilation, 0)  # fmt: skip
    _kernel("conv_transpose1d", x.dtype)(args, grid=grid_for(total), block=256)
    return result


def _conv_transpose_ref(x: Any, w: Any, b: Any, stride: int, padding: int, output_padding: int, groups: int,
                        dilation: int) -> Any:  # fmt: skip
    """float64 conv_transpose1d: scatter every input column through the kernel taps."""
    batch, c_in, length = x.shape
    _, c_out_group, ksize = w.shape
    c_in_group = c_in // groups
    full = (length - 1) * stride + dilation * (ksize - 1) + 1 + output_padding
    acc = np.zeros((batch, c_out_group * groups, full + padding))
    for g in range(groups):
        xs = x[:, g * c_in_group : (g + 1) * c_in_group]  # (N, Cg, L)
        ws = w[g * c_in_group : (g + 1) * c_in_group]  # (Cg, Og, K)
        contrib = np.einsum("ncl,cok->nolk", xs, ws)  # (N, Og, L, K)
        for k in range(ksize):
            start = k * dilation
            acc[:, g * c_out_group : (g + 1) * c_out_group, start : start + (length - 1) * stride + 1 : stride] += (
                contrib[..., k]
            )
    l_out = full - 2 * padding
    result = acc[:, :, padding : padding + l_out]
    if b is not None:
        result = result + b[None, :, None]
    return result


def _norm(name: str, x: GPUArray, scale: GPUArray | None, shift: GPUArray | None, per_sample: bool,
          scale_offset: float, eps: float, out: GPUArray | None) -> GPUArray:  # fmt: skip
    x = float_input(name, "x", x)
    x3, unbatched = _ncl(name, x)
    batch, channels, length = x3.shape
    eps = eps_value(name, eps)
    params: list[GPUArray | None] = []
    for what, value in (("scale" if not per_sample else "gamma", scale), ("bias" if not per_sample else "beta", shift)):
        if value is None:
            params.append(None)
            continue
        if per_sample:
            value = array(name, what, value)
            same_dtype(name, what, value, x.dtype)
            want = (batch, channels)
            if value.shape != want and not (unbatched and value.shape == (channels,)):
                raise ShapeError(f"{name}: {what} must have shape {want}, got {value.shape}")
            if value.ndim == 1:
                value = value[None]
        else:
            value = vector_param(name, what, value, channels, (x.dtype,))
        params.append(value)
    scale_p, shift_p = params
    if scale_p is not None and shift_p is not None and scale_p._strides != shift_p._strides:
        shift_p = shift_p.contiguous()
        if scale_p._strides != shift_p._strides:
            scale_p = scale_p.contiguous()
    if length == 0:
        raise ShapeError(f"{name}: x {x.shape} has no elements to normalize over")
    result = output(name, "out", out, x.shape, x.dtype)
    check_devices(name, [a for a in (x, scale_p, shift_p, result) if a is not None])
    check_overlap(name, [("out", result)], [("x", x), ("scale", scale_p), ("shift", shift_p)], in_place=True)
    if result.size == 0:
        return result
    out3 = result[None] if unbatched else result
    if not is_cuda():
        v = host64(x3)
        mean = v.mean(axis=2, keepdims=True)
        var = ((v - mean) ** 2).mean(axis=2, keepdims=True)
        norm = (v - mean) / np.sqrt(var + eps)

        def expand(p: GPUArray | None) -> Any:
            if p is None:
                return 0.0
            h = host64(p)
            return h[:, :, None] if per_sample else h[None, :, None]

        _cpu.store(out3, norm * (scale_offset + expand(scale_p)) + expand(shift_p))
        return result
    if channels * batch > 2**31 - 1:
        raise ShapeError(f"{name}: {batch} x {channels} rows exceed the grid")
    ref = scale_p if scale_p is not None else shift_p
    if ref is None:
        s_n = s_c = 0
    elif per_sample:
        s_n, s_c = ref._strides
    else:
        s_n, s_c = 0, ref._strides[0]
    args = NORM_ARGS.pack_flat(x3.device_ptr, 0 if scale_p is None else scale_p.device_ptr,
                               0 if shift_p is None else shift_p.device_ptr, out3.device_ptr, *x3._strides,
                               *out3._strides, s_n, s_c, channels, length, eps, scale_offset)  # fmt: skip
    _kernel("instance_norm", x.dtype)(args, grid=batch * channels, block=_NORM_THREADS)
    return result


def instance_norm(x: GPUArray, weight: GPUArray | None = None, bias: GPUArray | None = None, eps: float = 1e-5, *,
                  out: GPUArray | None = None) -> GPUArray:  # fmt: skip
    """torch.nn.functional.instance_norm without running statistics: every (n, c) row of ``x`` (N, C, L)
    or (C, L) normalized over L with its biased variance, then ``* weight[c] + bias[c]`` (each (C,) or
    None). x and out may have any strides; out may be x itself."""
    return _norm("instance_norm", x, weight, bias, False, 0.0 if weight is not None else 1.0, eps, out)


def adain(x: GPUArray, gamma: GPUArray, beta: GPUArray, eps: float = 1e-5, *, out: GPUArray | None = None) -> GPUArray:
    """Adaptive instance norm of StyleTTS2 / Kokoro (AdaIN1d): ``(1 + gamma) * instance_norm(x) + beta``
    with per-sample ``gamma`` and ``beta`` of shape (N, C) ((C,) for an unbatched x (C, L)), usually the
    two halves of a style projection. x and out may have any strides; out may be x itself."""
    if gamma is None or beta is None:
        raise ArgumentError("adain: gamma and beta are required (use instance_norm without them)")
    return _norm("adain", x, gamma, beta, True, 1.0, eps, out)


def _snake(name: str, x: GPUArray, alpha: GPUArray | None, mode: int, slope: float, out: GPUArray | None) -> GPUArray:
    x = float_input(name, "x", x)
    if mode == 0:
        x3, _ = _ncl(name, x)
        channels, length = x3.shape[1], x3.shape[2]
        alpha = vector_param(name, "alpha", alpha, channels, (x.dtype,))
    else:
        channels, length = 1, max(x.size, 1)
    result = output(name, "out", out, x.shape, x.dtype)
    check_devices(name, [a for a in (x, alpha, result) if a is not None])
    check_overlap(name, [("out", result)], [("x", x), ("alpha", alpha)], in_place=True)
    if result.size == 0:
        return result
    if not is_cuda():
        v = host64(x)
        if mode == 0:
            a = host64(alpha).reshape((channels, 1))  # type: ignore[arg-type]
            with np.errstate(all="ignore"):
                r = v + np.sin(a * v) ** 2 / a
        else:
            r = np.where(v >= 0, v, v * slope)
        _cpu.store(result, r)
        return result
    if not x.is_contiguous or not result.is_contiguous:
        raise ShapeError(f"{name}: x and out must be contiguous, got strides {x.strides} and {result.strides}")
    args = SNAKE_ARGS.pack_flat(x.device_ptr, 0 if alpha is None else alpha.device_ptr, result.device_ptr, x.size,
                                channels, length, mode, slope)  # fmt: skip
    _kernel("snake", x.dtype)(args, grid=grid_for(x.size), block=256)
    return result


def snake(x: GPUArray, alpha: GPUArray, *, out: GPUArray | None = None) -> GPUArray:
    """Snake activation ``x + sin(alpha * x)**2 / alpha`` with a per-channel ``alpha`` (C,) over ``x``
    (N, C, L) or (C, L), as in Kokoro's AdaINResBlock1 (x and out contiguous on the GPU; out may be x)."""
    return _snake("snake", x, alpha, 0, 0.0, out)


def leaky_relu(x: GPUArray, negative_slope: Any = 0.01, *, out: GPUArray | None = None) -> GPUArray:
    """``x if x >= 0 else negative_slope * x`` elementwise over a float array of any shape (contiguous
    on the GPU; out may be x)."""
    if isinstance(negative_slope, bool) or not isinstance(negative_slope, numbers.Real):
        raise ArgumentError(f"leaky_relu: negative_slope must be a number, got {negative_slope!r}")
    return _snake("leaky_relu", x, None, 1, float(negative_slope), out)


def _enumerate() -> Groups:
    return {_FILE: [tuple(_expressions(d)) for d in FLOATS]}


register_enumerator(_enumerate)
