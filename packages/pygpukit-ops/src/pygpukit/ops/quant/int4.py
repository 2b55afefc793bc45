"""Group-quantized INT4 weight-only (W4A16) in the AWQ and GPTQ packings of HF checkpoints.

:class:`Int4Tensor` holds a linear weight W (N, K) exactly as an AWQ or GPTQ checkpoint stores it
(``qweight``, ``qzeros``, ``scales``; layouts in :mod:`pygpukit.ops.quant.int4_pack` and
docs/quantization.md), with ``W[n, k] = scales[k // g, n] * (q[k, n] - zero[k // g, n])``.
``pygpukit.ops.linear(x, w)`` (and ``matmul(x, w.T)``) runs:

- up to 8 rows of x: one GEMV kernel (native/kernels/quant/int4_gemv.cu) that reads the packed words
  directly, float32 accumulation;
- more rows (prefill): W dequantized to x's dtype on the device in row tiles of at most
  ``PREFILL_TILE_BYTES``, each through the GEMM dispatch.

:func:`quantize_int4` is the float64 NumPy round-to-nearest quantizer (min/max per group, or
symmetric). The CPU simulation backend computes the product in float64 from the decoded weights.
GPTQ's act-order (``desc_act=True``: g_idx not equal to k // g) is refused with :class:`ActOrderError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty, from_numpy
from pygpukit.core.dtypes import DType, bfloat16
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import Stream

from .. import _cpu
from .._kernels import NAMESPACE, Groups, c_param, code_param, group, pointer, register_enumerator, size_param
from .._layout import is_cuda
from . import _linear
from . import int4_pack as _pack
from .int4_pack import GROUP_SIZES, PACKINGS

__all__ = ["INT4_PACKINGS", "ActOrderError", "Int4Tensor", "concat_out_features", "int4_linear", "quantize_int4"]

INT4_PACKINGS = PACKINGS
_FILE = "quant/int4_gemv.cu"
_LAYOUT = {"awq": 0, "gptq": 1}
_BLOCK_COLUMNS = {"awq": 32, "gptq": 16}  # Shape::kBlockCols of the kernel: output columns per block
_PREFILL_TILE_BYTES = 256 << 20
_GEMV_PARAMS = [pointer("x"), pointer("qweight"), pointer("qzeros"), pointer("scales"), pointer("y"),
                pointer("bias"), c_param("rows", "int"), c_param("n", "int"), c_param("k", "int"),
                c_param("group", "int"), c_param("zero_offset", "int"), size_param("ldx"), size_param("ldy"),
                code_param("vector")]  # fmt: skip
_DEQUANT_PARAMS = [pointer("qweight"), pointer("qzeros"), pointer("scales"), pointer("out"), c_param("n", "int"),
                   c_param("k", "int"), c_param("group", "int"), c_param("zero_offset", "int"),
                   c_param("first", "int"), c_param("count", "int")]  # fmt: skip
_KERNELS: PlanCache[JITKernel] = PlanCache("ops.int4")


class ActOrderError(ArgumentError):
    """A GPTQ weight quantized with act-order (desc_act=True: g_idx is not k // group_size)."""


def _device_array(name: str, value: Any, dtypes: tuple[str, ...], shape: tuple[int, ...],
                  stream: Stream | None) -> GPUArray:  # fmt: skip
    if isinstance(value, np.ndarray):
        value = from_numpy(np.ascontiguousarray(value), stream=stream)
    if not isinstance(value, GPUArray):
        raise DTypeError(f"Int4Tensor: {name} must be a GPUArray or a NumPy array, got {type(value).__name__}")
    if value.dtype.name not in dtypes:
        raise DTypeError(f"Int4Tensor: {name} must be {' or '.join(dtypes)}, got {value.dtype}")
    if value.shape != shape:
        raise ShapeError(f"Int4Tensor: {name} must have shape {shape}, got {value.shape}")
    array: GPUArray = value if value.is_contiguous else value.contiguous(stream=stream)
    return array


class Int4Tensor(_linear.WeightOnlyTensor):
    """A linear weight (N, K) = (out_features, in_features) quantized to 4 bits in groups of
    ``group_size`` input features, held on the device in a checkpoint's packing:

    - ``"awq"``: ``qweight`` int32 (K, N / 8), ``qzeros`` int32 (K / g, N / 8), ``scales`` float16 (K / g, N);
    - ``"gptq"``: ``qweight`` int32 (K / 8, N), ``qzeros`` int32 (K / g, N / 8) storing zero -
      ``zero_offset`` (1: the "gptq" checkpoint format, 0: "gptq_v2"), ``scales`` float16 (K / g, N).

    The arrays may be GPUArrays or NumPy arrays (uploaded); int32 or uint32 words. ``g_idx`` (GPTQ,
    optional) must be ``k // group_size`` (act-order is refused with :class:`ActOrderError`)."""

    __slots__ = ("_host", "group_size", "packing", "qweight", "qzeros", "scales", "shape", "zero_offset")

    def __init__(self, qweight: Any, qzeros: Any, scales: Any, packing: str, group_size: int, *,
                 g_idx: Any = None, zero_offset: int | None = None, stream: Stream | None = None) -> None:  # fmt: skip
        name = "Int4Tensor"
        self.packing = _pack.packing_name(name, packing)
        if group_size not in GROUP_SIZES:
            raise ArgumentError(f"{name}: group_size must be one of {GROUP_SIZES}, got {group_size!r}")
        if not hasattr(scales, "shape") or len(scales.shape) != 2:
            raise ShapeError(f"{name}: scales must be 2-D (K / group_size, N), got {getattr(scales, 'shape', None)}")
        groups, n = (int(d) for d in scales.shape)
        k = groups * group_size
        if n % 8 or n <= 0 or k <= 0:
            raise ShapeError(f"{name}: scales of shape {scales.shape} give N = {n}, K = {k}; N must be a positive "
                             f"multiple of 8")  # fmt: skip
        words = ("int32", "uint32")
        shape_w = (k, n // 8) if self.packing == "awq" else (k // 8, n)
        self.qweight = _device_array("qweight", qweight, words, shape_w, stream)
        self.qzeros = _device_array("qzeros", qzeros, words, (groups, n // 8), stream)
        self.scales = _device_array("scales", scales, ("float16",), (groups, n), stream)
        if zero_offset is None:
            zero_offset = 1 if self.packing == "gptq" else 0
        if (self.packing == "awq" and zero_offset != 0) or zero_offset not in (0, 1):
            raise ArgumentError(f"{name}: zero_offset {zero_offset!r} is not valid for {self.packing} (AWQ: 0; "
                                f"GPTQ: 1 for 'gptq', 0 for 'gptq_v2')")  # fmt: skip
        if g_idx is not None:
            host = g_idx.to_numpy() if isinstance(g_idx, GPUArray) else np.asarray(g_idx)
            if self.packing != "gptq" or host.shape != (k,):
                raise ShapeError(f"{name}: g_idx (GPTQ only) must have shape ({k},), got {host.shape}")
            if not np.array_equal(host.astype(np.int64), np.arange(k) // group_size):
                raise ActOrderError(f"{name}: g_idx is not k // {group_size} (act-order, desc_act=True); only "
                                    f"desc_act=False GPTQ weights are supported")  # fmt: skip
        self.group_size, self.zero_offset = int(group_size), int(zero_offset)
        self.shape = (n, k)
        self._host: Any = None

    @property
    def nbytes(self) -> int:
        return int(self.qweight.nbytes + self.qzeros.nbytes + self.scales.nbytes)

    def unpacked(self) -> tuple[Any, Any, Any]:
        """(q (K, N), zero points (K / g, N), scales (K / g, N)) on the host, from the packed words."""
        q = _pack.unpack_qweight(self.qweight.to_numpy(), self.packing)
        z = _pack.unpack_qzeros(self.qzeros.to_numpy(), self.packing, self.zero_offset)
        return q, z, self.scales.to_numpy()

    def host_weights(self) -> Any:
        """The weight (N, K) decoded on the host in float64 (exact: (q - z) * s), kept once computed."""
        if self._host is None:
            q, z, s = self.unpacked()
            g = self.group_size
            wide = (q.astype(np.float64) - np.repeat(z, g, axis=0)) * np.repeat(s.astype(np.float64), g, axis=0)
            self._host = np.ascontiguousarray(wide.T)
        return self._host

    def dequantize(self, dtype: Any = bfloat16, *, stream: Stream | None = None) -> GPUArray:
        """W (N, K) on the device in float32 (exact), float16 or bfloat16 (rounded once)."""
        return self.dequantize_rows(0, self.shape[0], dtype, stream=stream)

    def dequantize_rows(
        self, first: int, last: int, dtype: Any = bfloat16, *, stream: Stream | None = None
    ) -> GPUArray:
        """Rows [first, last) of W, (last - first, K), decoded on the device to ``dtype``."""
        target = _linear.dequantize_dtype(dtype)
        n, k = self.shape
        if not 0 <= first < last <= n:
            raise ShapeError(f"dequantize: rows [{first}, {last}) are not a non-empty range of {n} rows")
        out = empty((last - first, k), target, stream=stream)
        if not is_cuda():
            _cpu.store(out, self.host_weights()[first:last])
            return out
        kernel = _kernel("dequant", self.packing, target, 0)
        args = (self.qweight.device_ptr, self.qzeros.device_ptr, self.scales.device_ptr, out.device_ptr, n, k,
                self.group_size, self.zero_offset, first, last - first)  # fmt: skip
        grid = max(1, min(-(-(last - first) * (k // 16) // 256), 1 << 16))  # a thread per 16 elements
        _linear.launch_on(kernel, args, grid, stream)
        return out

    def __repr__(self) -> str:
        return f"Int4Tensor({self.packing}, group_size={self.group_size}, shape={self.shape})"


def quantize_int4(w: Any, group_size: int = 128, packing: str = "awq", symmetric: bool = False, *,
                  stream: Stream | None = None) -> Int4Tensor:  # fmt: skip
    """``w`` (a 2-D float GPUArray or NumPy array (N, K), K a multiple of ``group_size`` (32, 64 or
    128), N of 8) quantized to 4 bits per group of ``group_size`` input features by the float64
    round-to-nearest reference (:func:`~pygpukit.ops.quant.int4_pack.quantize_groups`: min/max per
    group, or ``symmetric`` with zero point 8) and packed as an AWQ or GPTQ checkpoint stores it. The
    GPTQ packing ("gptq" format, zero - 1 stored) cannot hold a zero point of 0: its zero points are
    clipped to 1..15."""
    name = "quantize"
    packing = _pack.packing_name(name, packing)
    host = _linear.host_weight(name, w, stream)  # 2-D and floating (quantize_groups checks both again)
    q, z, s = _pack.quantize_groups(host, group_size, symmetric, 1 if packing == "gptq" else 0)
    offset = 1 if packing == "gptq" else 0
    qweight = _pack.pack_qweight(q, packing)
    qzeros = _pack.pack_qzeros(z, packing, offset)
    return Int4Tensor(qweight, qzeros, s, packing, group_size, zero_offset=offset, stream=stream)


def concat_out_features(parts: Sequence[Int4Tensor], *, stream: Stream | None = None) -> Int4Tensor:
    """Int4 weights of one packing, group size, zero offset and K stacked along the output features
    (rows of W): their qweight, qzeros and scales concatenate along axis 1 (N is a multiple of 8)."""
    from .. import shape as _shape

    first = parts[0]
    if any(not isinstance(p, Int4Tensor) for p in parts) or len(
        {(p.packing, p.group_size, p.zero_offset, p.shape[1]) for p in parts}
    ) != 1:  # fmt: skip
        raise ArgumentError(f"concat_out_features: the weights differ in kind, packing, group size or K: {list(parts)}")

    def cat(arrays: list[GPUArray]) -> GPUArray:
        if stream is None:
            return _shape.concatenate(arrays, axis=1)
        with stream:
            return _shape.concatenate(arrays, axis=1)

    return Int4Tensor(cat([p.qweight for p in parts]), cat([p.qzeros for p in parts]), cat([p.scales for p in parts]),
                      first.packing, first.group_size, zero_offset=first.zero_offset)  # fmt: skip


def _expression(kind: str, packing: str, dtype: DType, bucket: int) -> str:
    layout = _LAYOUT[packing]
    if kind == "dequant":
        return f"{NAMESPACE}int4gemv::int4_dequant<{layout}, {dtype.ctype}>"
    return f"{NAMESPACE}int4gemv::int4_gemv<{layout}, {dtype.ctype}, {bucket}>"


def _expressions(packing: str, dtype: DType) -> tuple[str, ...]:
    """One compilation per packing and dtype: the GEMV's row buckets and the dequantize kernel."""
    return (
        *(_expression("gemv", packing, dtype, b) for b in _linear.BUCKETS),
        _expression("dequant", packing, dtype, 0),
    )


def _kernel(kind: str, packing: str, dtype: DType, rows: int) -> JITKernel:
    bucket = _linear.gemv_bucket(rows) if kind == "gemv" else 0
    params = _GEMV_PARAMS if kind == "gemv" else _DEQUANT_PARAMS
    return _linear.cached_kernel(
        _KERNELS,
        (kind, packing, dtype, bucket),
        lambda: group(_FILE, _expressions(packing, dtype)).kernel(_expression(kind, packing, dtype, bucket), params),
    )


def _gemv(w: Int4Tensor, x2: GPUArray, out: GPUArray, bias: GPUArray | None) -> _linear.GemvLaunch:
    """The GEMV launch of :func:`int4_linear` (up to 8 rows of x2)."""
    (rows, k), n = x2.shape, w.shape[0]
    x_ptr, w_ptr = x2.device_ptr, w.qweight.device_ptr
    if w.scales.device_ptr % 16:
        raise ShapeError(f"linear: the weight's scales must be 16-byte aligned (address {w.scales.device_ptr:#x})")
    # 16-byte loads of x rows and of the qweight words a thread owns (AWQ rows of n / 2 bytes: n % 32 == 0)
    vector = int((x_ptr | w_ptr) % 16 == 0 and (k * x2.itemsize) % 16 == 0 and (w.packing == "gptq" or n % 32 == 0))
    args = (x_ptr, w_ptr, w.qzeros.device_ptr, w.scales.device_ptr, out.device_ptr,
            0 if bias is None else bias.device_ptr, rows, n, k, w.group_size, w.zero_offset, k, n, vector)  # fmt: skip
    return _kernel("gemv", w.packing, x2.dtype, rows), args, -(-n // _BLOCK_COLUMNS[w.packing])


def int4_linear(x: GPUArray, w: Int4Tensor, b: GPUArray | None = None, activation: str | None = None, *,
                stream: Stream | None = None, out: GPUArray | None = None) -> GPUArray:  # fmt: skip
    """``activation(x @ W.T + b)`` for an :class:`Int4Tensor` ``w`` (N, K) and x (..., K) of float32,
    float16 or bfloat16 (``pygpukit.ops.linear`` hands such weights here). More than 8 rows (prefill)
    take :func:`_prefill` on both backends: W rounded once to x's dtype, then the GEMM."""
    return _linear.linear_paths(x, w, Int4Tensor, "an Int4Tensor", (w.qweight, w.qzeros, w.scales), b, activation,
                                stream, host_values=Int4Tensor.host_weights, prefill=_prefill, gemv=_gemv,
                                host_prefill=True, out=out)  # fmt: skip


def _prefill(w: Int4Tensor, x2: GPUArray, bias: GPUArray | None, activation: str | None,
             stream: Stream | None) -> GPUArray:  # fmt: skip
    """W dequantized to x2's dtype in row tiles of at most ``_PREFILL_TILE_BYTES``, each through the GEMM."""
    from ..gemm.api import linear

    n, k = w.shape
    tile = max(8, _PREFILL_TILE_BYTES // (k * x2.itemsize) // 8 * 8)
    if tile >= n:
        return linear(x2, w.dequantize(x2.dtype, stream=stream), bias, activation, stream=stream)
    from .. import shape as _shape

    parts = []
    for first in range(0, n, tile):
        last = min(n, first + tile)
        wd = w.dequantize_rows(first, last, x2.dtype, stream=stream)
        parts.append(linear(x2, wd, None if bias is None else bias[first:last], activation, stream=stream))
    return _shape.concatenate(parts, axis=1)


def _enumerate() -> Groups:
    return {_FILE: [_expressions(p, d) for p in PACKINGS for d in _linear.DTYPES]}


register_enumerator(_enumerate)
