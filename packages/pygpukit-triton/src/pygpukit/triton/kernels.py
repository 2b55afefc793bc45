"""Triton versions of built-in ops, with the built-in op's signature plus ``out=``.

=========  ==========================================================  =========================
function   built-in op (same arguments)                                dtypes
=========  ==========================================================  =========================
rmsnorm    ``pygpukit.ops.rmsnorm(x, weight, eps=1e-6, out=None)``      float32, float16, bfloat16
layernorm  ``pygpukit.ops.layernorm(x, weight, bias, eps, out)``        float32, float16, bfloat16
softmax    ``pygpukit.ops.softmax(x, axis=-1)`` (+ ``out=``)            + float64
rotary     ``pygpukit.ops.apply_rope(q, k, cos, sin, positions, ...)``  float32, float16, bfloat16
swiglu     ``pygpukit.ops.swiglu(gate, up=None, out=None)``             float32, float16, bfloat16
matmul     ``pygpukit.ops.matmul(a, b, *, out, use_tf32, stream)``      float32, float16, bfloat16
=========  ==========================================================  =========================

The arguments are checked by the same code as the built-in ops (``pygpukit.ops._nn_common`` and
the RoPE checks), so a bad argument raises the same typed error. Triton needs the CUDA backend: on
the CPU backend every function raises :class:`BackendUnavailableError` (the routing layer,
:mod:`pygpukit.triton.routing`, runs the built-in op there instead). ``rotary`` rotates in place and
returns None, like ``apply_rope``; the first call of a kernel per dtype and shape class compiles it
(Triton's cache), so warm a kernel up before capturing it in a CUDA graph.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import bfloat16, float16, float32, float64
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.stream import Stream
from pygpukit.ops._layout import check_devices
from pygpukit.ops._nn_common import (
    array,
    check_overlap,
    eps_value,
    float_input,
    output,
    rows,
    same_dtype,
    vector_param,
)

from ._interop import TritonArray, _require_cuda, pygpukit_launches

__all__ = ["apply_rope", "layernorm", "matmul", "rmsnorm", "rotary", "softmax", "swiglu"]

_MAX_BLOCK = 4096
_INT32_MAX = 2**31 - 1


@functools.cache
def _k() -> Any:
    from . import _triton_kernels

    return _triton_kernels


def _start(name: str, *arrays: GPUArray | None) -> Any:
    """The kernels module, once the operands are known to be alive (InvalidPointerError, on every
    backend) and Triton can run here (BackendUnavailableError)."""
    for a in arrays:
        if a is not None:
            a.device_ptr  # noqa: B018 - raises InvalidPointerError (DeviceResetError) for freed memory
    _require_cuda(f"pygpukit.triton.kernels.{name}")
    return _k()


def _block(n: int, cap: int = _MAX_BLOCK) -> int:
    return max(16, min(cap, 1 << max(0, (max(n, 1) - 1).bit_length())))


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 2048 else 16


def _unwrap(value: Any) -> Any:
    """A TritonArray's GPUArray; anything else as it is (the checks then name what is wrong)."""
    return value.array if isinstance(value, TritonArray) else value


def _row_norm(name: str, x: Any, weight: Any, bias: Any, eps: Any, out: Any, layer: bool) -> GPUArray:
    x, weight, bias, out = _unwrap(x), _unwrap(weight), _unwrap(bias), _unwrap(out)
    x = float_input(name, "x", x)
    eps = eps_value(name, eps)
    count_rows, x_stride = rows(name, "x", x)
    n = x.shape[-1]
    weight = vector_param(name, "weight", weight, n, (x.dtype, float32))
    bias = vector_param(name, "bias", bias, n, (x.dtype, float32))
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise DTypeError(f"{name}: weight ({weight.dtype}) and bias ({bias.dtype}) must have the same dtype")
    result = output(name, "out", out, x.shape, x.dtype)
    check_devices(name, [a for a in (x, weight, bias, result) if a is not None])
    _, out_stride = rows(name, "out", result)
    check_overlap(name, [("out", result)], [("x", x)], in_place=True)
    check_overlap(name, [("out", result)], [("weight", weight), ("bias", bias)], in_place=False)
    kernels = _start(name, x, weight, bias, result)
    if result.size == 0:
        return result
    block = _block(n)
    with pygpukit_launches(name):
        if layer:
            kernels.layernorm_kernel[(count_rows,)](
                x, weight, bias, result, x_stride, out_stride, n, eps,
                HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK=block, num_warps=_warps(block),
            )  # fmt: skip
        else:
            kernels.rmsnorm_kernel[(count_rows,)](
                x, weight, result, x_stride, out_stride, n, eps,
                HAS_WEIGHT=weight is not None, BLOCK=block, num_warps=_warps(block),
            )  # fmt: skip
    return result


