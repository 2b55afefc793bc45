"""Dequantization of GGUF (ggml) tensors on the device: :func:`dequantize_gguf` turns the raw bytes of
a tensor as stored in a GGUF file into float32, float16 or bfloat16 elements in one kernel launch
(native/kernels/quant/gguf_dequant.cu).

Formats (:data:`GGUF_DEQUANT_TYPES`): the plain F32, F16 and BF16; the 32-element block formats Q4_0,
Q4_1, Q5_0, Q5_1 and Q8_0; and the 256-element k-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K. float32
results are bit for bit those of the ``gguf`` Python package's reference decoder
(``gguf.quants.dequantize``): the kernels repeat its float32 operations in its order, each rounded on
its own (no FMA). float16/bfloat16 results are that float32 value rounded once to nearest even, as
``astype`` rounds. The one difference on the GPU is NaN payloads: a NaN made by arithmetic (from a
NaN or infinite scale in a corrupt file) or rounded to float16/bfloat16 is the device's canonical NaN,
where the host keeps an operand's bits; NaNs of the plain formats decoded to float32 keep every bit.
The CPU simulation backend decodes with NumPy in the same operation order and matches the reference
bit for bit, NaNs included.

With ``out`` given nothing is allocated and nothing travels to the host, so the call can be captured
in a :class:`pygpukit.CudaGraph`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType, as_dtype, bfloat16, float16, float32, uint8
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from . import _cpu
from ._kernels import NAMESPACE, Groups, grid_for, group, pointer, register_enumerator, size_param
from ._layout import check_devices, is_cuda

__all__ = ["GGUF_DEQUANT_TYPES", "dequantize_gguf", "gguf_block_size"]

_FILE = "quant/gguf_dequant.cu"
_THREADS = 256  # kDequantThreads of the kernel
_TILE = 2048  # kTileElems: output elements per tile (one block of threads at a time)
_BLOCKS_PER_SM = 8  # resident blocks of 256 threads that fill an SM; the grid strides over the tiles
_DTYPES = (float32, float16, bfloat16)
_PARAMS = [pointer("data"), pointer("out"), size_param("blocks")]
_PLANS: PlanCache[tuple[JITKernel, int]] = PlanCache("ops.gguf")  # (kernel, grid) per call shape and device

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class _Type:
    name: str
    id: int  # the ggml type id (GGMLQuantizationType), the kernel's template argument
    elements: int  # per block
    nbytes: int  # per block


_TYPES = (
    _Type("F32", 0, 1, 4),
    _Type("F16", 1, 1, 2),
    _Type("BF16", 30, 1, 2),
    _Type("Q8_0", 8, 32, 34),
    _Type("Q4_0", 2, 32, 18),
    _Type("Q4_1", 3, 32, 20),
    _Type("Q5_0", 6, 32, 22),
    _Type("Q5_1", 7, 32, 24),
    _Type("Q2_K", 10, 256, 84),
    _Type("Q3_K", 11, 256, 110),
    _Type("Q4_K", 12, 256, 144),
    _Type("Q5_K", 13, 256, 176),
    _Type("Q6_K", 14, 256, 210),
)
_BY_NAME = {t.name: t for t in _TYPES}
_BY_ID = {t.id: t for t in _TYPES}

GGUF_DEQUANT_TYPES: tuple[str, ...] = tuple(t.name for t in _TYPES)
"""Names of the GGUF tensor types :func:`dequantize_gguf` decodes."""


def _type(name: str, qtype: Any) -> _Type:
    found: _Type | None = None
    if isinstance(qtype, str):
        found = _BY_NAME.get(qtype.upper())
    elif isinstance(qtype, (int, np.integer)) and not isinstance(qtype, bool):
        found = _BY_ID.get(int(qtype))  # also a gguf.GGMLQuantizationType, an IntEnum
    if found is None:
        supported = ", ".join(f"{t.name} ({t.id})" for t in _TYPES)
        raise ArgumentError(f"{name}: unsupported GGUF tensor type {qtype!r}; supported: {supported}")
    return found


def gguf_block_size(qtype: str | int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a GGUF tensor type, given by name (``"Q4_K"``, any
    case) or ggml type id (``12``): ``(256, 144)`` for Q4_K, ``(1, 2)`` for F16. :class:`ArgumentError`
    for a type outside :data:`GGUF_DEQUANT_TYPES`."""
    found = _type("gguf_block_size", qtype)
    return found.elements, found.nbytes


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool) else shape
    if not isinstance(dims, Sequence) or isinstance(dims, str):
        raise ShapeError(f"{name}: shape must be a tuple of ints, got {shape!r}")
    result = []
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 0:
            raise ShapeError(f"{name}: shape must be a tuple of non-negative ints, got {shape!r}")
        result.append(int(dim))
    return tuple(result)


