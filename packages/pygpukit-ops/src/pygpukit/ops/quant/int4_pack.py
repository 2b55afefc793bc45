"""Host (NumPy) side of group-quantized INT4: the AWQ and GPTQ packings of HF checkpoints and the
float64 reference quantizer.

A linear weight W (N, K) = (out_features, in_features) is quantized in groups of ``group_size``
consecutive input features (K / group_size groups per output column): integer quants q (K, N) in
0..15, per-group zero points z (K / g, N) and float16 scales s (K / g, N), with
``W[n, k] = s[k // g, n] * (q[k, n] - z[k // g, n])``. Both checkpoint formats store the transpose
(input features first) in int32 words of eight 4-bit fields (field i at bits 4i .. 4i + 3):

- AWQ (AutoAWQ, "version": "gemm"): ``qweight`` (K, N / 8), word [k, c] holds the columns 8c .. 8c + 7
  of input row k, column 8c + j in field ``AWQ_NIBBLE[j]`` = (0, 4, 1, 5, 2, 6, 3, 7)[j] (AutoAWQ
  packs the columns in the order 0 2 4 6 1 3 5 7); ``qzeros`` (K / g, N / 8) int32 packed alike; the
  zero point is the stored value.
- GPTQ (auto-gptq / gptqmodel, checkpoint_format "gptq"): ``qweight`` (K / 8, N), word [r, n] holds
  input rows 8r .. 8r + 7 of column n, row 8r + i in field i; ``qzeros`` (K / g, N / 8), column 8c + i
  in field i of word [grp, c], storing zero - 1 (the zero point is the field plus one: "v1";
  gptqmodel's "gptq_v2" stores the zero itself); ``g_idx`` (K,) int32, the group of each input row
  (k // g without act-order).

Both store ``scales`` (K / g, N) float16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

__all__ = ["AWQ_NIBBLE", "GROUP_SIZES", "PACKINGS", "pack_qweight", "pack_qzeros", "quantize_groups",
           "unpack_qweight", "unpack_qzeros"]  # fmt: skip

Array = np.ndarray[Any, Any]
PACKINGS = ("awq", "gptq")
GROUP_SIZES = (32, 64, 128)
AWQ_NIBBLE = (0, 4, 1, 5, 2, 6, 3, 7)
"""The 4-bit field holding column 8c + j of an AWQ word (the inverse of AutoAWQ's order 0 2 4 6 1 3 5 7)."""
_SHIFTS = np.arange(8, dtype=np.uint32) * np.uint32(4)


def packing_name(name: str, packing: Any) -> str:
    found = packing.lower() if isinstance(packing, str) else None
    if found not in PACKINGS:
        raise ArgumentError(f"{name}: packing must be 'awq' or 'gptq', got {packing!r}")
    return found


def _fields_to_words(fields: Array) -> Array:
    """(..., 8) values 0..15 -> (...) int32 words, field i at bits 4i."""
    words = (fields.astype(np.uint32) << _SHIFTS).sum(axis=-1, dtype=np.uint64).astype(np.uint32)
    result: Array = words.view(np.int32)
    return result


def _words_to_fields(words: Array) -> Array:
    """(...) int32/uint32 words -> (..., 8) uint8 fields."""
    unsigned = np.ascontiguousarray(words).view(np.uint32)
    result: Array = ((unsigned[..., None] >> _SHIFTS) & np.uint32(15)).astype(np.uint8)
    return result


def _columns_to_fields(values: Array, packing: str) -> Array:
    """(R, N) -> (R, N / 8, 8) fields: column 8c + j in field AWQ_NIBBLE[j] (AWQ) or j (GPTQ zeros)."""
    rows, n = values.shape
    grouped = values.reshape(rows, n // 8, 8)
    if packing == "gptq":
        return grouped
    fields = np.empty_like(grouped)
    fields[..., list(AWQ_NIBBLE)] = grouped
    return fields


def _fields_to_columns(fields: Array, packing: str) -> Array:
    rows, words, _ = fields.shape
    if packing == "awq":
        fields = fields[..., list(AWQ_NIBBLE)]
    result: Array = fields.reshape(rows, words * 8)
    return result


def pack_qweight(q: Array, packing: str) -> Array:
    """Quants q (K, N), values 0..15, as the checkpoint's int32 ``qweight``: (K, N / 8) for AWQ,
    (K / 8, N) for GPTQ."""
    packing = packing_name("pack_qweight", packing)
    k, n = q.shape
    if n % 8 or k % 8:
        raise ShapeError(f"pack_qweight: q of shape {q.shape} needs K and N multiples of 8")
    if packing == "awq":
        return _fields_to_words(_columns_to_fields(q, "awq"))
    return _fields_to_words(np.ascontiguousarray(q.reshape(k // 8, 8, n).transpose(0, 2, 1)))


def unpack_qweight(qweight: Array, packing: str) -> Array:
    """The (K, N) uint8 quants of a checkpoint's ``qweight``."""
    packing = packing_name("unpack_qweight", packing)
    fields = _words_to_fields(qweight)
    if packing == "awq":
        return _fields_to_columns(fields, "awq")
    rows, n, _ = fields.shape
    result: Array = fields.transpose(0, 2, 1).reshape(rows * 8, n)
    return result


def pack_qzeros(z: Array, packing: str, zero_offset: int = 1) -> Array:
    """Zero points z (K / g, N) as the checkpoint's int32 ``qzeros`` (K / g, N / 8): AWQ stores z in its
    interleaved order, GPTQ stores z - ``zero_offset`` (1 in the "gptq" checkpoint format) in field
    order. A GPTQ zero of 0 with offset 1 cannot be stored (it would read back as 16): ArgumentError."""
    packing = packing_name("pack_qzeros", packing)
    stored = z.astype(np.int64)
    if packing == "gptq":
        stored = stored - zero_offset
    if stored.min(initial=0) < 0 or stored.max(initial=0) > 15:
        raise ArgumentError(f"pack_qzeros: zero points {int(z.min())}..{int(z.max())} do not fit the {packing} "
                            f"field (offset {zero_offset if packing == 'gptq' else 0})")  # fmt: skip
    return _fields_to_words(_columns_to_fields(stored.astype(np.uint8), packing))


def unpack_qzeros(qzeros: Array, packing: str, zero_offset: int = 1) -> Array:
    """The (K / g, N) zero points of a checkpoint's ``qzeros`` (GPTQ: the field plus ``zero_offset``)."""
    packing = packing_name("unpack_qzeros", packing)
    z = _fields_to_columns(_words_to_fields(qzeros), packing).astype(np.int16)
    result: Array = z + zero_offset if packing == "gptq" else z
    return result


def quantize_groups(w: Array, group_size: int, symmetric: bool, min_zero: int = 0) -> tuple[Array, Array, Array]:
    """The float64 round-to-nearest reference quantizer of a float (N, K) weight: per group of
    ``group_size`` input features of a row, asymmetric (min/max): range = max(max - min, 1e-5),
    s = fp16(range / 15), z = clip(rint(-min / s), min_zero, 15); symmetric: s = fp16(2 max|w| / 15)
    (max|w| at least 1e-5), z = 8; then q = clip(rint(w / s) + z, 0, 15) (round half to even, all in
    float64 from the float16 scale). Returns q (K, N) uint8, z (K / g, N) uint8 and s (K / g, N)
    float16, in the checkpoints' (input features first) orientation."""
    if w.ndim != 2:
        raise ShapeError(f"quantize: w must be 2-D (N, K), got shape {w.shape}")
    if w.dtype.kind != "f" and w.dtype.name != "bfloat16":
        raise DTypeError(f"quantize: w must be a floating array, got {w.dtype}")
    n, k = w.shape
    if group_size not in GROUP_SIZES:
        raise ArgumentError(f"quantize: group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    if k % group_size or n % 8:
        raise ShapeError(f"quantize: int4 needs K a multiple of group_size {group_size} and N a multiple of 8, "
                         f"got shape {w.shape}")  # fmt: skip
    groups = np.asarray(w, dtype=np.float64).reshape(n, k // group_size, group_size)
    if not np.all(np.isfinite(groups)):
        raise ArgumentError("quantize: w has non-finite values")
    if symmetric:
        amax = np.maximum(np.abs(groups).max(axis=-1), 1e-5)
        scale = (2.0 * amax / 15.0).astype(np.float16)
        zero = np.full(scale.shape, 8.0)
    else:
        low, high = groups.min(axis=-1), groups.max(axis=-1)
        scale = (np.maximum(high - low, 1e-5) / 15.0).astype(np.float16)
    if not np.all(np.isfinite(scale)) or np.any(scale == 0):
        raise ArgumentError("quantize: a group's scale does not fit float16 (|w| too large or too small)")
    s64 = scale.astype(np.float64)
    if not symmetric:
        zero = np.clip(np.rint(-low / s64), min_zero, 15)
    q = np.clip(np.rint(groups / s64[..., None]) + zero[..., None], 0, 15).astype(np.uint8)
    return (np.ascontiguousarray(q.reshape(n, k).T), np.ascontiguousarray(zero.astype(np.uint8).T),
            np.ascontiguousarray(scale.T))  # fmt: skip