def rmsnorm(x: GPUArray, weight: GPUArray | None, eps: float = 1e-6, out: GPUArray | None = None) -> GPUArray:
    """``x / sqrt(mean(x**2, axis=-1) + eps) * weight`` over the last axis (as ``pygpukit.ops.rmsnorm``)."""
    return _row_norm("rmsnorm", x, weight, None, eps, out, layer=False)


def layernorm(
    x: GPUArray, weight: GPUArray | None, bias: GPUArray | None = None, eps: float = 1e-5, out: GPUArray | None = None
) -> GPUArray:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis (as ``pygpukit.ops.layernorm``)."""
    return _row_norm("layernorm", x, weight, bias, eps, out, layer=True)


def softmax(x: GPUArray, axis: int = -1, out: GPUArray | None = None) -> GPUArray:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis`` (as ``pygpukit.ops.softmax``, plus ``out=``);
    float32, float16, bfloat16 (computed in float32) and float64. ``x`` must be contiguous unless
    ``axis`` is the last one (then rows of any single stride)."""
    name = "softmax"
    x, out = array(name, "x", _unwrap(x)), _unwrap(out)
    if x.dtype not in (float32, float16, bfloat16, float64):
        raise DTypeError(f"{name}: the Triton softmax takes float32, float16, bfloat16 or float64, got {x.dtype}")
    if x.ndim == 0:
        raise ShapeError(f"{name}: x needs at least one dimension, got a 0-d array")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
        raise ArgumentError(f"{name}: axis {axis!r} is out of range for shape {x.shape}")
    axis = int(axis) % x.ndim
    result = output(name, "out", out, x.shape, x.dtype)
    check_devices(name, [x, result])
    check_overlap(name, [("out", result)], [("x", x)], in_place=True)
    n = x.shape[axis]
    inner = int(np.prod(x.shape[axis + 1 :], dtype=np.int64))
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    if axis == x.ndim - 1:
        _, x_stride = rows(name, "x", x)
        _, out_stride = rows(name, "out", result)
    else:
        for what, a in (("x", x), ("out", result)):
            if not a.is_contiguous:
                raise ShapeError(f"{name}: {what} must be contiguous for the Triton softmax along axis {axis}, "
                                 f"got shape {a.shape}, strides {a.strides} (bytes); call .contiguous()")  # fmt: skip
        x_stride = out_stride = n * inner
    kernels = _start(name, x, result)
    if x.size == 0:
        return result
    import triton.language as tl

    block = _block(n, 2048 if x.dtype == float64 else _MAX_BLOCK)
    with pygpukit_launches("softmax"):
        kernels.softmax_kernel[(outer * inner,)](
            x, result, n, inner, x_stride, out_stride,
            ACC=tl.float64 if x.dtype == float64 else tl.float32, BLOCK=block, num_warps=_warps(block),
        )  # fmt: skip
    return result


