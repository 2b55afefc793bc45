"""RoPE fused with the decode step's KV-cache write: :func:`rope_kv_append` rotates q, rotates k and
writes it, with v, into a fixed KV cache at positions read from the device, in one kernel launch
(native/kernels/nn/rope_kv.cu) where :func:`pygpukit.ops.apply_rope` followed by
:meth:`pygpukit.ops.KVCache.append` takes two.

The arithmetic is rope_apply's term for term (float32, one rounding at the store), so the cache and
q hold the values the two-launch path writes. q, k and v may be strided views into one fused qkv
buffer (the last dimension contiguous), so a fused QKV projection feeds it without a copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray
from pygpukit.core.dtypes import bfloat16, float16, float32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

from . import _cpu
from ._kernels import BLOCK, NAMESPACE, Groups, pointer, register_enumerator, size_param
from ._layout import check_devices, is_cuda
from .rope import RopeKernels

__all__ = ["rope_kv_append"]

_FILE = "nn/rope_kv.cu"
_SHAPE = KernelStruct(f"{NAMESPACE}RopeKVShape", _FILE, [
    ("q_stride", "long long[3]"), ("qo_stride", "long long[3]"), ("k_stride", "long long[3]"),
    ("v_stride", "long long[3]"), ("pos_stride", "long long"), ("batch", "int"), ("seq", "int"), ("q_heads", "int"),
    ("kv_heads", "int"), ("head_dim", "int"), ("half", "int"), ("max_positions", "int"), ("max_seq", "int"),
    ("offset", "int"), ("pad", "int"),
])  # fmt: skip
_DTYPES = (float32, float16, bfloat16)
_NAMES = frozenset(d.name for d in _DTYPES)
_STYLES = {"neox": 0, "gptj": 1}
_PARAMS = [*(pointer(n) for n in ("q", "q_out", "k", "v", "k_cache", "v_cache", "cos", "sin", "positions")),
           size_param("units"), _SHAPE.param("shape")]  # fmt: skip
_INT32_MAX = 2**31 - 1
_NAME = "rope_kv_append"

Array = np.ndarray[Any, Any]


_KERNELS = RopeKernels(_FILE, "rope_kv_append", _PARAMS, "ops.rope_kv.kernels", programmatic=True)


def _activation(name: str, x: Any, dtype: str | None) -> GPUArray:
    if not isinstance(x, GPUArray):
        raise DTypeError(f"{_NAME}: {name} must be a GPUArray, got {type(x).__name__}")
    if x.ndim != 4:
        raise ShapeError(f"{_NAME}: {name} must be (batch, seq, heads, head_dim), got shape {x.shape}")
    if x._dtype.name not in _NAMES or (dtype is not None and x._dtype.name != dtype):
        want = "float32, float16 or bfloat16" if dtype is None else f"{dtype} (q's dtype)"
        raise DTypeError(f"{_NAME}: {name} must be {want}, got {x.dtype}")
    if x._strides[-1] != 1 and x._shape[-1] > 1:
        raise ShapeError(f"{_NAME}: the last dimension of {name} must be contiguous (element stride 1), got shape "
                         f"{x.shape} with byte strides {x.strides}")  # fmt: skip
    return x


def _check(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, cos: Any, sin: Any, positions: Any, style: Any,
           rotary_dim: Any, offset: Any, q_out: Any) -> tuple[GPUArray, int, int]:  # fmt: skip
    """Every argument checked (typed errors naming the bad value); returns (q_out, half, offset)."""
    q = _activation("q", q, None)
    dt = q._dtype.name
    k, v = _activation("k", k, dt), _activation("v", v, dt)
    out = q if q_out is None else _activation("q_out", q_out, dt)
    batch, seq, _, head_dim = q.shape
    if out.shape != q.shape:
        raise ShapeError(f"{_NAME}: q_out {out.shape} must have q's shape {q.shape}")
    if k.shape != v.shape or k.shape[:2] != (batch, seq) or k.shape[3] != head_dim:
        raise ShapeError(f"{_NAME}: k {k.shape} and v {v.shape} must be (batch, seq, kv_heads, head_dim) with q's "
                         f"batch, seq and head_dim {q.shape}")  # fmt: skip
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(cache, GPUArray) or cache._dtype.name != dt:
            found = cache.dtype if isinstance(cache, GPUArray) else type(cache).__name__
            raise DTypeError(f"{_NAME}: {name} must be a {dt} GPUArray (q's dtype), got {found}")
        if cache.ndim != 4 or not cache.is_contiguous:
            raise ShapeError(f"{_NAME}: {name} must be a contiguous (batch, kv_heads, max_seq, head_dim) cache, got "
                             f"shape {cache.shape} with byte strides {cache.strides}")  # fmt: skip
        if cache.shape[0] < batch or cache.shape[1] != k.shape[2] or cache.shape[3] != head_dim:
            raise ShapeError(f"{_NAME}: {name} {cache.shape} does not hold k {k.shape} (batch at most {cache.shape[0]},"
                             f" kv_heads and head_dim equal)")  # fmt: skip
    if k_cache.shape != v_cache.shape:
        raise ShapeError(f"{_NAME}: k_cache {k_cache.shape} and v_cache {v_cache.shape} differ")
    if style not in _STYLES:
        raise ArgumentError(f"{_NAME}: style must be 'neox' or 'gptj', got {style!r}")
    for name, table in (("cos", cos), ("sin", sin)):
        if not isinstance(table, GPUArray):
            raise DTypeError(f"{_NAME}: {name} must be a GPUArray, got {type(table).__name__}")
        if table.ndim != 2 or not table.is_contiguous or min(table.shape) < 1:
            raise ShapeError(f"{_NAME}: {name} must be a contiguous (max_positions, rotary_dim // 2) table, got shape "
                             f"{table.shape} with byte strides {table.strides}")  # fmt: skip
        if table._dtype.name not in ("float32", dt):
            raise DTypeError(f"{_NAME}: {name} must be float32 or q's dtype {dt}, got {table.dtype}")
    if cos.shape != sin.shape or cos._dtype.name != sin._dtype.name:
        raise ShapeError(f"{_NAME}: cos {cos.shape} {cos.dtype} and sin {sin.shape} {sin.dtype} differ")
    half = cos.shape[1]
    if rotary_dim is not None and (isinstance(rotary_dim, bool) or rotary_dim != 2 * half):
        raise ShapeError(f"{_NAME}: rotary_dim {rotary_dim!r} does not match the tables' {half} columns")
    if 2 * half > head_dim:
        raise ShapeError(f"{_NAME}: rotary_dim {2 * half} (tables {cos.shape}) exceeds head_dim {head_dim}")
    if not isinstance(positions, GPUArray) or positions._dtype.name != "int32":
        found = positions.dtype if isinstance(positions, GPUArray) else type(positions).__name__
        raise DTypeError(f"{_NAME}: positions must be an int32 GPUArray, got {found}")
    if positions.shape != (batch,):
        raise ShapeError(f"{_NAME}: positions must have shape ({batch},) for q {q.shape}, got {positions.shape}")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or not -_INT32_MAX <= offset <= _INT32_MAX:
        raise ArgumentError(f"{_NAME}: position_offset must be an int32, got {offset!r}")
    check_devices(_NAME, [q, out, k, v, k_cache, v_cache, cos, sin, positions])
    return out, half, int(offset)


def rope_kv_append(
    q: GPUArray,
    k: GPUArray,
    v: GPUArray,
    k_cache: GPUArray,
    v_cache: GPUArray,
    cos: GPUArray,
    sin: GPUArray,
    positions: GPUArray,
    *,
    style: str = "neox",
    rotary_dim: int | None = None,
    position_offset: int = 0,
    q_out: GPUArray | None = None,
) -> GPUArray:
    """Rotate q into ``q_out`` (default: q, in place) and write rotated k and v into the cache, in
    one launch; returns ``q_out``.

    ``q`` (batch, seq, num_heads, head_dim), ``k`` and ``v`` (batch, seq, num_kv_heads, head_dim):
    float32, float16 or bfloat16, last dimension contiguous, other strides free; k and v are read
    only. ``k_cache``/``v_cache``: a :class:`pygpukit.ops.KVCache` layer (``cache.k(layer)``,
    ``cache.v(layer)``), contiguous (cache_batch >= batch, num_kv_heads, max_seq, head_dim).
    ``cos``/``sin``: tables of :func:`pygpukit.ops.rope_cos_sin` (or a RotaryEmbedding's), float32
    or q's dtype; ``style`` and ``rotary_dim`` as for :func:`pygpukit.ops.apply_rope`. Token (b, s)
    sits at position ``positions[b] + position_offset + s`` (``positions`` int32 (batch,) on the
    device, read by the kernel: capturable in a CUDA graph and replayed at any position; -1 takes a
    lengths buffer that already counts the new token). The result equals ``apply_rope(q, k, ...)``
    followed by ``KVCache.append(layer, k, v, positions, offset)``, bit for bit. Positions outside the
    cache raise ArgumentError on the CPU backend; on the GPU the kernel skips those cache writes and
    clamps positions into the tables (as the two ops do)."""
    out, half, offset = _check(q, k, v, k_cache, v_cache, cos, sin, positions, style, rotary_dim, position_offset,
                               q_out)  # fmt: skip
    batch, seq, q_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    max_seq = k_cache.shape[2]
    if batch * seq == 0:
        return out
    if batch * seq > _INT32_MAX:
        raise ShapeError(f"{_NAME}: batch * seq = {batch * seq} exceeds 2**31 - 1")
    if not is_cuda():
        _cpu_rope_kv(q, out, k, v, k_cache, v_cache, cos, sin, positions, style, half, offset)
        return out
    width = 16 // q.dtype.itemsize
    arrays = (q, out, k, v)
    vector = half % width == 0 and (head_dim - 2 * half) % width == 0 and head_dim % width == 0
    vector = vector and all(a.device_ptr % 16 == 0 and all(s % width == 0 for s in a._strides[:3]) for a in arrays)
    vector = vector and all(a.device_ptr % 16 == 0 for a in (k_cache, v_cache, cos, sin))
    w = width if vector else 1
    kernel = _KERNELS.kernel(q.dtype, cos.dtype, _STYLES[style], w)
    shape = _SHAPE.pack_flat(*q._strides[:3], *out._strides[:3], *k._strides[:3], *v._strides[:3],
                             positions._strides[0], batch, seq, q_heads, kv_heads, head_dim, half, cos.shape[0],
                             max_seq, offset, 0)  # fmt: skip
    units = batch * seq * (q_heads + 2 * kv_heads) * (half // w + (head_dim - 2 * half) // w)
    grid = max(1, min(-(-units // BLOCK), 1 << 20))
    kernel(q.device_ptr, out.device_ptr, k.device_ptr, v.device_ptr, k_cache.device_ptr, v_cache.device_ptr,
           cos.device_ptr, sin.device_ptr, positions.device_ptr, units, shape, grid=grid, block=BLOCK)  # fmt: skip
    return out


def _rotate(x: Array, c: Array, s: Array, style: str, half: int, dtype: Any) -> Array:
    """x (..., head_dim) of the storage dtype rotated as rope.py's _cpu_rope computes it (float32,
    one rounding), the dimensions past 2 * half unchanged."""
    y: Array = np.array(x, copy=True)
    if style == "neox":
        x1, x2 = x[..., :half].astype(np.float32), x[..., half : 2 * half].astype(np.float32)
        y[..., :half] = (x1 * c - x2 * s).astype(dtype)
        y[..., half : 2 * half] = (x2 * c + x1 * s).astype(dtype)
    else:
        x1, x2 = x[..., 0 : 2 * half : 2].astype(np.float32), x[..., 1 : 2 * half : 2].astype(np.float32)
        y[..., 0 : 2 * half : 2] = (x1 * c - x2 * s).astype(dtype)
        y[..., 1 : 2 * half : 2] = (x2 * c + x1 * s).astype(dtype)
    return y


def _cpu_rope_kv(q: GPUArray, out: GPUArray, k: GPUArray, v: GPUArray, k_cache: GPUArray, v_cache: GPUArray,
                 cos: GPUArray, sin: GPUArray, positions: GPUArray, style: str, half: int,
                 offset: int) -> None:  # fmt: skip
    batch, seq = q.shape[:2]
    max_seq = k_cache.shape[2]
    pos = _cpu.host(positions).astype(np.int64) + offset
    bad = (pos < 0) | (pos + seq > max_seq)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ArgumentError(f"{_NAME}: batch row {row} writes positions [{pos[row]}, {pos[row] + seq}), outside the "
                            f"cache's max_seq {max_seq}")  # fmt: skip
    at = pos[:, None] + np.arange(seq)[None, :]  # (batch, seq)
    tables = np.clip(at, 0, cos.shape[0] - 1)
    c = _cpu.host(cos).astype(np.float32)[tables][:, :, None, :]  # (batch, seq, 1, half)
    s = _cpu.host(sin).astype(np.float32)[tables][:, :, None, :]
    dtype = q.dtype.numpy
    rotated_q = _rotate(_cpu.host(q), c, s, style, half, dtype)
    rotated_k = _rotate(_cpu.host(k), c, s, style, half, dtype)
    values = _cpu.host(v)
    _cpu.host(out)[...] = rotated_q
    kc, vc = _cpu.host(k_cache), _cpu.host(v_cache)
    for b in range(batch):
        kc[b, :, at[b, 0] : at[b, 0] + seq, :] = rotated_k[b].transpose(1, 0, 2)
        vc[b, :, at[b, 0] : at[b, 0] + seq, :] = values[b].transpose(1, 0, 2)


def _enumerate() -> Groups:
    groups: list[tuple[str, ...]] = []
    for dtype in _DTYPES:
        for table in dict.fromkeys((float32, dtype)):
            groups.append(_KERNELS.expressions(dtype, table))
    return {_FILE: groups}


register_enumerator(_enumerate)
