"""``quantize(w, format)`` / ``dequantize(q)``: float weights to and from GGUF block formats.

Quantization runs on the host in NumPy (a one-off at load time) and, for the formats the ``gguf``
package can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), gives its bytes exactly: the same float32
operations in the same order (round half away from zero for Q8_0, truncation of x + 0.5 / 8.5 /
16.5 for the others, scales rounded to float16 once). The k-quants (Q2_K .. Q6_K) have no reference
quantizer in the gguf package (it raises NotImplementedError); they follow llama.cpp's reference
quantizers (:mod:`.kquants`).
Dequantization runs on the device (:func:`pygpukit.ops.dequantize_gguf`) for every format.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray
from pygpukit.core.dtypes import float32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.stream import Stream

from .fp8_block import BlockFP8Tensor, quantize_block_fp8
from .int4 import Int4Tensor, quantize_int4
from .kquants import KQUANT_QUANTIZERS, quantize_kquant_blocks
from .nvf4 import NVF4Tensor, quantize_nvf4
from .tensor import QuantizedTensor, quant_format
from .weight_only import ChannelQuantizedTensor, quantize_per_channel

__all__ = ["QUANTIZE_FORMATS", "dequantize", "quantize"]

Array = np.ndarray[Any, Any]
_CHUNK_BLOCKS = 1 << 16  # blocks quantized at a time (bounds the temporaries)


def _f16_bytes(values: Array) -> Array:
    """(blocks, 1) float32 -> (blocks, 2) uint8: the float16 bits, rounded once."""
    result: Array = values.astype(np.float16).view(np.uint8)
    return result


def _inverse(d: Array) -> Array:
    with np.errstate(divide="ignore"):
        result: Array = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    return result


def _pack_nibbles(q: Array) -> Array:
    """(blocks, 32) uint8 quants -> 16 bytes: elements 0-15 in the low nibbles, 16-31 in the high ones."""
    result: Array = (q[:, :16] & np.uint8(0x0F)) | (q[:, 16:] << np.uint8(4))
    return result


def _fifth_bits(q: Array) -> Array:
    """Bit 4 of each of 32 quants as a little-endian u32 (bit i: element i), 4 bytes."""
    bits = (q >> np.uint8(4)) & np.uint8(1)
    result: Array = np.packbits(bits, axis=-1, bitorder="little")
    return result


def _truncate(values: Array, top: int) -> Array:
    result: Array = np.trunc(values).astype(np.uint8).clip(0, top)
    return result


def _absmax_signed(blocks: Array) -> Array:
    """The element of largest magnitude of each block, with its sign (the first on ties)."""
    at = np.abs(blocks).argmax(axis=-1)[:, None]
    result: Array = np.take_along_axis(blocks, at, axis=-1)
    return result


def _q4_0(blocks: Array) -> Array:
    d = _absmax_signed(blocks) / np.float32(-8)
    q = _truncate(blocks * _inverse(d) + np.float32(8.5), 15)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=-1)


def _q5_0(blocks: Array) -> Array:
    d = _absmax_signed(blocks) / np.float32(-16)
    q = _truncate(blocks * _inverse(d) + np.float32(16.5), 31)
    return np.concatenate([_f16_bytes(d), _fifth_bits(q), _pack_nibbles(q)], axis=-1)


def _min_max(blocks: Array, levels: int) -> tuple[Array, Array, Array]:
    low = blocks.min(axis=-1, keepdims=True)
    d = (blocks.max(axis=-1, keepdims=True) - low) / np.float32(levels)
    q = _truncate((blocks - low) * _inverse(d) + np.float32(0.5), levels)
    return d, low, q


def _q4_1(blocks: Array) -> Array:
    d, low, q = _min_max(blocks, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(low), _pack_nibbles(q)], axis=-1)


def _q5_1(blocks: Array) -> Array:
    d, low, q = _min_max(blocks, 31)
    return np.concatenate([_f16_bytes(d), _f16_bytes(low), _fifth_bits(q), _pack_nibbles(q)], axis=-1)


def _round_away(values: Array) -> Array:
    """Round half away from zero (C's roundf) in float32: floor(|v|) + floor(2 * frac), signed."""
    a = np.abs(values)
    whole = np.floor(a)
    result: Array = np.sign(values) * (whole + np.floor(np.float32(2) * (a - whole)))
    return result


def _q8_0(blocks: Array) -> Array:
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    q = _round_away(blocks * _inverse(d)).astype(np.int8).view(np.uint8)
    return np.concatenate([_f16_bytes(d), q], axis=-1)


_QUANTIZERS: dict[str, Callable[[Array], Array]] = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    **{fmt: functools.partial(quantize_kquant_blocks, fmt=fmt) for fmt in KQUANT_QUANTIZERS},  # kquants.py
}
QUANTIZE_FORMATS: tuple[str, ...] = tuple(_QUANTIZERS)
"""The formats :func:`quantize` makes: the ``gguf`` package's reference quantizers (Q4_0 .. Q8_0) and
llama.cpp's reference k-quant quantizers (Q2_K .. Q6_K, :mod:`.kquants`)."""