def rotary(
    q: GPUArray,
    k: GPUArray | None,
    cos: GPUArray,
    sin: GPUArray,
    positions: GPUArray,
    style: str = "neox",
    rotary_dim: int | None = None,
    position_offset: int = 0,
) -> None:
    """Rotate the first ``rotary_dim`` dimensions of every head of ``q`` and ``k`` in place (as
    ``pygpukit.ops.apply_rope``; positions outside the tables are clamped into them, as on the GPU)."""
    from pygpukit.ops.rope import _check_args

    q, k, cos, sin, positions = (_unwrap(v) for v in (q, k, cos, sin, positions))
    q, k, cos, sin, positions, dim = _check_args(q, k, cos, sin, positions, style, rotary_dim)
    if (
        isinstance(position_offset, bool)
        or not isinstance(position_offset, (int, np.integer))
        or not (-_INT32_MAX <= position_offset <= _INT32_MAX)
    ):
        raise ArgumentError(f"apply_rope: position_offset must be an int32, got {position_offset!r}")
    kernels = _start("rotary", q, k, cos, sin, positions)
    batch, seq = q.shape[:2]
    if batch * seq == 0:
        return
    if positions.ndim == 2:
        pb, ps = positions._strides
    elif positions.shape == (seq,):
        pb, ps = 0, positions._strides[0]
    else:  # (batch,) with seq 1
        pb, ps = positions._strides[0], 0
    half = dim // 2
    block = _block(half, 256)
    with pygpukit_launches("rotary"):
        for x in (q, k):
            if x is None or x.shape[2] == 0:
                continue
            sb, ss, sh = x._strides[:3]
            kernels.rope_kernel[(batch * seq, x.shape[2])](
                x, cos, sin, positions, sb, ss, sh, pb, ps, seq, x.shape[2], half, cos.shape[0], int(position_offset),
                NEOX=style == "neox", BLOCK=block, num_warps=1 if block <= 64 else 2,
            )  # fmt: skip


apply_rope = rotary


