"""The GEMM family on the CPU simulation backend: the same functions in wide NumPy arithmetic (float64,
long double for float64 inputs, int64 for int8), rounded once to the result dtype. Never used on the
CUDA backend (no GEMM there round-trips through the host)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray

from .. import _cpu
from ._base import apply_activation

__all__ = ["gemm", "gemv", "linear", "matmul", "scaled_matmul"]

Array = np.ndarray[Any, Any]


def _wide(x: GPUArray) -> Array:
    return _cpu.host(x).astype(np.longdouble if x.dtype.name == "float64" else np.float64)  # one copy


def matmul(a: GPUArray, b: GPUArray, d: GPUArray) -> None:
    """d = a @ b (NumPy broadcasting over the batch dims); int8 accumulates in int64 and wraps to int32."""
    ha, hb = _cpu.host(a), _cpu.host(b)
    if d.dtype.name == "int32":
        result = np.matmul(ha.astype(np.int64), hb.astype(np.int64)).astype(np.int32)
    else:
        result = np.matmul(_wide(a), _wide(b)).astype(d.dtype.numpy)
    _cpu.store(d, result.reshape(d.shape))  # in place: no staging buffer (an out= matmul allocates nothing)


def linear(x2: GPUArray, w: GPUArray, bias: GPUArray | None, code: int, d: GPUArray) -> None:
    """d (rows, out) = act(x2 @ w.T + bias)."""
    result = _wide(x2) @ _wide(w).T
    if bias is not None:
        result = result + _wide(bias)
    result = apply_activation(result.astype(np.float64), code) if code else result
    _cpu.store(d, result.astype(d.dtype.numpy))  # in place: an out= linear allocates nothing


def scaled_matmul(a: GPUArray, b: GPUArray, scale_a: GPUArray, scale_b: GPUArray, bias: GPUArray | None,
                  d: GPUArray) -> None:  # fmt: skip
    """d = (a * scale_a) @ (b * scale_b) + bias."""
    ha = _cpu.host(a).astype(np.float64) * float(_cpu.host(scale_a).reshape(-1)[0])
    hb = _cpu.host(b).astype(np.float64) * float(_cpu.host(scale_b).reshape(-1)[0])
    result = ha @ hb + (_cpu.host(bias).astype(np.float64) if bias is not None else 0.0)
    d.copy_(np.ascontiguousarray(result.astype(d.dtype.numpy)))


def gemm(a: GPUArray, b: GPUArray, out: GPUArray, trans_a: bool, trans_b: bool, alpha: float, beta: float,
         bias: GPUArray | None, code: int) -> GPUArray:  # fmt: skip
    """out = act(alpha * op(a) @ op(b) + beta * out + bias) (gemm_mma's contract)."""
    lhs = _cpu.host(a).astype(np.float64)
    rhs = _cpu.host(b).astype(np.float64)
    result = alpha * ((lhs.T if trans_a else lhs) @ (rhs.T if trans_b else rhs))
    if beta != 0.0:
        result = result + beta * _cpu.host(out).astype(np.float64)
    if bias is not None:
        result = result + _cpu.host(bias).astype(np.float64)
    out.copy_(apply_activation(result, code).astype(out.dtype.numpy))
    return out


def gemv(x: GPUArray, w: GPUArray, out: GPUArray, w_layout: str, bias: GPUArray | None, code: int) -> None:
    """out = act(x @ op(w) + bias) (gemv's contract)."""
    x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
    rhs = _cpu.host(w).astype(np.float64)
    result = _cpu.host(x2).astype(np.float64) @ (rhs.T if w_layout == "nk" else rhs)
    if bias is not None:
        result = result + _cpu.host(bias).astype(np.float64)
    out.copy_(apply_activation(result, code).astype(out.dtype.numpy).reshape(out.shape))
