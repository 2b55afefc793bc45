"""FP8 e4m3 weights with 2-D block scales: the layout of HF "fp8" block-quantized checkpoints.

DeepSeek-V3 / Qwen3-FP8 checkpoints store a linear weight (N, K) as ``weight`` float8_e4m3fn and
``weight_scale_inv`` float32 of shape (ceil(N / 128), ceil(K / 128)) (``weight_block_size`` [128, 128]
in ``quantization_config``): ``W[r, c] = weight[r, c] * weight_scale_inv[r // 128, c // 128]``.
:class:`BlockFP8Tensor` keeps both on the device; :func:`quantize_block_fp8` makes one from float
weights (per block scale = max |w| / 448, 1 for an all-zero block; values w / scale cast to
float8_e4m3fn with round-to-nearest-even, ml_dtypes' and torch's cast).
``pygpukit.ops.linear(x, bw)`` runs:

- up to 8 rows of x (decode, W8A16): one GEMV kernel (native/kernels/quant/fp8_block_gemv.cu) reading
  the 1-byte weights with 16-byte loads and each 16-element partial sum scaled by its block's scale,
  float32 accumulation;
- more rows (prefill): W dequantized to x's dtype on the device (a kernel of the same file), then the
  GEMM dispatch; or, for a weight made with ``activation_scheme="dynamic"`` (HF's
  ``quantization_config.activation_scheme``, what DeepSeek-V3 and Qwen3-FP8 checkpoints say), W8A8: x
  quantized to float8_e4m3fn per row and 128 columns on the device
  (:func:`pygpukit.ops.quant.quantize_fp8`) and one cuBLASLt GEMM with the 1x128 and 128x128 block
  scales (:func:`pygpukit.ops.scaled_matmul`), where that runs: (128, 128) blocks, K and N multiples
  of 16, a Hopper GPU (else the W8A16 path above). It reads half the bytes of a bf16 GEMM and runs on
  the fp8 tensor cores, at the cost of the activations' e4m3 rounding (relative 2^-4 per element).

The CPU simulation backend computes the product in float64 from the stored values and scales.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import DType, float8_e4m3fn, float32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import Stream

from .. import _cpu
from .._kernels import NAMESPACE, Groups, c_param, code_param, group, pointer, register_enumerator, size_param
from .._layout import is_cuda
from ..gemm._base import row_major_ld
from . import _linear

__all__ = ["FP8_BLOCK", "BlockFP8Tensor", "block_fp8_linear", "concat_rows", "quantize_block_fp8", "w8a8_supported"]

_FILE = "quant/fp8_block_gemv.cu"
FP8_BLOCK = (128, 128)
"""The block (rows, columns) of HF fp8 checkpoints' ``weight_block_size``, the default."""
_GEMV_PARAMS = [pointer("x"), pointer("w"), pointer("s"), pointer("y"), pointer("bias"), c_param("rows", "int"),
                c_param("n", "int"), c_param("k", "int"), size_param("ldx"), size_param("ldw"), size_param("ldy"),
                size_param("lds"), c_param("bn", "int"), c_param("bk", "int"), code_param("vector")]  # fmt: skip
_DEQUANT_PARAMS = [pointer("w"), pointer("s"), pointer("out"), c_param("n", "int"), c_param("k", "int"),
                   size_param("ldw"), size_param("lds"), c_param("bn", "int"), c_param("bk", "int")]  # fmt: skip
_KERNELS: PlanCache[JITKernel] = PlanCache("ops.fp8_block")


def _block(name: str, block: Any) -> tuple[int, int]:
    if not isinstance(block, Sequence) or isinstance(block, str) or len(block) != 2:
        raise ShapeError(f"{name}: block must be (rows, columns), got {block!r}")
    dims = []
    for d in block:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d <= 0:
            raise ShapeError(f"{name}: block must be two positive ints, got {block!r}")
        dims.append(int(d))
    return dims[0], dims[1]