def swiglu(gate: GPUArray, up: GPUArray | None = None, out: GPUArray | None = None) -> GPUArray:
    """``silu(gate) * up`` (as ``pygpukit.ops.swiglu``; ``up`` None: ``gate`` holds [gate | up] along
    its last axis)."""
    name = "swiglu"
    gate, up, out = _unwrap(gate), _unwrap(up), _unwrap(out)
    gate = float_input(name, "gate", gate)
    if up is None:
        if gate.ndim == 0 or gate.shape[-1] % 2:
            raise ShapeError(f"{name}: a single input needs an even last axis (gate and up halves), got {gate.shape}")
        whole = gate
        half = gate.shape[-1] // 2
        gate, up = whole[..., :half], whole[..., half:]
        inputs: list[tuple[str, GPUArray | None]] = [("x", whole)]
    else:
        up = array(name, "up", up)
        same_dtype(name, "up", up, gate.dtype)
        if up.shape != gate.shape:
            raise ShapeError(f"{name}: gate has shape {gate.shape} but up has shape {up.shape}")
        inputs = [("gate", gate), ("up", up)]
    result = output(name, "out", out, gate.shape, gate.dtype)
    check_devices(name, [gate, up, result])
    count, gate_stride = rows(name, "gate", gate)
    _, up_stride = rows(name, "up", up)
    _, out_stride = rows(name, "out", result)
    check_overlap(name, [("out", result)], inputs, in_place=True)
    kernels = _start(name, gate, up, result)
    n = gate.shape[-1] if gate.ndim else 1
    if result.size == 0:
        return result
    block = _block(n, 1024)
    grid = (count, -(-n // block))
    with pygpukit_launches("swiglu"):
        kernels.swiglu_kernel[grid](gate, up, result, gate_stride, up_stride, out_stride, n, BLOCK=block,
                                    num_warps=4)  # fmt: skip
    return result


def _matrix(name: str, what: str, a: GPUArray, vector_axis: int) -> tuple[int, int, int, int, int, int]:
    """(batch, rows, cols, batch stride, row stride, col stride) of an operand of at most 3 dimensions;
    a vector becomes one row (``vector_axis`` 0, for a) or one column (1, for b)."""
    s = a._strides
    if a.ndim == 1:
        return (1, 1, a.shape[0], 0, 0, s[0]) if vector_axis == 0 else (1, a.shape[0], 1, 0, s[0], 0)
    if a.ndim == 2:
        return 1, a.shape[0], a.shape[1], 0, s[0], s[1]
    if a.ndim == 3:
        return (a.shape[0], a.shape[1], a.shape[2], s[0] if a.shape[0] > 1 else 0, s[1], s[2])
    raise ShapeError(f"{name}: the Triton matmul takes operands of 1 to 3 dimensions, got {what} of shape {a.shape}")


def matmul(
    a: GPUArray,
    b: GPUArray,
    *,
    out: GPUArray | None = None,
    use_tf32: bool | None = None,
    stream: Stream | None = None,
) -> GPUArray:
    """``a @ b`` (as ``pygpukit.ops.matmul``) for operands of 1 to 3 dimensions (a batch of 1
    broadcasts), float32, float16 or bfloat16 with float32 accumulation. float32 uses TF32 tensor
    cores only when the built-in op would (``use_tf32``, ``pygpukit.ops.get_tf32()``,
    ``PYGPUKIT_NO_TF32``), else exact IEEE fp32."""
    name = "matmul"
    a, b, out = _unwrap(a), _unwrap(b), _unwrap(out)
    a = array(name, "a", a)
    b = array(name, "b", b)
    if a.dtype not in (float32, float16, bfloat16):
        raise DTypeError(f"{name}: the Triton matmul takes float32, float16 or bfloat16, got {a.dtype}")
    same_dtype(name, "b", b, a.dtype)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"{name}: operands need at least one dimension, got {a.shape} and {b.shape}")
    ba, m, ka, sab, sam, sak = _matrix(name, "a", a, 0)
    bb, kb, n, sbb, sbk, sbn = _matrix(name, "b", b, 1)
    if ka != kb:
        raise ShapeError(f"{name}: inner dimensions differ: a {a.shape} and b {b.shape}")
    if ba != bb and 1 not in (ba, bb):
        raise ShapeError(f"{name}: batch dimensions {ba} and {bb} do not broadcast (a {a.shape}, b {b.shape})")
    batch = max(ba, bb)
    if batch > 65535:
        raise ShapeError(f"{name}: the Triton matmul takes at most 65535 batches (a grid axis), got {batch}")
    shape: tuple[int, ...] = ((batch,) if max(a.ndim, b.ndim) == 3 else ()) + (
        ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    )
    if out is None:
        result = empty(shape, a.dtype, stream=stream)  # stream-ordered for the stream it is written on
    else:
        result = output(name, "out", out, shape, a.dtype)
        if not result.is_contiguous:
            raise ShapeError(f"{name}: out must be contiguous, got strides {result.strides} (bytes)")
    check_devices(name, [a, b, result])
    check_overlap(name, [("out", result)], [("a", a), ("b", b)], in_place=False)
    from pygpukit.ops.gemm.api import _tf32_for

    tf32 = _tf32_for(use_tf32)  # the built-in op's rule: PYGPUKIT_NO_TF32 wins over use_tf32=True
    kernels = _start(name, a, b, result)
    if result.size == 0:
        return result
    scm, scn = n, 1
    scb = m * n if batch > 1 else 0
    precision = "ieee" if a.dtype == float32 and not tf32 else "tf32"
    if m <= 16:
        bm, bn, bk, warps, stages = 16, 64, 64, 4, 4
    elif a.dtype == float32 and precision == "ieee":
        bm, bn, bk, warps, stages = 64, 64, 32, 4, 3
    else:
        bm, bn, bk, warps, stages = 128, 128, 32 if a.dtype == float32 else 64, 8, 3
    grid = (-(-m // bm) * -(-n // bn), batch)

    def launch() -> None:
        kernels.matmul_kernel[grid](
            a, b, result, m, n, ka, sab, sam, sak, sbb, sbk, sbn, scb, scm, scn,
            PRECISION=precision, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages,
        )  # fmt: skip

    with pygpukit_launches("matmul"):
        if stream is None:
            launch()
        else:
            with stream:
                launch()
    return result
