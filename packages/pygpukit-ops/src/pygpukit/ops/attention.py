"""Scaled dot-product attention: prefill (causal, sliding window, grouped-query), non-causal and cross
attention, and decode attention over a fixed or paged KV cache.

Layouts (the head dimension contiguous, any other strides):

- ``q``: (batch, seq_q, num_heads, head_dim); ``k``, ``v``: (batch, seq_kv, num_kv_heads, head_dim);
  the output is (batch, seq_q, num_heads, head_dim). ``num_heads`` is a multiple of ``num_kv_heads``
  (grouped-query and multi-query attention: query head h reads kv head h // (num_heads // num_kv_heads)).
- Fixed KV cache: ``k_cache``, ``v_cache`` (batch, num_kv_heads, max_seq_len, head_dim).
- Paged KV cache: ``k_blocks``, ``v_blocks`` (num_blocks, num_kv_heads, block_size, head_dim),
  ``block_table`` int32 (batch, max_blocks_per_seq), ``context_lens`` int32 (batch,).

Causal masking aligns the queries to the end of the keys (flash-attention's bottom-right convention):
with seq_q <= seq_kv, query i sits at position p = seq_kv - seq_q + i and sees keys j <= p, and with a
sliding ``window`` w only keys p - w < j <= p. The default scale is 1 / sqrt(head_dim).

fp16 and bf16 run on tensor cores (mma.sync, flash-attention 2 style tiling with an online softmax in
float32, native/kernels/attention/attention_prefill.cu; on SM 90 devices head dimensions 64 and 128 run
a warpgroup-MMA kernel instead, attention_prefill_sm90.cu through _attention_sm90.py, which
:func:`set_prefill_kernel` can turn off for comparison); decode attention splits the keys over many blocks,
the last block of each sequence and kv head merging the splits (attention_decode.cu), and reads the
length of every sequence from device memory so that one captured CUDA graph serves every position.
float32 runs on the CUDA cores. Every kernel is deterministic (no atomics on the data) and allocates
nothing when ``out=`` (and for decode a :class:`DecodeWorkspace`) is given. On the CPU backend the
same functions compute in float64 NumPy.

Launches are planned once per call shape and device (kernel, tiling, grid and every non-pointer field
of the AttentionArgs struct, a KernelStruct checked against attention_common.cuh) in a
:class:`~pygpukit.core.plans.PlanCache`; a repeated call packs the addresses and launches. The module
is over 600 lines because the five entry points share these checks and launch plans.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, allocate, empty, from_numpy
from pygpukit.core.device import get_device_info
from pygpukit.core.dtypes import DType, bfloat16, float16, float32, int32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from . import _attention_sm90 as _sm90
from . import _cpu
from ._attention_sm90 import set_prefill_kernel
from ._kernels import NAMESPACE, Groups, group, register_enumerator
from ._layout import check_devices, is_cuda, overlaps

__all__ = [
    "DecodeWorkspace",
    "decode_attention",
    "decode_workspace",
    "paged_decode_attention",
    "prefill_attention",
    "sdpa",
    "sdpa_causal",
    "set_prefill_kernel",
]

HEAD_DIMS = (64, 80, 96, 128, 256)
_DTYPES = (float16, bfloat16, float32)
_PREFILL_FILE = "attention/attention_prefill.cu"
_DECODE_FILE = "attention/attention_decode.cu"
_NS = f"{NAMESPACE}attention::"
_LOG2E = 1.4426950408889634
_SPLIT_GRANULE = 64  # kSplitGranule in attention_common.cuh
# The one argument of every attention kernel (attention_common.cuh), declared once.
_ARGS = KernelStruct(f"{_NS}AttentionArgs", (_PREFILL_FILE, _DECODE_FILE, _sm90.FILE), [
    ("q", "const void*"), ("k", "const void*"), ("v", "const void*"), ("out", "void*"), ("lens", "const int*"),
    ("block_table", "const int*"), ("partial", "float*"),
    ("q_batch", "long long"), ("q_seq", "long long"), ("q_head", "long long"),
    ("k_batch", "long long"), ("k_seq", "long long"), ("k_head", "long long"),
    ("v_batch", "long long"), ("v_seq", "long long"), ("v_head", "long long"),
    ("o_batch", "long long"), ("o_seq", "long long"), ("o_head", "long long"), ("table_stride", "long long"),
    ("batch", "int"), ("heads", "int"), ("kv_heads", "int"), ("seq_q", "int"), ("kv_capacity", "int"),
    ("lens_add", "int"), ("causal", "int"), ("window", "int"), ("block_size", "int"), ("splits", "int"),
    ("scale_log2", "float"), ("min_chunk", "int"), ("num_blocks", "int"),
])  # fmt: skip
_PARAMS = [_ARGS.param("args")]
_PLANS: PlanCache[Any] = PlanCache("ops.attention")
# sdpa / sdpa_causal calls already checked once, by their layouts (out=None, no window): the plan to launch
# into a fresh result (_attention's fast path).
_CALLS: PlanCache[Any] = PlanCache("ops.attention.calls")

# Tensor-core prefill tilings per head dimension, (warps, m16 tiles per warp, keys per tile, Q in
# registers), best first; the first whose shared memory fits the device runs.
_PREFILL_CONFIGS: dict[int, list[tuple[int, int, int, bool]]] = {
    64: [(4, 2, 64, True)],
    80: [(4, 2, 64, False)],
    96: [(4, 2, 64, False)],
    128: [(4, 2, 64, False)],
    256: [(8, 1, 64, False), (4, 1, 32, False)],
}
# Also compiled, for tuning (benchmarks/test_ops_attention.py compares them).
_PREFILL_ALTERNATIVES: dict[int, list[tuple[int, int, int, bool]]] = {128: [(4, 1, 64, True)]}
# Decode kernels per head dimension, (warps, shared-memory stages), best first; the first whose shared
# memory fits the device runs. 16 keys per warp and tile; STAGES - 1 tiles are loaded ahead.
_DECODE_CONFIGS: dict[int, list[tuple[int, int]]] = {
    64: [(4, 3), (4, 2)],
    80: [(4, 3), (4, 2)],
    96: [(4, 3), (4, 2)],
    128: [(4, 3), (4, 2)],
    256: [(4, 2), (2, 2)],
}
# Fewest keys a decode split covers (a multiple of _SPLIT_GRANULE): a short context uses few splits,
# each streaming a few tiles, rather than many blocks of one tile each.
_DECODE_MIN_CHUNK = 256
_DECODE_MAX_SPLITS = 256  # the merging block keeps 16 * splits weights in shared memory


def _pad(head_dim: int) -> int:
    return -(-head_dim // 64) * 64


def _prefill_shared(head_dim: int, config: tuple[int, int, int, bool]) -> int:
    warps, tiles_m, block_n, _ = config
    return (warps * 16 * tiles_m + 4 * block_n) * _pad(head_dim) * 2


def _decode_shared(head_dim: int, config: tuple[int, int]) -> int:
    warps, stages = config
    return (16 + 2 * stages * 16 * warps) * _pad(head_dim) * 2


def _prefill_expression(dtype: DType, head_dim: int, config: tuple[int, int, int, bool]) -> str:
    warps, tiles_m, block_n, q_regs = config
    return f"{_NS}flash_prefill<{dtype.ctype}, {head_dim}, {warps}, {tiles_m}, {block_n}, {str(q_regs).lower()}>"


def _simt_expression(head_dim: int, paged: bool) -> str:
    return f"{_NS}attention_simt<{head_dim}, {str(paged).lower()}>"


def _decode_expression(dtype: DType, head_dim: int, config: tuple[int, int], paged: bool) -> str:
    warps, stages = config
    return f"{_NS}flash_decode<{dtype.ctype}, {head_dim}, {warps}, {stages}, {str(paged).lower()}>"


# -- devices and kernels -----------------------------------------------------------------------------
@functools.cache
def _device_limits(device: int) -> tuple[int, int, int]:
    """(SM count, opt-in shared memory per block, shared memory per SM) of ``device``."""
    info = get_device_info(device)
    return (int(info.multiprocessor_count), int(info.max_shared_memory_per_block_optin),
            int(info.max_shared_memory_per_multiprocessor))  # fmt: skip


def _kernel(file: str, expressions: Sequence[str], expression: str, shared: int) -> JITKernel:
    """The kernel, allowed ``shared`` bytes of dynamic shared memory on the current device (called when
    a launch plan is made: once per call shape and device). The decode kernels wait for the kernel
    before them with overlap_wait(), so they are launched programmatically."""
    kernel = group(file, expressions).kernel(expression, _PARAMS, programmatic=file == _DECODE_FILE)
    if shared > 48 * 1024:
        kernel.set_max_dynamic_shared_memory(shared)
    return kernel


def _prefill_config(head_dim: int) -> tuple[int, int, int, bool]:
    limit = _device_limits(thread_device())[1]
    configs = _PREFILL_CONFIGS[head_dim]
    for config in configs:
        if _prefill_shared(head_dim, config) <= limit:
            return config
    return configs[-1]


def _decode_config(head_dim: int) -> tuple[int, int]:
    limit = _device_limits(thread_device())[1]
    configs = _DECODE_CONFIGS[head_dim]
    return next((c for c in configs if _decode_shared(head_dim, c) <= limit), configs[-1])


# -- argument checks ---------------------------------------------------------------------------------
def _array(name: str, what: str, x: Any) -> GPUArray:
    if not isinstance(x, GPUArray):
        raise DTypeError(f"{name}: {what} must be a GPUArray, got {type(x).__name__}")
    return x


def _check_dtypes(name: str, **arrays: GPUArray) -> DType:
    dtypes = {what: x.dtype for what, x in arrays.items()}
    first = next(iter(dtypes.values()))
    if first not in _DTYPES:
        raise DTypeError(f"{name} supports float16, bfloat16 and float32, got {first.name}")
    if any(d != first for d in dtypes.values()):
        listed = ", ".join(f"{what} {d.name}" for what, d in dtypes.items())
        raise DTypeError(f"{name}: the operands must share one dtype, got {listed}")
    return first


def _check_ndim(name: str, what: str, x: GPUArray, ndim: int, layout: str) -> None:
    if x.ndim != ndim:
        raise ShapeError(f"{name}: {what} must be {layout}, got shape {x.shape}")


def _check_heads(name: str, heads: int, kv_heads: int, head_dim: int) -> None:
    if kv_heads < 1 or heads < 1 or heads % kv_heads != 0:
        raise ShapeError(f"{name}: num_heads ({heads}) must be a positive multiple of num_kv_heads ({kv_heads})")
    if head_dim not in HEAD_DIMS:
        raise ArgumentError(
            f"{name}: head_dim {head_dim} is not supported (supported: {', '.join(map(str, HEAD_DIMS))})"
        )


def _scale(name: str, scale: Any, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise ArgumentError(f"{name}: scale must be a number, got {type(scale).__name__}")
    value = float(scale)
    if not math.isfinite(value) or value <= 0.0:
        raise ArgumentError(f"{name}: scale must be positive and finite, got {value}")
    return value


def _window(name: str, window: Any) -> int:
    if window is None:
        return 0
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or int(window) < 1:
        raise ArgumentError(f"{name}: window must be None or a positive int, got {window!r}")
    return int(window)


def _check_out(name: str, out: Any, shape: tuple[int, ...], dtype: DType) -> GPUArray:
    if out is None:
        return empty(shape, dtype)
    result = _array(name, "out", out)
    if result.dtype != dtype:
        raise DTypeError(f"{name}: out must have dtype {dtype.name}, got {result.dtype.name}")
    if result.shape != shape:
        raise ShapeError(f"{name}: out must have shape {shape}, got {result.shape}")
    return result


def _int32_vector(name: str, what: str, x: Any, batch: int) -> tuple[GPUArray | None, np.ndarray[Any, Any] | None]:
    """(device array, host values where known) of an int32 (batch,) argument: a GPUArray, or host
    values (a sequence or NumPy array), which are uploaded."""
    if isinstance(x, GPUArray):
        if x.dtype != int32:
            raise DTypeError(f"{name}: {what} must be int32, got {x.dtype.name}")
        if x.shape != (batch,):
            raise ShapeError(f"{name}: {what} must have shape ({batch},), got {x.shape}")
        if not x._contiguous:  # the kernels read it as a plain int32 vector
            raise ShapeError(f"{name}: {what} must be contiguous, got strides {x.strides}; call .contiguous() first")
        return x, (_cpu.host(x).astype(np.int64) if not is_cuda() else None)
    values = np.asarray(x)
    if values.dtype.kind not in "iu":
        raise DTypeError(f"{name}: {what} must hold integers, got {values.dtype}")
    if values.shape != (batch,):
        raise ShapeError(f"{name}: {what} must have shape ({batch},), got {values.shape}")
    return None, values.astype(np.int64)


def _upload_int32(values: np.ndarray[Any, Any]) -> GPUArray:
    return from_numpy(np.ascontiguousarray(values, dtype=np.int32))


def _check_lengths(name: str, what: str, values: np.ndarray[Any, Any] | None, low: int, high: int) -> None:
    if values is None:
        return
    bad = np.flatnonzero((values < low) | (values > high))
    if bad.size:
        i = int(bad[0])
        raise ArgumentError(f"{name}: {what}[{i}] = {int(values[i])} is outside [{low}, {high}]")


# -- kernel launches ---------------------------------------------------------------------------------
def _aligned(x: GPUArray, dtype: DType, seq_axis: int = 1) -> bool:
    """Whether the kernels can read ``x`` as it is: unit last stride, and for the tensor-core kernels
    16-byte aligned rows (copied in 16-byte chunks) and a sequence stride whose offsets within a tile
    fit in 32 bits."""
    if x._strides[-1] != 1 and x.shape[-1] > 1:
        return False
    if dtype == float32:
        return True
    return (x.device_ptr % 16 == 0 and all(s % 8 == 0 for s in x._strides[:-1])
            and 0 <= x._strides[seq_axis] < 2**23)  # fmt: skip


def _operand(x: GPUArray, dtype: DType, seq_axis: int = 1) -> GPUArray:
    return x if _aligned(x, dtype, seq_axis) else x.clone()  # (contiguous() keeps a contiguous, misaligned view)


class _Plan:
    """One attention launch for a call shape: the kernel, its launch dimensions and the AttentionArgs
    fields after the seven pointers (``fields``), so a call packs the addresses and launches."""

    __slots__ = ("block", "fields", "grid", "kernel", "shared")

    def __init__(self, kernel: JITKernel, fields: tuple[Any, ...], grid: int | tuple[int, int, int], block: int,
                 shared: int) -> None:  # fmt: skip
        self.kernel = kernel
        self.fields = fields
        self.grid = grid
        self.block = block
        self.shared = shared

    def launch(self, q: GPUArray, k: GPUArray, v: GPUArray, out: GPUArray, lens: GPUArray | None,
               table: GPUArray | None, partial: GPUArray | None) -> None:  # fmt: skip
        args = _ARGS.pack_flat(
            q.device_ptr, k.device_ptr, v.device_ptr, out.device_ptr, 0 if lens is None else lens.device_ptr,
            0 if table is None else table.device_ptr, 0 if partial is None else partial.device_ptr, *self.fields,
        )  # fmt: skip
        self.kernel(args, grid=self.grid, block=self.block, shared_mem=self.shared)


def _fields(q: GPUArray, k: GPUArray, q_strides: Sequence[int], k_strides: Sequence[int], v_strides: Sequence[int],
            o_strides: Sequence[int], *, heads: int, kv_heads: int, seq_q: int, kv_capacity: int, causal: bool,
            window: int, scale: float, lens_add: int = 0, table: GPUArray | None = None, block_size: int = 0,
            splits: int = 1, min_chunk: int = 0) -> tuple[Any, ...]:  # fmt: skip
    """AttentionArgs after its pointers (_ARGS, from q_batch on)."""
    return (
        *q_strides, *k_strides, *v_strides, *o_strides, table._strides[0] if table is not None else 0,
        q.shape[0], heads, kv_heads, seq_q, kv_capacity, lens_add, int(causal), window, block_size, splits,
        scale * _LOG2E, min_chunk, k.shape[0] if table is not None else 0,  # paged: k is (num_blocks, ...)
    )  # fmt: skip


def _result_target(out: GPUArray, dtype: DType, inputs: Sequence[GPUArray]) -> GPUArray:
    """``out`` itself when the kernels can write it (aligned, not overlapping an input), else a fresh array."""
    if _aligned(out, dtype) and not any(overlaps(out, x) for x in inputs):
        return out
    return empty(out.shape, dtype)


def _plan_rows(q: GPUArray, k: GPUArray, target: GPUArray, k_strides: Sequence[int], v_strides: Sequence[int], *,
               kv_heads: int, kv_capacity: int, causal: bool, window: int, scale: float, lens_add: int,
               table: GPUArray | None, block_size: int) -> _Plan:  # fmt: skip
    batch, seq_q, heads, head_dim = q.shape
    dtype = q.dtype
    fields = _fields(q, k, q._strides[:3], k_strides, v_strides, target._strides[:3], heads=heads, kv_heads=kv_heads,
                     seq_q=seq_q, kv_capacity=kv_capacity, causal=causal, window=window, scale=scale,
                     lens_add=lens_add, table=table, block_size=block_size)  # fmt: skip
    if dtype == float32:
        expression = _simt_expression(head_dim, table is not None)
        group_rows = seq_q * (heads // kv_heads)
        kernel = _kernel(_PREFILL_FILE, [expression], expression, 0)
        return _Plan(kernel, fields, (-(-group_rows // 4), kv_heads, batch), 128, 0)
    tiling = _sm90.config(dtype, head_dim, table is not None, thread_device())
    if tiling is not None:  # SM 90: the wgmma kernel (_attention_sm90.py)
        expression = _sm90.expression(dtype, head_dim, tiling)
        shared = _sm90.shared_bytes(head_dim, tiling)
        kernel = _sm90.kernel(expression, _PARAMS, shared)
        return _Plan(kernel, fields, _sm90.grid(batch, seq_q, heads), _sm90.THREADS, shared)
    config = _prefill_config(head_dim)
    expression = _prefill_expression(dtype, head_dim, config)
    shared = _prefill_shared(head_dim, config)
    block_m = config[0] * 16 * config[1]
    kernel = _kernel(_PREFILL_FILE, [expression], expression, shared)
    return _Plan(kernel, fields, -(-seq_q // block_m) * batch * heads, config[0] * 32, shared)


def _launch_rows(q: GPUArray, k: GPUArray, v: GPUArray, out: GPUArray, k_strides: Sequence[int],
                 v_strides: Sequence[int], *, kv_heads: int, kv_capacity: int, causal: bool, window: int,
                 scale: float, lens: GPUArray | None = None, lens_add: int = 0, table: GPUArray | None = None,
                 block_size: int = 0) -> _Plan | None:  # fmt: skip
    """The attention kernels over q (batch, seq_q, heads, head_dim) into out, same layout; strided or
    paged keys. fp16/bf16: flash_prefill; float32: attention_simt. One plan lookup, then the launch.
    Returns the plan when it wrote ``out`` directly (None: through a temporary and a copy)."""
    target = _result_target(out, q.dtype, [q, k, v])
    key = ("rows", q._dtype, q._shape, q._strides, k._shape, tuple(k_strides), tuple(v_strides), target._strides,
           kv_heads, kv_capacity, causal, window, scale, lens is not None, lens_add,
           None if table is None else table._strides[0], block_size, thread_device(), _sm90.CHOICE.kind)  # fmt: skip
    plan: _Plan | None = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, _plan_rows(q, k, target, k_strides, v_strides, kv_heads=kv_heads,
                                          kv_capacity=kv_capacity, causal=causal, window=window, scale=scale,
                                          lens_add=lens_add, table=table, block_size=block_size))  # fmt: skip
    plan.launch(q, k, v, target, lens, table, None)
    if target is not out:
        out.copy_(target)
        return None
    return plan


def _bshd(x: GPUArray) -> tuple[int, int, int]:
    """(batch, seq, head) element strides of a (batch, seq, heads, dim) operand."""
    return x._strides[0], x._strides[1], x._strides[2]


def _bhsd(x: GPUArray) -> tuple[int, int, int]:
    """(batch, seq, head) element strides of a (batch, heads, seq, dim) cache (or paged blocks)."""
    return x._strides[0], x._strides[2], x._strides[1]


# -- CPU backend -------------------------------------------------------------------------------------
def _cpu_attend(q: np.ndarray[Any, Any], keys: Sequence[np.ndarray[Any, Any]], values: Sequence[np.ndarray[Any, Any]],
                causal: bool, window: int, scale: float) -> np.ndarray[Any, Any]:  # fmt: skip
    """float64 attention: q (batch, seq_q, heads, dim); keys[b], values[b] (kv_len_b, kv_heads, dim)."""
    batch, seq_q, heads, dim = q.shape
    out = np.zeros(q.shape, np.float64)
    for b in range(batch):
        k, v = keys[b], values[b]
        n, kv_heads = k.shape[0], k.shape[1]
        if n == 0:
            continue
        group_size = heads // kv_heads
        positions = n - seq_q + np.arange(seq_q)
        key_index = np.arange(n)
        visible = np.ones((seq_q, n), bool)
        if causal:
            visible = key_index[None, :] <= positions[:, None]
            if window:
                visible &= key_index[None, :] > positions[:, None] - window
        qg = q[b].reshape(seq_q, kv_heads, group_size, dim).transpose(1, 2, 0, 3)  # (h, g, q, d)
        with np.errstate(all="ignore"):
            scores = (qg @ k.transpose(1, 2, 0)[:, None]) * scale  # (h, g, q, k): BLAS per head
            scores = np.where(visible, scores, -np.inf)
            top = scores.max(axis=-1, keepdims=True)
            weights = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
            total = weights.sum(axis=-1, keepdims=True)
            weights /= np.where(total > 0, total, 1.0)
        result = weights @ v.transpose(1, 0, 2)[:, None]  # (h, g, q, d)
        out[b] = result.transpose(2, 0, 1, 3).reshape(seq_q, heads, dim)
    return out


def _host64(x: GPUArray) -> np.ndarray[Any, Any]:
    return _cpu.host(x).astype(np.float64)


# -- prefill, non-causal and cross attention ---------------------------------------------------------
def _attention(name: str, q: Any, k: Any, v: Any, *, causal: bool, scale: Any, window: Any, out: Any) -> GPUArray:
    # A repeated call (same layouts, alignment, scale and device, a fresh result) is one lookup, an
    # allocation and the launch: everything the checks below decide is in the key.
    key: tuple[Any, ...] | None = None
    if (out is None and window is None and (scale is None or type(scale) is float) and type(q) is GPUArray
            and type(k) is GPUArray and type(v) is GPUArray):  # fmt: skip
        key = (name, causal, scale, q._dtype, k._dtype, v._dtype,
               q._shape, k._shape, v._shape, q._strides, k._strides, v._strides, q.device_ptr % 16, k.device_ptr % 16,
               v.device_ptr % 16, q._buffer.device, k._buffer.device, v._buffer.device, thread_device(),
               _sm90.CHOICE.kind)  # fmt: skip
        plan = _CALLS.get(key)
        if plan is not None:
            result = allocate(q._shape, q._dtype)
            plan.launch(q, k, v, result, None, None, None)
            return result
    q, k, v = _array(name, "q", q), _array(name, "k", k), _array(name, "v", v)
    dtype = _check_dtypes(name, q=q, k=k, v=v)
    for what, x in (("q", q), ("k", k), ("v", v)):
        _check_ndim(name, what, x, 4, "(batch, seq, heads, head_dim)")
    batch, seq_q, heads, head_dim = q.shape
    _, seq_kv, kv_heads, _ = k.shape
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ShapeError(f"{name}: k {k.shape} does not match q {q.shape} (batch and head_dim must agree)")
    if v.shape != k.shape:
        raise ShapeError(f"{name}: v must have the shape of k {k.shape}, got {v.shape}")
    _check_heads(name, heads, kv_heads, head_dim)
    if seq_kv == 0 and seq_q > 0 and batch > 0:
        raise ShapeError(f"{name}: attention needs at least one key (k has shape {k.shape})")
    if causal and seq_q > seq_kv:
        raise ShapeError(f"{name}: causal attention needs seq_q <= seq_kv (the queries are the last positions), "
                         f"got q {q.shape} and k {k.shape}")  # fmt: skip
    scale_value = _scale(name, scale, head_dim)
    window_value = _window(name, window)
    result = _check_out(name, out, q.shape, dtype)
    check_devices(name, [q, k, v, result])
    if result.size == 0:
        return result
    if not is_cuda():
        keys = [_host64(k)[b] for b in range(batch)]
        values = [_host64(v)[b] for b in range(batch)]
        _cpu.store(result, _cpu_attend(_host64(q), keys, values, causal, window_value, scale_value))
        return result
    operands = _operand(q, dtype), _operand(k, dtype), _operand(v, dtype)
    plan = _launch_rows(*operands, result, _bshd(operands[1]), _bshd(operands[2]), kv_heads=kv_heads,
                        kv_capacity=seq_kv, causal=causal, window=window_value, scale=scale_value)  # fmt: skip
    if key is not None and plan is not None and operands[0] is q and operands[1] is k and operands[2] is v:
        _CALLS.put(key, plan)  # read in place and written straight into the result: repeatable as it is
    return result


def sdpa_causal(
    q: GPUArray, k: GPUArray, v: GPUArray, scale: float | None = None, window: int | None = None,
    out: GPUArray | None = None,
) -> GPUArray:  # fmt: skip
    """Causal attention ``softmax(scale * q k^T + mask) v`` (flash-attention 2 style on tensor cores
    for fp16/bf16).

    ``q`` (batch, seq_q, num_heads, head_dim), ``k`` and ``v`` (batch, seq_kv, num_kv_heads, head_dim),
    seq_q <= seq_kv: query i is position seq_kv - seq_q + i and sees the keys up to its position, and
    with ``window`` only the last ``window`` of them. Returns (batch, seq_q, num_heads, head_dim) in
    the inputs' dtype, or writes ``out``."""
    return _attention("sdpa_causal", q, k, v, causal=True, scale=scale, window=window, out=out)


