"""KV caches for decoding: a fixed cache (:class:`KVCache`) and a paged one (:class:`PagedKVCache`,
with :class:`BlockAllocator`), written by the kernels of native/kernels/attention/kv_cache.cu.

Layouts (the attention kernels read these):

- fixed, per layer: ``k(layer)`` and ``v(layer)`` of shape (batch, num_kv_heads, max_seq_len, head_dim),
  contiguous;
- paged, per layer: ``k_blocks(layer)`` and ``v_blocks(layer)`` of shape (num_blocks, num_kv_heads,
  block_size, head_dim), contiguous; ``block_table`` int32 (max_batch, max_blocks_per_seq) with -1 for
  unallocated entries; ``context_lens`` int32 (max_batch,), the tokens each slot holds.

Activations are (batch, seq, num_kv_heads, head_dim) with the last dimension contiguous. Every write
copies k and v in one launch; the decode-step writes take their positions from device memory, so they
(and :meth:`PagedKVCache.advance`) can be captured in a CUDA graph and replayed at any position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.abi import KernelStruct
from pygpukit.core.array import GPUArray, empty, full
from pygpukit.core.dtypes import DType, as_dtype, bfloat16, float16, float32, int32
from pygpukit.core.errors import ArgumentError, DTypeError, OutOfMemoryError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache

from . import _cpu
from ._kernels import (
    BLOCK,
    NAMESPACE,
    Groups,
    c_param,
    group,
    pointer,
    register_enumerator,
    size_param,
)
from ._layout import check_devices, is_cuda

__all__ = ["BlockAllocator", "BlocksExhaustedError", "KVCache", "KVCacheSnapshot", "PagedKVCache"]

_FILE = "attention/kv_cache.cu"
# The shape argument of kv_write and paged_kv_write (kv_cache.cu), declared once.
_SHAPE = KernelStruct(f"{NAMESPACE}KVWriteShape", _FILE, [
    ("src_stride", "long long[6]"),  # index_t src_stride[2][3]: k and v, (batch, seq, head) each
    ("pos_stride", "long long"), ("batch", "int"), ("seq", "int"), ("heads", "int"), ("head_dim", "int"),
    ("max_seq", "int"), ("start", "int"), ("slot", "int"), ("max_blocks", "int"), ("num_blocks", "int"), ("pad", "int"),
])  # fmt: skip
_DTYPES = (float32, float16, bfloat16)
_INT32_MAX = 2**31 - 1
_WRITE_PARAMS = [pointer("k_cache"), pointer("v_cache"), pointer("k"), pointer("v"), pointer("positions"),
                 size_param("units"), _SHAPE.param("shape")]  # fmt: skip
_PAGED_PARAMS = [pointer("k_blocks"), pointer("v_blocks"), pointer("k"), pointer("v"), pointer("block_table"),
                 pointer("context_lens"), size_param("units"), _SHAPE.param("shape")]  # fmt: skip
_ADVANCE_PARAMS = [pointer("context_lens"), pointer("block_table"), c_param("n", "int"),
                   c_param("batch", "int"), c_param("block_size", "int"), c_param("max_blocks", "int"),
                   c_param("num_blocks", "int")]  # fmt: skip
_ADVANCE = f"{NAMESPACE}paged_advance<int>"

Array = np.ndarray[Any, Any]


class BlocksExhaustedError(OutOfMemoryError):
    """A :class:`BlockAllocator` has fewer free blocks than requested (nothing was allocated)."""

    def __init__(self, message: str, *, requested_blocks: int = 0, available_blocks: int = 0) -> None:
        super().__init__(message)
        self.requested_blocks = requested_blocks
        self.available_blocks = available_blocks


# -- argument checks -------------------------------------------------------------------------------
def _positive(name: str, value: Any, limit: int = _INT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= limit:
        raise ArgumentError(f"{name} must be an int in [1, {limit}], got {value!r}")
    return int(value)


def _index(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"{name} must be an int, got {value!r}")
    return int(value)


def _cache_dtype(dtype: Any) -> DType:
    dt = as_dtype(dtype)
    if dt not in _DTYPES:
        raise DTypeError(f"KV caches hold float32, float16 or bfloat16, got {dt}")
    return dt


def _check_kv(op: str, k: Any, v: Any, dtype: DType, heads: int, head_dim: int) -> tuple[GPUArray, GPUArray]:
    """k and v: (batch, seq, heads, head_dim) of the cache's dtype, one shape, last dim contiguous."""
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, GPUArray):
            raise DTypeError(f"{op}: {name} must be a GPUArray, got {type(x).__name__}")
        if x.ndim != 4:
            raise ShapeError(f"{op}: {name} must be (batch, seq, num_kv_heads, head_dim), got shape {x.shape}")
        if x._dtype.name != dtype.name:
            raise DTypeError(f"{op}: {name} is {x.dtype} but the cache holds {dtype}")
        if x.shape[2] != heads:
            raise ShapeError(f"{op}: {name} has {x.shape[2]} kv heads (shape {x.shape}), the cache has {heads}")
        if x.shape[3] != head_dim:
            raise ShapeError(f"{op}: {name} has head_dim {x.shape[3]} (shape {x.shape}), the cache has {head_dim}")
        if x._strides[3] != 1 and head_dim > 1:
            raise ShapeError(f"{op}: the last dimension of {name} must be contiguous, got byte strides {x.strides}")
    if k.shape != v.shape:
        raise ShapeError(f"{op}: k {k.shape} and v {v.shape} differ")
    return k, v


