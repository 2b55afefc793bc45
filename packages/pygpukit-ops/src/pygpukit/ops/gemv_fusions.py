"""A one-row GEMV with the decode step's neighbours fused in (native/kernels/nn/fused_gemv.cu):
:func:`fused_gemv` computes ``[residual +] prologue(x) @ weight.T + bias`` in one launch, the
prologue being RMSNorm (the norm before a projection), SwiGLU (the MLP's gate | up halves before the
down projection) or nothing, and the optional residual add the transformer layer's. A decode step
of a small model is bound by kernel launches, not by bandwidth: a layer runs four of these where it
ran a norm, a GEMV, an activation and a residual add around each projection.

Every intermediate rounds where the separate ops round it (the normed or activated row to the
dtype, the projection to the dtype, then the residual sum), so the results equal the op chain's up
to the order of the float32 sums.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType, bfloat16, float16, float32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from . import _cpu
from ._kernels import NAMESPACE, Groups, group, register_enumerator
from ._layout import check_devices, is_cuda
from .gemm._base import device_props

__all__ = ["FUSED_GEMV_MAX_K", "fused_gemv", "fused_gemv_supported"]

_FILE = "nn/fused_gemv.cu"
_ARGS = KernelStruct(f"{NAMESPACE}FusedGemvArgs", _FILE, [
    ("x", "const void*"), ("norm_w", "const void*"), ("w", "const void*"), ("bias", "const void*"),
    ("residual", "const void*"), ("y", "void*"), ("ldw", "long long"), ("n", "int"), ("k", "int"), ("eps", "float"),
    ("pad", "int"),
])  # fmt: skip
_PARAMS = [_ARGS.param("args")]
_DTYPES = (float32, float16, bfloat16)
_NAMES = frozenset(d.name for d in _DTYPES)
_PROLOGUES = {None: 0, "rmsnorm": 1, "swiglu": 2}
_ROWS = 2  # rows of W per warp (R of the kernel)
_THREADS = 256
_ROWS_PER_BLOCK = _ROWS * _THREADS // 32
FUSED_GEMV_MAX_K = 40 * 1024  # bytes of the prologue's row in shared memory (K * itemsize; static + dynamic <= 48 KiB)
_NAME = "fused_gemv"


_HELD = (4, 8)  # N of the kernel: rows of at most 32 N 16-byte chunks are loaded into registers up front


def _held(k: int, itemsize: int, blocks: int) -> int:
    """The kernel's N for rows of ``k`` elements: the smallest of _HELD that holds a row, else 0 (streamed).
    N = 8 takes about 160 registers a thread (sm_90: one block of 256 threads an SM), so only grids of
    ``blocks`` that fit the device at once take it."""
    chunks = k * itemsize // 16
    if chunks <= 32 * 4:
        return 4
    if chunks <= 32 * 8 and blocks <= device_props(thread_device()).sms:
        return 8
    return 0


def _expression(dtype: DType, prologue: int, held: int) -> str:
    return f"{NAMESPACE}fused_gemv<{dtype.ctype}, {prologue}, {_ROWS}, {held}>"


def _expressions(dtype: DType) -> tuple[str, ...]:
    return tuple(_expression(dtype, p, n) for p in (0, 1, 2) for n in (0, *_HELD))


_kernels: PlanCache[JITKernel] = PlanCache("ops.fused_gemv.kernels")


def _kernel(dtype: DType, prologue: int, held: int = 0) -> JITKernel:
    key = (dtype.name, prologue, held)
    kernel = _kernels.get(key)
    if kernel is None:
        expression = _expression(dtype, prologue, held)
        kernel = _kernels.put(key, group(_FILE, _expressions(dtype)).kernel(expression, _PARAMS, programmatic=True))
    return kernel


def fused_gemv_supported(weight: Any, dtype: Any = None) -> bool:
    """Whether :func:`fused_gemv` takes ``weight`` (a dense (N, K) GPUArray): float32/float16/bfloat16
    (``dtype`` when given), unit stride along K, K a multiple of 16 bytes and within
    :data:`FUSED_GEMV_MAX_K` bytes, rows starting on 16-byte boundaries."""
    if type(weight) is not GPUArray or weight.ndim != 2 or weight._dtype.name not in _NAMES:
        return False
    if dtype is not None and weight._dtype.name != getattr(dtype, "name", dtype):
        return False
    item = weight.itemsize
    n, k = weight.shape
    if n < 1 or k < 1 or (k * item) % 16 or k * item > FUSED_GEMV_MAX_K or (k > 1 and weight._strides[1] != 1):
        return False
    return (weight._strides[0] * item) % 16 == 0 and weight.device_ptr % 16 == 0


def _vector(name: str, what: str, a: Any, size: int, dtype: str) -> GPUArray:
    if not isinstance(a, GPUArray):
        raise DTypeError(f"{_NAME}: {what} must be a GPUArray, got {type(a).__name__}")
    if a._dtype.name != dtype:
        raise DTypeError(f"{_NAME}: {what} must be {dtype} (the weight's dtype), got {a.dtype}")
    if a.size != size or not a.is_contiguous:
        raise ShapeError(f"{_NAME}: {what} must be contiguous with {size} elements ({name}), got shape {a.shape} "
                         f"and byte strides {a.strides}")  # fmt: skip
    return a


def fused_gemv(
    x: GPUArray,
    weight: GPUArray,
    *,
    prologue: str | None = None,
    norm_weight: GPUArray | None = None,
    eps: float = 1e-6,
    bias: GPUArray | None = None,
    residual: GPUArray | None = None,
    out: GPUArray | None = None,
) -> GPUArray:
    """``y = [residual +] (p @ weight.T [+ bias])`` for ONE row, in one launch; returns ``y`` (``out``
    or a fresh array of N elements, shaped (N,)).

    ``weight``: dense (N, K), see :func:`fused_gemv_supported`. ``prologue``: None (p = x, K
    values), ``"rmsnorm"`` (p = ``rmsnorm(x, norm_weight, eps)``, x of K values) or ``"swiglu"`` (p =
    ``silu(x[:K]) * x[K:]``, x of 2K values: the gate | up halves). x, norm_weight, bias, residual and
    out: contiguous, of the weight's dtype, any shape with that many elements (a (1, 1, N) decode
    buffer works). ``out`` may be ``residual`` itself (the residual stream updated in place), never
    x. p, the projection, the bias sum and the residual sum each round to the dtype, as the separate
    ops of the decoder's unfused step do (rmsnorm or swiglu, a GEMV, an add, add_rmsnorm)."""
    if prologue not in _PROLOGUES:
        raise ArgumentError(f"{_NAME}: prologue must be None, 'rmsnorm' or 'swiglu', got {prologue!r}")
    if not fused_gemv_supported(weight):
        found = f"{weight.dtype} {weight.shape} strides {weight.strides}" if isinstance(weight, GPUArray) else (
            type(weight).__name__)  # fmt: skip
        raise ShapeError(f"{_NAME}: weight must be a dense float32/float16/bfloat16 (N, K) array with unit stride "
                         f"along K, K * itemsize a multiple of 16 and at most {FUSED_GEMV_MAX_K} bytes, 16-byte "
                         f"aligned rows; got {found}")  # fmt: skip
    dt = weight._dtype.name
    n, k = weight.shape
    x = _vector("x", "x", x, 2 * k if prologue == "swiglu" else k, dt)
    if prologue == "rmsnorm":
        if norm_weight is None:
            raise ArgumentError(f"{_NAME}: prologue 'rmsnorm' needs norm_weight")
        norm_weight = _vector("K", "norm_weight", norm_weight, k, dt)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 <= float(eps) < float("inf"):
            raise ArgumentError(f"{_NAME}: eps must be a finite number >= 0, got {eps!r}")
    elif norm_weight is not None:
        raise ArgumentError(f"{_NAME}: norm_weight is only for prologue 'rmsnorm' (prologue is {prologue!r})")
    if bias is not None:
        bias = _vector("N", "bias", bias, n, dt)
    if residual is not None:
        residual = _vector("N", "residual", residual, n, dt)
    y = empty(n, weight.dtype) if out is None else _vector("N", "out", out, n, dt)
    if y.buffer is x.buffer:
        raise ArgumentError(f"{_NAME}: out must not share memory with x")
    check_devices(_NAME, [a for a in (x, weight, norm_weight, bias, residual, y) if a is not None])
    if not is_cuda():
        _cpu_fused_gemv(x, weight, prologue, norm_weight, float(eps), bias, residual, y)
        return y
    grid = -(-n // _ROWS_PER_BLOCK)
    kernel = _kernel(weight.dtype, _PROLOGUES[prologue], _held(k, weight.itemsize, grid))
    args = _ARGS.pack(x.device_ptr, 0 if norm_weight is None else norm_weight.device_ptr, weight.device_ptr,
                      0 if bias is None else bias.device_ptr, 0 if residual is None else residual.device_ptr,
                      y.device_ptr, weight._strides[0], n, k, float(eps), 0)  # fmt: skip
    kernel(args, grid=grid, block=_THREADS, shared_mem=k * weight.itemsize)
    return y


def _cpu_fused_gemv(x: GPUArray, weight: GPUArray, prologue: str | None, norm_weight: GPUArray | None, eps: float,
                    bias: GPUArray | None, residual: GPUArray | None, y: GPUArray) -> None:  # fmt: skip
    """The op chain on the host: each step in float64 and rounded where the separate ops round."""
    dtype = weight.dtype.numpy
    values = _cpu.host(x).reshape(-1).astype(np.float64)
    k = weight.shape[1]
    with np.errstate(all="ignore"):
        if prologue == "rmsnorm":
            assert norm_weight is not None
            values = values / np.sqrt((values * values).sum(axis=-1, keepdims=True) / k + eps)
            values = values * _cpu.host(norm_weight).reshape(-1).astype(np.float64)
        elif prologue == "swiglu":
            gate, up = values[:k], values[k:]
            values = gate / (1.0 + np.exp(-gate)) * up
        p = values.astype(dtype).astype(np.float64)
        result = np.matmul(p[None, :], _cpu.host(weight).astype(np.float64).T)[0].astype(dtype)
        if bias is not None:  # added to the rounded product (a GEMV into a buffer, then an add)
            result = (result.astype(np.float64) + _cpu.host(bias).reshape(-1).astype(np.float64)).astype(dtype)
        if residual is not None:
            result = (_cpu.host(residual).reshape(-1).astype(np.float64) + result.astype(np.float64)).astype(dtype)
    _cpu.store(y, result.reshape(y.shape))


def _enumerate() -> Groups:
    return {_FILE: [_expressions(d) for d in _DTYPES]}


register_enumerator(_enumerate)