def sdpa(
    q: GPUArray, k: GPUArray, v: GPUArray, causal: bool = False, scale: float | None = None,
    out: GPUArray | None = None,
) -> GPUArray:  # fmt: skip
    """Attention without a mask (encoders, cross attention; seq_q and seq_kv independent), or causal
    with ``causal=True`` (as :func:`sdpa_causal`). Same layouts as :func:`sdpa_causal`."""
    return _attention("sdpa", q, k, v, causal=bool(causal), scale=scale, window=None, out=out)


# -- attention over a fixed KV cache -----------------------------------------------------------------
def _check_cache(name: str, q_heads: int, head_dim: int, batch: int, k_cache: Any, v_cache: Any,
                 dtype: DType) -> tuple[GPUArray, GPUArray]:  # fmt: skip
    k_cache, v_cache = _array(name, "k_cache", k_cache), _array(name, "v_cache", v_cache)
    if k_cache.dtype != dtype or v_cache.dtype != dtype:
        raise DTypeError(f"{name}: the operands must share one dtype, got q {dtype.name}, k_cache "
                         f"{k_cache.dtype.name}, v_cache {v_cache.dtype.name}")  # fmt: skip
    for what, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_ndim(name, what, x, 4, "(batch, num_kv_heads, max_seq_len, head_dim)")
    if k_cache.shape[0] != batch or k_cache.shape[3] != head_dim:
        raise ShapeError(f"{name}: k_cache {k_cache.shape} does not match batch {batch} and head_dim {head_dim}")
    if v_cache.shape != k_cache.shape:
        raise ShapeError(f"{name}: v_cache must have the shape of k_cache {k_cache.shape}, got {v_cache.shape}")
    _check_heads(name, q_heads, k_cache.shape[1], head_dim)
    return k_cache, v_cache


