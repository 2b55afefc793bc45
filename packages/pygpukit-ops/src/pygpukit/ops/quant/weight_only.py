"""Weight-only quantization with per-channel scales: FP8 e4m3 (W8A16) and INT8.

:class:`ChannelQuantizedTensor` holds a linear weight W (N, K) as ``data`` (float8_e4m3fn or int8,
row-major) and ``scale`` (N,) float32: ``W[r, k] = scale[r] * data[r, k]``. :func:`quantize_per_channel`
makes one from float weights (scale = max |W[r]| / 448 for FP8, / 127 for INT8; FP8 values are the
float32 quotient cast to float8_e4m3fn with round-to-nearest-even, as ``torch``'s cast and ml_dtypes
round; INT8 values round half to even). ``pygpukit.ops.linear(x, cw)`` runs:

- up to 8 rows of x: a GEMV kernel reading the 1-byte weights with 16-byte loads, float32 accumulation,
  the scale applied once per output: from 2 rows (``MMA_MIN_ROWS``) on the tensor cores for fp16 /
  bf16 x and K a multiple of 64 (native/kernels/quant/wo_gemv_mma.cu: 16 rows of W per mma tile, the
  weights widened exactly to x's type in registers), else a warp per row (native/kernels/quant/wo_gemv.cu);
- more rows: W dequantized to x's dtype on the device, then the GEMM dispatch; or, for FP8 weights made
  with ``activation_scheme="dynamic"`` (what compressed-tensors "FP8-dynamic" and fbgemm_fp8 checkpoints
  run: per-token activation scales), W8A8: x quantized to float8_e4m3fn per row on the device
  (:func:`pygpukit.ops.quant.quantize_fp8` ``"row"``) and one fp8 GEMM with the per-row and per-channel
  scales (:func:`pygpukit.ops.scaled_matmul`, kind "channel") where that runs: K and N multiples of 16,
  compute capability 8.9 or newer (else the W8A16 path above).

The CPU simulation backend computes the product in float64 from the stored values and scales.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import DType, as_dtype, bfloat16, float16, float32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import Stream

from .. import _cpu
from .._kernels import NAMESPACE, Groups, c_param, code_param, group, pointer, register_enumerator, size_param
from .._layout import is_cuda
from ..gemm._base import row_major_ld
from . import _linear

__all__ = [
    "WEIGHT_ONLY_KINDS",
    "ChannelQuantizedTensor",
    "quantize_per_channel",
    "w8a8_supported",
    "weight_only_linear",
]

_FILE = "quant/wo_gemv.cu"
_MMA_FILE = "quant/wo_gemv_mma.cu"
_MMA_DTYPES = (float16, bfloat16)
USE_MMA_GEMV = True  # False: every call through wo_gemv.cu (benchmarks compare the two)
# Rows of x from which the tensor-core kernel is used: on the H100 (2026-12-07, 7B/8B shapes) the SIMT
# kernel read FP8 / INT8 weights at 77-85 % of the copy bandwidth at M = 1, the tensor-core one at 57-73 %;
# at M = 8 the tensor-core kernel was 2.4-3.2x faster.
MMA_MIN_ROWS = 2
WEIGHT_ONLY_KINDS = ("fp8_e4m3", "int8")
_STORAGE = {"fp8_e4m3": "float8_e4m3fn", "int8": "int8"}
_LIMIT = {"fp8_e4m3": 448.0, "int8": 127.0}
_PARAMS = [pointer("x"), pointer("w"), pointer("scale"), pointer("y"), pointer("bias"), c_param("rows", "int"),
           c_param("n", "int"), c_param("k", "int"), size_param("ldx"), size_param("ldw"), size_param("ldy"),
           code_param("vector")]  # fmt: skip
_KERNELS: PlanCache[JITKernel] = PlanCache("ops.weight_only_gemv")


def _kind(name: str, kind: Any) -> str:
    found = kind.lower() if isinstance(kind, str) else None
    found = {"fp8": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3"}.get(found or "", found)
    if found not in WEIGHT_ONLY_KINDS:
        raise ArgumentError(f"{name}: unsupported weight-only kind {kind!r}; supported: fp8_e4m3 (fp8), int8")
    return found


class ChannelQuantizedTensor(_linear.WeightOnlyTensor):
    """A linear weight (N, K) as 1-byte values ``data`` (float8_e4m3fn or int8, row-major with unit
    stride along K) times a per-row float32 ``scale`` (N,)."""

    __slots__ = ("activation_scheme", "data", "kind", "scale", "shape")

    def __init__(self, data: GPUArray, scale: GPUArray, kind: str | None = None, *,
                 activation_scheme: str | None = None) -> None:  # fmt: skip
        name = "ChannelQuantizedTensor"
        if not isinstance(data, GPUArray) or not isinstance(scale, GPUArray):
            raise DTypeError(f"{name}: data and scale must be GPUArrays, got {type(data).__name__} and "
                             f"{type(scale).__name__}")  # fmt: skip
        found = {"float8_e4m3fn": "fp8_e4m3", "int8": "int8"}.get(data.dtype.name)
        if found is None:
            raise DTypeError(f"{name}: data must be float8_e4m3fn or int8, got {data.dtype}")
        if kind is not None and _kind(name, kind) != found:
            raise DTypeError(f"{name}: kind {kind!r} does not match data of dtype {data.dtype}")
        if data.ndim != 2 or row_major_ld(data) is None:
            raise ShapeError(f"{name}: data must be a row-major 2-D (N, K) array, got shape {data.shape} and "
                             f"strides {data.strides}")  # fmt: skip
        n = data.shape[0]
        if scale.dtype != float32 or scale.shape != (n,) or not scale.is_contiguous:
            raise ShapeError(f"{name}: scale must be a contiguous float32 ({n},) array, got {scale.dtype} "
                             f"{scale.shape}")  # fmt: skip
        if activation_scheme not in (None, "dynamic"):
            raise ArgumentError(f"{name}: activation_scheme must be None (W8A16) or 'dynamic' (W8A8 prefill), "
                                f"got {activation_scheme!r}")  # fmt: skip
        if activation_scheme is not None and found != "fp8_e4m3":
            raise ArgumentError(f"{name}: activation_scheme 'dynamic' (W8A8) is for FP8 weights; {found} weights "
                                "run weight-only")  # fmt: skip
        self.data, self.scale, self.kind = data, scale, found
        self.shape = (int(n), int(data.shape[1]))
        self.activation_scheme = activation_scheme

    def with_rows(self, data: GPUArray, scale: GPUArray) -> ChannelQuantizedTensor:
        """A weight of this kind and activation scheme over other rows ``data`` and their ``scale`` (row
        views of this one, or rows of weights like it stacked)."""
        return ChannelQuantizedTensor(data, scale, self.kind, activation_scheme=self.activation_scheme)

    def host_values(self) -> Any:
        """The weight in float64 on the host (CPU backend): ``scale[:, None] * data``."""
        return _cpu.host(self.data).astype(np.float64) * _cpu.host(self.scale).astype(np.float64)[:, None]

    def dequantize(self, dtype: Any = float32, *, stream: Stream | None = None) -> GPUArray:
        """``scale[:, None] * data`` on the device, in ``dtype`` (float32, float16 or bfloat16), on ``stream``
        (default: the current one)."""
        from .. import elementwise

        target = _linear.dequantize_dtype(dtype)
        with stream if stream is not None else contextlib.nullcontext():
            wide = elementwise.mul(self.data.astype(float32), self.scale.reshape(self.shape[0], 1))
            return wide if target == float32 else wide.astype(target)

    def __repr__(self) -> str:
        scheme = "" if self.activation_scheme is None else f", activation_scheme={self.activation_scheme!r}"
        return f"ChannelQuantizedTensor({self.kind}, shape={self.shape}{scheme})"


def quantize_per_channel(w: Any, kind: str = "fp8_e4m3", *, stream: Stream | None = None,
                         activation_scheme: str | None = None) -> ChannelQuantizedTensor:  # fmt: skip
    """``w`` (2-D float GPUArray or NumPy array, (N, K)) as a :class:`ChannelQuantizedTensor` of
    ``kind`` ``"fp8_e4m3"`` (alias ``"fp8"``) or ``"int8"``: per row, scale = max |w| / 448 (FP8) or
    / 127 (INT8) (1 for an all-zero row) and values w / scale, cast to float8_e4m3fn with
    round-to-nearest-even (torch's and ml_dtypes' cast) or rounded half to even into int8. Computed
    on the host in float32. ``activation_scheme="dynamic"`` (FP8 only) makes the prefill W8A8."""
    name = "quantize_per_channel"
    found = _kind(name, kind)
    host = _linear.host_weight(name, w, stream, floating=False)
    values = np.asarray(host, dtype=np.float32)
    amax = np.abs(values).max(axis=1) if values.shape[1] else np.zeros(values.shape[0], np.float32)
    scale = np.where(amax > 0, amax / np.float32(_LIMIT[found]), np.float32(1)).astype(np.float32)
    quotient = values / scale[:, None]
    storage = as_dtype(_STORAGE[found])
    if found == "int8":
        data = np.clip(np.rint(quotient), -127, 127).astype(np.int8)
    else:
        data = np.clip(quotient, -448.0, 448.0).astype(storage.numpy)
    return ChannelQuantizedTensor(from_numpy(data, stream=stream), from_numpy(scale, stream=stream), found,
                                  activation_scheme=activation_scheme)  # fmt: skip


def _expression(w: DType, dtype: DType, bucket: int) -> str:
    return f"{NAMESPACE}wogemv::wo_gemv<{w.ctype}, {dtype.ctype}, {bucket}>"


def _expressions(w: DType, dtype: DType) -> tuple[str, ...]:
    return tuple(_expression(w, dtype, b) for b in _linear.BUCKETS)


def _kernel(w: DType, dtype: DType, rows: int) -> JITKernel:
    bucket = _linear.gemv_bucket(rows)
    return _linear.cached_kernel(
        _KERNELS,
        (w, dtype, bucket),
        lambda: group(_FILE, _expressions(w, dtype)).kernel(_expression(w, dtype, bucket), _PARAMS),
    )


def _mma_expression(w: DType, dtype: DType) -> str:
    return f"{NAMESPACE}qgemv::wo_gemv_mma<{w.ctype}, {dtype.ctype}>"


def _mma_kernel(w: DType, dtype: DType) -> JITKernel:
    expression = _mma_expression(w, dtype)
    return _linear.cached_kernel(_KERNELS, ("mma", w, dtype),
                                 lambda: group(_MMA_FILE, (expression,)).kernel(expression, _PARAMS))  # fmt: skip


def _gemv(w: ChannelQuantizedTensor, x2: GPUArray, out: GPUArray, bias: GPUArray | None) -> _linear.GemvLaunch:
    """The GEMV launch of :func:`weight_only_linear` (up to 8 rows of x2): the tensor-core kernel
    (wo_gemv_mma.cu, 16 rows of W per block) for at least MMA_MIN_ROWS rows of fp16 / bf16 x, K a
    multiple of 64 and W and its row stride 16-byte aligned; else wo_gemv.cu (a warp per row)."""
    (rows, k), n = x2.shape, w.shape[0]
    ldw = row_major_ld(w.data)
    assert ldw is not None  # checked by the constructor
    x_ptr, w_ptr = x2.device_ptr, w.data.device_ptr
    vector = int(k % 16 == 0 and (x_ptr | w_ptr) % 16 == 0 and (k * x2.itemsize) % 16 == 0 and ldw % 16 == 0)
    args = (x_ptr, w_ptr, w.scale.device_ptr, out.device_ptr, 0 if bias is None else bias.device_ptr, rows, n, k,
            k, ldw, n, vector)  # fmt: skip
    mma = USE_MMA_GEMV and rows >= MMA_MIN_ROWS and x2.dtype in _MMA_DTYPES
    if mma and k % 64 == 0 and w_ptr % 16 == 0 and ldw % 16 == 0:
        return _mma_kernel(w.data.dtype, x2.dtype), args, -(-n // 16)
    return _kernel(w.data.dtype, x2.dtype, rows), args, -(-n // 8)


def weight_only_linear(x: GPUArray, w: ChannelQuantizedTensor, b: GPUArray | None = None,
                       activation: str | None = None, *, stream: Stream | None = None,
                       out: GPUArray | None = None) -> GPUArray:  # fmt: skip
    """``activation(x @ W.T + b)`` for a :class:`ChannelQuantizedTensor` ``w`` (N, K) and x (..., K)
    of float32, float16 or bfloat16 (``pygpukit.ops.linear`` hands such weights here)."""
    dynamic = isinstance(w, ChannelQuantizedTensor) and w.activation_scheme == "dynamic"
    return _linear.linear_paths(x, w, ChannelQuantizedTensor, "a ChannelQuantizedTensor", (w.data, w.scale), b,
                                activation, stream, host_values=ChannelQuantizedTensor.host_values,
                                prefill=_w8a8_prefill if dynamic else _linear.dequantized_prefill, gemv=_gemv,
                                host_prefill=dynamic, out=out)  # fmt: skip


def w8a8_supported(w: ChannelQuantizedTensor, x: GPUArray) -> bool:
    """Whether :func:`weight_only_linear`'s prefill runs W8A8 for this weight and input (else W8A16):
    FP8 weights, K and N multiples of 16, float x, and on the GPU compute capability 8.9 or newer."""
    n, k = w.shape
    if w.kind != "fp8_e4m3" or k % 16 or n % 16 or x.dtype not in _linear.DTYPES:
        return False
    if not is_cuda():
        return True
    from pygpukit.core.stream import thread_device

    from ..gemm._base import device_props

    return device_props(thread_device()).capability >= (8, 9)


def _w8a8_prefill(w: ChannelQuantizedTensor, x2: GPUArray, bias: GPUArray | None, activation: str | None,
                  stream: Stream | None) -> GPUArray:  # fmt: skip
    """W8A8 prefill: x quantized per row to e4m3, one fp8 GEMM with the per-row and per-channel scales and
    the bias (scaled_matmul's "channel" kind: cuBLASLt's outer-vector scaling, or its device fallback where
    this cuBLASLt lacks it); W8A16 where the GEMM cannot run."""
    return _linear.w8a8_prefill(w, x2, bias, activation, stream, supported=w8a8_supported(w, x2), granularity="row",
                                weight_scale=lambda: w.scale)  # fmt: skip


def _enumerate() -> Groups:
    kinds = [as_dtype(s) for s in _STORAGE.values()]
    return {_FILE: [_expressions(w, d) for w in kinds for d in _linear.DTYPES],
            _MMA_FILE: [(_mma_expression(w, d),) for w in kinds for d in _MMA_DTYPES]}  # fmt: skip


register_enumerator(_enumerate)
