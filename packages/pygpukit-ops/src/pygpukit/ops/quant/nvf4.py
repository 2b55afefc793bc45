"""NVF4 (NVFP4) weights: e2m1 values with one float8_e4m3 scale per 16 values and a float32 per-tensor
scale, the format of NVIDIA's FP4 checkpoints (ModelOpt ``weight``, ``weight_scale``, ``weight_scale_2``).

:class:`NVF4Tensor` holds a linear weight W (N, K), K a multiple of 16, as ``data`` uint8 (N, K / 2)
(two values a byte, element 2i in the low nibble: sign bit 3, exponent bits 2-1, mantissa bit 0;
magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6), ``scale`` float8_e4m3fn (N, K / 16) and ``global_scale`` (a
float): ``W[r, c] = e2m1(data)[r, c] * float(scale[r, c // 16]) * global_scale``, computed in float32
(the first product is exact, the second rounds once). :func:`quantize_nvf4` makes one: global_scale =
max |w| / (448 * 6) (1 for an all-zero weight), block scale = max |block| / 6 / global_scale cast to
float8_e4m3fn (round to nearest even), values w / (scale * global_scale) rounded to the nearest e2m1
value (ties to the even code, saturating at 6).

``pygpukit.ops.linear(x, q)``: up to 8 rows of x a dequantizing GEMV (native/kernels/quant/nvf4_gemv.cu,
for SM80 and later: nibbles decoded with integer operations, float32 accumulation); more rows: W
dequantized to x's dtype on the device, then the GEMM. Native SM100/SM120 block-scaled FP4
tensor-core kernels (tcgen05 / mma with ``kind::mxf4nvf4``) are not written. The CPU simulation
backend computes the product in float64 from the decoded weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import DType, float8_e4m3fn, float32, uint8
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import Stream

from .. import _cpu
from .._kernels import NAMESPACE, Groups, c_param, code_param, group, pointer, register_enumerator, size_param
from ..gemm._base import row_major_ld
from . import _linear

__all__ = ["E2M1_VALUES", "NVF4Tensor", "nvf4_linear", "quantize_nvf4"]

Array = np.ndarray[Any, Any]
_FILE = "quant/nvf4_gemv.cu"
_GROUP = 16
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
"""The value of each 4-bit e2m1 code."""
_MIDPOINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
_GEMV_PARAMS = [pointer("x"), pointer("w"), pointer("s"), pointer("y"), pointer("bias"), c_param("g", "float"),
                c_param("rows", "int"), c_param("n", "int"), c_param("k", "int"), size_param("ldx"),
                size_param("ldw"), size_param("ldy"), size_param("lds"), code_param("vector")]  # fmt: skip
_DEQUANT_PARAMS = [pointer("w"), pointer("s"), pointer("out"), c_param("g", "float"), c_param("n", "int"),
                   c_param("k", "int"), size_param("ldw"), size_param("lds")]  # fmt: skip
_KERNELS: PlanCache[JITKernel] = PlanCache("ops.nvf4")


def e2m1_codes(values: Array) -> Array:
    """float32 values (already divided by their scales) -> 4-bit e2m1 codes (uint8): nearest value,
    ties to the even code, magnitudes above 6 saturate to 6; negative values get the sign bit."""
    a = np.abs(values)
    code = np.searchsorted(_MIDPOINTS, a, side="left")  # midpoints below a (a tie rounds down here)
    tie = (code < 7) & (_MIDPOINTS[np.minimum(code, 6)] == a) & (code % 2 == 1)
    code = np.where(np.isnan(a), 0, code + tie).astype(np.uint8)
    sign = ((values < 0) & (code > 0)).astype(np.uint8) << 3
    result: Array = code | sign
    return result


class NVF4Tensor(_linear.WeightOnlyTensor):
    """A linear weight (N, K) in NVF4: ``data`` uint8 (N, K / 2), ``scale`` float8_e4m3fn (N, K / 16),
    both row-major, and ``global_scale`` (float)."""

    __slots__ = ("data", "global_scale", "scale", "shape")

    def __init__(self, data: GPUArray, scale: GPUArray, global_scale: float, k: int | None = None) -> None:
        name = "NVF4Tensor"
        if not isinstance(data, GPUArray) or not isinstance(scale, GPUArray):
            raise DTypeError(f"{name}: data and scale must be GPUArrays, got {type(data).__name__} and "
                             f"{type(scale).__name__}")  # fmt: skip
        if data.dtype != uint8 or scale.dtype != float8_e4m3fn:
            raise DTypeError(f"{name}: data must be uint8 and scale float8_e4m3fn, got {data.dtype} and {scale.dtype}")
        if data.ndim != 2 or row_major_ld(data) is None or scale.ndim != 2 or row_major_ld(scale) is None:
            raise ShapeError(f"{name}: data and scale must be row-major 2-D arrays, got shapes {data.shape} and "
                             f"{scale.shape}")  # fmt: skip
        n, half = int(data.shape[0]), int(data.shape[1])
        kk = 2 * half if k is None else int(k)
        if kk % _GROUP or kk != 2 * half or scale.shape != (n, kk // _GROUP):
            raise ShapeError(f"{name}: K = {kk} must be a multiple of 16 with data ({n}, {kk // 2}) and scale "
                             f"({n}, {kk // _GROUP}), got data {data.shape} and scale {scale.shape}")  # fmt: skip
        g = float(global_scale)
        if not np.isfinite(g) or g <= 0:
            raise ShapeError(f"{name}: global_scale must be a positive finite float, got {global_scale!r}")
        self.data, self.scale, self.global_scale = data, scale, g
        self.shape = (n, kk)

    def host_values(self) -> Array:
        """The decoded weight in float32 on the host (the device's values bit for bit)."""
        raw = _cpu.host(self.data)
        codes = np.stack([raw & 0x0F, raw >> 4], axis=-1).reshape(self.shape)
        s = _cpu.host(self.scale).astype(np.float32)
        values = E2M1_VALUES[codes] * np.repeat(s, _GROUP, axis=1)
        result: Array = (values * np.float32(self.global_scale)).astype(np.float32)
        return result

    def dequantize(self, dtype: Any = float32, *, stream: Stream | None = None) -> GPUArray:
        """The (N, K) weight on the device in ``dtype`` (float32, float16 or bfloat16; the float32 value
        rounded once)."""
        return _linear.dequantized(self, dtype, stream, _dequant)

    def __repr__(self) -> str:
        return f"NVF4Tensor(shape={self.shape}, global_scale={self.global_scale})"


def quantize_nvf4(w: Any, *, stream: Stream | None = None) -> NVF4Tensor:
    """``w`` (2-D float GPUArray or NumPy array (N, K), K a multiple of 16) as an :class:`NVF4Tensor`
    (see the module's description of the scales and rounding). Computed on the host in float32."""
    name = "quantize_nvf4"
    host = _linear.host_weight(name, w, stream)
    n, k = host.shape
    if k % _GROUP:
        raise ShapeError(f"{name}: K = {k} (shape {host.shape}) is not a multiple of the 16-value NVF4 blocks")
    values = np.asarray(host, dtype=np.float32)
    amax = float(np.abs(values).max()) if values.size else 0.0
    g = np.float32(amax / (448.0 * 6.0)) if amax > 0 else np.float32(1.0)
    if g == 0:  # amax so small that the quotient underflows
        g = np.float32(np.finfo(np.float32).tiny)
    blocks = values.reshape(n, k // _GROUP, _GROUP)
    block_max = np.abs(blocks).max(axis=2)
    scale = np.clip(block_max / np.float32(6.0) / g, 0.0, 448.0).astype(float8_e4m3fn.numpy)
    denominator = scale.astype(np.float32) * g
    with np.errstate(divide="ignore", invalid="ignore"):
        quotient = np.where(denominator[..., None] > 0, blocks / denominator[..., None], np.float32(0))
    codes = e2m1_codes(quotient.astype(np.float32)).reshape(n, k // 2, 2)
    packed = (codes[..., 0] | (codes[..., 1] << 4)).astype(np.uint8)
    return NVF4Tensor(from_numpy(packed, stream=stream), from_numpy(scale, stream=stream), float(g), k)


def _gemv_expression(dtype: DType, bucket: int) -> str:
    return f"{NAMESPACE}nvf4::nvf4_gemv<{dtype.ctype}, {bucket}>"


def _expressions(dtype: DType) -> tuple[str, ...]:
    return (*(_gemv_expression(dtype, b) for b in _linear.BUCKETS), f"{NAMESPACE}nvf4::nvf4_dequant<{dtype.ctype}>")


def _kernel(expression: str, params: list[Any], dtype: DType) -> JITKernel:
    return _linear.cached_kernel(
        _KERNELS, (expression,), lambda: group(_FILE, _expressions(dtype)).kernel(expression, params)
    )


def _dequant(w: NVF4Tensor, out: GPUArray) -> tuple[JITKernel, tuple[Any, ...]]:
    """The dequantize kernel of :meth:`NVF4Tensor.dequantize` into ``out`` and its arguments."""
    n, k = w.shape
    ldw, lds = row_major_ld(w.data), row_major_ld(w.scale)
    args = (w.data.device_ptr, w.scale.device_ptr, out.device_ptr, w.global_scale, n, k, ldw, lds)
    return _kernel(f"{NAMESPACE}nvf4::nvf4_dequant<{out.dtype.ctype}>", _DEQUANT_PARAMS, out.dtype), args


def _gemv(w: NVF4Tensor, x2: GPUArray, out: GPUArray, bias: GPUArray | None) -> _linear.GemvLaunch:
    """The GEMV launch of :func:`nvf4_linear` (up to 8 rows of x2)."""
    (rows, k), n = x2.shape, w.shape[0]
    ldw, lds = row_major_ld(w.data), row_major_ld(w.scale)
    assert ldw is not None  # checked by the constructor
    assert lds is not None
    x_ptr, w_ptr = x2.device_ptr, w.data.device_ptr
    vector = int(k % 32 == 0 and (x_ptr | w_ptr) % 16 == 0 and (k * x2.itemsize) % 16 == 0 and ldw % 16 == 0)
    args = (x_ptr, w_ptr, w.scale.device_ptr, out.device_ptr, 0 if bias is None else bias.device_ptr,
            w.global_scale, rows, n, k, k, ldw, n, lds, vector)  # fmt: skip
    return _kernel(_gemv_expression(x2.dtype, _linear.gemv_bucket(rows)), _GEMV_PARAMS, x2.dtype), args, -(-n // 8)


def nvf4_linear(x: GPUArray, w: NVF4Tensor, b: GPUArray | None = None, activation: str | None = None, *,
                stream: Stream | None = None, out: GPUArray | None = None) -> GPUArray:  # fmt: skip
    """``activation(x @ W.T + b)`` for an :class:`NVF4Tensor` ``w`` (N, K) and x (..., K) of float32,
    float16 or bfloat16 (``pygpukit.ops.linear`` hands such weights here)."""
    return _linear.linear_paths(x, w, NVF4Tensor, "an NVF4Tensor", (w.data, w.scale), b, activation, stream,
                                host_values=NVF4Tensor.host_values, prefill=_linear.dequantized_prefill,
                                gemv=_gemv, out=out)  # fmt: skip


def _enumerate() -> Groups:
    return {_FILE: [_expressions(d) for d in _linear.DTYPES]}


register_enumerator(_enumerate)
