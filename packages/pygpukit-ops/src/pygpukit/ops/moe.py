"""Mixture-of-experts layers: router gating, token permutation by expert, grouped GEMM and the MoE MLP.

The pieces of a sparse MoE block (HF Mixtral, Qwen3-MoE), each usable alone:

* :func:`moe_topk_gating` -- softmax (or sigmoid) router scores in float32, the k best experts per token
  (ties to the lower expert id), optionally renormalised over the chosen k.
* :func:`moe_permute` -- a stable counting sort of the token copies by expert: the permuted rows, the
  group offsets (on the device) and the permutation.
* :func:`grouped_gemm` -- ``out[offs[e]:offs[e+1]] = x[offs[e]:offs[e+1]] @ W[e]^T`` for every expert.
* :func:`moe_unpermute` -- the weighted sum of each token's k expert outputs, in slot order.
* :func:`moe_mlp` -- all of them with a gated activation (SwiGLU) between the two grouped GEMMs.

The module keeps the five ops and their shared checks together (about 780 lines): they share the
argument checks, the workspace layout and the kernel enumeration, and each is short.

The number of rows each expert receives is only known on the device, and no op reads it back: the
kernels (native/kernels/moe/moe.cu and grouped_gemm.cu) read counts and offsets from device buffers,
and the grouped GEMM's grid covers the worst case, its surplus blocks returning at once. So every op
runs without host synchronisation, allocates nothing when its outputs (and, for :func:`moe_mlp`, the
workspace) are given, and can be captured in a CUDA graph. Results are deterministic: no kernel
depends on the order of atomic operations.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.codes import ACTIVATION_CODES
from pygpukit.core.device import get_device_info
from pygpukit.core.dtypes import DType, bfloat16, float16, float32, int32, uint8
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel, Param

from . import _cpu
from ._kernels import Groups, code_param, grid_for, group, pointer, register_enumerator, size_param
from ._layout import check_devices, is_cuda

if TYPE_CHECKING:
    from .quant.experts import QuantizedExperts

__all__ = [
    "MOE_MAX_EXPERTS",
    "grouped_gemm",
    "moe_mlp",
    "moe_permute",
    "moe_topk_gating",
    "moe_unpermute",
    "moe_workspace_size",
]

Array = np.ndarray[Any, Any]

MOE_MAX_EXPERTS = 1024
_FILE = "moe/moe.cu"
_GEMM_FILE = "gemm/grouped_gemm.cu"
_NS = "pygpukit::ops::moe::"
_GEMM_NS = "pygpukit::ops::gemm::"
_FLOATS = (float32, float16, bfloat16)
_HALF = (float16, bfloat16)
_VPL = (1, 2, 4, 8, 16, 32)  # router logits per lane of the gating kernel
_SCORING = {"softmax": 0, "sigmoid": 1}
_ACTIVATIONS = {name: ACTIVATION_CODES[name] for name in ("silu", "gelu_tanh", "gelu")}  # common/codes.cuh
_INT32_MAX = 2**31 - 1
_ALIGN = 256
_BLOCK = 256


# -- kernels ------------------------------------------------------------------------------------------
def _gating_expr(dtype: DType, vpl: int) -> str:
    return f"{_NS}moe_gating<{dtype.ctype}, {vpl}>"


def _routing_exprs(dtype: DType) -> tuple[str, ...]:
    """Every moe.cu kernel for activations of ``dtype``: compiled together, on first use."""
    return (
        *(_gating_expr(dtype, v) for v in _VPL),
        f"{_NS}moe_positions",
        f"{_NS}moe_gather_rows<{dtype.ctype}>",
        f"{_NS}moe_unpermute<{dtype.ctype}>",
        f"{_NS}moe_glu<{dtype.ctype}>",
    )


_GATING_PARAMS = [pointer("logits"), pointer("weights"), pointer("ids"), size_param("tokens"), code_param("experts"),
                  code_param("k"), size_param("ld"), code_param("renormalize"), code_param("scoring")]  # fmt: skip
_POSITIONS_PARAMS = [pointer("ids"), pointer("offsets"), pointer("permutation"), size_param("slots"),
                     code_param("experts"), size_param("chunk")]  # fmt: skip
_GATHER_PARAMS = [pointer("x"), pointer("permutation"), pointer("x_perm"), size_param("slots"), code_param("k"),
                  size_param("hidden"), size_param("ldx"), code_param("lanes"), code_param("vector")]  # fmt: skip
_UNPERMUTE_PARAMS = [pointer("y"), pointer("permutation"), pointer("weights"), pointer("out"), size_param("tokens"),
                     code_param("k"), size_param("hidden"), size_param("ldo"), size_param("rows"), code_param("lanes"),
                     code_param("vector")]  # fmt: skip
_GLU_PARAMS = [pointer("gate"), pointer("up"), pointer("h"), size_param("rows"), size_param("cols"), size_param("ldg"),
               size_param("ldu"), size_param("ldh"), code_param("activation"), code_param("lanes"),
               code_param("vector")]  # fmt: skip
_GEMM_PARAMS = [pointer("a"), pointer("w"), pointer("out"), pointer("offsets"), code_param("experts"),
                code_param("total_rows"), code_param("n"), code_param("k"), size_param("lda"), size_param("ldb"),
                size_param("w_stride"), size_param("ldc"), code_param("worst_m")]  # fmt: skip
_MMA_PARAMS = [*_GEMM_PARAMS, code_param("vector_a"), code_param("vector_b")]


def _routing_kernel(dtype: DType, expression: str, params: list[Param]) -> JITKernel:
    return group(_FILE, _routing_exprs(dtype)).kernel(expression, params)


class _Tile:
    """A block tile of grouped_gemm_mma: BM x BN outputs, K in steps of BK, WARPS_M x WARPS_N warps."""

    __slots__ = ("bk", "bm", "bn", "stages", "warps_m", "warps_n")

    def __init__(self, bm: int, bn: int, bk: int, warps_m: int, warps_n: int, stages: int) -> None:
        self.bm, self.bn, self.bk = bm, bn, bk
        self.warps_m, self.warps_n, self.stages = warps_m, warps_n, stages

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    @property
    def shared_bytes(self) -> int:
        return self.stages * (self.bm + self.bn) * self.bk * 2

    def expression(self, dtype: DType, trans_b: bool) -> str:
        return (f"{_GEMM_NS}grouped_gemm_mma<{dtype.ctype}, {str(trans_b).lower()}, {self.bm}, {self.bn}, {self.bk}, "
                f"{self.warps_m}, {self.warps_n}, {self.stages}>")  # fmt: skip


# Decode (a few rows per expert): 16-row tiles; every live block streams a 64 x K slice of one
# expert's weight through 8 stages (56 KiB in flight), so that even the few blocks of a down
# projection keep the memory system busy. Prefill: the tiles of the built-in dense GEMM
# (pygpukit.ops.gemm.mma.GEMM_MMA_TILES; grouped_gemm.cu runs its main loop, mma_mainloop.cuh).
_TILE_16 = _Tile(16, 64, 64, 1, 4, 8)
_TILE_64 = _Tile(64, 128, 32, 2, 2, 4)
_TILE_128 = _Tile(128, 128, 32, 2, 2, 4)
_TILE_256 = _Tile(128, 256, 64, 2, 4, 3)
_TILES = (_TILE_16, _TILE_64, _TILE_128, _TILE_256)
_SIMT_BM = 64
_SIMT_BN = 64


def _simt_exprs() -> tuple[str, str]:
    return f"{_GEMM_NS}grouped_gemm_simt<true>", f"{_GEMM_NS}grouped_gemm_simt<false>"


@functools.cache
def _device_limits(device: int) -> tuple[int, int]:
    info = get_device_info(device)
    return int(info.multiprocessor_count), int(info.max_shared_memory_per_block_optin)


_shared_set: set[tuple[str, int]] = set()
_shared_lock = threading.Lock()


def _mma_kernel(tile: _Tile, dtype: DType, trans_b: bool, device: int) -> JITKernel:
    expression = tile.expression(dtype, trans_b)
    kernel = group(_GEMM_FILE, (expression,)).kernel(expression, _MMA_PARAMS)
    if (expression, device) not in _shared_set:  # the blocks' static shared memory comes on top
        with _shared_lock:
            kernel.set_max_dynamic_shared_memory(tile.shared_bytes)
            _shared_set.add((expression, device))
    return kernel


def _choose_tile(rows: int, n: int, experts: int, shared_per_block: int) -> _Tile:
    """The tile for ``rows`` rows spread over up to ``experts`` groups: the mean group size decides."""
    mean = rows / max(1, min(experts, rows))
    if mean <= 16:
        tile = _TILE_16
    elif mean <= 64:
        tile = _TILE_64
    elif mean < 256 or n < 256:
        tile = _TILE_128
    else:
        tile = _TILE_256
    if tile.shared_bytes + 1024 > shared_per_block:
        tile = _TILE_64 if tile is _TILE_16 else _TILE_128
    return tile


def _worst_row_tiles(rows: int, experts: int, bm: int) -> int:
    """The most row tiles that ``rows`` rows split into at most ``experts`` non-empty groups can need."""
    groups = min(experts, rows)
    return (rows + groups * (bm - 1)) // bm


def _lanes(packs: int) -> int:
    """Threads per row of the row-wise kernels: about four 16-byte packs each, 32 to 256."""
    lanes = 32
    while lanes < 256 and lanes * 4 < packs:
        lanes *= 2
    return lanes


# -- argument checks ----------------------------------------------------------------------------------
def _array(op: str, name: str, value: Any) -> GPUArray:
    if not isinstance(value, GPUArray):
        raise DTypeError(f"{op}: {name} must be a GPUArray, got {type(value).__name__}")
    return value


def _float(op: str, name: str, array: GPUArray) -> None:
    if array.dtype not in _FLOATS:
        raise DTypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {array.dtype}")


def _row_major(op: str, name: str, array: GPUArray) -> int:
    """Leading dimension (elements) of a 2-D array with unit stride along its rows."""
    rows, cols = array.shape
    s0, s1 = array._strides
    if (cols <= 1 or s1 == 1) and (rows <= 1 or s0 >= max(cols, 1)):
        return s0 if rows > 1 else max(cols, 1)
    raise ShapeError(f"{op}: {name} (shape {array.shape}, strides {array.strides}) must have unit stride along its "
                     "rows and a row stride of at least the row length")  # fmt: skip


def _output(op: str, name: str, out: Any, shape: tuple[int, ...], dtype: DType) -> GPUArray:
    """A given output: shape, dtype and contiguity checked."""
    array = _array(op, name, out)
    if array.shape != shape:
        raise ShapeError(f"{op}: {name} must have shape {shape}, got {array.shape}")
    if array.dtype != dtype:
        raise DTypeError(f"{op}: {name} must have dtype {dtype}, got {array.dtype}")
    if not array.is_contiguous:
        raise ShapeError(f"{op}: {name} must be contiguous, got strides {array.strides}")
    return array


def _count(op: str, name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentError(f"{op}: {name} must be an int, got {value!r} of type {type(value).__name__}")
    number = int(value)
    if not low <= number <= high:
        raise ArgumentError(f"{op}: {name}={number} is outside [{low}, {high}]")
    return number


def _vector(*pairs: tuple[GPUArray, int]) -> int:
    """1 when every array starts on a 16-byte boundary and its leading dimension (elements) is a
    multiple of 16 bytes."""
    return int(all(a.device_ptr % 16 == 0 and (ld * a.itemsize) % 16 == 0 for a, ld in pairs))


# -- gating -------------------------------------------------------------------------------------------
def _order_keys(values: Array) -> Array:
    """The kernels' total order of float32 values as uint32 keys (-0 as +0, NaN above +inf)."""
    bits = values.astype(np.float32).view(np.uint32).copy()
    bits[bits == 0x80000000] = 0
    keys: Array = np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)
    keys[np.isnan(values)] = 0xFFFFFFFF
    return keys


