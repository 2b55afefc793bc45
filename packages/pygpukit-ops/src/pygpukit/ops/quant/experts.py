"""Mixture-of-experts weights kept in a GGUF block format: :class:`QuantizedExperts` and the projections
:func:`pygpukit.ops.moe_mlp` runs them through (:func:`project_experts`; :func:`quantized_moe_mlp` is
the same call as ``moe_mlp``).

A stack of E experts' (N, K) linear weights is one :class:`~pygpukit.ops.quant.QuantizedTensor` of
(E * N, K) rows (a row is whole blocks, so the experts' raw rows concatenate; expert e's rows are
[e * N, (e + 1) * N)), as GGUF files store ``ffn_gate_exps`` / ``ffn_up_exps`` / ``ffn_down_exps``.
A Mixtral 8x7B layer's experts in Q4_K take 28 % of their bf16 bytes.

``moe_mlp`` routes them as it routes dense experts (:func:`~pygpukit.ops.moe_topk_gating`, the
stable :func:`~pygpukit.ops.moe_permute`), then runs each projection as one launch that finds each
row's expert from the offsets on the device, so no host synchronisation at any size and a step can be
captured in a CUDA graph:

* up to :data:`GROUPED_MAX_ROWS` routed rows (tokens x k: decode), the grouped GEMV
  (native/kernels/quant/gguf_grouped_gemv.cu), which reads only the chosen experts' blocks;
* beyond, with fp16 / bf16 activations, the grouped GEMM (native/kernels/quant/gguf_grouped_gemm.cu):
  tiles of each expert's rows on the tensor cores, the weight blocks decoded into shared memory per
  32-wide k tile. float32 activations beyond take the E + 1 offsets to the host (one synchronisation)
  and run each expert that received rows through the quantized linear.

Between the projections the fused gated activation; then :func:`~pygpukit.ops.moe_unpermute` with the
routing weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray
from pygpukit.core.dtypes import DType, bfloat16, float16, float32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from .. import _cpu
from .. import gguf as _gguf
from .._kernels import NAMESPACE, Groups, c_param, group, launch, pointer, register_enumerator, size_param
from .._layout import is_cuda
from .tensor import _IDS, QUANT_FORMATS, QuantizedTensor

__all__ = [
    "GROUPED_MAX_ROWS",
    "QuantizedExperts",
    "check_experts",
    "project_experts",
    "quantize_experts",
    "quantized_moe_mlp",
]


class QuantizedExperts:
    """E experts' weights (E, N, K) in one GGUF block format: ``q`` a :class:`QuantizedTensor` of
    (E * N, K), expert e's weight its rows [e * N, (e + 1) * N)."""

    __slots__ = ("experts", "q", "shape")
    _quantized_experts = True  # what moe_mlp looks for

    def __init__(self, q: QuantizedTensor, experts: int) -> None:
        name = "QuantizedExperts"
        if not isinstance(q, QuantizedTensor):
            raise DTypeError(f"{name}: q must be a QuantizedTensor, got {type(q).__name__}")
        if isinstance(experts, bool) or not isinstance(experts, (int, np.integer)) or experts <= 0:
            raise ShapeError(f"{name}: experts must be a positive int, got {experts!r}")
        rows, k = q.shape
        if rows % int(experts):
            raise ShapeError(f"{name}: {rows} rows do not split into {experts} experts")
        self.q, self.experts = q, int(experts)
        self.shape = (self.experts, rows // self.experts, k)

    @classmethod
    def stack(cls, parts: Sequence[QuantizedTensor]) -> QuantizedExperts:
        """Per-expert weights of one format and shape stacked on the device."""
        if not parts or not all(isinstance(p, QuantizedTensor) for p in parts):
            raise DTypeError("QuantizedExperts.stack: parts must be a non-empty sequence of QuantizedTensor")
        first = parts[0]
        for p in parts:
            if p.format != first.format or p.shape != first.shape:
                raise ShapeError(f"QuantizedExperts.stack: parts differ: {p.format} {p.shape} vs {first.format} "
                                 f"{first.shape}")  # fmt: skip
        from .. import shape as _shape

        data = _shape.concatenate([p.data for p in parts], axis=0) if len(parts) > 1 else first.data
        return cls(QuantizedTensor(data, first.format, (len(parts) * first.shape[0], first.shape[1])), len(parts))

    @property
    def format(self) -> str:
        return self.q.format

    @property
    def nbytes(self) -> int:
        return int(self.q.nbytes)

    @property
    def data(self) -> GPUArray:
        return self.q.data

    def expert(self, e: int) -> QuantizedTensor:
        """Expert ``e``'s (N, K) weight, a view of the same device bytes."""
        if not 0 <= e < self.experts:
            raise ArgumentError(f"QuantizedExperts.expert: {e} is not an expert of {self.experts}")
        n = self.shape[1]
        return self.q.rows(e * n, (e + 1) * n)

    def dequantize(self, dtype: Any = "float32") -> GPUArray:
        """The (E, N, K) weights expanded on the device in ``dtype``."""
        return self.q.dequantize(dtype).reshape(self.shape)

    def __repr__(self) -> str:
        return f"QuantizedExperts({self.format}, shape={self.shape}, {self.nbytes} bytes)"


def quantize_experts(w: Any, fmt: str) -> QuantizedExperts:
    """(E, N, K) float weights (GPUArray or NumPy) in the GGUF block format ``fmt``, each expert quantized
    as :func:`pygpukit.ops.quantize` quantizes a 2-D weight."""
    from .quantizers import quantize

    shape = tuple(w.shape)
    if len(shape) != 3:
        raise ShapeError(f"quantize_experts: w must be (experts, N, K), got shape {shape}")
    flat = w.reshape(shape[0] * shape[1], shape[2])
    q = quantize(flat, fmt)
    if not isinstance(q, QuantizedTensor):
        raise ArgumentError(f"quantize_experts: {fmt!r} is not a GGUF block format")
    return QuantizedExperts(q, shape[0])


GROUPED_MAX_ROWS = 32
"""Up to this many routed rows (tokens x k) the experts run through the grouped GEMV, beyond through the
grouped GEMM (fp16 / bf16) or one quantized linear per expert (float32); see the module docstring."""
_FILE = "quant/gguf_grouped_gemv.cu"
_PARAMS = [pointer("x"), pointer("w"), pointer("y"), pointer("offsets"), c_param("experts", "int"),
           c_param("rows", "int"), c_param("n", "int"), c_param("k", "int"), size_param("ldx"),
           size_param("ldy")]  # fmt: skip
_DTYPES = (float32, float16, bfloat16)
_KERNELS: PlanCache[JITKernel] = PlanCache("ops.quant_experts")


def _expression(fmt: str, dtype: DType) -> str:
    return f"{NAMESPACE}qgemv::gguf_grouped_gemv<{_IDS[fmt]}, {dtype.ctype}>"


def _kernel(fmt: str, dtype: DType) -> JITKernel:
    key = (fmt, dtype, thread_device())
    kernel = _KERNELS.get(key)
    if kernel is None:
        expression = _expression(fmt, dtype)
        kernel = _KERNELS.put(key, group(_FILE, (expression,)).kernel(expression, _PARAMS))
    return kernel


def _grouped(x: GPUArray, w: QuantizedExperts, offsets: GPUArray, out: GPUArray) -> None:
    """out[r] = x[r] @ W_e.T for every routed row r (e from the device offsets), one launch."""
    rows, k = x.shape
    n = w.shape[1]
    if not is_cuda():  # the CPU simulation: the same products from the host offsets
        bounds = _cpu.host(offsets)
        dense = w.q.host_weights()  # decoded once and kept
        for e in range(w.experts):
            lo, hi = int(bounds[e]), int(bounds[e + 1])
            if hi > lo:
                weight = dense[e * n : (e + 1) * n].astype(np.float64)
                _cpu.store(out[lo:hi], _cpu.host(x[lo:hi]).astype(np.float64) @ weight.T)
        return
    launch(_kernel(w.format, x.dtype), (x.device_ptr, w.data.device_ptr, out.device_ptr, offsets.device_ptr,
                                        w.experts, rows, n, k, k, n), (-(-n // 8), rows))  # fmt: skip


_GEMM_FILE = "quant/gguf_grouped_gemm.cu"
_GEMM_PARAMS = [pointer("a"), pointer("w"), pointer("out"), pointer("offsets"), c_param("experts", "int"),
                c_param("total_rows", "int"), c_param("n", "int"), c_param("k", "int"), size_param("lda"),
                size_param("ldc"), c_param("worst_m", "int"), c_param("vector_a", "int")]  # fmt: skip
_GEMM_DTYPES = (float16, bfloat16)


class _GemmTile:
    """A block tile of gguf_grouped_gemm: BM x BN outputs with WARPS_M x WARPS_N warps."""

    __slots__ = ("bm", "bn", "warps_m", "warps_n")

    def __init__(self, bm: int, bn: int, warps_m: int, warps_n: int) -> None:
        self.bm, self.bn, self.warps_m, self.warps_n = bm, bn, warps_m, warps_n

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    def shared_bytes(self, fmt: str) -> int:
        """GroupedGemmShared<Type, BM, BN>::kBytes: the A and B tiles, the staged bytes of a 256-wide
        span of BN weight rows (16-byte rows), 16 bytes of slack for the block readers."""
        elems, nbytes = _gguf.gguf_block_size(fmt)
        span = 256 // elems * nbytes
        return (self.bm + self.bn) * 32 * 2 + self.bn * (-(-span // 16) * 16) + 16

    def expression(self, fmt: str, dtype: DType) -> str:
        return (f"{NAMESPACE}qgemv::gguf_grouped_gemm<{_IDS[fmt]}, {dtype.ctype}, {self.bm}, {self.bn}, "
                f"{self.warps_m}, {self.warps_n}>")  # fmt: skip


# Groups of up to 32 rows on average (a batch of decode steps): 32-row tiles; larger groups (prefill):
# 64 x 128 tiles, each decoded weight tile serving 64 rows.
_GEMM_TILES = (_GemmTile(32, 64, 2, 2), _GemmTile(64, 128, 2, 2))


def _gemm_tile(rows: int, experts: int) -> _GemmTile:
    return _GEMM_TILES[0] if rows / max(1, min(experts, rows)) <= 32 else _GEMM_TILES[1]


def _gemm_kernel(fmt: str, dtype: DType, tile: _GemmTile) -> JITKernel:
    key = ("gemm", fmt, dtype, tile.bm, tile.bn, thread_device())
    kernel = _KERNELS.get(key)
    if kernel is None:
        expression = tile.expression(fmt, dtype)
        kernel = group(_GEMM_FILE, (expression,)).kernel(expression, _GEMM_PARAMS)
        kernel.set_max_dynamic_shared_memory(tile.shared_bytes(fmt))
        kernel = _KERNELS.put(key, kernel)
    return kernel


def _grouped_gemm(x: GPUArray, w: QuantizedExperts, offsets: GPUArray, out: GPUArray) -> None:
    """:func:`_grouped`'s products for any number of rows (fp16 / bf16 x): one tensor-core launch."""
    from ..moe import _worst_row_tiles

    rows, k = x.shape
    n = w.shape[1]
    tile = _gemm_tile(rows, w.experts)
    worst = _worst_row_tiles(rows, w.experts, tile.bm)
    vector_a = int(x.device_ptr % 16 == 0 and (k * x.itemsize) % 16 == 0)
    launch(_gemm_kernel(w.format, x.dtype, tile), (x.device_ptr, w.data.device_ptr, out.device_ptr,
                                                    offsets.device_ptr, w.experts, rows, n, k, k, n, worst,
                                                    vector_a),
           worst * -(-n // tile.bn), tile.threads, tile.shared_bytes(w.format))  # fmt: skip


def _project(x: GPUArray, w: QuantizedExperts, bounds: np.ndarray[Any, Any], out: GPUArray) -> None:
    from ..gemm.api import linear

    for e in range(w.experts):
        lo, hi = int(bounds[e]), int(bounds[e + 1])
        if hi > lo:
            linear(x[lo:hi], w.expert(e), out=out[lo:hi])


def check_experts(op: str, x: GPUArray, experts: int, w_gate_up: Any, w_down: Any) -> int:
    """The intermediate size I of quantized experts that fit x (T, H) and ``experts`` router columns
    (HF "nk" layout: ``w_gate_up`` (E, 2I, H) with the gate in each expert's first I rows, ``w_down``
    (E, H, I)); typed errors naming what does not fit."""
    if not isinstance(w_gate_up, QuantizedExperts) or not isinstance(w_down, QuantizedExperts):
        raise DTypeError(f"{op}: quantized experts need both w_gate_up and w_down as QuantizedExperts, got "
                         f"{type(w_gate_up).__name__} and {type(w_down).__name__}")  # fmt: skip
    hidden = x.shape[1]
    e1, two_inter, h1 = w_gate_up.shape
    e2, h2, inter = w_down.shape
    if h1 != hidden or h2 != hidden or two_inter != 2 * inter or e2 != e1:
        raise ShapeError(f"{op}: experts {w_gate_up.shape} and {w_down.shape} do not fit x {x.shape} (want "
                         f"(E, 2I, {hidden}) and (E, {hidden}, I))")  # fmt: skip
    if experts != e1:
        raise ShapeError(f"{op}: router_logits has {experts} experts, the weights {e1}")
    return int(inter)


def project_experts(a: GPUArray, w: QuantizedExperts, offsets: GPUArray, out: GPUArray) -> None:
    """out[r] = a[r] @ W_e.T for every permuted row r of expert e's group (``offsets`` from
    :func:`~pygpukit.ops.moe_permute`): the grouped GEMV up to :data:`GROUPED_MAX_ROWS` rows, the
    grouped GEMM beyond for fp16 / bf16, else one quantized linear per expert after reading the offsets
    on the host. ``a`` (rows, K) and ``out`` (rows, N) are contiguous (moe_mlp's workspace views)."""
    if not (a.is_contiguous and out.is_contiguous):
        raise ShapeError(f"project_experts: a and out must be contiguous, got strides {a.strides} and {out.strides}")
    rows = a.shape[0]
    if rows <= GROUPED_MAX_ROWS or (a.dtype in _GEMM_DTYPES and not is_cuda()):
        _grouped(a, w, offsets, out)
    elif a.dtype in _GEMM_DTYPES:
        _grouped_gemm(a, w, offsets, out)
    else:  # float32 beyond the GEMV: the host needs the groups, one synchronisation
        _project(a, w, offsets.to_numpy(), out)


def quantized_moe_mlp(x: GPUArray, router_logits: GPUArray, w_gate_up: QuantizedExperts, w_down: QuantizedExperts,
                      k: int, renormalize: bool = False, activation: str = "silu", *, scoring: str = "softmax",
                      out: GPUArray | None = None, workspace: GPUArray | None = None) -> GPUArray:  # fmt: skip
    """:func:`pygpukit.ops.moe_mlp` on quantized experts (the same call; see the module docstring)."""
    from ..moe import moe_mlp

    return moe_mlp(x, router_logits, w_gate_up, w_down, k, renormalize, activation,  # type: ignore[arg-type]
                   scoring=scoring, out=out, workspace=workspace)  # type: ignore[arg-type]  # fmt: skip


def _enumerate() -> Groups:
    return {
        _FILE: [(_expression(f, d),) for f in QUANT_FORMATS for d in _DTYPES],
        _GEMM_FILE: [(t.expression(f, d),) for f in QUANT_FORMATS for d in _GEMM_DTYPES for t in _GEMM_TILES],
    }


register_enumerator(_enumerate)