class BlockFP8Tensor(_linear.WeightOnlyTensor):
    """A linear weight (N, K) as float8_e4m3fn ``data`` (row-major, unit stride along K) and float32
    ``scale`` (ceil(N / bn), ceil(K / bk)), ``W[r, c] = data[r, c] * scale[r // bn, c // bk]`` (HF's
    ``weight`` and ``weight_scale_inv``); ``block`` = (bn, bk), (128, 128) by default."""

    __slots__ = ("_scale_t", "activation_scheme", "block", "data", "scale", "shape")

    def __init__(self, data: GPUArray, scale: GPUArray, block: Sequence[int] = FP8_BLOCK, *,
                 activation_scheme: str | None = None) -> None:  # fmt: skip
        name = "BlockFP8Tensor"
        if not isinstance(data, GPUArray) or not isinstance(scale, GPUArray):
            raise DTypeError(f"{name}: data and scale must be GPUArrays, got {type(data).__name__} and "
                             f"{type(scale).__name__}")  # fmt: skip
        if data.dtype != float8_e4m3fn:
            raise DTypeError(f"{name}: data must be float8_e4m3fn, got {data.dtype}")
        if data.ndim != 2 or row_major_ld(data) is None:
            raise ShapeError(f"{name}: data must be a row-major 2-D (N, K) array, got shape {data.shape} and "
                             f"strides {data.strides}")  # fmt: skip
        bn, bk = _block(name, block)
        n, k = int(data.shape[0]), int(data.shape[1])
        grid = (-(-n // bn), -(-k // bk))
        if scale.dtype != float32 or scale.shape != grid or not scale.is_contiguous:
            raise ShapeError(f"{name}: scale must be a contiguous float32 {grid} array for {(n, k)} in blocks of "
                             f"{(bn, bk)}, got {scale.dtype} {scale.shape}")  # fmt: skip
        if activation_scheme not in (None, "dynamic"):
            raise ArgumentError(f"{name}: activation_scheme must be None (W8A16) or 'dynamic' (W8A8 prefill), "
                                f"got {activation_scheme!r}")  # fmt: skip
        self.data, self.scale, self.block = data, scale, (bn, bk)
        self.shape = (n, k)
        self.activation_scheme = activation_scheme
        self._scale_t: GPUArray | None = None  # scaled_matmul's scale_b, made on first use

    def host_values(self) -> Any:
        """The weight in float64 on the host (CPU backend and tests)."""
        bn, bk = self.block
        n, k = self.shape
        s = _cpu.host(self.scale).astype(np.float64)
        full = np.repeat(np.repeat(s, bn, axis=0)[:n], bk, axis=1)[:, :k]
        return _cpu.host(self.data).astype(np.float64) * full

    def dequantize(self, dtype: Any = float32, *, stream: Stream | None = None) -> GPUArray:
        """``data * scale`` (each block's scale) on the device, in ``dtype`` (float32, float16 or
        bfloat16; the float32 product rounded once)."""
        return _linear.dequantized(self, dtype, stream, _dequant)

    def __repr__(self) -> str:
        return f"BlockFP8Tensor(shape={self.shape}, block={self.block})"


def quantize_block_fp8(w: Any, block: Sequence[int] = FP8_BLOCK, *, stream: Stream | None = None) -> BlockFP8Tensor:
    """``w`` (2-D float GPUArray or NumPy array, (N, K)) as a :class:`BlockFP8Tensor`: per block of
    ``block`` = (bn, bk) (edge blocks smaller), scale = max |w| / 448 (1 for an all-zero block) and
    values ``w / scale`` cast to float8_e4m3fn with round-to-nearest-even. Computed on the host in
    float32."""
    name = "quantize_block_fp8"
    bn, bk = _block(name, block)
    values = np.asarray(_linear.host_weight(name, w, stream), dtype=np.float32)
    n, k = values.shape
    gn, gk = -(-n // bn), -(-k // bk)
    padded = np.zeros((gn * bn, gk * bk), np.float32)
    padded[:n, :k] = np.abs(values)
    amax = padded.reshape(gn, bn, gk, bk).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / np.float32(448.0), np.float32(1)).astype(np.float32)
    full = np.repeat(np.repeat(scale, bn, axis=0)[:n], bk, axis=1)[:, :k]
    data = np.clip(values / full, -448.0, 448.0).astype(float8_e4m3fn.numpy)
    return BlockFP8Tensor(from_numpy(data, stream=stream), from_numpy(scale, stream=stream), (bn, bk))


def _gemv_expression(dtype: DType, bucket: int) -> str:
    return f"{NAMESPACE}fp8block::fp8_block_gemv<{dtype.ctype}, {bucket}>"


def _dequant_expression(dtype: DType) -> str:
    return f"{NAMESPACE}fp8block::fp8_block_dequant<{dtype.ctype}>"


def _expressions(dtype: DType) -> tuple[str, ...]:
    return (*(_gemv_expression(dtype, b) for b in _linear.BUCKETS), _dequant_expression(dtype))


def _kernel(expression: str, params: list[Any], dtype: DType) -> JITKernel:
    return _linear.cached_kernel(
        _KERNELS, (expression,), lambda: group(_FILE, _expressions(dtype)).kernel(expression, params)
    )


def _dequant(w: BlockFP8Tensor, out: GPUArray) -> tuple[JITKernel, tuple[Any, ...]]:
    """The dequantize kernel of :meth:`BlockFP8Tensor.dequantize` into ``out`` and its arguments."""
    n, k = w.shape
    ldw = row_major_ld(w.data)
    assert ldw is not None  # checked by the constructor
    bn, bk = w.block
    args = (w.data.device_ptr, w.scale.device_ptr, out.device_ptr, n, k, ldw, w.scale.shape[1], bn, bk)
    return _kernel(_dequant_expression(out.dtype), _DEQUANT_PARAMS, out.dtype), args


def _gemv(w: BlockFP8Tensor, x2: GPUArray, out: GPUArray, bias: GPUArray | None) -> _linear.GemvLaunch:
    """The GEMV launch of :func:`block_fp8_linear` (up to 8 rows of x2)."""
    (rows, k), n = x2.shape, w.shape[0]
    ldw = row_major_ld(w.data)
    assert ldw is not None  # checked by the constructor
    bn, bk = w.block
    x_ptr, w_ptr = x2.device_ptr, w.data.device_ptr
    aligned = (x_ptr | w_ptr) % 16 == 0 and (k * x2.itemsize) % 16 == 0 and ldw % 16 == 0
    vector = int(k % 16 == 0 and bk % 16 == 0 and aligned)
    args = (x_ptr, w_ptr, w.scale.device_ptr, out.device_ptr, 0 if bias is None else bias.device_ptr, rows, n, k,
            k, ldw, n, w.scale.shape[1], bn, bk, vector)  # fmt: skip
    return _kernel(_gemv_expression(x2.dtype, _linear.gemv_bucket(rows)), _GEMV_PARAMS, x2.dtype), args, -(-n // 8)


def block_fp8_linear(x: GPUArray, w: BlockFP8Tensor, b: GPUArray | None = None, activation: str | None = None, *,
                     stream: Stream | None = None, out: GPUArray | None = None) -> GPUArray:  # fmt: skip
    """``activation(x @ W.T + b)`` for a :class:`BlockFP8Tensor` ``w`` (N, K) and x (..., K) of
    float32, float16 or bfloat16 (``pygpukit.ops.linear`` hands such weights here)."""
    dynamic = w.activation_scheme == "dynamic" if isinstance(w, BlockFP8Tensor) else False
    return _linear.linear_paths(x, w, BlockFP8Tensor, "a BlockFP8Tensor", (w.data, w.scale), b, activation, stream,
                                host_values=BlockFP8Tensor.host_values,
                                prefill=_w8a8_prefill if dynamic else _linear.dequantized_prefill, gemv=_gemv,
                                host_prefill=dynamic, out=out)  # fmt: skip


def w8a8_supported(w: BlockFP8Tensor, x: GPUArray) -> bool:
    """Whether :func:`block_fp8_linear`'s prefill runs W8A8 for this weight and input (else W8A16)."""
    n, k = w.shape
    if w.block != (128, 128) or k % 16 or n % 16 or x.dtype.name not in ("float32", "float16", "bfloat16"):
        return False
    if not is_cuda():
        return True
    from pygpukit.core.stream import thread_device

    from ..gemm._base import device_props
    from ..gemm.scaled import native_unsupported

    device = thread_device()  # W8A16 where this cuBLASLt refused block scales (the fallback would be slower)
    return device_props(device).capability[0] == 9 and not native_unsupported("block", device)


def _w8a8_prefill(w: BlockFP8Tensor, x2: GPUArray, bias: GPUArray | None, activation: str | None,
                  stream: Stream | None) -> GPUArray:  # fmt: skip
    """W8A8 prefill: x quantized per 1x128 group, one block-scaled cuBLASLt GEMM (W8A16 where it cannot)."""

    def weight_scale() -> GPUArray:
        from ..gemm.scaled import block_weight_scale

        if w._scale_t is None:
            w._scale_t = block_weight_scale(w.scale)
        return w._scale_t

    return _linear.w8a8_prefill(w, x2, bias, activation, stream, supported=w8a8_supported(w, x2),
                                granularity="block", weight_scale=weight_scale)  # fmt: skip


def _enumerate() -> Groups:
    return {_FILE: [_expressions(d) for d in _linear.DTYPES]}


register_enumerator(_enumerate)


def concat_rows(parts: Sequence[BlockFP8Tensor]) -> BlockFP8Tensor:
    """Block-FP8 weights of one K and block stacked along their output features (rows), on the device
    (a checkpoint's gate and up projections as one weight). Every part but the last must have a
    multiple of the block's rows, so that the scale grids stack."""
    name = "concat_rows"
    if not parts or not all(isinstance(p, BlockFP8Tensor) for p in parts):
        raise DTypeError(f"{name}: parts must be a non-empty sequence of BlockFP8Tensor")
    first = parts[0]
    bn = first.block[0]
    for p in parts:
        if p.block != first.block or p.shape[1] != first.shape[1]:
            raise ShapeError(f"{name}: parts differ in K or block: {p.shape} {p.block} vs {first.shape} {first.block}")
    for p in parts[:-1]:
        if p.shape[0] % bn:
            raise ShapeError(f"{name}: a part of {p.shape[0]} rows is not a multiple of the {bn}-row blocks")
    from .. import shape as _shape

    data = _shape.concatenate([p.data for p in parts], axis=0)
    scale = _shape.concatenate([p.scale for p in parts], axis=0)
    schemes = {p.activation_scheme for p in parts}
    return BlockFP8Tensor(data, scale, first.block, activation_scheme=schemes.pop() if len(schemes) == 1 else None)
