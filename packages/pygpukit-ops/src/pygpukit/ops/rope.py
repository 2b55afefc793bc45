"""Rotary position embeddings (RoPE): cos/sin tables with Hugging Face's rope scaling types, and
:func:`apply_rope`, which rotates q and k in place in one kernel launch (native/kernels/nn/rope.cu);
:func:`rope_inplace` is its short form, ``rope_inplace(x, freqs)``, with the tables of a
:class:`RotaryEmbedding` (or a ``(cos, sin)`` pair) and positions 0, 1, ... by default.

Tables are computed in float64 on the host, once, and uploaded: ``cos[p, i] = cos(p * inv_freq[i]) *
attention_factor`` for positions ``p < max_positions`` and the ``rotary_dim // 2`` frequencies
``inv_freq`` of the scaling type (the formulas of transformers' ``ROPE_INIT_FUNCTIONS``: default,
linear, dynamic NTK-aware, YaRN with its attention factor, llama3). The rotation itself runs in float32
for every storage dtype and rounds once when stored.

Layouts: q is (batch, seq, num_heads, head_dim), k is (batch, seq, num_kv_heads, head_dim), the last
dimension contiguous, the other strides arbitrary; positions are int32, (batch, seq) or (seq,).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import DType, as_dtype, bfloat16, float16, float32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache

from . import _cpu, _route
from ._kernels import BLOCK, NAMESPACE, Groups, group, pointer, register_enumerator, size_param
from ._layout import check_devices, is_cuda

__all__ = ["RotaryEmbedding", "apply_rope", "rope_cos_sin", "rope_inplace", "rope_inv_freq"]

_FILE = "nn/rope.cu"
# RopeShape of nn/rope.cu, declared once (checked there by the kernel compile check's static_asserts).
_SHAPE = KernelStruct(
    "pygpukit::ops::RopeShape",
    "nn/rope.cu",
    [("q_stride", "long long[3]"), ("k_stride", "long long[3]"), ("pos_stride", "long long[2]"), ("batch", "int"),
     ("seq", "int"), ("q_heads", "int"), ("k_heads", "int"), ("half", "int"), ("max_positions", "int"),
     ("offset", "int"), ("pad", "int")],
)  # fmt: skip
_DTYPES = (float32, float16, bfloat16)
_NAMES = frozenset(d.name for d in _DTYPES)  # name checks: DType equality is a dataclass comparison
_STYLES = {"neox": 0, "gptj": 1}
_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
_PARAMS = [pointer("q"), pointer("k"), pointer("cos"), pointer("sin"), pointer("positions"), size_param("units"),
           _SHAPE.param("shape")]  # fmt: skip
_INT32_MAX = 2**31 - 1

Array = np.ndarray[Any, Any]


# -- tables ----------------------------------------------------------------------------------------
def _rotary_dim(head_dim: int, rotary_dim: int | None) -> int:
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 2:
        raise ArgumentError(f"head_dim must be an int >= 2, got {head_dim!r}")
    dim = int(head_dim) if rotary_dim is None else rotary_dim
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 2 <= dim <= head_dim or dim % 2:
        raise ArgumentError(f"rotary_dim must be an even int in [2, head_dim={head_dim}], got {rotary_dim!r}")
    return int(dim)


def _number(scaling: Mapping[str, Any], key: str, rope_type: str, default: float | None = None) -> float:
    value = scaling.get(key, default)
    if value is None:
        raise ArgumentError(f"rope scaling {rope_type!r} needs {key!r} (got keys {sorted(scaling)})")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentError(f"rope scaling {key!r} must be a number, got {value!r}")
    return float(value)


def _original_length(scaling: Mapping[str, Any], rope_type: str, prefer_original: bool) -> float:
    keys = ("original_max_position_embeddings", "max_position_embeddings")
    for key in keys if prefer_original else keys[::-1]:
        if scaling.get(key) is not None:
            value = _number(scaling, key, rope_type)
            if value <= 0:
                raise ArgumentError(f"rope scaling {key!r} must be positive, got {value!r}")
            return value
    raise ArgumentError(f"rope scaling {rope_type!r} needs 'original_max_position_embeddings' or "
                        f"'max_position_embeddings' (got keys {sorted(scaling)})")  # fmt: skip


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(
    head_dim: int,
    theta: float = 10000.0,
    rotary_dim: int | None = None,
    scaling: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
) -> tuple[Array, float]:
    """The ``rotary_dim // 2`` inverse frequencies (float64 NumPy array) and the attention factor that
    multiplies cos and sin, for ``scaling`` (a Hugging Face ``rope_scaling`` dict, ``rope_type`` or
    ``type`` one of default, linear, dynamic, yarn, llama3; None is default). ``seq_len`` is the
    sequence length dynamic NTK scaling is computed for (default: its max_position_embeddings)."""
    dim = _rotary_dim(head_dim, rotary_dim)
    base = float(theta)
    if not base > 1.0 or not math.isfinite(base):
        raise ArgumentError(f"theta must be a finite number > 1, got {theta!r}")
    rope_type = "default"
    params: Mapping[str, Any] = {}
    if scaling is not None:
        if not isinstance(scaling, Mapping):
            raise ArgumentError(f"scaling must be a dict like transformers' rope_scaling, got {scaling!r}")
        params = scaling
        rope_type = str(scaling.get("rope_type", scaling.get("type", "default")))
        if rope_type not in _ROPE_TYPES:
            raise ArgumentError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(_ROPE_TYPES)}")
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    attention_factor = 1.0
    if rope_type in ("linear", "dynamic", "yarn", "llama3"):
        factor = _number(params, "factor", rope_type)
        if not factor > 0:
            raise ArgumentError(f"rope scaling 'factor' must be positive, got {factor!r}")
    if rope_type == "dynamic":
        length = _original_length(params, rope_type, prefer_original=False)
        current = length if seq_len is None else max(float(seq_len), length)
        if dim <= 2:
            raise ArgumentError(f"dynamic rope scaling needs rotary_dim > 2, got {dim}")
        base = base * ((factor * current / length) - (factor - 1.0)) ** (dim / (dim - 2))
    inv_freq: Array = 1.0 / base**exponents
    if rope_type == "linear":
        inv_freq = inv_freq / factor
    elif rope_type == "yarn":
        original = _original_length(params, rope_type, prefer_original=True)
        given = params.get("attention_factor")
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if given is not None:
            attention_factor = _number(params, "attention_factor", rope_type)
        elif mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
        beta_fast = float(params.get("beta_fast") or 32.0)
        beta_slow = float(params.get("beta_slow") or 1.0)

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2.0 * math.pi))) / (2.0 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if params.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # no division by zero
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        extrapolation = 1.0 - ramp  # 1: keep the original frequency, 0: interpolate
        inv_freq = (inv_freq / factor) * (1.0 - extrapolation) + inv_freq * extrapolation
    elif rope_type == "llama3":
        low_factor = _number(params, "low_freq_factor", rope_type)
        high_factor = _number(params, "high_freq_factor", rope_type)
        if not high_factor > low_factor > 0:
            raise ArgumentError(f"llama3 rope scaling needs high_freq_factor > low_freq_factor > 0, got "
                                f"{high_factor!r} and {low_factor!r}")  # fmt: skip
        old_context = _original_length(params, rope_type, prefer_original=True)
        low_wavelen, high_wavelen = old_context / low_factor, old_context / high_factor
        wavelen = 2.0 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low_factor) / (high_factor - low_factor)
        smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled)
    return np.asarray(inv_freq, dtype=np.float64), float(attention_factor)


def _check_table_dtype(dtype: Any) -> DType:
    dt = as_dtype(dtype)
    if dt not in _DTYPES:
        raise DTypeError(f"RoPE tables can be float32, float16 or bfloat16, got {dt}")
    return dt


def rope_cos_sin(
    head_dim: int,
    max_positions: int,
    theta: float = 10000.0,
    rotary_dim: int | None = None,
    scaling: Mapping[str, Any] | None = None,
    dtype: Any = float32,
) -> tuple[GPUArray, GPUArray]:
    """(cos, sin) device tables of shape (max_positions, rotary_dim // 2), computed in float64 and
    rounded once to ``dtype`` (float32, float16 or bfloat16); YaRN's attention factor is folded in.
    Dynamic NTK scaling is computed for a sequence of ``max_positions`` tokens, as transformers does
    for a sequence of that length."""
    dt = _check_table_dtype(dtype)
    if (
        isinstance(max_positions, bool)
        or not isinstance(max_positions, (int, np.integer))
        or not (1 <= max_positions <= _INT32_MAX)
    ):
        raise ArgumentError(f"max_positions must be an int in [1, 2**31 - 1], got {max_positions!r}")
    inv_freq, attention_factor = rope_inv_freq(head_dim, theta, rotary_dim, scaling, seq_len=int(max_positions))
    angles = np.arange(int(max_positions), dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.cos(angles) * attention_factor
    sin = np.sin(angles) * attention_factor
    return from_numpy(cos.astype(dt.numpy)), from_numpy(sin.astype(dt.numpy))


# -- apply_rope ------------------------------------------------------------------------------------
class RopeKernels:
    """The JIT kernels of one RoPE kernel template ``<T, C, kGptj, W>`` (``rope_apply`` here,
    ``rope_kv_append`` in rope_kv.py), compiled as one group per (dtype, table dtype): both styles
    and both pack widths. ``programmatic``: the template waits with overlap_wait() (common/overlap.cuh)."""

    def __init__(self, file: str, template: str, params: Any, cache: str, programmatic: bool = False) -> None:
        self._file, self._template, self._params = file, template, params
        self._programmatic = programmatic
        self._kernels: PlanCache[JITKernel] = PlanCache(cache)

    def expression(self, dtype: DType, table: DType, gptj: int, width: int) -> str:
        return f"{NAMESPACE}{self._template}<{dtype.ctype}, {table.ctype}, {gptj}, {width}>"

    def expressions(self, dtype: DType, table: DType) -> tuple[str, ...]:
        return tuple(self.expression(dtype, table, gptj, width)
                     for gptj in (0, 1) for width in (16 // dtype.itemsize, 1))  # fmt: skip

    def kernel(self, dtype: DType, table: DType, gptj: int, width: int) -> JITKernel:
        key = (dtype.name, table.name, gptj, width)
        kernel = self._kernels.get(key)
        if kernel is None:
            expression = self.expression(dtype, table, gptj, width)
            group_ = group(self._file, self.expressions(dtype, table))
            kernel = self._kernels.put(key, group_.kernel(expression, self._params, self._programmatic))
        return kernel


_KERNELS = RopeKernels(_FILE, "rope_apply", _PARAMS, "ops.rope.kernels")


def _check_activation(name: str, x: Any, ndim: int = 4) -> GPUArray:
    if not isinstance(x, GPUArray):
        raise DTypeError(f"apply_rope: {name} must be a GPUArray, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ShapeError(f"apply_rope: {name} must be (batch, seq, heads, head_dim), got shape {x.shape}")
    if x._dtype.name not in _NAMES:
        raise DTypeError(f"apply_rope: {name} must be float32, float16 or bfloat16, got {x.dtype}")
    if x._strides[-1] != 1 and x._shape[-1] > 1:
        raise ShapeError(f"apply_rope: the last dimension of {name} must be contiguous (element stride 1), got "
                         f"shape {x.shape} with byte strides {x.strides}")  # fmt: skip
    return x


def _check_args(
    q: Any, k: Any, cos: Any, sin: Any, positions: Any, style: str, rotary_dim: int | None
) -> tuple[GPUArray, GPUArray | None, GPUArray, GPUArray, GPUArray, int]:
    q = _check_activation("q", q)
    if k is not None:
        k = _check_activation("k", k)
        if k._dtype.name != q._dtype.name:
            raise DTypeError(f"apply_rope: q and k must have one dtype, got {q.dtype} and {k.dtype}")
        if k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
            raise ShapeError(f"apply_rope: k {k.shape} must match q {q.shape} in batch, seq and head_dim")
    if style not in _STYLES:
        raise ArgumentError(f"apply_rope: style must be 'neox' or 'gptj', got {style!r}")
    for name, table in (("cos", cos), ("sin", sin)):
        if not isinstance(table, GPUArray):
            raise DTypeError(f"apply_rope: {name} must be a GPUArray, got {type(table).__name__}")
        if table.ndim != 2 or not table.is_contiguous:
            raise ShapeError(f"apply_rope: {name} must be a contiguous (max_positions, rotary_dim // 2) table, "
                             f"got shape {table.shape} with byte strides {table.strides}")  # fmt: skip
        if table._dtype.name not in ("float32", q._dtype.name):
            raise DTypeError(f"apply_rope: {name} must be float32 or q's dtype {q.dtype}, got {table.dtype}")
    if cos.shape != sin.shape or cos._dtype.name != sin._dtype.name:
        raise ShapeError(f"apply_rope: cos {cos.shape} {cos.dtype} and sin {sin.shape} {sin.dtype} differ")
    max_positions, half = cos.shape
    if max_positions < 1 or half < 1:
        raise ShapeError(f"apply_rope: empty tables {cos.shape}")
    head_dim = q.shape[3]
    dim = 2 * half if rotary_dim is None else rotary_dim
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim != 2 * half:
        raise ShapeError(f"apply_rope: rotary_dim {rotary_dim!r} does not match the tables' {half} columns "
                         f"(rotary_dim = 2 * columns = {2 * half})")  # fmt: skip
    if dim > head_dim:
        raise ShapeError(f"apply_rope: rotary_dim {dim} (tables {cos.shape}) exceeds head_dim {head_dim}")
    if not isinstance(positions, GPUArray):
        raise DTypeError(f"apply_rope: positions must be an int32 GPUArray, got {type(positions).__name__}")
    if positions._dtype.name != "int32":
        raise DTypeError(f"apply_rope: positions must be int32, got {positions.dtype}")
    batch, seq = q.shape[:2]
    if positions.shape not in ((batch, seq), (seq,)) and not (seq == 1 and positions.shape == (batch,)):
        raise ShapeError(f"apply_rope: positions must have shape ({batch}, {seq}) or ({seq},) (or ({batch},) when "
                         f"seq is 1) for q {q.shape}, got {positions.shape}")  # fmt: skip
    arrays = [q, cos, sin, positions] + ([k] if k is not None else [])
    check_devices("apply_rope", arrays)
    return q, k, cos, sin, positions, int(dim)


def _aligned(x: GPUArray, width: int) -> bool:
    return x.device_ptr % 16 == 0 and all(s % width == 0 for s in x._strides[:3])


def apply_rope(
    q: GPUArray,
    k: GPUArray | None,
    cos: GPUArray,
    sin: GPUArray,
    positions: GPUArray,
    style: str = "neox",
    rotary_dim: int | None = None,
    position_offset: int = 0,
) -> None:
    """Rotate the first ``rotary_dim`` dimensions of every head of ``q`` and ``k`` (None to skip it)
    in place by the angles of ``positions``, in one launch, computed in float32.

    ``style="neox"`` pairs dimension i with i + rotary_dim/2 (Llama, Qwen, transformers' rotate_half);
    ``"gptj"`` pairs 2i with 2i + 1. ``cos``/``sin`` come from :func:`rope_cos_sin` (float32 or q's
    dtype); ``rotary_dim`` defaults to twice their width and must equal it. ``positions`` is int32
    (batch, seq), (seq,) or, when seq is 1, (batch,); ``position_offset`` is added to every position
    (e.g. -1 to use a paged cache's context_lens after advance() as the positions). Positions outside
    [0, max_positions) raise ArgumentError on the CPU backend; on the GPU (where positions are not
    read by the host) the kernel clamps them into the table. Capturable in a CUDA graph."""
    if _route.hook is not None and _route.hook(
        "rotary", (q, k, cos, sin, positions),
        {"style": style, "rotary_dim": rotary_dim, "position_offset": position_offset},
    ) is not _route.BUILTIN:  # fmt: skip
        return
    q, k, cos, sin, positions, dim = _check_args(q, k, cos, sin, positions, style, rotary_dim)
    if (
        isinstance(position_offset, bool)
        or not isinstance(position_offset, (int, np.integer))
        or not (-_INT32_MAX <= position_offset <= _INT32_MAX)
    ):
        raise ArgumentError(f"apply_rope: position_offset must be an int32, got {position_offset!r}")
    offset = int(position_offset)
    batch, seq, q_heads = q.shape[:3]
    k_heads = k.shape[2] if k is not None else 0
    half = dim // 2
    max_positions = cos.shape[0]
    if batch * seq == 0 or q_heads + k_heads == 0:
        return
    if batch * seq > _INT32_MAX:
        raise ShapeError(f"apply_rope: batch * seq = {batch * seq} exceeds 2**31 - 1")
    if not is_cuda():
        _cpu_rope(q, k, cos, sin, positions, style, half, max_positions, offset)
        return
    width = 16 // q.dtype.itemsize
    vector = half % width == 0 and _aligned(q, width) and (k is None or _aligned(k, width))
    vector = vector and cos.device_ptr % 16 == 0 and sin.device_ptr % 16 == 0
    w = width if vector else 1
    kernel = _KERNELS.kernel(q.dtype, cos.dtype, _STYLES[style], w)
    k_strides = k._strides[:3] if k is not None else (0, 0, 0)
    if positions.ndim == 2:
        pos_strides = positions._strides
    elif positions.shape == (seq,):
        pos_strides = (0, positions._strides[0])
    else:  # (batch,) with seq 1
        pos_strides = (positions._strides[0], 0)
    shape = _SHAPE.pack_flat(*q._strides[:3], *k_strides, *pos_strides, batch, seq, q_heads, k_heads, half,
                             max_positions, offset, 0)  # fmt: skip
    units = batch * seq * (q_heads + k_heads) * (half // w)
    grid = max(1, min(-(-units // BLOCK), 1 << 20))
    kernel(q.device_ptr, 0 if k is None else k.device_ptr, cos.device_ptr, sin.device_ptr, positions.device_ptr,
           units, shape, grid=grid, block=BLOCK)  # fmt: skip


def _cpu_rope(
    q: GPUArray,
    k: GPUArray | None,
    cos: GPUArray,
    sin: GPUArray,
    positions: GPUArray,
    style: str,
    half: int,
    max_positions: int,
    offset: int,
) -> None:
    pos = _cpu.host(positions).astype(np.int64) + offset
    bad = (pos < 0) | (pos >= max_positions)
    if bad.any():
        value = int(pos[bad].reshape(-1)[0])
        raise ArgumentError(
            f"apply_rope: position {value} is outside the RoPE tables' [0, {max_positions}) "
            f"({int(bad.sum())} positions out of range); build larger tables with rope_cos_sin"
        )
    pos = pos[:, None] if pos.shape == (q.shape[0],) and q.shape[1] == 1 else pos
    pos = np.broadcast_to(pos, q.shape[:2])
    c = _cpu.host(cos).astype(np.float32)[pos][:, :, None, :]  # (batch, seq, 1, half)
    s = _cpu.host(sin).astype(np.float32)[pos][:, :, None, :]
    for x in (q, k):
        if x is None:
            continue
        view = _cpu.host(x)
        if style == "neox":
            x1 = view[..., :half].astype(np.float32)
            x2 = view[..., half : 2 * half].astype(np.float32)
            first, second = view[..., :half], view[..., half : 2 * half]
        else:
            x1 = view[..., 0 : 2 * half : 2].astype(np.float32)
            x2 = view[..., 1 : 2 * half : 2].astype(np.float32)
            first, second = view[..., 0 : 2 * half : 2], view[..., 1 : 2 * half : 2]
        first[...] = (x1 * c - x2 * s).astype(x.dtype.numpy)
        second[...] = (x2 * c + x1 * s).astype(x.dtype.numpy)


class RotaryEmbedding:
    """RoPE tables for one model and the style to apply them with: ``rope(q, k, positions)``.

    ``RotaryEmbedding(head_dim, max_positions, theta, rotary_dim=None, scaling=None, style="neox",
    dtype=float32)``; ``cos``/``sin`` are the device tables, ``inv_freq``/``attention_factor`` the
    host values they were computed from."""

    __slots__ = ("attention_factor", "cos", "head_dim", "inv_freq", "max_positions", "rotary_dim", "sin", "style")

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float = 10000.0,
        rotary_dim: int | None = None,
        scaling: Mapping[str, Any] | None = None,
        style: str = "neox",
        dtype: Any = float32,
    ) -> None:
        if style not in _STYLES:
            raise ArgumentError(f"style must be 'neox' or 'gptj', got {style!r}")
        self.head_dim = int(head_dim)
        self.rotary_dim = _rotary_dim(head_dim, rotary_dim)
        self.max_positions = int(max_positions)
        self.style = style
        self.inv_freq, self.attention_factor = rope_inv_freq(head_dim, theta, rotary_dim, scaling, max_positions)
        self.cos, self.sin = rope_cos_sin(head_dim, max_positions, theta, rotary_dim, scaling, dtype)

    def __call__(self, q: GPUArray, k: GPUArray | None, positions: GPUArray, position_offset: int = 0) -> None:
        """:func:`apply_rope` with these tables, in place."""
        apply_rope(q, k, self.cos, self.sin, positions, self.style, self.rotary_dim, position_offset)

    def __repr__(self) -> str:
        return (f"RotaryEmbedding(head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, "
                f"max_positions={self.max_positions}, style={self.style!r}, dtype={self.cos.dtype})")  # fmt: skip


# -- rope_inplace -----------------------------------------------------------------------------------
# Device tables 0, 1, ..., capacity - 1 (int32) by (device, capacity), capacity a power of two: the
# default positions of rope_inplace are a prefix of one.
_positions: PlanCache[GPUArray] = PlanCache("rope_inplace positions", maxsize=64)


def _default_positions(seq: int, device: int) -> GPUArray:
    """int32 positions 0 .. seq - 1 on the device (uploaded once per power-of-two length: make the
    first call for a length before capturing a CUDA graph)."""
    capacity = 1 << max(seq - 1, 0).bit_length()
    key = (device, capacity)
    table = _positions.get(key)
    if table is None or table.buffer.freed:
        table = _positions.put(key, from_numpy(np.arange(capacity, dtype=np.int32)))
    return table[:seq]


def _tables(freqs: Any) -> tuple[GPUArray, GPUArray, str | None, int | None]:
    if isinstance(freqs, RotaryEmbedding):
        return freqs.cos, freqs.sin, freqs.style, freqs.rotary_dim
    if isinstance(freqs, (tuple, list)) and len(freqs) == 2 and all(isinstance(t, GPUArray) for t in freqs):
        return freqs[0], freqs[1], None, None
    raise DTypeError(f"rope_inplace: freqs must be a RotaryEmbedding or a (cos, sin) pair of tables from "
                     f"rope_cos_sin, got {type(freqs).__name__}")  # fmt: skip


def _as_4d(name: str, x: Any) -> GPUArray:
    if not isinstance(x, GPUArray):
        raise DTypeError(f"rope_inplace: {name} must be a GPUArray, got {type(x).__name__}")
    if x.ndim == 3:
        return x[None]  # (1, seq, heads, head_dim): a view, written in place
    if x.ndim != 4:
        raise ShapeError(f"rope_inplace: {name} must be (seq, heads, head_dim) or (batch, seq, heads, head_dim), "
                         f"got shape {x.shape}")  # fmt: skip
    return x


def rope_inplace(
    x: GPUArray,
    freqs: RotaryEmbedding | tuple[GPUArray, GPUArray],
    positions: GPUArray | None = None,
    *,
    k: GPUArray | None = None,
    style: str | None = None,
    position_offset: int = 0,
) -> None:
    """Rotate ``x`` (and ``k``, if given) in place by rotary position embeddings: :func:`apply_rope`
    with the tables of ``freqs``, a :class:`RotaryEmbedding` (its tables, style and rotary_dim) or a
    ``(cos, sin)`` pair from :func:`rope_cos_sin` (style "neox" unless ``style`` says otherwise).

    ``x`` and ``k`` are (seq, heads, head_dim) or (batch, seq, heads, head_dim), float32, float16 or
    bfloat16, with a contiguous last dimension (other strides are free: views into a fused qkv buffer
    work). ``positions`` is as for apply_rope; None means 0, 1, ..., seq - 1 for every sequence, plus
    ``position_offset``. Errors are apply_rope's (raised before anything is written), and
    :class:`DTypeError` for ``freqs`` that is neither, :class:`ShapeError` for another rank or x and k
    of different ranks."""
    cos, sin, table_style, rotary_dim = _tables(freqs)
    q4 = _as_4d("x", x)
    k4 = None if k is None else _as_4d("k", k)
    if k is not None and k.ndim != x.ndim:
        raise ShapeError(f"rope_inplace: x {x.shape} and k {k.shape} must have the same rank")
    if positions is None:
        positions = _default_positions(q4.shape[1], q4.buffer.device)
    chosen = style if style is not None else (table_style or "neox")
    apply_rope(q4, k4, cos, sin, positions, chosen, rotary_dim, position_offset)


# -- compile-check enumeration ----------------------------------------------------------------------
def _enumerate() -> Groups:
    groups: list[tuple[str, ...]] = []
    for dtype in _DTYPES:
        for table in dict.fromkeys((float32, dtype)):
            groups.append(_KERNELS.expressions(dtype, table))
    return {_FILE: groups}


register_enumerator(_enumerate)