def _offset(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not -_INT32_MAX <= value <= _INT32_MAX:
        raise ArgumentError(f"offset must be an int32, got {value!r}")
    return int(value)


def _check_layer(layer: Any, num_layers: int) -> int:
    index = _index("layer", layer)
    if not 0 <= index < num_layers:
        raise ArgumentError(f"layer {layer} is out of range for a cache of {num_layers} layers")
    return index


def _vector_width(dtype: DType, head_dim: int, arrays: Sequence[GPUArray]) -> int:
    width = 16 // dtype.itemsize
    if head_dim % width:
        return 1
    for x in arrays:
        if x.device_ptr % 16 or any(s % width for s in x._strides[:-1]):
            return 1
    return width


def _write_expressions(dtype: DType) -> tuple[str, ...]:
    width = 16 // dtype.itemsize
    return tuple(f"{NAMESPACE}{kernel}<{dtype.ctype}, {w}>" for kernel in ("kv_write", "paged_kv_write")
                 for w in (width, 1))  # fmt: skip


_PLANS: PlanCache[tuple[JITKernel, bytes, int, int]] = PlanCache("ops.kv_cache")


def _write_plan(kernel_name: str, params: Any, dtype: DType, width: int, k: GPUArray, v: GPUArray, pos_stride: int,
                max_seq: int, start: int, slot: int = 0, max_blocks: int = 0,
                num_blocks: int = 0) -> tuple[JITKernel, bytes, int, int]:  # fmt: skip
    """(kernel, KVWriteShape bytes, units, grid) of one write, planned once per call shape."""
    key = (kernel_name, dtype, width, k._shape, k._strides, v._strides, pos_stride, max_seq, start, slot, max_blocks,
           num_blocks)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        batch, seq, heads, head_dim = k.shape
        units = 2 * batch * seq * heads * (head_dim // width)
        # kv_write waits with overlap_wait() (programmatic launch); paged_kv_write does not yet
        kernel = group(_FILE, _write_expressions(dtype)).kernel(f"{NAMESPACE}{kernel_name}<{dtype.ctype}, {width}>",
                                                                params, kernel_name == "kv_write")  # fmt: skip
        shape = _SHAPE.pack((*k._strides[:3], *v._strides[:3]), pos_stride, batch, seq, heads, head_dim, max_seq, start,
                            slot, max_blocks, num_blocks, 0)  # fmt: skip
        plan = _PLANS.put(key, (kernel, shape, units, max(1, min(-(-units // BLOCK), 1 << 20))))
    return plan


# -- fixed cache -----------------------------------------------------------------------------------
class KVCacheSnapshot:
    """Device copies of the first ``length`` positions of every layer of a :class:`KVCache`
    (``k[layer]``/``v[layer]``: (batch, num_kv_heads, length, head_dim)), for :meth:`KVCache.restore`."""

    __slots__ = ("batch", "dtype", "head_dim", "k", "length", "num_kv_heads", "v")

    def __init__(self, k: list[GPUArray], v: list[GPUArray], length: int, batch: int, heads: int, head_dim: int,
                 dtype: DType) -> None:  # fmt: skip
        self.k, self.v, self.length = k, v, length
        self.batch, self.num_kv_heads, self.head_dim, self.dtype = batch, heads, head_dim, dtype

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.k, *self.v))

    def __repr__(self) -> str:
        return f"KVCacheSnapshot(layers={len(self.k)}, length={self.length}, dtype={self.dtype})"


class KVCache:
    """A fixed-size KV cache: per layer, k and v of shape (batch, num_kv_heads, max_seq_len, head_dim).

    ``length`` is the host-known number of filled positions (set by :meth:`write_prefill`, snapshots
    and :meth:`reset`; decode appends at device positions do not change it)."""

    def __init__(
        self, num_layers: int, batch: int, num_kv_heads: int, max_seq_len: int, head_dim: int, dtype: Any = float16
    ) -> None:
        self.num_layers = _positive("num_layers", num_layers)
        self.batch = _positive("batch", batch)
        self.num_kv_heads = _positive("num_kv_heads", num_kv_heads)
        self.max_seq_len = _positive("max_seq_len", max_seq_len)
        self.head_dim = _positive("head_dim", head_dim)
        self.dtype = _cache_dtype(dtype)
        self.shape = (self.batch, self.num_kv_heads, self.max_seq_len, self.head_dim)
        self._k = [empty(self.shape, self.dtype) for _ in range(self.num_layers)]
        self._v = [empty(self.shape, self.dtype) for _ in range(self.num_layers)]
        self.length = 0

    def k(self, layer: int) -> GPUArray:
        return self._k[_check_layer(layer, self.num_layers)]

    def v(self, layer: int) -> GPUArray:
        return self._v[_check_layer(layer, self.num_layers)]

    @property
    def nbytes(self) -> int:
        return 2 * self.num_layers * self._k[0].nbytes

    def _activations(self, op: str, k: Any, v: Any) -> tuple[GPUArray, GPUArray]:
        k, v = _check_kv(op, k, v, self.dtype, self.num_kv_heads, self.head_dim)
        if k.shape[0] > self.batch:
            raise ShapeError(f"{op}: k/v have batch {k.shape[0]} (shape {k.shape}), the cache only {self.batch}")
        return k, v

    def write_prefill(self, layer: int, k: GPUArray, v: GPUArray, start: int = 0) -> None:
        """Write k/v (batch, seq, num_kv_heads, head_dim) at positions [start, start + seq) of batch rows
        [0, batch), both in one launch. ``start + seq`` past max_seq_len raises ArgumentError."""
        index = _check_layer(layer, self.num_layers)
        k, v = self._activations("write_prefill", k, v)
        first = _index("start", start)
        batch, seq = k.shape[:2]
        if first < 0 or first + seq > self.max_seq_len:
            raise ArgumentError(f"write_prefill: positions [{first}, {first + seq}) do not fit in max_seq_len "
                                f"{self.max_seq_len}")  # fmt: skip
        check_devices("write_prefill", [k, v, self._k[index]])
        if batch * seq:
            self._write(index, k, v, None, first)
        self.length = max(self.length, first + seq)

    def append(self, layer: int, k: GPUArray, v: GPUArray, positions: GPUArray, offset: int = 0) -> None:
        """Write k/v (batch, n, num_kv_heads, head_dim), usually n = 1, at positions[b] + offset + [0, n)
        for each batch row b; ``positions`` is an int32 device array (batch,), read by the kernel, so the
        call can be captured in a CUDA graph and replayed at other positions (``offset=-1`` takes a
        lengths buffer that already counts the new token). Positions outside [0, max_seq_len) raise
        ArgumentError on the CPU backend; on the GPU the kernel skips those writes."""
        index = _check_layer(layer, self.num_layers)
        shift = _offset(offset)
        k, v = self._activations("append", k, v)
        if not isinstance(positions, GPUArray) or positions._dtype.name != "int32":
            found = positions.dtype if isinstance(positions, GPUArray) else type(positions).__name__
            raise DTypeError(f"append: positions must be an int32 GPUArray, got {found}")
        batch, seq = k.shape[:2]
        if positions.shape != (batch,):
            raise ShapeError(f"append: positions must have shape ({batch},) for k {k.shape}, got {positions.shape}")
        check_devices("append", [k, v, positions, self._k[index]])
        if not is_cuda():
            pos = _cpu.host(positions).astype(np.int64) + shift
            bad = (pos < 0) | (pos + seq > self.max_seq_len)
            if bad.any():
                row = int(np.flatnonzero(bad)[0])
                raise ArgumentError(f"append: batch row {row} writes positions [{pos[row]}, {pos[row] + seq}), outside "
                                    f"max_seq_len {self.max_seq_len}")  # fmt: skip
        if batch * seq:
            self._write(index, k, v, positions, shift)

    def _write(self, index: int, k: GPUArray, v: GPUArray, positions: GPUArray | None, start: int) -> None:
        k_cache, v_cache = self._k[index], self._v[index]
        batch, seq, _, head_dim = k.shape
        if not is_cuda():
            pos = (
                np.full(batch, start, np.int64) if positions is None else _cpu.host(positions).astype(np.int64) + start
            )
            for cache, source in ((k_cache, k), (v_cache, v)):
                view, values = _cpu.host(cache), _cpu.host(source)
                for b in range(batch):
                    view[b, :, pos[b] : pos[b] + seq, :] = values[b].transpose(1, 0, 2)
            return
        width = _vector_width(self.dtype, head_dim, [k, v, k_cache, v_cache])
        pos_ptr, pos_stride = (0, 0) if positions is None else (positions.device_ptr, positions._strides[0])
        kernel, shape, units, grid = _write_plan("kv_write", _WRITE_PARAMS, self.dtype, width, k, v, pos_stride,
                                                 self.max_seq_len, start)  # fmt: skip
        kernel(k_cache.device_ptr, v_cache.device_ptr, k.device_ptr, v.device_ptr, pos_ptr, units, shape, grid=grid,
               block=BLOCK)  # fmt: skip

    def snapshot(self, length: int | None = None) -> KVCacheSnapshot:
        """Device-to-device copies of positions [0, length) of every layer (default: ``self.length``),
        e.g. to reuse a prompt's cache for several continuations."""
        used = self.length if length is None else _index("length", length)
        if not 0 <= used <= self.max_seq_len:
            raise ArgumentError(f"snapshot: length {used} is outside [0, max_seq_len={self.max_seq_len}]")
        shape = (self.batch, self.num_kv_heads, used, self.head_dim)
        ks, vs = [], []
        for cache_k, cache_v in zip(self._k, self._v, strict=True):
            ks.append(empty(shape, self.dtype).copy_(cache_k[:, :, :used, :]))
            vs.append(empty(shape, self.dtype).copy_(cache_v[:, :, :used, :]))
        return KVCacheSnapshot(ks, vs, used, self.batch, self.num_kv_heads, self.head_dim, self.dtype)

    def restore(self, snapshot: KVCacheSnapshot) -> None:
        """Copy a snapshot of this cache's geometry back (device to device) and set ``length`` to its
        length; positions past it keep whatever they held."""
        if not isinstance(snapshot, KVCacheSnapshot):
            raise DTypeError(f"restore needs a KVCacheSnapshot, got {type(snapshot).__name__}")
        mine = (self.num_layers, self.batch, self.num_kv_heads, self.head_dim, self.dtype)
        theirs = (len(snapshot.k), snapshot.batch, snapshot.num_kv_heads, snapshot.head_dim, snapshot.dtype)
        if mine != theirs or snapshot.length > self.max_seq_len:
            raise ShapeError(
                f"restore: the snapshot (layers, batch, kv heads, head_dim, dtype) = {theirs} with length "
                f"{snapshot.length} does not fit this cache {mine} with max_seq_len {self.max_seq_len}"
            )
        used = snapshot.length
        for layer in range(self.num_layers):
            self._k[layer][:, :, :used, :].copy_(snapshot.k[layer])
            self._v[layer][:, :, :used, :].copy_(snapshot.v[layer])
        self.length = used

    def reset(self, clear: bool = False) -> None:
        """Forget the contents (``length = 0``); ``clear=True`` also zero-fills every layer."""
        if clear:
            for array in (*self._k, *self._v):
                array.copy_(full(self.shape, 0, self.dtype))
        self.length = 0

    def __repr__(self) -> str:
        return (f"KVCache(layers={self.num_layers}, shape={self.shape}, dtype={self.dtype}, "
                f"length={self.length})")  # fmt: skip


# -- paged cache -----------------------------------------------------------------------------------
class BlockAllocator:
    """Host-side bookkeeping of ``num_blocks`` cache blocks: :meth:`allocate` hands out the lowest free
    ids, :meth:`free` takes them back; errors change nothing."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = _positive("num_blocks", num_blocks)
        self._free = list(range(self.num_blocks - 1, -1, -1))  # popped from the end: lowest id first
        self._used: set[int] = set()

    @property
    def available(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return len(self._used)

    def allocate(self, n: int) -> list[int]:
        count = _index("n", n)
        if count < 0:
            raise ArgumentError(f"allocate: n must be >= 0, got {n}")
        if count > len(self._free):
            raise BlocksExhaustedError(f"allocate: {count} blocks requested, {len(self._free)} of {self.num_blocks} "
                                       "free", requested_blocks=count, available_blocks=len(self._free))  # fmt: skip
        ids = [self._free.pop() for _ in range(count)]
        self._used.update(ids)
        return ids

    def free(self, ids: Sequence[int]) -> None:
        items = [_index("block id", i) for i in ids]
        if len(set(items)) != len(items):
            raise ArgumentError(f"free: repeated block ids in {items}")
        unknown = [i for i in items if i not in self._used]
        if unknown:
            raise ArgumentError(f"free: blocks {unknown} are not allocated (out of range or already free)")
        self._used.difference_update(items)
        self._free.extend(sorted(items, reverse=True))
        self._free.sort(reverse=True)

    def __repr__(self) -> str:
        return f"BlockAllocator(num_blocks={self.num_blocks}, available={self.available})"


class PagedKVCache:
    """A paged KV cache: per layer, ``k_blocks``/``v_blocks`` (num_blocks, num_kv_heads, block_size,
    head_dim); sequence slot b owns the blocks in row b of the int32 ``block_table`` (max_batch,
    max_blocks_per_seq; -1 where unallocated) and holds ``context_lens[b]`` tokens.

    Blocks are allocated on the host (:meth:`add_sequence`, :meth:`ensure_capacity`), which then
    updates the device table: do that outside graph capture. :meth:`append` and :meth:`advance` only
    read device state and can be captured."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: Any = float16,
        max_batch: int = 1,
        max_blocks_per_seq: int | None = None,
    ) -> None:
        self.num_layers = _positive("num_layers", num_layers)
        self.num_blocks = _positive("num_blocks", num_blocks)
        self.block_size = _positive("block_size", block_size)
        self.num_kv_heads = _positive("num_kv_heads", num_kv_heads)
        self.head_dim = _positive("head_dim", head_dim)
        self.dtype = _cache_dtype(dtype)
        self.max_batch = _positive("max_batch", max_batch)
        blocks = self.num_blocks if max_blocks_per_seq is None else max_blocks_per_seq
        self.max_blocks_per_seq = _positive("max_blocks_per_seq", blocks)
        if self.max_blocks_per_seq * self.block_size > _INT32_MAX:
            raise ArgumentError(f"max_blocks_per_seq * block_size = {self.max_blocks_per_seq * self.block_size} "
                                "exceeds 2**31 - 1 positions")  # fmt: skip
        self.allocator = BlockAllocator(self.num_blocks)
        self.shape = (self.num_blocks, self.num_kv_heads, self.block_size, self.head_dim)
        self._k = [empty(self.shape, self.dtype) for _ in range(self.num_layers)]
        self._v = [empty(self.shape, self.dtype) for _ in range(self.num_layers)]
        self.block_table = full((self.max_batch, self.max_blocks_per_seq), -1, int32)
        self.context_lens = full(self.max_batch, 0, int32)
        self._blocks: dict[int, list[int]] = {}

    # -- layout ----------------------------------------------------------------------------------------
    def k_blocks(self, layer: int) -> GPUArray:
        return self._k[_check_layer(layer, self.num_layers)]

    def v_blocks(self, layer: int) -> GPUArray:
        return self._v[_check_layer(layer, self.num_layers)]

    @property
    def sequences(self) -> dict[int, tuple[int, ...]]:
        """Active slots and the block ids each owns, in order."""
        return {slot: tuple(ids) for slot, ids in sorted(self._blocks.items())}

    def capacity(self, slot: int) -> int:
        """Positions the slot's allocated blocks hold."""
        return len(self._slot_blocks("capacity", slot)) * self.block_size

    def _slot_blocks(self, op: str, slot: Any) -> list[int]:
        index = _index("slot", slot)
        blocks = self._blocks.get(index)
        if blocks is None:
            raise ArgumentError(f"{op}: slot {slot} holds no sequence (active slots: {sorted(self._blocks)})")
        return blocks

    # -- host-side management ------------------------------------------------------------------------
    def _set_length(self, slot: int, length: int) -> None:
        self.context_lens[slot : slot + 1].copy_(np.array([length], np.int32))

    def add_sequence(self, length: int = 0, slot: int | None = None) -> int:
        """Take a free slot (the lowest, or ``slot``), allocate blocks for ``length`` tokens and set its
        context length to ``length`` (the prompt's tokens are then written with :meth:`write_prefill`).
        Returns the slot."""
        tokens = _index("length", length)
        if tokens < 0:
            raise ArgumentError(f"add_sequence: length must be >= 0, got {length}")
        if slot is None:
            free = [s for s in range(self.max_batch) if s not in self._blocks]
            if not free:
                raise ArgumentError(f"add_sequence: all {self.max_batch} slots hold sequences")
            chosen = free[0]
        else:
            chosen = _index("slot", slot)
            if not 0 <= chosen < self.max_batch:
                raise ArgumentError(f"add_sequence: slot {slot} is outside [0, max_batch={self.max_batch})")
            if chosen in self._blocks:
                raise ArgumentError(f"add_sequence: slot {slot} already holds a sequence")
        needed = self._blocks_for("add_sequence", tokens)
        ids = self.allocator.allocate(needed)
        self._blocks[chosen] = ids
        if ids:
            self.block_table[chosen, :needed].copy_(np.array(ids, np.int32))
        self._set_length(chosen, tokens)
        return chosen

    def _blocks_for(self, op: str, tokens: int) -> int:
        needed = -(-tokens // self.block_size)
        if needed > self.max_blocks_per_seq:
            raise ArgumentError(f"{op}: {tokens} tokens need {needed} blocks of {self.block_size}, more than "
                                f"max_blocks_per_seq {self.max_blocks_per_seq}")  # fmt: skip
        return needed

    def ensure_capacity(self, slot: int, new_len: int) -> int:
        """Allocate blocks so that the slot holds at least ``new_len`` positions and write them into the
        device block table (not inside graph capture); returns the capacity. A no-op without device
        work when the capacity suffices."""
        blocks = self._slot_blocks("ensure_capacity", slot)
        tokens = _index("new_len", new_len)
        needed = self._blocks_for("ensure_capacity", max(tokens, 0))
        extra = needed - len(blocks)
        if extra > 0:
            ids = self.allocator.allocate(extra)
            self.block_table[int(slot), len(blocks) : needed].copy_(np.array(ids, np.int32))
            blocks.extend(ids)
        return len(blocks) * self.block_size

    def remove_sequence(self, slot: int) -> None:
        """Free the slot's blocks, reset its block table row to -1 and its context length to 0."""
        blocks = self._slot_blocks("remove_sequence", slot)
        self.allocator.free(blocks)
        del self._blocks[int(slot)]
        self.block_table[int(slot)].copy_(np.full(self.max_blocks_per_seq, -1, np.int32))
        self._set_length(int(slot), 0)

    def set_length(self, slot: int, length: int) -> None:
        """Set the slot's device context length (not inside graph capture); it must fit its blocks."""
        tokens = _index("length", length)
        if not 0 <= tokens <= self.capacity(slot):
            raise ArgumentError(f"set_length: length {length} is outside [0, capacity {self.capacity(slot)}] of slot "
                                f"{slot}; call ensure_capacity first")  # fmt: skip
        self._set_length(int(slot), tokens)

    # -- device writes -------------------------------------------------------------------------------
    def write_prefill(self, layer: int, seq_slot: int, k: GPUArray, v: GPUArray, start: int = 0) -> None:
        """Write one sequence's k/v, (seq, num_kv_heads, head_dim) or (1, seq, ...), at positions
        [start, start + seq) of slot ``seq_slot``, k and v in one launch; the positions must lie within
        the slot's allocated blocks. Does not change ``context_lens`` (:meth:`add_sequence` set it)."""
        index = _check_layer(layer, self.num_layers)
        blocks = self._slot_blocks("write_prefill", seq_slot)
        if isinstance(k, GPUArray) and k.ndim == 3:
            k = k[None]
        if isinstance(v, GPUArray) and v.ndim == 3:
            v = v[None]
        k, v = _check_kv("write_prefill", k, v, self.dtype, self.num_kv_heads, self.head_dim)
        if k.shape[0] != 1:
            raise ShapeError(f"write_prefill: k/v hold one sequence, (seq, kv_heads, head_dim) or (1, seq, ...), "
                             f"got {k.shape}")  # fmt: skip
        first = _index("start", start)
        seq = k.shape[1]
        capacity = len(blocks) * self.block_size
        if first < 0 or first + seq > capacity:
            raise ArgumentError(f"write_prefill: positions [{first}, {first + seq}) exceed slot {seq_slot}'s capacity "
                                f"{capacity}; call ensure_capacity first")  # fmt: skip
        check_devices("write_prefill", [k, v, self._k[index]])
        if seq:
            self._write(index, k, v, int(seq_slot), first, lengths=False)

    def append(self, layer: int, k: GPUArray, v: GPUArray, offset: int = 0) -> None:
        """Write k/v (batch, n, num_kv_heads, head_dim), usually n = 1, of slots [0, batch) at positions
        context_lens[b] + offset + [0, n), read on the device (capturable); ``offset=-n`` after
        :meth:`advance` writes the tokens advance just counted. Writes to slots without a block for
        the position (free slots, or no :meth:`ensure_capacity`) are skipped."""
        index = _check_layer(layer, self.num_layers)
        shift = _offset(offset)
        k, v = _check_kv("append", k, v, self.dtype, self.num_kv_heads, self.head_dim)
        if k.shape[0] > self.max_batch:
            raise ShapeError(f"append: k/v have batch {k.shape[0]} (shape {k.shape}), max_batch is {self.max_batch}")
        check_devices("append", [k, v, self._k[index]])
        if k.shape[0] * k.shape[1]:
            self._write(index, k, v, 0, shift, lengths=True)

    def _write(self, index: int, k: GPUArray, v: GPUArray, slot: int, start: int, lengths: bool) -> None:
        k_blocks, v_blocks = self._k[index], self._v[index]
        batch, seq, _, head_dim = k.shape
        if not is_cuda():
            table, lens = _cpu.host(self.block_table), _cpu.host(self.context_lens)
            for cache, source in ((k_blocks, k), (v_blocks, v)):
                view, values = _cpu.host(cache), _cpu.host(source)
                for b in range(batch):
                    base = (int(lens[slot + b]) if lengths else 0) + start
                    for s in range(seq):
                        position = base + s
                        entry = position // self.block_size
                        if position < 0 or entry >= self.max_blocks_per_seq:
                            continue
                        block = int(table[slot + b, entry])
                        if 0 <= block < self.num_blocks:
                            view[block, :, position - entry * self.block_size, :] = values[b, s]
            return
        width = _vector_width(self.dtype, head_dim, [k, v, k_blocks, v_blocks])
        kernel, shape, units, grid = _write_plan("paged_kv_write", _PAGED_PARAMS, self.dtype, width, k, v, 0,
                                                 self.block_size, start, slot, self.max_blocks_per_seq,
                                                 self.num_blocks)  # fmt: skip
        lens_ptr = self.context_lens.device_ptr if lengths else 0
        kernel(k_blocks.device_ptr, v_blocks.device_ptr, k.device_ptr, v.device_ptr, self.block_table.device_ptr,
               lens_ptr, units, shape, grid=grid, block=BLOCK)  # fmt: skip

    def advance(self, n: int = 1, batch: int | None = None) -> None:
        """``context_lens[b] += n`` on the device for slots b < batch (default max_batch) whose blocks
        hold position context_lens[b] + n - 1 (free slots and slots without the capacity are left
        alone). One tiny kernel; capturable."""
        step = _positive("n", n)
        rows = self.max_batch if batch is None else _positive("batch", batch, self.max_batch)
        if not is_cuda():
            table, lens = _cpu.host(self.block_table), _cpu.host(self.context_lens)
            for b in range(rows):
                last = int(lens[b]) + step - 1
                entry = last // self.block_size
                if lens[b] >= 0 and entry < self.max_blocks_per_seq and 0 <= table[b, entry] < self.num_blocks:
                    lens[b] += step
            return
        kernel = group(_FILE, [_ADVANCE]).kernel(_ADVANCE, _ADVANCE_PARAMS)
        kernel(self.context_lens.device_ptr, self.block_table.device_ptr, step, rows, self.block_size,
               self.max_blocks_per_seq, self.num_blocks, grid=-(-rows // BLOCK), block=BLOCK)  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(layers={self.num_layers}, blocks={self.shape}, dtype={self.dtype}, "
            f"max_batch={self.max_batch}, sequences={len(self._blocks)}, free_blocks={self.allocator.available})"
        )


# -- compile-check enumeration ----------------------------------------------------------------------
def _enumerate() -> Groups:
    return {_FILE: [_write_expressions(d) for d in _DTYPES] + [(_ADVANCE,)]}


register_enumerator(_enumerate)