def prefill_attention(
    q: GPUArray, k_cache: GPUArray, v_cache: GPUArray, start_pos: Any, scale: float | None = None,
    window: int | None = None, out: GPUArray | None = None,
) -> GPUArray:  # fmt: skip
    """Causal attention of a chunk of new queries over a fixed KV cache, with the start position on the
    device: sequence b's queries are positions ``start_pos[b] .. start_pos[b] + seq_q - 1`` and see the
    cache's keys ``0 .. start_pos[b] + seq_q - 1`` (the chunk's keys already written there).

    ``q`` (batch, seq_q, num_heads, head_dim); caches (batch, num_kv_heads, max_seq_len, head_dim);
    ``start_pos`` an int32 (batch,) GPUArray (a captured graph replays at any position) or host values.
    Positions past the cache are clamped on the GPU; host-known ones raise ArgumentError."""
    name = "prefill_attention"
    q = _array(name, "q", q)
    dtype = _check_dtypes(name, q=q)
    _check_ndim(name, "q", q, 4, "(batch, seq_q, num_heads, head_dim)")
    batch, seq_q, heads, head_dim = q.shape
    k_cache, v_cache = _check_cache(name, heads, head_dim, batch, k_cache, v_cache, dtype)
    kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    starts, host = _int32_vector(name, "start_pos", start_pos, batch)
    _check_lengths(name, "start_pos", host, 0, max_len - seq_q)
    scale_value = _scale(name, scale, head_dim)
    window_value = _window(name, window)
    result = _check_out(name, out, q.shape, dtype)
    check_devices(name, [x for x in (q, k_cache, v_cache, result, starts) if x is not None])
    if result.size == 0:
        return result
    if not is_cuda():
        assert host is not None
        kc, vc = _host64(k_cache), _host64(v_cache)
        ends = [min(int(s) + seq_q, max_len) for s in host]
        keys = [kc[b, :, : ends[b]].transpose(1, 0, 2) for b in range(batch)]
        values = [vc[b, :, : ends[b]].transpose(1, 0, 2) for b in range(batch)]
        _cpu.store(result, _cpu_attend(_host64(q), keys, values, True, window_value, scale_value))
        return result
    if starts is None:
        assert host is not None
        starts = _upload_int32(host)
    q, k_cache, v_cache = _operand(q, dtype), _operand(k_cache, dtype, 2), _operand(v_cache, dtype, 2)
    _launch_rows(q, k_cache, v_cache, result, _bhsd(k_cache), _bhsd(v_cache), kv_heads=kv_heads, kv_capacity=max_len,
                 causal=True, window=window_value, scale=scale_value, lens=starts, lens_add=seq_q)  # fmt: skip
    return result


