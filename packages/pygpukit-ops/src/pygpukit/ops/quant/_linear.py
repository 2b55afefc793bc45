"""What the weight-only quantized types (weight_only, int4, fp8_block, nvf4) share.

- :class:`WeightOnlyTensor`: their base (``ndim``, ``T``, the mark ``pygpukit.ops.linear`` looks for);
- :func:`linear_paths`: the body of their ``linear``, in one order for all: the argument checks and x
  as (rows, K) (:func:`linear_prologue`); no rows; the CPU simulation backend's float64 product
  (:func:`host_product`); more than :data:`MAX_ROWS` rows (prefill) through the format's ``prefill``
  (:func:`dequantized_prefill`: W dequantized to x's dtype, then the GEMM dispatch); else the format's
  GEMV kernel on ``stream``, then the activation in place;
- :func:`dequantized`: the body of a ``dequantize`` that runs one kernel (fp8_block, nvf4);
- the GEMV row buckets (:func:`gemv_bucket`), the kernel caches' lookup (:func:`cached_kernel`), the
  launch on a stream or the current one (:func:`launch_on`), the dtype check of ``dequantize``
  (:func:`dequantize_dtype`) and the quantizers' host copy of their input (:func:`host_weight`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType, as_dtype, bfloat16, float16, float32
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import Stream, thread_device

from .. import _cpu
from .._kernels import launch
from .._layout import check_devices, is_cuda
from ..gemm._base import check_activation, check_bias
from .tensor import TransposedWeight

BUCKETS = (1, 2, 4, 8)
"""The GEMV kernels' row template values: rows of x round up to one."""
MAX_ROWS = 8
"""The most rows of x the GEMV kernels take; more go through :func:`linear_paths`' ``prefill``."""
DTYPES = (float32, float16, bfloat16)
"""The dtypes of x (and of a dequantized weight)."""

Array = np.ndarray[Any, Any]
Prologue = tuple[GPUArray, tuple[int, ...], int, int, int, "GPUArray | None"]
"""What :func:`linear_prologue` returns: (x2, lead shape, rows, N, activation code, bias)."""
GemvLaunch = tuple[JITKernel, tuple[Any, ...], int]
"""A GEMV launch: the kernel, its arguments and the grid (blocks of 256 threads)."""
Gemv = Callable[[Any, GPUArray, GPUArray, "GPUArray | None"], GemvLaunch]
Prefill = Callable[[Any, GPUArray, "GPUArray | None", "str | None", "Stream | None"], GPUArray]
# linear_paths' decode calls already checked: (rows, N, result shape or None, activation code) per call shape
_DECODE: PlanCache[tuple[int, int, tuple[int, ...] | None, int]] = PlanCache("ops.quant_weight_decode")


class WeightOnlyTensor:
    """The base of the weight-only quantized types: a 2-D weight (N, K) (``shape``, set by the subclass)
    that ``pygpukit.ops.linear`` takes (``_quantized``) and ``matmul`` takes as ``w.T``."""

    __slots__ = ()
    _quantized = True  # what linear() looks for
    ndim = 2
    shape: tuple[int, int]

    @property
    def T(self) -> TransposedWeight:  # noqa: N802 (NumPy's name)
        """The (K, N) transpose, for ``pygpukit.ops.matmul(x, w.T)``."""
        return TransposedWeight(self)


def gemv_bucket(rows: int) -> int:
    """The row bucket (template value) a GEMV of ``rows`` rows of x (1 to :data:`MAX_ROWS`) runs."""
    return next(b for b in BUCKETS if b >= rows)


def cached_kernel(cache: PlanCache[JITKernel], key: tuple[Hashable, ...], make: Callable[[], JITKernel]) -> JITKernel:
    """The kernel ``cache`` keeps under ``key`` for the calling thread's device, made by ``make()`` (and
    kept) on the first call."""
    full = (*key, thread_device())
    kernel = cache.get(full)
    if kernel is None:
        kernel = cache.put(full, make())
    return kernel


def launch_on(kernel: JITKernel, args: tuple[Any, ...], grid: int, stream: Stream | None) -> None:
    """``kernel(*args)`` over ``grid`` blocks of 256 threads: the fast launch on the current stream when
    ``stream`` is None, else the full call on ``stream``."""
    if stream is None:
        launch(kernel, args, grid, 256)
    else:
        kernel(*args, grid=grid, block=256, stream=stream)


def dequantize_dtype(dtype: Any) -> DType:
    """``dtype`` of a ``dequantize`` call: float32, float16 or bfloat16 (else :class:`DTypeError`)."""
    target = as_dtype(dtype)
    if target not in DTYPES:
        raise DTypeError(f"dequantize: dtype must be float32, float16 or bfloat16, got {target}")
    return target