def _expression(qtype: _Type, dtype: DType) -> str:
    return f"{NAMESPACE}gguf_dequant<{qtype.id}, {dtype.ctype}>"


def _expressions(dtype: DType) -> tuple[str, ...]:
    """Every format's kernel for one output dtype, compiled together: a model loads in one dtype."""
    return tuple(_expression(t, dtype) for t in _TYPES)


def _byte_range(a: GPUArray) -> tuple[int, int]:
    start = a._offset * a.itemsize
    return start, start + a.nbytes


def dequantize_gguf(
    data: GPUArray,
    qtype: str | int,
    shape: Sequence[int] | int,
    dtype: Any = float32,
    *,
    out: GPUArray | None = None,
) -> GPUArray:
    """Decode the raw bytes of a GGUF tensor into an array of ``shape`` (row-major NumPy order, the
    reverse of GGUF's ``ne``) and ``dtype`` (float32, float16 or bfloat16).

    ``data``: a contiguous uint8 array (any shape) holding the tensor's bytes exactly as stored in the
    file; ``qtype``: the tensor type by name (``"Q4_K"``, any case) or ggml type id, one of
    :data:`GGUF_DEQUANT_TYPES`. The element count of ``shape`` must be a whole number of blocks and
    ``data`` must hold exactly those blocks (:func:`gguf_block_size`). float32 results equal
    ``gguf.quants.dequantize`` bit for bit (see the module documentation for NaN payloads); float16
    and bfloat16 results are those values rounded once to nearest even.

    ``out``: an optional contiguous array of exactly ``shape`` and ``dtype`` to write; given, the call
    allocates nothing and synchronises nothing (graph-capturable). Raises :class:`ArgumentError` for
    an unsupported type or an ``out`` overlapping ``data``, :class:`DTypeError` for non-uint8 data or
    a wrong dtype, :class:`ShapeError` for sizes that do not match; nothing is written then."""
    name = "dequantize_gguf"
    if not isinstance(data, GPUArray):
        raise DTypeError(f"{name}: data must be a uint8 GPUArray, got {type(data).__name__}")
    if data.dtype != uint8:
        raise DTypeError(f"{name}: data must be uint8 (the tensor's raw bytes), got {data.dtype}")
    if not data.is_contiguous:
        raise ShapeError(f"{name}: data must be contiguous, got shape {data.shape} and strides {data.strides}")
    fmt = _type(name, qtype)
    dims = _shape(name, shape)
    target = as_dtype(dtype)
    if target not in _DTYPES:
        raise DTypeError(f"{name}: dtype must be float32, float16 or bfloat16, got {target}")
    count = math.prod(dims)
    if count % fmt.elements:
        raise ShapeError(f"{name}: shape {dims} holds {count} elements, not a multiple of the {fmt.elements}-element "
                         f"blocks of {fmt.name}")  # fmt: skip
    blocks = count // fmt.elements
    expected = blocks * fmt.nbytes
    if data.size != expected:
        raise ShapeError(f"{name}: data has {data.size} bytes but shape {dims} in {fmt.name} takes {expected} "
                         f"({blocks} blocks of {fmt.nbytes} bytes)")  # fmt: skip
    if out is None:
        result = empty(dims, target)
    else:
        if not isinstance(out, GPUArray):
            raise DTypeError(f"{name}: out must be a GPUArray, got {type(out).__name__}")
        if out.shape != dims:
            raise ShapeError(f"{name}: out has shape {out.shape} but the result has shape {dims}")
        if out.dtype != target:
            raise DTypeError(f"{name}: out has dtype {out.dtype} but the result is {target}")
        if not out.is_contiguous:
            raise ShapeError(f"{name}: out must be contiguous, got strides {out.strides}")
        if out._buffer is data._buffer and count:
            (a0, a1), (b0, b1) = _byte_range(out), _byte_range(data)
            if a0 < b1 and b0 < a1:
                raise ArgumentError(f"{name}: out overlaps data in memory")
        result = out
    check_devices(name, [data, result])
    if count == 0:
        return result
    if not is_cuda():
        _cpu_dequantize(fmt, _cpu.host(data).reshape(blocks, fmt.nbytes), _cpu.host(result).reshape(-1))
        return result
    key = (fmt.id, target, blocks, thread_device())
    plan = _PLANS.get(key)
    if plan is None:
        kernel = group(_FILE, _expressions(target)).kernel(_expression(fmt, target), _PARAMS)
        plan = _PLANS.put(key, (kernel, grid_for(-(-count // _TILE), 1, _BLOCKS_PER_SM)))
    kernel, grid = plan
    kernel(data.device_ptr, result.device_ptr, blocks, grid=grid, block=_THREADS)
    return result


# -- the CPU backend: NumPy decoders in the reference's float32 operation order ----------------------
# Each quant is gathered with a per-element table of (byte offset in the block, right shift, mask).
# Scales are multiplied first (d * sc) and kept in the reference's shapes, so that NumPy runs the
# same loops and even NaN payloads come out alike.
Field = tuple[Array, Array, Array]


def _field(offsets: Sequence[int], shifts: Sequence[int], mask: int | Sequence[int]) -> Field:
    return np.asarray(offsets, np.intp), np.asarray(shifts, np.uint8), np.asarray(mask, np.uint8)


def _take(raw: Array, field: Field) -> Array:
    """(blocks, len(offsets)) uint8: (byte >> shift) & mask for each column's byte of every block."""
    offsets, shifts, mask = field
    result: Array = (raw[:, offsets] >> shifts) & mask
    return result


def _f16(raw: Array, at: int) -> Array:
    """The float16 field at byte ``at`` of every block, as float32 of shape (blocks, 1)."""
    return np.ascontiguousarray(raw[:, at : at + 2]).view(np.float16).astype(np.float32)


def _nibbles(first: int) -> Field:
    """32-element blocks: element i in the low (i < 16) or high nibble of byte first + i % 16."""
    return _field([first + (i & 15) for i in range(32)], [4 * (i >> 4) for i in range(32)], 0x0F)


def _fifth_bits(first: int) -> Field:
    """Bit i of the little-endian 32-bit word at byte ``first``."""
    return _field([first + (i >> 3) for i in range(32)], [i & 7 for i in range(32)], 1)


_K_LOW = [0x3F] * 4 + [0x0F] * 4
_K_HIGH = [0x00] * 4 + [0x30] * 4


@functools.cache
def _tables() -> dict[str, Field]:
    k = range(256)
    j8 = range(8)
    j16 = range(16)
    return {
        "q4_0": _nibbles(2),
        "q4_1": _nibbles(4),
        "q5_0_low": _nibbles(6),
        "q5_0_high": _fifth_bits(2),
        "q5_1_low": _nibbles(8),
        "q5_1_high": _fifth_bits(4),
        # 2-bit quants of Q2_K (from byte 16) and Q3_K (32): i = 128 h + 32 s + l in bits 2s of byte 32 h + l
        "q2_k": _field([16 + (i >> 7) * 32 + (i & 31) for i in k], [2 * ((i >> 5) & 3) for i in k], 3),
        "q3_k_low": _field([32 + (i >> 7) * 32 + (i & 31) for i in k], [2 * ((i >> 5) & 3) for i in k], 3),
        "q3_k_high": _field([i & 31 for i in k], [i >> 5 for i in k], 1),
        "q3_k_scale_low": _field([96 + (j & 7) for j in j16], [4 * (j >> 3) for j in j16], 0x0F),
        "q3_k_scale_high": _field([104 + (j & 3) for j in j16], [2 * (j >> 2) for j in j16], 3),
        # Q4_K/Q5_K: 6-bit scale and min of sub-block j from the 12 bytes at 4 (k_scale_min in the kernel):
        # low bits (a) | top 2 bits (b, none for j < 4)
        "k_scale_a": _field([4 + (j if j < 4 else j + 4) for j in j8], [0] * 8, _K_LOW),
        "k_scale_b": _field([4 + (j if j < 4 else j - 4) for j in j8], [2] * 8, _K_HIGH),
        "k_min_a": _field([8 + j for j in j8], [0 if j < 4 else 4 for j in j8], _K_LOW),
        "k_min_b": _field([4 + j for j in j8], [2] * 8, _K_HIGH),
        "q4_k": _field([16 + (i >> 6) * 32 + (i & 31) for i in k], [4 * ((i >> 5) & 1) for i in k], 0x0F),
        "q5_k_low": _field([48 + (i >> 6) * 32 + (i & 31) for i in k], [4 * ((i >> 5) & 1) for i in k], 0x0F),
        "q5_k_high": _field([16 + (i & 31) for i in k], [i >> 5 for i in k], 1),
        "q6_k_low": _field([(i >> 7) * 64 + (i & 63) for i in k], [4 * ((i >> 6) & 1) for i in k], 0x0F),
        "q6_k_high": _field([128 + (i >> 7) * 32 + (i & 31) for i in k], [2 * ((i >> 5) & 3) for i in k], 3),
    }


def _k_scales(raw: Array) -> tuple[Array, Array]:
    """(scales, mins) of Q4_K/Q5_K blocks: (blocks, 8) float32 each."""
    t = _tables()
    scales = _take(raw, t["k_scale_a"]) | _take(raw, t["k_scale_b"])
    mins = _take(raw, t["k_min_a"]) | _take(raw, t["k_min_b"])
    return scales.astype(np.float32), mins.astype(np.float32)


def _plain_f32(raw: Array) -> Array:
    result: Array = raw.reshape(-1).view(np.float32)
    return result


def _plain_f16(raw: Array) -> Array:
    result: Array = raw.reshape(-1).view(np.float16).astype(np.float32)
    return result


def _plain_bf16(raw: Array) -> Array:
    result: Array = (raw.reshape(-1).view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return result


def _q8_0(raw: Array) -> Array:
    q = raw[:, 2:].view(np.int8).astype(np.float32)
    result: Array = q * _f16(raw, 0)
    return result


def _q4_0(raw: Array) -> Array:
    q = _take(raw, _tables()["q4_0"]).astype(np.int8) - np.int8(8)
    result: Array = _f16(raw, 0) * q.astype(np.float32)
    return result


def _q4_1(raw: Array) -> Array:
    q = _take(raw, _tables()["q4_1"]).astype(np.float32)
    result: Array = (_f16(raw, 0) * q) + _f16(raw, 2)
    return result


def _q5(raw: Array, low: str, high: str) -> Array:
    t = _tables()
    result: Array = _take(raw, t[low]) | (_take(raw, t[high]) << np.uint8(4))
    return result


def _q5_0(raw: Array) -> Array:
    q = _q5(raw, "q5_0_low", "q5_0_high").astype(np.int8) - np.int8(16)
    result: Array = _f16(raw, 0) * q.astype(np.float32)
    return result


def _q5_1(raw: Array) -> Array:
    q = _q5(raw, "q5_1_low", "q5_1_high").astype(np.float32)
    result: Array = (_f16(raw, 0) * q) + _f16(raw, 2)
    return result


def _q2_k(raw: Array) -> Array:
    n = raw.shape[0]
    scales = raw[:, :16]
    dl = (_f16(raw, 80) * (scales & np.uint8(0x0F)).astype(np.float32)).reshape(n, 16, 1)
    ml = (_f16(raw, 82) * (scales >> np.uint8(4)).astype(np.float32)).reshape(n, 16, 1)
    q = _take(raw, _tables()["q2_k"]).reshape(n, 16, 16).astype(np.float32)
    result: Array = (dl * q - ml).reshape(n, 256)
    return result


def _q3_k(raw: Array) -> Array:
    n = raw.shape[0]
    t = _tables()
    packed = _take(raw, t["q3_k_scale_low"]) | (_take(raw, t["q3_k_scale_high"]) << np.uint8(4))
    scales = (packed.astype(np.int8) - np.int8(32)).astype(np.float32)
    dl = (_f16(raw, 108) * scales).reshape(n, 16, 1)
    low = _take(raw, t["q3_k_low"]).astype(np.int8)
    offset = ((_take(raw, t["q3_k_high"]) ^ np.uint8(1)) << np.uint8(2)).astype(np.int8)
    q = (low - offset).reshape(n, 16, 16).astype(np.float32)
    result: Array = (dl * q).reshape(n, 256)
    return result


def _k_quant(raw: Array, q: Array) -> Array:
    n = raw.shape[0]
    scales, mins = _k_scales(raw)
    d = (_f16(raw, 0) * scales).reshape(n, 8, 1)
    dm = (_f16(raw, 2) * mins).reshape(n, 8, 1)
    result: Array = (d * q.reshape(n, 8, 32).astype(np.float32) - dm).reshape(n, 256)
    return result


def _q4_k(raw: Array) -> Array:
    return _k_quant(raw, _take(raw, _tables()["q4_k"]))


def _q5_k(raw: Array) -> Array:
    return _k_quant(raw, _q5(raw, "q5_k_low", "q5_k_high"))


def _q6_k(raw: Array) -> Array:
    n = raw.shape[0]
    t = _tables()
    scales = raw[:, 192:208].view(np.int8).astype(np.float32)
    d = (_f16(raw, 208) * scales).reshape(n, 16, 1)
    q = (_take(raw, t["q6_k_low"]) | (_take(raw, t["q6_k_high"]) << np.uint8(4))).astype(np.int8) - np.int8(32)
    result: Array = (d * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)
    return result


_CHUNK = 1 << 21  # elements decoded at a time on the CPU backend, bounding the temporaries of a large tensor


def _cpu_dequantize(fmt: _Type, raw: Array, flat: Array) -> None:
    """Decode the (blocks, bytes per block) ``raw`` into the contiguous 1-D view ``flat`` of the result,
    whole blocks at a time (each element takes the same NumPy loop whatever the chunk)."""
    decode = _DECODERS[fmt.name]
    step = max(1, _CHUNK // fmt.elements)
    for first in range(0, raw.shape[0], step):
        part = raw[first : first + step]
        # Silent like the kernels: NaN/inf scales of a corrupt tensor decode as the reference does, and
        # float16 results beyond its range round to inf.
        with np.errstate(all="ignore"):
            values = decode(part).reshape(-1)
            flat[first * fmt.elements : first * fmt.elements + values.size] = values.astype(flat.dtype, copy=False)


_DECODERS: dict[str, Callable[[Array], Array]] = {
    "F32": _plain_f32,
    "F16": _plain_f16,
    "BF16": _plain_bf16,
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}


# -- compile-check enumeration ----------------------------------------------------------------------
def _enumerate() -> Groups:
    return {_FILE: [_expressions(d) for d in _DTYPES]}


register_enumerator(_enumerate)