def quantize_host(values: Array, fmt: str) -> Array:
    """The raw blocks (uint8, (rows, row bytes)) of a float (rows, K) NumPy array in ``fmt``."""
    name = "quantize"
    fmt = quant_format(name, fmt)
    function = _QUANTIZERS.get(fmt)
    if function is None:
        raise ArgumentError(f"{name}: no quantizer for {fmt}; quantize makes {', '.join(QUANTIZE_FORMATS)}")
    if values.ndim != 2:
        raise ShapeError(f"{name}: w must be 2-D (N, K), got shape {values.shape}")
    if values.dtype.kind != "f" and values.dtype.name != "bfloat16":
        raise DTypeError(f"{name}: w must be a floating array, got {values.dtype}")
    n, k = values.shape
    qk = 256 if fmt in KQUANT_QUANTIZERS else 32
    if k % qk:
        raise ShapeError(f"{name}: K = {k} (shape {values.shape}) is not a multiple of the {qk}-element blocks "
                         f"of {fmt}")  # fmt: skip
    blocks = np.ascontiguousarray(values, dtype=np.float32).reshape(-1, qk)
    parts = []
    chunk = _CHUNK_BLOCKS * 32 // qk
    with np.errstate(invalid="ignore", over="ignore"):
        for first in range(0, blocks.shape[0], chunk):
            parts.append(function(blocks[first : first + chunk]))
    result: Array = np.concatenate(parts, axis=0).reshape(n, -1)
    return result


def quantize(w: Any, format: str | int, *, stream: Stream | None = None, group_size: int = 128, packing: str = "awq",
             symmetric: bool = False) -> QuantizedTensor | ChannelQuantizedTensor | Int4Tensor | BlockFP8Tensor | NVF4Tensor:  # fmt: skip  # noqa: E501
    """``w`` (a 2-D GPUArray or NumPy array of floats, shape (N, K), K a multiple of 32, of 256 for the k-quants) as a
    :class:`QuantizedTensor` in ``format`` (one of :data:`QUANTIZE_FORMATS`), its bytes equal to
    ``gguf.quants.quantize(w.astype(float32), format)``. Runs on the host (NumPy); the result is on
    the device. The k-quants follow llama.cpp's reference quantizers (:mod:`.kquants`). ``format`` ``"fp8"``
    (``"fp8_e4m3"``) or ``"int8"``: weight-only with per-channel scales
    (:func:`~pygpukit.ops.quant.weight_only.quantize_per_channel`); ``"fp8_block"``: FP8 with 128x128
    block scales (:func:`~.fp8_block.quantize_block_fp8`); ``"nvf4"`` (:func:`~.nvf4.quantize_nvf4`).
    ``format`` ``"int4"``: groups of
    ``group_size`` in the ``packing`` "awq" or "gptq", ``symmetric`` or not (:func:`~.int4.quantize_int4`)."""
    if isinstance(format, str) and format.lower() == "int4":  # group-quantized INT4 (int4.py): AWQ / GPTQ packing
        return quantize_int4(w, group_size, packing, symmetric, stream=stream)
    if isinstance(format, str) and format.lower() in ("fp8", "fp8_e4m3", "int8"):
        return quantize_per_channel(w, format, stream=stream)
    if isinstance(format, str) and format.lower() == "fp8_block":  # 128x128 block scales (fp8_block.py)
        return quantize_block_fp8(w, stream=stream)
    if isinstance(format, str) and format.lower() == "nvf4":  # nvf4.py
        return quantize_nvf4(w, stream=stream)
    if isinstance(w, GPUArray):
        if not w.dtype.is_floating:
            raise DTypeError(f"quantize: w must be a floating array, got {w.dtype}")
        host = w.to_numpy(stream=stream)
    elif isinstance(w, np.ndarray):
        host = w
    else:
        raise DTypeError(f"quantize: w must be a GPUArray or a NumPy array, got {type(w).__name__}")
    fmt = quant_format("quantize", format)
    raw = quantize_host(host, fmt)
    return QuantizedTensor.from_raw(raw, fmt, host.shape, stream=stream)


def dequantize(q: QuantizedTensor | Int4Tensor, dtype: Any = float32, *, out: GPUArray | None = None) -> GPUArray:
    """The (N, K) weight of ``q`` decoded on the device to float32 (bit for bit
    ``gguf.quants.dequantize``), float16 or bfloat16 (that value rounded once). An
    :class:`~.int4.Int4Tensor` decodes to (q - zero) * scale (exact in float32); ``out`` is not taken."""
    if isinstance(q, Int4Tensor) and out is None:
        return q.dequantize(dtype)
    if not isinstance(q, QuantizedTensor):
        raise DTypeError(f"dequantize: q must be a QuantizedTensor, got {type(q).__name__}")
    return q.dequantize(dtype, out=out)