def _gating_numpy(logits: Array, k: int, renormalize: bool, scoring: int) -> tuple[Array, Array]:
    values = logits.astype(np.float32)
    tokens, experts = values.shape
    order = np.lexsort((np.broadcast_to(np.arange(experts), values.shape), ~_order_keys(values)), axis=-1)
    ids = order[:, :k].astype(np.int32)
    chosen = np.take_along_axis(values, ids, axis=-1)
    with np.errstate(all="ignore"):
        if scoring == 0:
            top = np.max(values, axis=-1, keepdims=True) if experts else np.zeros((tokens, 1), np.float32)
            total = np.exp(values - top).sum(axis=-1, keepdims=True, dtype=np.float32)
            weights = np.exp(chosen - top) / total
        else:
            weights = np.float32(1.0) / (np.float32(1.0) + np.exp(-chosen))
        weights = weights.astype(np.float32)
        if renormalize:
            weights = weights / weights.sum(axis=-1, keepdims=True, dtype=np.float32)
    return weights.astype(np.float32), ids


def moe_topk_gating(
    router_logits: GPUArray,
    k: int,
    renormalize: bool = False,
    scoring: Literal["softmax", "sigmoid"] = "softmax",
    out_weights: GPUArray | None = None,
    out_ids: GPUArray | None = None,
) -> tuple[GPUArray, GPUArray]:
    """Routing weights and expert ids of each token: ``(weights float32 (T, k), ids int32 (T, k))``.

    ``router_logits`` is ``(tokens, experts)`` (float32, float16 or bfloat16; rows with unit stride), at
    most :data:`MOE_MAX_EXPERTS` experts. Scores are computed in float32: ``scoring="softmax"`` over
    all experts (HF Mixtral, Qwen3-MoE), ``"sigmoid"`` per expert. The k experts with the largest
    logits are chosen best first, ties going to the lower expert id (a NaN logit counts as the
    largest); their weights are their scores, divided by the sum of the k (in slot order) when
    ``renormalize`` (HF ``norm_topk_prob``; Mixtral always renormalises). ``out_weights`` /
    ``out_ids`` (contiguous, the result's shape and dtype) receive the results when given.

    Errors: :class:`DTypeError` for other dtypes, :class:`ShapeError` for shapes, :class:`ArgumentError`
    when ``k`` is not in [1, experts] or experts exceed the limit, and for an unknown ``scoring``.
    """
    op = "moe_topk_gating"
    logits = _array(op, "router_logits", router_logits)
    _float(op, "router_logits", logits)
    if logits.ndim != 2:
        raise ShapeError(f"{op}: router_logits must be 2-D (tokens, experts), got shape {logits.shape}")
    tokens, experts = logits.shape
    if experts < 1 or experts > MOE_MAX_EXPERTS:
        raise ArgumentError(f"{op}: {experts} experts; between 1 and {MOE_MAX_EXPERTS} are supported")
    k = _count(op, "k", k, 1, experts)
    if scoring not in _SCORING:
        raise ArgumentError(f"{op}: scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    ld = _row_major(op, "router_logits", logits)
    weights = _output(op, "out_weights", out_weights, (tokens, k), float32) if out_weights is not None else None
    ids = _output(op, "out_ids", out_ids, (tokens, k), int32) if out_ids is not None else None
    check_devices(op, [a for a in (logits, weights, ids) if a is not None])
    if weights is None:
        weights = empty((tokens, k), float32)
    if ids is None:
        ids = empty((tokens, k), int32)
    if tokens == 0:
        return weights, ids
    if not is_cuda():
        w, i = _gating_numpy(_cpu.host(logits), k, bool(renormalize), _SCORING[scoring])
        _cpu.store(weights, w)
        _cpu.store(ids, i)
        return weights, ids
    vpl = next(v for v in _VPL if 32 * v >= experts)
    kernel = _routing_kernel(logits.dtype, _gating_expr(logits.dtype, vpl), _GATING_PARAMS)
    kernel(logits.device_ptr, weights.device_ptr, ids.device_ptr, tokens, experts, k, ld, int(bool(renormalize)),
           _SCORING[scoring], grid=grid_for(tokens, _BLOCK // 32), block=_BLOCK)  # fmt: skip
    return weights, ids


# -- permutation --------------------------------------------------------------------------------------
def _positions_numpy(ids: Array, experts: int) -> tuple[Array, Array]:
    """(offsets (experts + 1,), permutation): a stable sort of the slots by expert, ids outside
    [0, experts) after every expert."""
    flat = ids.reshape(-1).astype(np.int64)
    bucket = np.where((flat >= 0) & (flat < experts), flat, experts)
    order = np.argsort(bucket, kind="stable")
    permutation = np.empty(flat.size, np.int32)
    permutation[order] = np.arange(flat.size, dtype=np.int32)
    counts = np.bincount(bucket, minlength=experts + 1)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    return offsets, permutation


def moe_permute(
    x: GPUArray,
    expert_ids: GPUArray,
    num_experts: int,
    out: GPUArray | None = None,
    offsets: GPUArray | None = None,
    permutation: GPUArray | None = None,
) -> tuple[GPUArray, GPUArray, GPUArray]:
    """Token copies grouped by expert: ``(x_perm (T*k, H), expert_offsets int32 (E+1,), permutation
    int32 (T*k,))``.

    ``x`` is ``(tokens, hidden)`` (float32, float16 or bfloat16; rows with unit stride), ``expert_ids``
    ``(tokens, k)`` int32 (contiguous). Slot ``i = t * k + j`` (token t's j-th choice) goes to row
    ``permutation[i]`` of ``x_perm``; rows are grouped by expert in expert order and, within an expert,
    by slot (a stable counting sort), so expert e's rows are ``expert_offsets[e]:expert_offsets[e+1]``
    and ``expert_offsets[E]`` is the number of slots with a valid id. Slots whose id is outside
    [0, num_experts) are placed after every expert (no grouped GEMM touches them). Given outputs must
    be contiguous with the result's shape and dtype.
    """
    op = "moe_permute"
    x = _array(op, "x", x)
    ids = _array(op, "expert_ids", expert_ids)
    _float(op, "x", x)
    if ids.dtype != int32:
        raise DTypeError(f"{op}: expert_ids must be int32, got {ids.dtype}")
    if x.ndim != 2 or ids.ndim != 2 or ids.shape[0] != x.shape[0]:
        raise ShapeError(f"{op}: x must be (tokens, hidden) and expert_ids (tokens, k); got {x.shape} and {ids.shape}")
    if not ids.is_contiguous:
        raise ShapeError(f"{op}: expert_ids must be contiguous, got strides {ids.strides}")
    experts = _count(op, "num_experts", num_experts, 1, MOE_MAX_EXPERTS)
    tokens, hidden = x.shape
    k = ids.shape[1]
    slots = tokens * k
    if slots > _INT32_MAX:
        raise ShapeError(f"{op}: {slots} token copies; at most 2**31 - 1 are supported")
    ldx = _row_major(op, "x", x)
    x_perm = _output(op, "out", out, (slots, hidden), x.dtype) if out is not None else None
    offs = _output(op, "offsets", offsets, (experts + 1,), int32) if offsets is not None else None
    perm = _output(op, "permutation", permutation, (slots,), int32) if permutation is not None else None
    check_devices(op, [a for a in (x, ids, x_perm, offs, perm) if a is not None])
    x_perm = x_perm if x_perm is not None else empty((slots, hidden), x.dtype)
    offs = offs if offs is not None else empty((experts + 1,), int32)
    perm = perm if perm is not None else empty((slots,), int32)
    if not is_cuda():
        o, p = _positions_numpy(_cpu.host(ids), experts)
        _cpu.store(offs, o)
        _cpu.store(perm, p)
        if slots:
            rows = _cpu.host(x)[np.arange(slots) // k]
            dest = _cpu.host(x_perm)
            valid = p < slots
            dest[p[valid]] = rows[valid]
        return x_perm, offs, perm
    kernels = _routing_exprs(x.dtype)
    positions = group(_FILE, kernels).kernel(kernels[len(_VPL)], _POSITIONS_PARAMS)
    chunk = max(1024, -(-slots // 64))
    chunk = -(-chunk // _BLOCK) * _BLOCK
    blocks = max(1, -(-slots // chunk))
    positions(ids.device_ptr, offs.device_ptr, perm.device_ptr, slots, experts, chunk, grid=blocks, block=_BLOCK,
              shared_mem=8 * (experts + 1))  # fmt: skip
    if slots and hidden:
        width = 16 // x.itemsize
        vector = _vector((x, ldx), (x_perm, hidden))
        lanes = _lanes(-(-hidden // width) if vector else -(-hidden // 4))
        gather = _routing_kernel(x.dtype, kernels[len(_VPL) + 1], _GATHER_PARAMS)
        gather(x.device_ptr, perm.device_ptr, x_perm.device_ptr, slots, k, hidden, ldx, lanes, vector,
               grid=grid_for(slots, _BLOCK // lanes), block=_BLOCK)  # fmt: skip
    return x_perm, offs, perm


def moe_unpermute(
    expert_out: GPUArray, permutation: GPUArray, weights: GPUArray, out: GPUArray | None = None
) -> GPUArray:
    """``out[t] = sum_j weights[t, j] * expert_out[permutation[t * k + j]]`` for j = 0..k-1 in that
    order, in float32, rounded once: ``(tokens, hidden)`` of ``expert_out``'s dtype.

    ``expert_out`` is ``(tokens * k, hidden)`` (float32, float16 or bfloat16, contiguous), ``permutation``
    ``(tokens * k,)`` int32 as returned by :func:`moe_permute`, ``weights`` ``(tokens, k)`` float32. An
    entry of ``permutation`` outside [0, tokens * k) contributes nothing. ``out`` (contiguous) receives
    the result when given; it must not overlap the inputs.
    """
    op = "moe_unpermute"
    y = _array(op, "expert_out", expert_out)
    perm = _array(op, "permutation", permutation)
    w = _array(op, "weights", weights)
    _float(op, "expert_out", y)
    if perm.dtype != int32:
        raise DTypeError(f"{op}: permutation must be int32, got {perm.dtype}")
    if w.dtype != float32:
        raise DTypeError(f"{op}: weights must be float32, got {w.dtype}")
    if w.ndim != 2 or y.ndim != 2 or perm.shape != (w.shape[0] * w.shape[1],) or y.shape[0] != perm.shape[0]:
        raise ShapeError(f"{op}: weights must be (tokens, k), permutation (tokens * k,) and expert_out (tokens * k, "
                         f"hidden); got {w.shape}, {perm.shape} and {y.shape}")  # fmt: skip
    for name, array in (("expert_out", y), ("permutation", perm), ("weights", w)):
        if not array.is_contiguous:
            raise ShapeError(f"{op}: {name} must be contiguous, got strides {array.strides}")
    tokens, k = w.shape
    rows, hidden = y.shape
    result = _output(op, "out", out, (tokens, hidden), y.dtype) if out is not None else None
    check_devices(op, [a for a in (y, perm, w, result) if a is not None])
    result = result if result is not None else empty((tokens, hidden), y.dtype)
    if result.size == 0:
        return result
    if not is_cuda():
        p = _cpu.host(perm).reshape(tokens, k).astype(np.int64)
        values = _cpu.host(y).astype(np.float32)
        ws = _cpu.host(w)
        acc = np.zeros((tokens, hidden), np.float32)
        for j in range(k):
            valid = (p[:, j] >= 0) & (p[:, j] < rows)
            contribution = ws[:, j, None] * values[np.where(valid, p[:, j], 0)]
            acc += np.where(valid[:, None], contribution, np.float32(0.0))
        _cpu.store(result, acc)
        return result
    width = 16 // y.itemsize
    vector = _vector((y, hidden), (result, hidden))
    lanes = _lanes(-(-hidden // width) if vector else -(-hidden // 4))
    kernel = _routing_kernel(y.dtype, f"{_NS}moe_unpermute<{y.dtype.ctype}>", _UNPERMUTE_PARAMS)
    kernel(y.device_ptr, perm.device_ptr, w.device_ptr, result.device_ptr, tokens, k, hidden, hidden, rows, lanes,
           vector, grid=grid_for(tokens, _BLOCK // lanes), block=_BLOCK)  # fmt: skip
    return result


# -- grouped GEMM -------------------------------------------------------------------------------------
def _group_bounds(offsets: Array, rows: int) -> list[tuple[int, int]]:
    """The kernels' reading of expert_offsets: running maximum, clamped to [0, rows]."""
    bounds, run = [], 0
    values = [int(v) for v in offsets]
    for e in range(len(values) - 1):
        run = max(run, values[e])
        lo = min(run, rows)
        hi = min(max(run, values[e + 1]), rows)
        bounds.append((lo, hi))
    return bounds


def grouped_gemm(
    x: GPUArray,
    weights: GPUArray,
    expert_offsets: GPUArray,
    layout: Literal["nk", "kn"] = "nk",
    out: GPUArray | None = None,
) -> GPUArray:
    """``out[o[e]:o[e+1]] = x[o[e]:o[e+1]] @ W[e]^T`` for every expert e (``o = expert_offsets``).

    ``x`` is ``(rows, K)`` with unit stride along its rows; ``weights`` is ``(E, N, K)`` when
    ``layout="nk"`` (a stack of HF ``nn.Linear`` weights) or ``(E, K, N)`` when ``layout="kn"`` (then
    ``x @ W[e]``), contiguous, of x's dtype: float32, float16 or bfloat16. ``expert_offsets`` is a
    contiguous int32 device array of E + 1 non-decreasing row offsets (as from :func:`moe_permute`);
    it is read only on the device, so ill-formed values are never an error: the kernels take the
    running maximum clamped to [0, rows] (groups stay disjoint and in bounds). Result: ``(rows, N)``
    of x's dtype; rows outside every group are left unwritten. ``out`` may be a row-strided view (unit
    stride along rows), for example one half of a wider buffer.

    fp16/bf16 run on the tensor cores (mma.sync m16n8k16) with float32 accumulation, float32 as exact
    float FMAs; the grid covers the worst case, and surplus blocks exit at once.
    """
    op = "grouped_gemm"
    x = _array(op, "x", x)
    w = _array(op, "weights", weights)
    offs = _array(op, "expert_offsets", expert_offsets)
    _float(op, "x", x)
    if w.dtype != x.dtype:
        raise DTypeError(f"{op}: weights must have x's dtype {x.dtype}, got {w.dtype}")
    if offs.dtype != int32:
        raise DTypeError(f"{op}: expert_offsets must be int32, got {offs.dtype}")
    if layout not in ("nk", "kn"):
        raise ArgumentError(
            f"{op}: layout must be 'nk' (weights (E, N, K)) or 'kn' (weights (E, K, N)), got {layout!r}"
        )
    if x.ndim != 2 or w.ndim != 3:
        raise ShapeError(f"{op}: x must be (rows, K) and weights (E, N, K) or (E, K, N); got {x.shape} and {w.shape}")
    rows, k = x.shape
    experts = w.shape[0]
    n, k_w = (w.shape[1], w.shape[2]) if layout == "nk" else (w.shape[2], w.shape[1])
    if k != k_w:
        raise ShapeError(f"{op}: x {x.shape} has K={k} but weights {w.shape} (layout {layout!r}) have K={k_w}")
    if experts < 1:
        raise ShapeError(f"{op}: weights hold no expert (shape {w.shape})")
    if offs.shape != (experts + 1,) or not offs.is_contiguous:
        raise ShapeError(f"{op}: expert_offsets must be contiguous of shape ({experts + 1},) for {experts} experts, "
                         f"got {offs.shape}")  # fmt: skip
    if not w.is_contiguous:
        raise ShapeError(f"{op}: weights must be contiguous, got strides {w.strides}")
    if max(rows, n, k, experts) > _INT32_MAX:
        raise ShapeError(f"{op}: sizes up to 2**31 - 1 are supported, got rows={rows}, N={n}, K={k}, E={experts}")
    lda = _row_major(op, "x", x)
    if out is not None:
        result = _array(op, "out", out)
        if result.shape != (rows, n):
            raise ShapeError(f"{op}: out must have shape {(rows, n)}, got {result.shape}")
        if result.dtype != x.dtype:
            raise DTypeError(f"{op}: out must have dtype {x.dtype}, got {result.dtype}")
        ldc = _row_major(op, "out", result)
    else:
        result = empty((rows, n), x.dtype)
        ldc = n
    device = check_devices(op, [x, w, offs, result])
    if rows == 0 or n == 0:
        return result
    if device < 0:
        a = _cpu.host(x).astype(np.float64)
        weight = _cpu.host(w).astype(np.float64)
        dest = _cpu.host(result)
        for e, (lo, hi) in enumerate(_group_bounds(_cpu.host(offs), rows)):
            if hi > lo:
                matrix = weight[e].T if layout == "nk" else weight[e]
                dest[lo:hi] = (a[lo:hi] @ matrix).astype(x.dtype.numpy)
        return result
    trans_b = layout == "nk"
    ldb = k if trans_b else n
    w_stride = n * k
    if x.dtype == float32:
        worst = _worst_row_tiles(rows, experts, _SIMT_BM)
        grid = worst * -(-n // _SIMT_BN)
        exprs = _simt_exprs()
        kernel = group(_GEMM_FILE, exprs).kernel(exprs[0 if trans_b else 1], _GEMM_PARAMS)
        kernel(x.device_ptr, w.device_ptr, result.device_ptr, offs.device_ptr, experts, rows, n, k, lda, ldb, w_stride,
               ldc, worst, grid=grid, block=256)  # fmt: skip
        return result
    _, shared_per_block = _device_limits(device)
    tile = _choose_tile(rows, n, experts, shared_per_block)
    worst = _worst_row_tiles(rows, experts, tile.bm)
    grid = worst * -(-n // tile.bn)
    if grid > _INT32_MAX:
        raise ShapeError(f"{op}: {grid} blocks exceed the grid limit (rows={rows}, N={n}, E={experts})")
    kernel = _mma_kernel(tile, x.dtype, trans_b, device)
    vector_b = int(w.device_ptr % 16 == 0 and (ldb * w.itemsize) % 16 == 0 and (w_stride * w.itemsize) % 16 == 0)
    kernel(x.device_ptr, w.device_ptr, result.device_ptr, offs.device_ptr, experts, rows, n, k, lda, ldb, w_stride,
           ldc, worst, _vector((x, lda)), vector_b, grid=grid, block=tile.threads,
           shared_mem=tile.shared_bytes)  # fmt: skip
    return result


# -- gated activation ---------------------------------------------------------------------------------
def _activation_numpy(values: Array, code: int) -> Array:
    result: Array
    with np.errstate(all="ignore"):
        if code == ACTIVATION_CODES["silu"]:
            result = values / (np.float32(1.0) + np.exp(-values))
        elif code == ACTIVATION_CODES["gelu_tanh"]:
            inner = np.float32(0.7978845608028654) * (values + np.float32(0.044715) * values * values * values)
            result = np.float32(0.5) * values * (np.float32(1.0) + np.tanh(inner))
        else:
            erf = np.vectorize(math.erf, otypes=[np.float64])
            result = (0.5 * values * (1.0 + erf(values.astype(np.float64) / math.sqrt(2.0)))).astype(np.float32)
    return result


def _glu(gate: GPUArray, up: GPUArray, h: GPUArray, code: int) -> None:
    """h = act(gate) * up, elementwise over (rows, cols) views with unit stride along rows."""
    rows, cols = h.shape
    if rows == 0 or cols == 0:
        return
    if not is_cuda():
        g = _cpu.host(gate).astype(np.float32)
        u = _cpu.host(up).astype(np.float32)
        _cpu.store(h, _activation_numpy(g, code) * u)
        return
    ldg, ldu, ldh = (_row_major("moe_mlp", name, a) for name, a in (("gate", gate), ("up", up), ("h", h)))
    width = 16 // h.itemsize
    vector = _vector((gate, ldg), (up, ldu), (h, ldh)) and cols % width == 0
    lanes = _lanes(-(-cols // width) if vector else -(-cols // 4))
    kernel = _routing_kernel(h.dtype, f"{_NS}moe_glu<{h.dtype.ctype}>", _GLU_PARAMS)
    kernel(gate.device_ptr, up.device_ptr, h.device_ptr, rows, cols, ldg, ldu, ldh, code, lanes, int(vector),
           grid=grid_for(rows, _BLOCK // lanes), block=_BLOCK)  # fmt: skip


# -- the MoE MLP --------------------------------------------------------------------------------------
def _round_up(value: int, step: int = _ALIGN) -> int:
    return -(-value // step) * step


def _workspace_parts(
    tokens: int, hidden: int, intermediate: int, experts: int, k: int, itemsize: int
) -> list[tuple[str, int]]:
    slots = tokens * k
    return [
        ("weights", slots * 4),
        ("ids", slots * 4),
        ("offsets", (experts + 1) * 4),
        ("permutation", slots * 4),
        ("x_perm", slots * hidden * itemsize),  # later the down projection's output
        ("gate_up", slots * 2 * intermediate * itemsize),
        ("h", slots * intermediate * itemsize),
    ]


def moe_workspace_size(tokens: int, hidden: int, intermediate: int, num_experts: int, k: int, dtype: Any) -> int:
    """Bytes of the ``workspace`` that :func:`moe_mlp` needs for these sizes (a uint8 array of at least
    this many elements): routing results, the permuted rows and the intermediate activations."""
    from pygpukit.core.dtypes import as_dtype

    itemsize = as_dtype(dtype).itemsize
    parts = _workspace_parts(tokens, hidden, intermediate, num_experts, k, itemsize)
    return _ALIGN + sum(_round_up(size) for _, size in parts)


def _carve(
    workspace: GPUArray, parts: list[tuple[str, int]], shapes: dict[str, tuple[tuple[int, ...], DType]]
) -> dict[str, GPUArray]:
    base = workspace.device_ptr
    offset = _round_up(base) - base
    views: dict[str, GPUArray] = {}
    for name, size in parts:
        shape, dtype = shapes[name]
        start = workspace._offset + offset
        views[name] = GPUArray(workspace._buffer, shape, dtype, None, start // dtype.itemsize)
        offset += _round_up(size)
    return views


def _expert_weights(op: str, name: str, value: Any, shape: tuple[int, int, int], dtype: DType) -> GPUArray:
    w = _array(op, name, value)
    if w.dtype != dtype:
        raise DTypeError(f"{op}: {name} must have x's dtype {dtype}, got {w.dtype}")
    if w.shape != shape:
        raise ShapeError(f"{op}: {name} must have shape {shape}, got {w.shape}")
    if not w.is_contiguous:
        raise ShapeError(f"{op}: {name} must be contiguous, got strides {w.strides}")
    return w


def moe_mlp(
    x: GPUArray,
    router_logits: GPUArray,
    w_gate_up: GPUArray | Sequence[GPUArray] | QuantizedExperts,
    w_down: GPUArray | QuantizedExperts,
    k: int,
    renormalize: bool = False,
    activation: Literal["silu", "gelu_tanh", "gelu"] = "silu",
    *,
    scoring: Literal["softmax", "sigmoid"] = "softmax",
    layout: Literal["nk", "kn"] = "nk",
    out: GPUArray | None = None,
    workspace: GPUArray | None = None,
) -> GPUArray:
    """A sparse MoE MLP block: ``out[t] = sum_j w[t, j] * down_e(act(gate_e(x[t])) * up_e(x[t]))`` over
    token t's k chosen experts e = ids[t, j] (from :func:`moe_topk_gating`); ``(tokens, hidden)``.

    ``x`` is ``(T, H)``; ``router_logits`` ``(T, E)`` (any of float32, float16, bfloat16); with
    ``layout="nk"`` (HF) ``w_gate_up`` is ``(E, 2I, H)`` with the gate projection in its first I rows
    and the up projection in the last I, or a pair ``(w_gate, w_up)`` of ``(E, I, H)``, and ``w_down``
    is ``(E, H, I)``; with ``layout="kn"`` each is transposed per expert (``(E, H, 2I)``, ``(E, I, H)``).
    x and the weights share one dtype (float32, float16 or bfloat16); GEMMs accumulate in float32 and
    the intermediates are stored in that dtype. ``activation``: ``"silu"`` (SwiGLU, Mixtral and Qwen3),
    ``"gelu_tanh"`` or ``"gelu"``. With ``out`` and ``workspace`` (a contiguous uint8 array of at least
    :func:`moe_workspace_size` bytes) given, nothing is allocated and the call can be captured in a
    CUDA graph.

    ``w_gate_up`` and ``w_down`` may instead both be :class:`~pygpukit.ops.quant.QuantizedExperts`
    (GGUF block formats, ``layout="nk"``): the same routing, workspace and activation, the projections
    through the quantized grouped kernels (:mod:`pygpukit.ops.quant.experts`). They too run without a
    host synchronisation, so capturable, except float32 x beyond
    :data:`~pygpukit.ops.quant.experts.GROUPED_MAX_ROWS` routed rows.
    """
    op = "moe_mlp"
    quantized = getattr(w_gate_up, "_quantized_experts", False) or getattr(w_down, "_quantized_experts", False)
    x = _array(op, "x", x)
    _float(op, "x", x)
    if x.ndim != 2:
        raise ShapeError(f"{op}: x must be (tokens, hidden), got shape {x.shape}")
    tokens, hidden = x.shape
    logits = _array(op, "router_logits", router_logits)
    if logits.ndim != 2 or logits.shape[0] != tokens:
        raise ShapeError(f"{op}: router_logits must be ({tokens}, experts) for x {x.shape}, got {logits.shape}")
    experts = logits.shape[1]
    if layout not in ("nk", "kn"):
        raise ArgumentError(f"{op}: layout must be 'nk' or 'kn', got {layout!r}")
    if activation not in _ACTIVATIONS:
        raise ArgumentError(f"{op}: activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    stacked: Any = None
    down_w: Any = None
    pair: tuple[GPUArray, GPUArray] | None = None
    if quantized:
        from .quant.experts import check_experts

        if layout != "nk":
            raise ArgumentError(f"{op}: quantized experts take the 'nk' layout, got {layout!r}")
        inter = check_experts(op, x, experts, w_gate_up, w_down)
        stacked, down_w = w_gate_up, w_down
    else:
        down_w = _array(op, "w_down", w_down)  # dense from here on
        if down_w.ndim != 3:
            raise ShapeError(f"{op}: w_down must be 3-D (experts, hidden, intermediate), got shape {down_w.shape}")
        inter = down_w.shape[2] if layout == "nk" else down_w.shape[1]

        def shape(rows: int, cols: int) -> tuple[int, int, int]:
            return (experts, rows, cols) if layout == "nk" else (experts, cols, rows)

        _expert_weights(op, "w_down", down_w, shape(hidden, inter), x.dtype)
        if isinstance(w_gate_up, GPUArray):
            stacked = _expert_weights(op, "w_gate_up", w_gate_up, shape(2 * inter, hidden), x.dtype)
        elif isinstance(w_gate_up, (tuple, list)) and len(w_gate_up) == 2:
            pair = (_expert_weights(op, "w_gate", w_gate_up[0], shape(inter, hidden), x.dtype),
                    _expert_weights(op, "w_up", w_gate_up[1], shape(inter, hidden), x.dtype))  # fmt: skip
        else:
            raise DTypeError(f"{op}: w_gate_up must be a GPUArray or a pair (w_gate, w_up), got "
                             f"{type(w_gate_up).__name__}")  # fmt: skip
    # The gating checks (dtype, k, experts) before anything is allocated or written.
    _float(op, "router_logits", logits)
    if experts < 1 or experts > MOE_MAX_EXPERTS:
        raise ArgumentError(f"{op}: {experts} experts; between 1 and {MOE_MAX_EXPERTS} are supported")
    k = _count(op, "k", k, 1, experts)
    if scoring not in _SCORING:
        raise ArgumentError(f"{op}: scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    _row_major(op, "router_logits", logits)
    _row_major(op, "x", x)
    result = _output(op, "out", out, (tokens, hidden), x.dtype) if out is not None else None
    parts = _workspace_parts(tokens, hidden, inter, experts, k, x.itemsize)
    needed = moe_workspace_size(tokens, hidden, inter, experts, k, x.dtype)
    if workspace is not None:
        workspace = _array(op, "workspace", workspace)
        if workspace.dtype != uint8 or workspace.ndim != 1 or not workspace.is_contiguous:
            raise DTypeError(f"{op}: workspace must be a contiguous 1-D uint8 array, got {workspace.dtype} "
                             f"{workspace.shape}")  # fmt: skip
        if workspace.size < needed:
            raise ShapeError(f"{op}: workspace has {workspace.size} bytes; these sizes need {needed} "
                             "(moe_workspace_size)")  # fmt: skip
    weights_in = [stacked.data, down_w.data] if quantized else [down_w, *([stacked] if pair is None else pair)]
    check_devices(op, [a for a in (x, logits, *weights_in, result, workspace) if a is not None])
    if workspace is None:
        workspace = empty((needed,), uint8)
    if result is None:
        result = empty((tokens, hidden), x.dtype)
    slots = tokens * k
    views = _carve(workspace, parts, {
        "weights": ((tokens, k), float32), "ids": ((tokens, k), int32), "offsets": ((experts + 1,), int32),
        "permutation": ((slots,), int32), "x_perm": ((slots, hidden), x.dtype),
        "gate_up": ((slots, 2 * inter), x.dtype), "h": ((slots, inter), x.dtype),
    })  # fmt: skip
    if tokens == 0 or hidden == 0:
        return result
    weights, ids = moe_topk_gating(logits, k, renormalize, scoring, views["weights"], views["ids"])
    x_perm, offsets, permutation = moe_permute(x, ids, experts, views["x_perm"], views["offsets"],
                                               views["permutation"])  # fmt: skip
    gate_up = views["gate_up"]
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    h = views["h"]
    if quantized:
        from .quant.experts import project_experts

        project_experts(x_perm, stacked, offsets, gate_up)
    elif pair is None:
        grouped_gemm(x_perm, stacked, offsets, layout, gate_up)
    else:
        grouped_gemm(x_perm, pair[0], offsets, layout, gate)
        grouped_gemm(x_perm, pair[1], offsets, layout, up)
    _glu(gate, up, h, _ACTIVATIONS[activation])
    if quantized:  # the down projection into x_perm, free again
        project_experts(h, down_w, offsets, x_perm)
    else:
        grouped_gemm(h, down_w, offsets, layout, x_perm)
    return moe_unpermute(x_perm, permutation, weights, result)


# -- compile-check enumeration ------------------------------------------------------------------------
def _enumerate() -> Groups:
    gemm: list[tuple[str, ...]] = [
        (t.expression(d, trans_b),) for t in _TILES for d in _HALF for trans_b in (True, False)
    ]
    gemm.append(_simt_exprs())
    return {_FILE: [_routing_exprs(d) for d in _FLOATS], _GEMM_FILE: gemm}


register_enumerator(_enumerate)
