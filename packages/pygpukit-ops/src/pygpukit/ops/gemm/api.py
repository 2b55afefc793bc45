"""Matrix products: ``matmul`` (2-D, batched, broadcasting), ``linear`` with fused epilogues, fp8
``scaled_matmul``, the TF32 switch and ``bias_add_inplace``.

Each call shape is checked and planned once (dispatch.py: GEMV, cuBLASLt, wgmma, mma.sync or the
CUDA-core kernel); the plan is kept in the family's plan cache, so a repeated call does one lookup
and its launch. Transposed views reach the kernels as transposed operands, never copied.

Precision: float32 is exact IEEE fp32 by default; TF32 tensor cores only when asked
(``use_tf32=True``, :func:`set_tf32` or ``PYGPUKIT_ALLOW_TF32=1``; ``PYGPUKIT_NO_TF32=1`` forbids them
whatever else says). float16 and bfloat16 accumulate in fp32. int8 accumulates in int32 and returns
int32. fp8 needs scales: :func:`scaled_matmul`.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from pygpukit.core import array as _array
from pygpukit.core.array import GPUArray
from pygpukit.core.backend import backend_state, env_flag
from pygpukit.core.dtypes import DType, as_dtype
from pygpukit.core.errors import CublasLtError, DeviceError, DTypeError, PyGPUkitError, ShapeError
from pygpukit.core.stream import Stream, thread_device

from .. import _route
from . import cublaslt, host
from ._base import PLANS, check_activation, device_props, row_major_ld
from .dispatch import DirectPlan, Problem, plan_for

if TYPE_CHECKING:
    from ..quant.tensor import QuantizedTensor, TransposedWeight
    from ..quant.weight_only import ChannelQuantizedTensor

__all__ = [
    "bias_add_inplace",
    "get_tf32",
    "linear",
    "linear_bias_gelu",
    "matmul",
    "scaled_matmul",
    "set_tf32",
]

_MATMUL_DTYPES = ("float64", "float32", "float16", "bfloat16", "int8")
_LINEAR_DTYPES = ("float32", "float16", "bfloat16", "float64")

_tf32: bool | None = None


def set_tf32(enabled: bool) -> None:
    """Allow (True) or forbid (False) TF32 tensor cores for float32 matmuls in this process."""
    global _tf32
    _tf32 = bool(enabled)


def get_tf32() -> bool:
    """Whether float32 matmuls may use TF32: never with ``PYGPUKIT_NO_TF32=1`` (an alias that forbids
    TF32 whatever else says); else what :func:`set_tf32` set; else ``PYGPUKIT_ALLOW_TF32=1``. The
    environment variables are read when a call shape is first planned (a call passing ``use_tf32``
    explicitly is bound by ``PYGPUKIT_NO_TF32`` too)."""
    if env_flag("PYGPUKIT_NO_TF32", False):
        return False
    if _tf32 is not None:
        return _tf32
    return env_flag("PYGPUKIT_ALLOW_TF32", False)


def _tf32_for(use_tf32: bool | None) -> bool:
    if use_tf32 is None:
        return get_tf32()
    if not isinstance(use_tf32, (bool, np.bool_)):
        raise DTypeError(f"use_tf32 must be True, False or None, got {type(use_tf32).__name__} {use_tf32!r}")
    return bool(use_tf32) and not env_flag("PYGPUKIT_NO_TF32", False)


def _broadcast_batch(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    if a_shape == b_shape:  # the common cases (2-D operands, equal batches) without NumPy's machinery
        return a_shape
    try:
        return tuple(np.broadcast_shapes(a_shape, b_shape))
    except ValueError:
        raise ShapeError(f"matmul: batch dimensions {a_shape} and {b_shape} do not broadcast") from None


def _check_pair(a: Any, b: Any, what: str) -> None:
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, GPUArray):
            raise DTypeError(f"{what}: {name} must be a GPUArray, got {type(x).__name__}")
        if x.ndim == 0:
            raise ShapeError(f"{what}: {name} must have at least 1 dimension, got a scalar")
    if a.buffer.device != b.buffer.device:
        raise DeviceError(f"{what}: a is on device {a.buffer.device}, b on device {b.buffer.device}")


def _check_out(out: Any, shape: tuple[int, ...], dtype: DType, what: str, device: int) -> None:
    if not isinstance(out, GPUArray):
        raise DTypeError(f"{what}: out must be a GPUArray, got {type(out).__name__}")
    if out.shape != shape:
        raise ShapeError(f"{what}: out must have shape {shape} (dtype {dtype.name}), got {out.shape}")
    if out.dtype != dtype:
        raise DTypeError(f"{what}: out must have dtype {dtype.name} (shape {shape}), got {out.dtype.name}")
    if out.buffer.device != device:
        raise DeviceError(f"{what}: out is on device {out.buffer.device}, the operands on device {device}")
    if not out.is_contiguous:
        raise ShapeError(f"{what}: out must be contiguous (got strides {out.strides})")


def _row(x: GPUArray) -> GPUArray:
    """A 1-D operand as a (1, K) matrix: a view, whatever its stride (reshape would copy)."""
    (size,), (stride,) = x._shape, x._strides
    return x._view((1, size), (stride * size, stride), x._offset)


def _column(x: GPUArray) -> GPUArray:
    """A 1-D operand as a (K, 1) matrix view."""
    (size,), (stride,) = x._shape, x._strides
    return x._view((size, 1), (stride, 1), x._offset)


def _plan(a2: GPUArray, b2: GPUArray, d: GPUArray, batch: tuple[int, ...], m: int, n: int, k: int,
          result_shape: tuple[int, ...], *, bias: GPUArray | None = None, code: int = 0, tf32: bool = False,
          scales: bool = False) -> DirectPlan | None:  # fmt: skip
    problem = Problem(a2, b2, d, batch, math.prod(batch) if batch else 1, m, n, k, bias, code, tf32, scales,
                      d.buffer.device, cublaslt.enabled())  # fmt: skip
    return plan_for(problem, result_shape)


def _quantized_matmul(a: GPUArray, w: Any, out: GPUArray | None, stream: Stream | None) -> GPUArray:
    """``a @ w.T`` for a quantized weight ``w`` (pygpukit.ops.quant): its linear, into ``out`` if given."""
    from ..quant.gemv import quantized_linear

    result = quantized_linear(a, w, stream=stream)
    if out is None:
        return result
    _check_out(out, result.shape, result.dtype, "matmul", result.buffer.device)
    out.copy_(result)
    return out


def matmul(
    a: GPUArray,
    b: GPUArray | TransposedWeight,
    *,
    out: GPUArray | None = None,
    use_tf32: bool | None = None,
    stream: Stream | None = None,
) -> GPUArray:
    """``a @ b`` with NumPy's rules: 1-D operands are vectors, leading dimensions broadcast as batches.

    Both operands must have the same dtype (float64, float32, float16, bfloat16 or int8; int8 gives
    int32). ``out`` (contiguous, the result's shape and dtype) receives the result when given. ``b``
    may be ``w.T`` of a quantized weight ``w`` (pygpukit.ops.quant): then ``linear(a, w)``.
    """
    if (
        _route.hook is not None
        and (routed := _route.hook("matmul", (a, b), {"out": out, "use_tf32": use_tf32, "stream": stream}))
        is not _route.BUILTIN
    ):
        return routed  # type: ignore[no-any-return]
    key = None
    if type(a) is GPUArray and type(b) is GPUArray and (out is None or type(out) is GPUArray):
        # TF32 as the plan sees it: asked for, else set_tf32's setting, else (None) the environment's.
        key = ("matmul", a._shape, a._strides, a._dtype, a._buffer.device, b._shape, b._strides, b._dtype,
               b._buffer.device, None if out is None else (out._shape, out._strides, out._dtype, out._buffer.device),
               _tf32 if use_tf32 is None else use_tf32)  # fmt: skip
        plan = PLANS.get(key)
        if plan is not None:
            return plan(a, b, None, out, stream)  # type: ignore[no-any-return]
    if use_tf32 is not None and not isinstance(use_tf32, (bool, np.bool_)):
        raise DTypeError(f"matmul: use_tf32 must be True, False or None, got {type(use_tf32).__name__} {use_tf32!r}")
    if not isinstance(b, GPUArray) and getattr(b, "_quantized_t", False):  # w.T of a quantized weight
        return _quantized_matmul(a, b.weight, out, stream)
    _check_pair(a, b, "matmul")
    assert isinstance(b, GPUArray)  # _check_pair raised otherwise
    if a.dtype != b.dtype:
        raise DTypeError(f"matmul needs operands of one dtype, got {a.dtype.name} and {b.dtype.name}")
    dtype = a.dtype
    if dtype.name.startswith("float8"):
        raise DTypeError(f"matmul of {dtype.name} needs scales: use scaled_matmul(a, b, scale_a, scale_b)")
    if dtype.name not in _MATMUL_DTYPES:
        raise DTypeError(f"matmul supports {', '.join(_MATMUL_DTYPES)}; got {dtype.name}")
    a2 = _row(a) if a.ndim == 1 else a
    b2 = _column(b) if b.ndim == 1 else b
    m, k = a2.shape[-2], a2.shape[-1]
    k2, n = b2.shape[-2], b2.shape[-1]
    if k != k2:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} do not align ({k} != {k2})")
    batch = _broadcast_batch(a2.shape[:-2], b2.shape[:-2])
    out_dtype = as_dtype("int32") if dtype.name == "int8" else dtype
    full_shape = (*batch, m, n)
    result_shape = full_shape
    if a.ndim == 1:
        result_shape = result_shape[:-2] + result_shape[-1:]
    if b.ndim == 1:
        result_shape = result_shape[:-1]
    if out is not None:
        _check_out(out, result_shape, out_dtype, "matmul", a.buffer.device)
        d = out if result_shape == full_shape else out.reshape(full_shape)
    else:
        d = _array.empty(full_shape, out_dtype, stream=stream)
    result = out if out is not None else d if result_shape == full_shape else d.reshape(result_shape)
    if d.size == 0:
        return result
    if k == 0:  # an empty sum
        d.copy_(_array.zeros(full_shape, out_dtype, stream=stream))
        return result
    if backend_state().name != "cuda":
        host.matmul(a2, b2, d)
        return result
    plan = _plan(a2, b2, d, batch, m, n, k, result_shape, tf32=_tf32_for(use_tf32) and dtype.name == "float32")
    if plan is None:  # every dtype here has the CUDA-core route
        raise PyGPUkitError(f"matmul: no GEMM kernel takes {dtype.name} {a.shape} @ {b.shape}")
    if key is not None:
        PLANS.put(key, plan)
    plan(a, b, None, d if out is None else out, stream)
    return result


def scaled_matmul(
    a: GPUArray,
    b: GPUArray,
    scale_a: GPUArray,
    scale_b: GPUArray,
    *,
    out_dtype: Any = "bfloat16",
    bias: GPUArray | None = None,
    scale_out: GPUArray | None = None,
    stream: Stream | None = None,
) -> GPUArray:
    """fp8 GEMM: ``(a * scale_a) @ (b * scale_b)`` with fp32 accumulation, result in ``out_dtype``
    (bfloat16, float16, float32, or float8_e4m3fn: then ``saturate(scale_out * product)``). a is (M, K)
    row-major, b (K, N) must be column-major (the transpose of a contiguous (N, K) weight, as ``w.T``).
    The scales are float32 device arrays of one kind for both (:mod:`pygpukit.ops.gemm.scaled`): one
    scalar each; per channel, (M,) and (N,); or per 128-block, (M, ceil(K/128)) M-major and
    (ceil(K/128), ceil(N/128)) (HF "fp8" checkpoints; Hopper). Needs a GPU of compute capability 8.9
    or newer and cuBLASLt (there is no built-in fp8 kernel)."""
    from . import scaled

    _check_pair(a, b, "scaled_matmul")
    for name, x in (("a", a), ("b", b)):
        if not x.dtype.name.startswith("float8"):
            raise DTypeError(f"scaled_matmul: {name} must be float8_e4m3fn or float8_e5m2, got {x.dtype.name}")
        if x.ndim != 2:
            raise ShapeError(f"scaled_matmul: {name} must be 2-D, got shape {x.shape}")
    if a.dtype.name == "float8_e5m2" and b.dtype.name == "float8_e5m2":
        raise DTypeError("scaled_matmul: a and b cannot both be float8_e5m2 (cuBLASLt has no such kernel)")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ShapeError(f"scaled_matmul: shapes {a.shape} and {b.shape} do not align ({k} != {k2})")
    kind = scaled.scale_kind(a, b, scale_a, scale_b)
    out_dt = as_dtype(out_dtype)
    if out_dt.name not in ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2"):
        raise DTypeError(
            f"scaled_matmul: out_dtype must be bfloat16, float16, float32 or float8_e4m3fn, got {out_dt.name}"
        )
    scaled.check_fp8_output(out_dt, kind, scale_out, bias)
    if k % 16 or n % 16:
        raise ShapeError(f"scaled_matmul: K and N must be multiples of 16 for fp8 GEMM, got K={k}, N={n}")
    if a._strides[1] != 1 or b._strides[0] != 1:
        raise ShapeError(
            f"scaled_matmul: a must be row-major and b column-major (pass w.T of a contiguous (N, K) w); "
            f"got strides {a.strides} and {b.strides}"
        )
    if bias is not None and (not isinstance(bias, GPUArray) or bias.shape != (n,) or bias.dtype != out_dt):
        raise ShapeError(f"scaled_matmul: bias must have shape ({n},) and dtype {out_dt.name}")
    state = backend_state()
    if state.name == "cuda":
        cc = device_props(thread_device()).capability
        if cc < (8, 9):
            raise DeviceError(f"scaled_matmul needs compute capability 8.9 or newer (fp8); this GPU is {cc}")
        if kind == "block" and cc[0] != 9:
            raise DeviceError(f"scaled_matmul: 128-block scales run on Hopper (compute capability 9.x); this GPU is "
                              f"{cc}")  # fmt: skip
    d = _array.empty((m, n), out_dt, stream=stream)
    if state.name != "cuda":
        scaled.host_scaled_matmul(a, b, scale_a, scale_b, kind, bias, d, scale_out)
        return d
    if d.size == 0:
        return d
    if not cublaslt.enabled():
        raise PyGPUkitError("scaled_matmul needs cuBLASLt (there is no built-in fp8 kernel); it was not found "
                            "or PYGPUKIT_NO_CUBLASLT=1 turned it off")  # fmt: skip
    device = a._buffer.device
    refusal = kind if kind != "tensor" else "fp8-out" if scale_out is not None else None
    if refusal is not None and scaled.native_unsupported(refusal, device):
        scaled.device_fallback(a, b, scale_a, scale_b, kind, bias, d, stream, scale_out)
        return d
    if bias is not None and refusal is not None and scaled.native_unsupported(refusal + "+bias", device):
        # this cuBLASLt scales this kind without a bias epilogue only: the bias added after, on the device
        return _bias_after(a, b, scale_a, scale_b, out_dt, bias, stream)
    key = ("scaled_matmul", a._shape, a._strides, a._dtype, device, b._shape, b._strides, b._dtype,
           b._buffer.device, out_dt, None if bias is None else (bias._strides, bias._buffer.device), kind)  # fmt: skip
    plan = PLANS.get(key)
    if plan is None:
        if kind == "tensor" and not out_dt.name.startswith("float8"):
            plan = _plan(a, b, d, (), m, n, k, (m, n), bias=bias, scales=True)
        else:
            plan = cublaslt.cublaslt_launch(
                (a.dtype, b.dtype, out_dt), m, n, k, 1, (True, row_major_ld(a) or k, 0), (False, b._strides[1], 0),
                (a.device_ptr, b.device_ptr, d.device_ptr), bias=None if bias is None else bias.dtype,
                scale_modes=scaled.MODES[kind], d_scale=scale_out is not None,
                scale_pointers=(scale_a.device_ptr, scale_b.device_ptr),
            )  # fmt: skip
        if plan is None and refusal is not None and bias is not None:  # maybe the bias epilogue: try without
            scaled.refuse(refusal + "+bias", device)
            return _bias_after(a, b, scale_a, scale_b, out_dt, bias, stream)
        if plan is None and refusal is not None:  # cuBLASLt before 12.9: no outer-vector or block scaling
            scaled.refuse(refusal, device)
            scaled.device_fallback(a, b, scale_a, scale_b, kind, bias, d, stream, scale_out)
            return d
        if plan is None:
            raise PyGPUkitError(f"scaled_matmul: cuBLASLt has no fp8 algorithm for {a.dtype.name} {a.shape} @ "
                                f"{b.dtype.name} {b.shape} -> {out_dt.name} on this device")  # fmt: skip
        PLANS.put(key, plan)
    launch = plan.launch if isinstance(plan, DirectPlan) else plan
    try:
        launch.run(a.device_ptr, b.device_ptr, d.device_ptr, 0 if bias is None else bias.device_ptr, stream,
                   scale_a.device_ptr, scale_b.device_ptr,
                   0 if scale_out is None else scale_out.device_ptr)  # fmt: skip
    except CublasLtError:
        if refusal is None:
            raise
        if bias is not None:  # an algorithm was found, but the launch refused: maybe the bias epilogue
            scaled.refuse(refusal + "+bias", device)
            return _bias_after(a, b, scale_a, scale_b, out_dt, bias, stream)
        scaled.refuse(refusal, device)  # an algorithm was found, but this cuBLASLt rejects the scale mode
        scaled.device_fallback(a, b, scale_a, scale_b, kind, bias, d, stream, scale_out)
    return d


def _bias_after(a: GPUArray, b: GPUArray, scale_a: GPUArray, scale_b: GPUArray, out_dt: DType, bias: GPUArray,
                stream: Stream | None) -> GPUArray:  # fmt: skip
    """scaled_matmul without the bias (cuBLASLt's scaled GEMM where it refused the bias epilogue with these
    scales, or the device fallback), then the bias added in place on ``stream``."""
    from ..elementwise import add

    d = scaled_matmul(a, b, scale_a, scale_b, out_dtype=out_dt, stream=stream)
    with stream if stream is not None else contextlib.nullcontext():
        add(d, bias.reshape(1, -1), out=d)
    return d


def linear(
    x: GPUArray,
    w: GPUArray | QuantizedTensor | ChannelQuantizedTensor,
    b: GPUArray | None = None,
    activation: str | None = None,
    *,
    out: GPUArray | None = None,
    stream: Stream | None = None,
) -> GPUArray:
    """``activation(x @ w.T + b)`` for a weight ``w`` of shape (out_features, in_features), like
    torch.nn.functional.linear; x is (..., in_features). ``w`` may be a GGUF block-quantized
    :class:`~pygpukit.ops.quant.QuantizedTensor` (then :func:`~pygpukit.ops.quant.quantized_linear`
    runs the product). ``activation`` is None, ``"relu"``,
    ``"gelu"`` (the exact erf form, torch's default), ``"gelu_tanh"`` (the tanh approximation) or
    ``"silu"``. The bias add and the activation are fused into the GEMM's epilogue; where cuBLASLt's
    epilogue has no such activation (exact GELU, SiLU) one fused elementwise kernel follows on the
    device. ``out`` (contiguous, shape (..., out_features), x's dtype) receives the result when given:
    nothing is allocated then (for a quantized ``w``, its result is copied into ``out``)."""
    key = None
    if (
        type(x) is GPUArray
        and type(w) is GPUArray
        and (b is None or type(b) is GPUArray)
        and (activation is None or type(activation) is str)
        and (out is None or type(out) is GPUArray)
    ):
        key = ("linear", x._shape, x._strides, x._dtype, x._buffer.device, w._shape, w._strides, w._dtype,
               w._buffer.device, None if b is None else (b._shape, b._strides, b._dtype, b._buffer.device),
               activation, _tf32,
               None if out is None else (out._shape, out._strides, out._dtype, out._buffer.device))  # fmt: skip
        plan = PLANS.get(key)
        if plan is not None:
            return plan(x, w, b, out, stream)  # type: ignore[no-any-return]
    if not isinstance(w, GPUArray) and getattr(w, "_quantized", False):
        from ..quant.gemv import quantized_linear  # a QuantizedTensor: its own GEMV/GEMM (pygpukit.ops.quant)

        if out is not None and not isinstance(out, GPUArray):
            raise DTypeError(f"linear: out must be a GPUArray, got {type(out).__name__}")
        return quantized_linear(x, w, b, activation, stream=stream, out=out)  # checks out's shape and dtype
    _check_pair(x, w, "linear")
    assert isinstance(w, GPUArray)  # _check_pair raised otherwise
    code = check_activation(activation, "linear")
    if w.ndim != 2:
        raise ShapeError(f"linear: w must be 2-D (out_features, in_features), got shape {w.shape}")
    if x.dtype != w.dtype:
        raise DTypeError(f"linear: x is {x.dtype.name} but w is {w.dtype.name}")
    if x.dtype.name not in _LINEAR_DTYPES:
        raise DTypeError(f"linear supports float32, float16, bfloat16 and float64; got {x.dtype.name}")
    out_features, in_features = w.shape
    if x.shape[-1] != in_features:
        raise ShapeError(f"linear: x has {x.shape[-1]} features, w expects {in_features} (w shape {w.shape})")
    if b is not None:
        if not isinstance(b, GPUArray):
            raise DTypeError(f"linear: b must be a GPUArray or None, got {type(b).__name__}")
        if b.shape != (out_features,):
            raise ShapeError(f"linear: b must have shape ({out_features},), got {b.shape}")
        if b.dtype != x.dtype:
            raise DTypeError(f"linear: b must have x's dtype {x.dtype.name}, got {b.dtype.name}")
        if b.buffer.device != x.buffer.device:
            raise DeviceError(f"linear: b is on device {b.buffer.device}, x on device {x.buffer.device}")
        if not b.is_contiguous:
            raise ShapeError(f"linear: b must be contiguous, got strides {b.strides}")
    lead = x.shape[:-1]
    rows = math.prod(lead) if lead else 1
    x2 = x.reshape(rows, in_features) if x.is_contiguous else x.contiguous(stream=stream).reshape(rows, in_features)
    result_shape = (*lead, out_features)
    if out is not None:
        _check_out(out, result_shape, x.dtype, "linear", x.buffer.device)
        d = out.reshape(rows, out_features)
    else:
        d = _array.empty((rows, out_features), x.dtype, stream=stream)
    if d.size == 0:
        return d.reshape(result_shape) if out is None else out
    if backend_state().name != "cuda":
        host.linear(x2, w, b, code, d)
        return d.reshape(result_shape) if out is None else out
    plan = _plan(x2, w.T, d, (), rows, out_features, in_features, result_shape, bias=b, code=code,
                 tf32=get_tf32() and x.dtype.name == "float32")  # fmt: skip
    if plan is None:
        raise PyGPUkitError(f"linear: no GEMM kernel takes {x.dtype.name} {x.shape} @ {w.shape}.T")
    if key is not None and x.is_contiguous:  # (else x2 is a copy of x)
        PLANS.put(key, plan)
    plan(x2, w, b, d, stream)
    return d.reshape(result_shape) if out is None else out


def linear_bias_gelu(x: GPUArray, w: GPUArray, b: GPUArray, *, stream: Stream | None = None) -> GPUArray:
    """``gelu(x @ w.T + b)`` with the exact (erf) GELU, torch.nn.functional.gelu's default; for the
    tanh approximation use ``linear(x, w, b, "gelu_tanh")``."""
    return linear(x, w, b, "gelu", stream=stream)


def bias_add_inplace(x: GPUArray, bias: GPUArray, *, stream: Stream | None = None) -> GPUArray:
    """``x += bias`` over the last axis, on the device; returns x."""
    if not isinstance(x, GPUArray) or not isinstance(bias, GPUArray):
        raise DTypeError("bias_add_inplace needs GPUArrays")
    if bias.ndim != 1 or x.ndim == 0 or bias.shape[0] != x.shape[-1]:
        raise ShapeError(f"bias_add_inplace: bias of shape {bias.shape} does not match the last axis of {x.shape}")
    if bias.dtype != x.dtype:
        raise DTypeError(f"bias_add_inplace: x is {x.dtype.name} but bias is {bias.dtype.name}")
    from .. import elementwise

    if stream is None:
        elementwise.add(x, bias, out=x)
    else:
        with stream:
            elementwise.add(x, bias, out=x)
    return x