# -- decode ------------------------------------------------------------------------------------------
class DecodeWorkspace:
    """Scratch memory of :func:`decode_attention` and :func:`paged_decode_attention`: the partial
    results of the key splits (at most ``splits`` per sequence and head) and the counters that elect
    the block merging them (zero between calls), allocated once so that a captured decode step
    allocates nothing. Make one with :func:`decode_workspace`."""

    __slots__ = ("batch", "buffer", "head_dim", "num_heads", "splits")

    def __init__(self, batch: int, num_heads: int, head_dim: int, splits: int, buffer: GPUArray) -> None:
        self.batch = batch
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.splits = splits
        self.buffer = buffer

    def __repr__(self) -> str:
        return (f"DecodeWorkspace(batch={self.batch}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"splits={self.splits})")  # fmt: skip


def _decode_splits(batch: int, heads: int, kv_heads: int, head_dim: int, max_seq_len: int) -> int:
    """The grid's splits per (sequence, kv head): as many as fit one wave of resident blocks (so every
    block streams its chunk with no tail wave), at most one per _DECODE_MIN_CHUNK keys of capacity."""
    if not is_cuda():
        return 1
    sms, _, per_sm = _device_limits(thread_device())
    # Blocks per SM by shared memory (2 KiB a block for the static and the reserved shared memory);
    # registers (under 170 a thread at head_dim <= 128) allow three blocks of 128 threads.
    resident = max(1, per_sm // (_decode_shared(head_dim, _decode_config(head_dim)) + 2048))
    blocks = batch * kv_heads * -(-(heads // kv_heads) // 16)
    useful = -(-max_seq_len // _DECODE_MIN_CHUNK)
    return max(1, min(sms * resident // blocks, useful, _DECODE_MAX_SPLITS))


def decode_workspace(batch: int, num_heads: int, num_kv_heads: int, head_dim: int, max_seq_len: int) -> DecodeWorkspace:
    """Scratch memory for decode attention of ``batch`` sequences of up to ``max_seq_len`` keys with
    these head counts. The number of key splits is chosen here, for the current device, so reuse one
    workspace for every step (and for a captured graph) to get the same, bitwise reproducible result.
    One workspace serves one decode call at a time (calls queued on one stream, such as the layers
    of a captured step, may share it)."""
    name = "decode_workspace"
    for what, value in (("batch", batch), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("max_seq_len", max_seq_len)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
            raise ArgumentError(f"{name}: {what} must be a positive int, got {value!r}")
    _check_heads(name, int(num_heads), int(num_kv_heads), int(head_dim))
    splits = _decode_splits(int(batch), int(num_heads), int(num_kv_heads), int(head_dim), int(max_seq_len))
    rows = int(batch) * int(num_heads)
    # Partial outputs and (max, sum) per split, then one uint32 ticket per row (at most one per block
    # row of the grid), zero: a synchronous copy, so the workspace is ready for any stream.
    words = rows * splits * (int(head_dim) + 2) + rows if splits > 1 else 1
    return DecodeWorkspace(int(batch), int(num_heads), int(head_dim), splits, from_numpy(np.zeros(words, np.float32)))


def _check_decode_q(name: str, q: Any) -> tuple[GPUArray, DType]:
    q = _array(name, "q", q)
    dtype = _check_dtypes(name, q=q)
    _check_ndim(name, "q", q, 3, "(batch, num_heads, head_dim)")
    return q, dtype


def _workspace(name: str, workspace: Any, batch: int, heads: int, kv_heads: int, head_dim: int,
               max_len: int) -> DecodeWorkspace:  # fmt: skip
    if workspace is None:
        return decode_workspace(batch, heads, kv_heads, head_dim, max_len)
    if not isinstance(workspace, DecodeWorkspace):
        raise DTypeError(f"{name}: workspace must be a DecodeWorkspace (see decode_workspace), got "
                         f"{type(workspace).__name__}")  # fmt: skip
    if (workspace.batch, workspace.num_heads, workspace.head_dim) != (batch, heads, head_dim):
        raise ShapeError(f"{name}: {workspace!r} was made for other shapes than batch {batch}, num_heads {heads}, "
                         f"head_dim {head_dim}")  # fmt: skip
    return workspace


def _plan_decode(q: GPUArray, k: GPUArray, target: GPUArray, k_strides: Sequence[int], v_strides: Sequence[int],
                 splits: int, *, kv_heads: int, kv_capacity: int, window: int, scale: float, table: GPUArray | None,
                 block_size: int) -> _Plan:  # fmt: skip
    batch, heads, head_dim = q.shape
    q_strides = (q._strides[0], 0, q._strides[1])
    o_strides = (target._strides[0], 0, target._strides[1])
    fields = _fields(q, k, q_strides, k_strides, v_strides, o_strides, heads=heads, kv_heads=kv_heads, seq_q=1,
                     kv_capacity=kv_capacity, causal=True, window=window, scale=scale, table=table,
                     block_size=block_size, splits=splits, min_chunk=_DECODE_MIN_CHUNK)  # fmt: skip
    config = _decode_config(head_dim)
    decode = _decode_expression(q.dtype, head_dim, config, table is not None)
    shared = _decode_shared(head_dim, config)
    chunks = -(-(heads // kv_heads) // 16)
    kernel = _kernel(_DECODE_FILE, [decode], decode, shared)
    return _Plan(kernel, fields, (splits, kv_heads * chunks, batch), config[0] * 32, shared)


def _launch_decode(name: str, q: GPUArray, k: GPUArray, v: GPUArray, out: GPUArray, lens: GPUArray,
                   workspace: DecodeWorkspace, *, kv_heads: int, kv_capacity: int, window: int, scale: float,
                   table: GPUArray | None = None, block_size: int = 0) -> None:  # fmt: skip
    batch, heads, head_dim = q.shape
    dtype = q.dtype
    k_strides, v_strides = _bhsd(k), _bhsd(v)
    if dtype == float32:
        # (batch, 1, heads, dim) views: one query per sequence, at the last position.
        q4 = q._view((batch, 1, heads, head_dim), (q._strides[0], 0, *q._strides[1:]), q._offset)
        out4 = out._view((batch, 1, heads, head_dim), (out._strides[0], 0, *out._strides[1:]), out._offset)
        _launch_rows(q4, k, v, out4, k_strides, v_strides, kv_heads=kv_heads, kv_capacity=kv_capacity, causal=True,
                     window=window, scale=scale, lens=lens, table=table, block_size=block_size)  # fmt: skip
        return
    target = _result_target(out, dtype, [q, k, v])
    splits = workspace.splits
    key = ("decode", dtype, q._shape, q._strides, k._shape, k_strides, v_strides, target._strides, kv_heads,
           kv_capacity, window, scale, None if table is None else table._strides[0], block_size, splits,
           thread_device())  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, _plan_decode(q, k, target, k_strides, v_strides, splits, kv_heads=kv_heads,
                                            kv_capacity=kv_capacity, window=window, scale=scale, table=table,
                                            block_size=block_size))  # fmt: skip
    plan.launch(q, k, v, target, lens, table, workspace.buffer)
    if target is not out:
        out.copy_(target)


def decode_attention(
    q: GPUArray, k_cache: GPUArray, v_cache: GPUArray, context_lens: Any, scale: float | None = None,
    window: int | None = None, out: GPUArray | None = None, workspace: DecodeWorkspace | None = None,
) -> GPUArray:  # fmt: skip
    """Attention of one new query per sequence over a fixed KV cache (split-K flash-decoding).

    ``q`` (batch, num_heads, head_dim) is the query of the token at position ``context_lens[b] - 1``,
    whose key and value are already in the cache; ``k_cache``, ``v_cache`` are (batch, num_kv_heads,
    max_seq_len, head_dim); ``context_lens`` an int32 (batch,) GPUArray read on the device (one
    captured graph replays at any length), or host values. It sees keys ``0 .. context_lens[b] - 1``
    (the last ``window`` with a window). Returns (batch, num_heads, head_dim) or writes ``out``. Pass a
    ``workspace`` (:func:`decode_workspace`) to allocate nothing. On the GPU, lengths past
    max_seq_len are clamped to it; host-known ones raise ArgumentError."""
    name = "decode_attention"
    q, dtype = _check_decode_q(name, q)
    batch, heads, head_dim = q.shape
    k_cache, v_cache = _check_cache(name, heads, head_dim, batch, k_cache, v_cache, dtype)
    kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    lens, host = _int32_vector(name, "context_lens", context_lens, batch)
    _check_lengths(name, "context_lens", host, 0, max_len)
    scale_value = _scale(name, scale, head_dim)
    window_value = _window(name, window)
    result = _check_out(name, out, q.shape, dtype)
    ws = _workspace(name, workspace, batch, heads, kv_heads, head_dim, max_len)
    check_devices(name, [x for x in (q, k_cache, v_cache, result, lens, ws.buffer) if x is not None])
    if result.size == 0:
        return result
    if not is_cuda():
        assert host is not None
        kc, vc = _host64(k_cache), _host64(v_cache)
        keys = [kc[b, :, : int(host[b])].transpose(1, 0, 2) for b in range(batch)]
        values = [vc[b, :, : int(host[b])].transpose(1, 0, 2) for b in range(batch)]
        attended = _cpu_attend(_host64(q)[:, None], keys, values, True, window_value, scale_value)
        _cpu.store(result, attended[:, 0])
        return result
    if lens is None:
        assert host is not None
        lens = _upload_int32(host)
    q, k_cache, v_cache = _operand(q, dtype), _operand(k_cache, dtype, 2), _operand(v_cache, dtype, 2)
    _launch_decode(name, q, k_cache, v_cache, result, lens, ws, kv_heads=kv_heads, kv_capacity=max_len,
                   window=window_value, scale=scale_value)  # fmt: skip
    return result


def paged_decode_attention(
    q: GPUArray, k_blocks: GPUArray, v_blocks: GPUArray, block_table: Any, context_lens: Any,
    scale: float | None = None, window: int | None = None, out: GPUArray | None = None,
    workspace: DecodeWorkspace | None = None,
) -> GPUArray:  # fmt: skip
    """:func:`decode_attention` over a paged KV cache: key j of sequence b is row ``j % block_size`` of
    block ``block_table[b, j // block_size]`` of ``k_blocks``/``v_blocks`` (num_blocks, num_kv_heads,
    block_size, head_dim). ``block_table`` is int32 (batch, max_blocks_per_seq) and ``context_lens``
    int32 (batch,), GPUArrays or host values (then checked: lengths within max_blocks_per_seq *
    block_size, block ids of the used blocks within num_blocks). On the GPU a device table is not read
    back: a block id outside [0, num_blocks) there reads as zero keys and values (nothing outside the
    cache is read), and device lengths are clamped to max_blocks_per_seq * block_size."""
    name = "paged_decode_attention"
    q, dtype = _check_decode_q(name, q)
    batch, heads, head_dim = q.shape
    k_blocks, v_blocks = _array(name, "k_blocks", k_blocks), _array(name, "v_blocks", v_blocks)
    _check_dtypes(name, q=q, k_blocks=k_blocks, v_blocks=v_blocks)
    for what, x in (("k_blocks", k_blocks), ("v_blocks", v_blocks)):
        _check_ndim(name, what, x, 4, "(num_blocks, num_kv_heads, block_size, head_dim)")
    if k_blocks.shape[3] != head_dim:
        raise ShapeError(f"{name}: k_blocks {k_blocks.shape} does not match head_dim {head_dim}")
    if v_blocks.shape != k_blocks.shape:
        raise ShapeError(f"{name}: v_blocks must have the shape of k_blocks {k_blocks.shape}, got {v_blocks.shape}")
    num_blocks, kv_heads, block_size, _ = k_blocks.shape
    if num_blocks < 1 or block_size < 1:
        raise ShapeError(f"{name}: k_blocks {k_blocks.shape} holds no block")
    _check_heads(name, heads, kv_heads, head_dim)
    if isinstance(block_table, GPUArray):
        table: GPUArray | None = block_table
        if block_table.dtype != int32:
            raise DTypeError(f"{name}: block_table must be int32, got {block_table.dtype.name}")
        if block_table.ndim != 2 or block_table.shape[0] != batch:
            raise ShapeError(
                f"{name}: block_table must be (batch={batch}, max_blocks_per_seq), got {block_table.shape}"
            )
        if block_table._strides[1] != 1 and block_table.shape[1] > 1:  # the kernel steps rows by their stride
            raise ShapeError(f"{name}: block_table needs unit stride along its rows, got strides {block_table.strides}")
        blocks_per_seq = block_table.shape[1]
        table_host = _cpu.host(block_table).astype(np.int64) if not is_cuda() else None
    else:
        table = None
        table_host = np.asarray(block_table)
        if table_host.dtype.kind not in "iu":
            raise DTypeError(f"{name}: block_table must hold integers, got {table_host.dtype}")
        if table_host.ndim != 2 or table_host.shape[0] != batch:
            raise ShapeError(f"{name}: block_table must be (batch={batch}, max_blocks_per_seq), got {table_host.shape}")
        table_host = table_host.astype(np.int64)
        blocks_per_seq = table_host.shape[1]
    max_len = blocks_per_seq * block_size
    lens, host = _int32_vector(name, "context_lens", context_lens, batch)
    _check_lengths(name, "context_lens", host, 0, max_len)
    if host is not None and table_host is not None:
        for b in range(batch):
            used = table_host[b, : -(-int(host[b]) // block_size)]
            bad = np.flatnonzero((used < 0) | (used >= num_blocks))
            if bad.size:
                raise ArgumentError(f"{name}: block_table[{b}, {int(bad[0])}] = {int(used[bad[0]])} is not a block "
                                    f"id in [0, {num_blocks})")  # fmt: skip
    scale_value = _scale(name, scale, head_dim)
    window_value = _window(name, window)
    result = _check_out(name, out, q.shape, dtype)
    ws = _workspace(name, workspace, batch, heads, kv_heads, head_dim, max_len)
    check_devices(name, [x for x in (q, k_blocks, v_blocks, table, result, lens, ws.buffer) if x is not None])
    if result.size == 0:
        return result
    if not is_cuda():
        assert host is not None
        assert table_host is not None
        kb, vb = _host64(k_blocks), _host64(v_blocks)
        keys, values = [], []
        for b in range(batch):
            n = int(host[b])
            ids = table_host[b, : -(-n // block_size)]
            keys.append(kb[ids].transpose(0, 2, 1, 3).reshape(-1, kv_heads, head_dim)[:n])
            values.append(vb[ids].transpose(0, 2, 1, 3).reshape(-1, kv_heads, head_dim)[:n])
        attended = _cpu_attend(_host64(q)[:, None], keys, values, True, window_value, scale_value)
        _cpu.store(result, attended[:, 0])
        return result
    if lens is None:
        assert host is not None
        lens = _upload_int32(host)
    if table is None:
        assert table_host is not None
        table = _upload_int32(table_host)
    elif table._strides[1] != 1:
        table = table.contiguous()
    q, k_blocks, v_blocks = _operand(q, dtype), _operand(k_blocks, dtype, 2), _operand(v_blocks, dtype, 2)
    _launch_decode(name, q, k_blocks, v_blocks, result, lens, ws, kv_heads=kv_heads, kv_capacity=max_len,
                   window=window_value, scale=scale_value, table=table, block_size=block_size)  # fmt: skip
    return result


# -- compile-check enumeration -----------------------------------------------------------------------
def _enumerate() -> Groups:
    prefill: list[tuple[str, ...]] = []
    decode: list[tuple[str, ...]] = []
    for head_dim in HEAD_DIMS:
        for paged in (False, True):
            prefill.append((_simt_expression(head_dim, paged),))
        for dtype in (float16, bfloat16):
            for config in _PREFILL_CONFIGS[head_dim] + _PREFILL_ALTERNATIVES.get(head_dim, []):
                prefill.append((_prefill_expression(dtype, head_dim, config),))
            for decode_config in _DECODE_CONFIGS[head_dim]:
                for paged in (False, True):
                    decode.append((_decode_expression(dtype, head_dim, decode_config, paged),))
    return {_PREFILL_FILE: prefill, _DECODE_FILE: list(dict.fromkeys(decode))}


register_enumerator(_enumerate)