def dequantized(w: Any, dtype: Any, stream: Stream | None,
                kernel: Callable[[Any, GPUArray], tuple[JITKernel, tuple[Any, ...]]]) -> GPUArray:  # fmt: skip
    """``w.dequantize(dtype, stream=stream)``: the (N, K) weight in a new array of ``dtype`` (float32,
    float16 or bfloat16). The CPU simulation backend stores ``w.host_values()`` as float32 (then rounded
    once to ``dtype``); on the device ``kernel(w, out)`` gives the dequantize kernel and its arguments,
    launched on ``stream`` over ceil(N K / 256) blocks (at most 65536) of 256 threads."""
    target = dequantize_dtype(dtype)
    n, k = w.shape
    out = empty((n, k), target, stream=stream)
    if n * k == 0:
        return out
    if not is_cuda():
        _cpu.store(out, np.asarray(w.host_values(), dtype=np.float32))
        return out
    found, args = kernel(w, out)
    launch_on(found, args, min(-(-(n * k) // 256), 65536), stream)
    return out


def host_weight(name: str, w: Any, stream: Stream | None, *, floating: bool = True) -> Array:
    """A quantizer's input ``w`` on the host: a GPUArray (of a floating dtype) copied on ``stream``, a
    NumPy array as it is; it must be 2-D (N, K) and, with ``floating``, of a floating dtype (bfloat16
    included). Errors name ``name``."""
    if isinstance(w, GPUArray):
        if not w.dtype.is_floating:
            raise DTypeError(f"{name}: w must be a floating array, got {w.dtype}")
        host: Array = w.to_numpy(stream=stream)
    elif isinstance(w, np.ndarray):
        host = w
    else:
        raise DTypeError(f"{name}: w must be a GPUArray or a NumPy array, got {type(w).__name__}")
    if host.ndim != 2:
        raise ShapeError(f"{name}: w must be 2-D (N, K), got shape {host.shape}")
    if floating and host.dtype.kind != "f" and host.dtype.name != "bfloat16":
        raise DTypeError(f"{name}: w must be a floating array, got {host.dtype}")
    return host


def linear_prologue(x: Any, w: Any, kind: type[Any], noun: str, parts: Sequence[GPUArray], b: GPUArray | None,
                    activation: str | None, stream: Stream | None) -> Prologue:  # fmt: skip
    """The checks every quantized weight type's ``linear`` runs first (``w`` an instance of ``kind``,
    named ``noun`` in messages; ``parts``: its device arrays), then x as a contiguous (rows, K) view.
    Returns (x2, lead shape, rows, N, activation code, bias)."""
    op = "linear"
    if not isinstance(w, kind):
        raise DTypeError(f"{op}: w must be {noun}, got {type(w).__name__}")
    if not isinstance(x, GPUArray):
        raise DTypeError(f"{op}: x must be a GPUArray, got {type(x).__name__}")
    n, k = w.shape
    if x.dtype not in DTYPES:
        raise DTypeError(f"{op}: x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != k:
        raise ShapeError(f"{op}: x of shape {x.shape} does not have the weight's K = {k} features")
    code = check_activation(activation, op)
    bias = check_bias(b, n, x.dtype, op, x.dtype)
    check_devices(op, [v for v in (x, *parts, bias) if v is not None])
    lead = x.shape[:-1]
    rows = int(np.prod(lead)) if lead else 1
    x2 = x.reshape(rows, k) if x.is_contiguous else x.contiguous(stream=stream).reshape(rows, k)
    return x2, lead, rows, n, code, bias


def host_product(out: GPUArray, x2: GPUArray, weight: Any, bias: GPUArray | None, code: int) -> None:
    """The CPU simulation backend's ``linear``: ``x2 @ weight.T`` (``weight`` (N, K) on the host), the
    bias and the activation in float64, stored to ``out`` (one rounding)."""
    from ..gemm._base import apply_activation

    y = _cpu.host(x2).astype(np.float64) @ np.asarray(weight, dtype=np.float64).T
    if bias is not None:
        y = y + _cpu.host(bias).astype(np.float64)
    _cpu.store(out, apply_activation(y, code) if code else y)


def dequantized_prefill(w: Any, x2: GPUArray, bias: GPUArray | None, activation: str | None,
                        stream: Stream | None) -> GPUArray:  # fmt: skip
    """A ``prefill`` for :func:`linear_paths`: ``w.dequantize(x's dtype, stream=stream)``, then the GEMM
    dispatch (:func:`pygpukit.ops.linear`) on it."""
    from ..gemm.api import linear

    return linear(x2, w.dequantize(x2.dtype, stream=stream), bias, activation, stream=stream)


def w8a8_prefill(w: Any, x2: GPUArray, bias: GPUArray | None, activation: str | None, stream: Stream | None, *,
                 supported: bool, granularity: str, weight_scale: Callable[[], GPUArray]) -> GPUArray:  # fmt: skip
    """The W8A8 ``prefill`` of the FP8 weight types with activation_scheme "dynamic": x quantized on the
    device (:func:`~pygpukit.ops.quant.quantize_fp8` at ``granularity``), one fp8 GEMM with its scales and
    ``weight_scale()`` and the bias (:func:`pygpukit.ops.scaled_matmul`), then the activation; where the
    GEMM cannot run (not ``supported``) W8A16: the float64 product on the CPU simulation, else
    :func:`dequantized_prefill`."""
    from ..gemm._base import check_activation

    if not supported:
        if not is_cuda():
            out = empty((x2.shape[0], w.shape[0]), x2.dtype)
            host_product(out, x2, w.host_values(), bias, check_activation(activation, "linear"))
            return out
        return dequantized_prefill(w, x2, bias, activation, stream)
    from ..gemm.api import scaled_matmul
    from .fp8_act import quantize_fp8

    q, sx = quantize_fp8(x2, granularity, stream=stream)
    y = scaled_matmul(q, w.data.T, sx, weight_scale(), out_dtype=x2.dtype, bias=bias, stream=stream)
    if activation is not None:
        from .gemv import _activate

        _activate(y, check_activation(activation, "linear"), stream)
    return y


def linear_paths(x: Any, w: Any, kind: type[Any], noun: str, parts: Sequence[GPUArray], b: GPUArray | None,
                 activation: str | None, stream: Stream | None, *, host_values: Callable[[Any], Any], prefill: Prefill,
                 gemv: Gemv, host_prefill: bool = False, out: GPUArray | None = None) -> GPUArray:  # fmt: skip
    """``activation(x @ W.T + b)`` for a quantized weight ``w`` (N, K) and x (..., K): the body of every
    weight-only type's ``linear``. After :func:`linear_prologue` (the first eight arguments), in order:

    - more than :data:`MAX_ROWS` rows on the device (with ``host_prefill``, on either backend):
      ``prefill(w, x2, bias, activation, stream)``, nothing allocated before it;
    - no rows: the empty (..., N) result;
    - the CPU simulation backend: :func:`host_product` with the weight ``host_values(w)``;
    - else ``gemv(w, x2, out, bias)``'s kernel launched on ``stream`` (:func:`launch_on`), then the
      activation, if any, applied to ``out`` in place on ``stream``.

    ``out`` (a contiguous array of the result's shape and x's dtype) receives the result: the GEMV
    writes straight into it (nothing allocated, so a decode step can be captured); the other paths
    copy theirs in.
    """
    key = None
    if out is None and type(x) is GPUArray and x._contiguous and (b is None or type(b) is GPUArray):
        # A repeated decode call: the checks ran when its shape was first seen (the key holds everything they
        # read); the GEMV is chosen per call (it looks at the addresses' alignment).
        key = (kind, x._shape, x._dtype, x._buffer.device, w.shape, tuple(p._buffer.device for p in parts),
               None if b is None else (b._shape, b._strides, b._dtype, b._buffer.device), activation)  # fmt: skip
        plan = _DECODE.get(key)
        if plan is not None:
            rows, n, result_shape, code = plan
            x2 = x if x._shape == (rows, w.shape[1]) else x.reshape(rows, w.shape[1])
            result = empty((rows, n), x._dtype, stream=stream)
            kernel, args, grid = gemv(w, x2, result, b)
            launch_on(kernel, args, grid, stream)
            if code:
                from .gemv import _activate

                _activate(result, code, stream)
            return result if result_shape is None else result.reshape(result_shape)
    x2, lead, rows, n, code, bias = linear_prologue(x, w, kind, noun, parts, b, activation, stream)
    given = out
    if given is not None and not (
        isinstance(given, GPUArray) and given.dtype == x.dtype and given.size == rows * n and given.is_contiguous
    ):
        what = f"{getattr(given, 'dtype', type(given).__name__)} {getattr(given, 'shape', '')}"
        raise ShapeError(f"linear: out must be a contiguous {x.dtype.name} array of {(*lead, n)}, got {what}")
    if rows > MAX_ROWS and (host_prefill or is_cuda()):
        result = prefill(w, x2, bias, activation, stream).reshape((*lead, n))
        if given is None:
            return result
        given.copy_(result.reshape(given.shape))
        return given
    out = empty((rows, n), x.dtype, stream=stream) if given is None else given.reshape(rows, n)
    if rows == 0:
        return out.reshape((*lead, n)) if given is None else given
    if not is_cuda():
        host_product(out, x2, host_values(w), bias, code)
        return out.reshape((*lead, n)) if given is None else given
    kernel, args, grid = gemv(w, x2, out, bias)
    launch_on(kernel, args, grid, stream)
    if code:
        from .gemv import _activate

        _activate(out, code, stream)
    if key is not None:
        _DECODE.put(key, (rows, n, None if (*lead, n) == (rows, n) else (*lead, n), code))
    return out.reshape((*lead, n)) if given is None else given
