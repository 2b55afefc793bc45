"""Matrix products: ``matmul`` (2-D, batched, broadcasting), ``linear`` with fused epilogues, fp8
``scaled_matmul``, and the TF32 switch.

On the CUDA backend the work goes to cuBLASLt, loaded at run time (``pygpukit.core.cublaslt``), with
plans cached by shapes, dtypes, layouts and alignment and a per-stream workspace from the memory pool
(native/runtime/gemm.cpp). Without cuBLASLt, or with ``PYGPUKIT_NO_CUBLASLT=1``, built-in kernels run
instead. Transposed views are passed to cuBLASLt as transposed operands, never copied.

Precision: float32 is exact IEEE fp32 by default; TF32 tensor cores only when asked
(``use_tf32=True``, :func:`set_tf32` or ``PYGPUKIT_ALLOW_TF32=1``). float16 and bfloat16 accumulate in
fp32. int8 accumulates in int32 and returns int32. fp8 needs scales: :func:`scaled_matmul`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal

import numpy as np

from pygpukit.core import array as _array
from pygpukit.core.array import GPUArray
from pygpukit.core.backend import backend_state, env_flag
from pygpukit.core.dtypes import DType, as_dtype
from pygpukit.core.errors import DeviceError, DTypeError, PyGPUkitError, ShapeError
from pygpukit.core.stream import Stream, current_stream, thread_device

from . import _builtin_gemm

__all__ = [
    "bias_add_inplace",
    "get_tf32",
    "linear",
    "linear_bias_gelu",
    "matmul",
    "scaled_matmul",
    "set_tf32",
]

# cudaDataType_t values (see native/runtime/gemm.hpp)
_CUDA_TYPE = {"float32": 0, "float64": 1, "float16": 2, "int8": 3, "int32": 10, "bfloat16": 14,
              "float8_e4m3fn": 28, "float8_e5m2": 29}  # fmt: skip
_COMPUTE_32F, _COMPUTE_TF32, _COMPUTE_64F, _COMPUTE_32I = 68, 77, 70, 72
# cublasLtEpilogue_t: (activation, with bias) -> value
_EPILOGUE = {(None, False): 1, ("relu", False): 2, ("gelu", False): 32, (None, True): 4, ("relu", True): 6,
             ("gelu", True): 36}  # fmt: skip
# Problems cuBLASLt had no algorithm for (int8 with sizes it does not take): the built-in kernel runs them.
_unsupported: set[tuple[Any, ...]] = set()
_MATMUL_DTYPES = ("float64", "float32", "float16", "bfloat16", "int8")

_tf32: bool | None = None


def set_tf32(enabled: bool) -> None:
    """Allow (True) or forbid (False) TF32 tensor cores for float32 matmuls in this process."""
    global _tf32
    _tf32 = bool(enabled)


def get_tf32() -> bool:
    """Whether float32 matmuls may use TF32: :func:`set_tf32`, else ``PYGPUKIT_ALLOW_TF32=1``."""
    if _tf32 is not None:
        return _tf32
    return env_flag("PYGPUKIT_ALLOW_TF32", False)


def _use_cublaslt() -> bool:
    if env_flag("PYGPUKIT_NO_CUBLASLT", False):
        return False
    from pygpukit.core.cublaslt import is_cublaslt_available

    return is_cublaslt_available()


class _Operand:
    """A 2-D matrix (per batch) in cuBLASLt's column-major terms: rows x cols stored with leading
    dimension ``ld``; ``transposed`` when the memory holds its transpose."""

    __slots__ = ("array", "batch_stride", "ld", "transposed")

    def __init__(self, array: GPUArray, batch_stride: int, ld: int, transposed: bool) -> None:
        self.array, self.batch_stride, self.ld, self.transposed = array, batch_stride, ld, transposed


def _matrix_layout(rows: int, cols: int, s0: int, s1: int) -> tuple[str, int] | None:
    """('row', ld) when a rows x cols matrix with element strides (s0, s1) is row-major with leading
    dimension ld, ('col', ld) when column-major, None when neither (then it needs a copy)."""
    if s1 == 1 or cols == 1:
        ld = s0 if rows > 1 else max(cols, 1)
        if ld >= max(cols, 1):
            return "row", ld
    if s0 == 1 or rows == 1:
        ld = s1 if cols > 1 else max(rows, 1)
        if ld >= max(rows, 1):
            return "col", ld
    return None


def _batch_stride(shape: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """One element stride that walks the (row-major) batch index over these batch dims, or None."""
    stride: int | None = None
    expected: int | None = None
    for size, s in zip(reversed(shape), reversed(strides), strict=True):
        if size == 1:
            continue
        if stride is None:
            stride, expected = s, s * size
            continue
        if s != expected:
            return None
        expected = s * size
    return 0 if stride is None else stride


def _swap_last(x: GPUArray) -> GPUArray:
    """A view with the last two axes exchanged."""
    order = list(range(x.ndim))
    order[-1], order[-2] = order[-2], order[-1]
    return x.transpose(order)


def _element_strides(x: GPUArray) -> tuple[int, ...]:
    return tuple(s // x.itemsize for s in x.strides)


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


def matmul(
    a: GPUArray,
    b: GPUArray,
    *,
    out: GPUArray | None = None,
    use_tf32: bool | None = None,
    stream: Stream | None = None,
) -> GPUArray:
    """``a @ b`` with NumPy's rules: 1-D operands are vectors, leading dimensions broadcast as batches.

    Both operands must have the same dtype (float64, float32, float16, bfloat16 or int8; int8 gives
    int32). ``out`` (contiguous, the result's shape and dtype) receives the result when given.
    """
    key = None
    if type(a) is GPUArray and type(b) is GPUArray and (out is None or type(out) is GPUArray):
        key = ("matmul", _array_key(a), _array_key(b), None if out is None else _array_key(out))
        route = _routes.get(key)
        if route is not None:
            return route(a, b, None, out, stream)
    _check_pair(a, b, "matmul")
    if a.dtype != b.dtype:
        raise DTypeError(f"matmul needs operands of one dtype, got {a.dtype.name} and {b.dtype.name}")
    dtype = a.dtype
    if dtype.name.startswith("float8"):
        raise DTypeError(f"matmul of {dtype.name} needs scales: use scaled_matmul(a, b, scale_a, scale_b)")
    if dtype.name not in _MATMUL_DTYPES:
        raise DTypeError(f"matmul supports {', '.join(_MATMUL_DTYPES)}; got {dtype.name}")
    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    b2 = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
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
        _check_out(out, result_shape, out_dtype, "matmul")
        d = out if result_shape == full_shape else out.reshape(full_shape)
    else:
        d = _array.empty(full_shape, out_dtype, stream=stream)
    if d.size == 0:
        return d if result_shape == full_shape else d.reshape(result_shape)
    if k == 0:  # an empty sum
        d.copy_(_array.zeros(full_shape, out_dtype, stream=stream))
        return d if result_shape == full_shape else d.reshape(result_shape)
    tf32 = get_tf32() if use_tf32 is None else bool(use_tf32)
    state = backend_state()
    if state.name != "cuda":
        _cpu_matmul(a2, b2, d, tf32)
    else:
        launch = _gemm(a2, b2, d, batch, m, n, k, tf32=tf32, stream=stream)
        if launch is not None and key is not None and (out is None or result_shape == full_shape):
            _remember(key, _SmallRoute(full_shape, result_shape, out_dtype, launch))
    return d if result_shape == full_shape else d.reshape(result_shape)


class _SmallRoute:
    """A product that ran on the built-in GEMV, kept per call shape (operands' shapes, strides, dtypes
    and devices): the decode path repeats the same shapes every step, and a repeated call then only
    allocates its result (unless ``out`` is given) and launches (host time of a (1, 4096) @ (4096,
    4096) matmul: see docs/performance.md). The launch reads the addresses and their alignment anew
    on every call."""

    __slots__ = ("dtype", "full_shape", "launch", "result_shape")

    def __init__(self, full_shape: tuple[int, ...], result_shape: tuple[int, ...], dtype: DType,
                 launch: _builtin_gemm._GemvLaunch) -> None:  # fmt: skip
        self.full_shape = full_shape
        self.result_shape = None if result_shape == full_shape else result_shape
        self.dtype = dtype
        self.launch = launch

    def __call__(self, x: GPUArray, w: GPUArray, bias: GPUArray | None, out: GPUArray | None,
                 stream: Stream | None) -> GPUArray:  # fmt: skip
        d = _array.empty(self.full_shape, self.dtype, stream=stream) if out is None else out
        self.launch.run(x, w, d, bias, stream)
        return d if self.result_shape is None else d.reshape(self.result_shape)


_ROUTES_MAX = 4096
_routes: dict[tuple[Any, ...], _SmallRoute] = {}


def _array_key(x: GPUArray) -> tuple[Any, ...]:
    return (x._shape, x._strides, x._dtype, x._buffer.device)


def _remember(key: tuple[Any, ...], route: _SmallRoute) -> None:
    if len(_routes) >= _ROUTES_MAX:
        _routes.clear()
    _routes[key] = route


def _check_out(out: Any, shape: tuple[int, ...], dtype: DType, what: str) -> None:
    if not isinstance(out, GPUArray):
        raise DTypeError(f"{what}: out must be a GPUArray, got {type(out).__name__}")
    if out.shape != shape or out.dtype != dtype:
        raise ShapeError(
            f"{what}: out must have shape {shape} and dtype {dtype.name}, got {out.shape} {out.dtype.name}"
        )
    if not out.is_contiguous:
        raise ShapeError(f"{what}: out must be contiguous (got strides {out.strides})")


def _cpu_matmul(a: GPUArray, b: GPUArray, d: GPUArray, tf32: bool) -> None:
    """The CPU backend: float64 (int64 for int8) accumulation, rounded to the result dtype."""
    ha, hb = a.to_numpy(), b.to_numpy()
    if d.dtype.name == "int32":
        result = np.matmul(ha.astype(np.int64), hb.astype(np.int64)).astype(np.int32)
    else:
        wide = np.longdouble if d.dtype.name == "float64" else np.float64
        result = np.matmul(ha.astype(wide), hb.astype(wide)).astype(d.dtype.numpy)
    d.copy_(np.ascontiguousarray(result.reshape(d.shape)))


def _operand(x: GPUArray, batch: tuple[int, ...], rows: int, cols: int, stream: Stream | None) -> _Operand:
    """Describe x (..., rows, cols) broadcast to ``batch`` for cuBLASLt. It is copied (on the device)
    only when its layout cannot be expressed: neither matrix dimension unit-strided, or batch dims that
    one stride cannot walk (a partial broadcast)."""
    strides = _element_strides(x)
    pad = len(batch) - (x.ndim - 2)
    lead = (1,) * pad + tuple(x.shape[:-2])
    lead_strides = (0,) * pad + strides[:-2]
    batch_strides = tuple(0 if size == 1 else st for size, st in zip(lead, lead_strides, strict=True))
    layout = _matrix_layout(rows, cols, strides[-2], strides[-1])
    bstride = _batch_stride(batch, batch_strides)
    if layout is None or bstride is None:
        # Materialise the broadcast operand with C layout, on the device.
        full = x._view((*batch, rows, cols), (*batch_strides, strides[-2], strides[-1]), x._offset)
        x = full.contiguous(stream=stream)
        layout, bstride = ("row", max(cols, 1)), rows * cols
    kind, ld = layout
    # Row-major rows x cols is column-major cols x rows: the operand's transpose.
    return _Operand(x, bstride, ld, transposed=(kind == "row"))


def _gemm(
    a: GPUArray,
    b: GPUArray,
    d: GPUArray,
    batch: tuple[int, ...],
    m: int,
    n: int,
    k: int,
    *,
    tf32: bool,
    stream: Stream | None,
    bias: GPUArray | None = None,
    activation: str | None = None,
    scales: tuple[GPUArray, GPUArray] | None = None,
    alpha: float = 1.0,
) -> _builtin_gemm._GemvLaunch | None:
    """d (batch, m, n) row-major = a (.., m, k) @ b (.., k, n), through cuBLASLt or a built-in kernel.
    Returns the launch when the built-in GEMV ran it (see _SmallRoute), else None."""
    if m <= _GEMV_ROWS and not batch and scales is None and alpha == 1.0:
        launch = _gemv(a, b, d, bias, activation, stream)
        if launch is not None:
            return launch
    if not _use_cublaslt():
        _fallback(a, b, d, batch, m, n, k, bias=bias, activation=activation, scales=scales, alpha=alpha, stream=stream)
        return None
    # Row-major D (m x n) is column-major D^T (n x m) = B^T A^T: cuBLASLt's A is our b, its B our a.
    if a.dtype.name == "int8":  # integer tensor-core GEMMs exist only for the "TN" layout
        if _matrix_layout(k, n, *_element_strides(b)[-2:]) != ("col", k):
            b = _swap_last(_swap_last(b).contiguous(stream=stream))
        if _matrix_layout(m, k, *_element_strides(a)[-2:]) != ("row", k):
            a = a.contiguous(stream=stream)
    ob = _operand(b, batch, k, n, stream)  # column-major: b^T (n x k) when b is row-major
    oa = _operand(a, batch, m, k, stream)
    # cuBLASLt's op(A') must be n x k. b's memory as column-major is (n x k) when b is row-major: op N.
    trans_a = not ob.transposed
    trans_b = not oa.transposed
    dtype = a.dtype.name
    if dtype == "float64":
        compute, scale_type = _COMPUTE_64F, _CUDA_TYPE["float64"]
    elif dtype == "int8":
        compute, scale_type = _COMPUTE_32I, _CUDA_TYPE["int32"]
    elif dtype == "float32" and tf32:
        compute, scale_type = _COMPUTE_TF32, _CUDA_TYPE["float32"]
    else:
        compute, scale_type = _COMPUTE_32F, _CUDA_TYPE["float32"]
    epilogue = _EPILOGUE[(activation, bias is not None)]
    native = backend_state().native
    handle = (stream or current_stream()).handle
    batch_count = math.prod(batch) if batch else 1
    key = (dtype, m, n, k, batch_count, trans_a, trans_b, ob.ld, oa.ld)
    if key in _unsupported:
        _fallback(a, b, d, batch, m, n, k, bias=bias, activation=activation, scales=scales, alpha=alpha, stream=stream)
        return None
    try:
        _call_gemm(native, a, b, d, ob, oa, trans_a, trans_b, compute, scale_type, m, n, k, batch_count, bias,
                   epilogue, scales, alpha, handle)  # fmt: skip
    except PyGPUkitError as error:
        if dtype != "int8" or "no algorithm" not in str(error):
            raise
        _unsupported.add(key)
        _fallback(a, b, d, batch, m, n, k, bias=bias, activation=activation, scales=scales, alpha=alpha, stream=stream)
    return None


_GEMV_ROWS = 8  # up to this many rows of a, the built-in GEMV (memory-bound decode path) runs


def _gemv(
    a: GPUArray, b: GPUArray, d: GPUArray, bias: GPUArray | None, activation: str | None, stream: Stream | None
) -> _builtin_gemm._GemvLaunch | None:
    """Small-M products on the built-in GEMV kernels (native/kernels/gemv/gemv.cu), which read the
    weight once at close to the memory bandwidth: the launch that ran, or None when the layout or
    dtype is not one they take."""
    if a.dtype.name not in ("float32", "float16", "bfloat16") or a.ndim != 2 or b.ndim != 2:
        return None
    sb = _element_strides(b)
    layout: Literal["kn", "nk"]
    if sb[1] == 1 and sb[0] == b.shape[1]:
        layout, weight = "kn", b  # b stored (K, N)
    elif sb[0] == 1 and sb[1] == b.shape[0]:
        layout, weight = "nk", _swap_last(b)  # b is the transpose of a contiguous (N, K) weight
    else:
        return None
    try:
        launch = _builtin_gemm.gemv_launch(a, weight, d, w_layout=layout, bias=bias,
                                           activation=_GEMV_ACTIVATION[activation])  # fmt: skip
    except (ShapeError, DTypeError):
        return None
    if launch is not None:  # (None: nothing to launch, which _gemm's callers have ruled out)
        launch.run(a, weight, d, bias, stream)
    return launch


_GEMV_ACTIVATION = {None: None, "relu": "relu", "gelu": "gelu_tanh"}


def _fallback(a: GPUArray, b: GPUArray, d: GPUArray, batch: tuple[int, ...], m: int, n: int, k: int,
              **kwargs: Any) -> None:  # fmt: skip
    from ._gemm_fallback import gemm_fallback

    gemm_fallback(a, b, d, batch, m, n, k, **kwargs)


def _call_gemm(
    native: Any,
    a: GPUArray,
    b: GPUArray,
    d: GPUArray,
    ob: _Operand,
    oa: _Operand,
    trans_a: bool,
    trans_b: bool,
    compute: int,
    scale_type: int,
    m: int,
    n: int,
    k: int,
    batch_count: int,
    bias: GPUArray | None,
    epilogue: int,
    scales: tuple[GPUArray, GPUArray] | None,
    alpha: float,
    handle: int,
) -> None:
    native.gemm(
        _CUDA_TYPE[b.dtype.name], _CUDA_TYPE[a.dtype.name], _CUDA_TYPE[d.dtype.name], compute, scale_type,
        trans_a, trans_b, n, m, k, ob.ld, oa.ld, n, batch_count, ob.batch_stride, oa.batch_stride, m * n,
        ob.array.device_ptr, oa.array.device_ptr, d.device_ptr,
        bias.device_ptr if bias is not None else 0, _CUDA_TYPE[bias.dtype.name] if bias is not None else -1,
        epilogue, scales[1].device_ptr if scales else 0, scales[0].device_ptr if scales else 0, alpha, 0.0, handle,
    )  # fmt: skip


@functools.cache
def _compute_capability(device: int) -> tuple[int, int]:
    """Cached: reading the device properties costs a fraction of a millisecond."""
    from pygpukit.core.device import get_device_info

    major, minor = get_device_info(device).compute_capability
    return int(major), int(minor)


def scaled_matmul(
    a: GPUArray,
    b: GPUArray,
    scale_a: GPUArray,
    scale_b: GPUArray,
    *,
    out_dtype: Any = "bfloat16",
    bias: GPUArray | None = None,
    stream: Stream | None = None,
) -> GPUArray:
    """fp8 GEMM: ``(a * scale_a) @ (b * scale_b)`` with fp32 accumulation, result in ``out_dtype``
    (bfloat16, float16 or float32). a is (M, K) row-major, b (K, N) must be column-major (the transpose
    of a contiguous (N, K) weight, as ``w.T``); scales are float32 device scalars (shape () or (1,)).
    Needs a GPU of compute capability 8.9 or newer."""
    _check_pair(a, b, "scaled_matmul")
    for name, x in (("a", a), ("b", b)):
        if not x.dtype.name.startswith("float8"):
            raise DTypeError(f"scaled_matmul: {name} must be float8_e4m3fn or float8_e5m2, got {x.dtype.name}")
        if x.ndim != 2:
            raise ShapeError(f"scaled_matmul: {name} must be 2-D, got shape {x.shape}")
    if a.dtype.name == "float8_e5m2" and b.dtype.name == "float8_e5m2":
        raise DTypeError("scaled_matmul: a and b cannot both be float8_e5m2 (cuBLASLt has no such kernel)")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, GPUArray) or s.dtype.name != "float32" or s.size != 1:
            raise DTypeError(f"scaled_matmul: {name} must be a float32 GPUArray with one element")
    out_dt = as_dtype(out_dtype)
    if out_dt.name not in ("bfloat16", "float16", "float32"):
        raise DTypeError(f"scaled_matmul: out_dtype must be bfloat16, float16 or float32, got {out_dt.name}")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ShapeError(f"scaled_matmul: shapes {a.shape} and {b.shape} do not align ({k} != {k2})")
    if k % 16 or n % 16:
        raise ShapeError(f"scaled_matmul: K and N must be multiples of 16 for fp8 GEMM, got K={k}, N={n}")
    sa, sb = _element_strides(a), _element_strides(b)
    if sa[1] != 1 or sb[0] != 1:
        raise ShapeError(
            f"scaled_matmul: a must be row-major and b column-major (pass w.T of a contiguous (N, K) w); "
            f"got strides {a.strides} and {b.strides}"
        )
    state = backend_state()
    if state.name == "cuda":
        cc = _compute_capability(thread_device())
        if cc < (8, 9):
            raise DeviceError(f"scaled_matmul needs compute capability 8.9 or newer (fp8); this GPU is {cc}")
    if bias is not None and (bias.shape != (n,) or bias.dtype != out_dt):
        raise ShapeError(f"scaled_matmul: bias must have shape ({n},) and dtype {out_dt.name}")
    d = _array.empty((m, n), out_dt, stream=stream)
    if state.name != "cuda":
        ha = a.to_numpy().astype(np.float64) * float(scale_a.to_numpy().reshape(-1)[0])
        hb = b.to_numpy().astype(np.float64) * float(scale_b.to_numpy().reshape(-1)[0])
        result = ha @ hb + (bias.to_numpy().astype(np.float64) if bias is not None else 0.0)
        d.copy_(np.ascontiguousarray(result.astype(out_dt.numpy)))
        return d
    if not _use_cublaslt():
        raise PyGPUkitError("scaled_matmul needs cuBLASLt (there is no built-in fp8 kernel); it was not found")
    _gemm(a, b, d, (), m, n, k, tf32=False, stream=stream, bias=bias, scales=(scale_a, scale_b))
    return d


_ACTIVATIONS = (None, "relu", "gelu")


def linear(
    x: GPUArray,
    w: GPUArray,
    b: GPUArray | None = None,
    activation: str | None = None,
    *,
    stream: Stream | None = None,
) -> GPUArray:
    """``activation(x @ w.T + b)`` for a weight ``w`` of shape (out_features, in_features), like
    torch.nn.functional.linear; x is (..., in_features). The bias add and the activation (None, "relu",
    "gelu" in its tanh form) are fused into the GEMM's epilogue."""
    key = None
    if (
        type(x) is GPUArray
        and type(w) is GPUArray
        and (b is None or type(b) is GPUArray)
        and (activation is None or type(activation) is str)
    ):
        key = ("linear", _array_key(x), _array_key(w), None if b is None else _array_key(b), activation)
        route = _routes.get(key)
        if route is not None:
            return route(x, w, b, None, stream)
    _check_pair(x, w, "linear")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {_ACTIVATIONS}, got {activation!r}")
    if w.ndim != 2:
        raise ShapeError(f"linear: w must be 2-D (out_features, in_features), got shape {w.shape}")
    if x.dtype != w.dtype:
        raise DTypeError(f"linear: x is {x.dtype.name} but w is {w.dtype.name}")
    if x.dtype.name not in ("float32", "float16", "bfloat16", "float64"):
        raise DTypeError(f"linear supports float32, float16, bfloat16 and float64; got {x.dtype.name}")
    out_features, in_features = w.shape
    if x.shape[-1] != in_features:
        raise ShapeError(f"linear: x has {x.shape[-1]} features, w expects {in_features} (w shape {w.shape})")
    if b is not None and (not isinstance(b, GPUArray) or b.shape != (out_features,) or b.dtype != x.dtype):
        raise ShapeError(f"linear: b must have shape ({out_features},) and dtype {x.dtype.name}")
    lead = x.shape[:-1]
    rows = math.prod(lead) if lead else 1
    x2 = x.reshape(rows, in_features) if x.is_contiguous else x.contiguous(stream=stream).reshape(rows, in_features)
    d = _array.empty((rows, out_features), x.dtype, stream=stream)
    if d.size == 0:
        return d.reshape((*lead, out_features))
    state = backend_state()
    if state.name != "cuda":
        hx, hw = x2.to_numpy().astype(np.float64), w.to_numpy().astype(np.float64)
        result = hx @ hw.T
        if b is not None:
            result = result + b.to_numpy().astype(np.float64)
        result = _cpu_activation(result, activation)
        d.copy_(np.ascontiguousarray(result.astype(x.dtype.numpy)))
    else:
        launch = _gemm(x2, w.T, d, (), rows, out_features, in_features, tf32=get_tf32(), stream=stream, bias=b,
                       activation=activation)  # fmt: skip
        if launch is not None and key is not None and x.is_contiguous:  # (else x2 is a copy of x)
            _remember(key, _SmallRoute(d.shape, (*lead, out_features), x.dtype, launch))
    return d.reshape((*lead, out_features))


def _cpu_activation(x: np.ndarray[Any, Any], activation: str | None) -> np.ndarray[Any, Any]:
    if activation == "relu":
        relu: np.ndarray[Any, Any] = np.maximum(x, 0.0)
        return relu
    if activation == "gelu":
        gelu: np.ndarray[Any, Any] = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
        return gelu
    return x


def linear_bias_gelu(x: GPUArray, w: GPUArray, b: GPUArray, *, stream: Stream | None = None) -> GPUArray:
    """``gelu(x @ w.T + b)`` (tanh GELU) with the bias and activation fused into the GEMM."""
    return linear(x, w, b, "gelu", stream=stream)


def bias_add_inplace(x: GPUArray, bias: GPUArray, *, stream: Stream | None = None) -> GPUArray:
    """``x += bias`` over the last axis, on the device; returns x."""
    if not isinstance(x, GPUArray) or not isinstance(bias, GPUArray):
        raise DTypeError("bias_add_inplace needs GPUArrays")
    if bias.ndim != 1 or x.ndim == 0 or bias.shape[0] != x.shape[-1]:
        raise ShapeError(f"bias_add_inplace: bias of shape {bias.shape} does not match the last axis of {x.shape}")
    if bias.dtype != x.dtype:
        raise DTypeError(f"bias_add_inplace: x is {x.dtype.name} but bias is {bias.dtype.name}")
    from . import elementwise

    elementwise.add(x, bias, out=x)
    return x
