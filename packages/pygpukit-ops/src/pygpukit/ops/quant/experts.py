"""Mixture-of-experts weights kept in a GGUF block format: :class:`QuantizedExperts` and the MoE MLP that
runs on them (:func:`quantized_moe_mlp`, what :func:`pygpukit.ops.moe_mlp` hands such weights to).

A stack of E experts' (N, K) linear weights is one :class:`~pygpukit.ops.quant.QuantizedTensor` of
(E * N, K) rows (a row is whole blocks, so the experts' raw rows concatenate; expert e's rows are
[e * N, (e + 1) * N)), as GGUF files store ``ffn_gate_exps`` / ``ffn_up_exps`` / ``ffn_down_exps``.
A Mixtral 8x7B layer's experts in Q4_K take 28 % of their bf16 bytes.

:func:`quantized_moe_mlp` routes as the dense block does (:func:`~pygpukit.ops.moe_topk_gating`, the
stable :func:`~pygpukit.ops.moe_permute`). Up to :data:`GROUPED_MAX_ROWS` routed rows (tokens x k:
decode) each projection is one grouped GEMV launch (native/kernels/quant/gguf_grouped_gemv.cu) that
finds each row's expert from the offsets on the device and reads only the chosen experts' blocks: no
host synchronisation, so a decode step can be captured in a CUDA graph. Beyond, it reads the E + 1
expert offsets on the host (one synchronisation per call) and runs each expert that received tokens
through the quantized linear on its contiguous rows of the permuted tokens (dequantized tiles through
the GEMM). Between the projections the fused gated activation; then :func:`~pygpukit.ops.moe_unpermute`
with the routing weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType, bfloat16, float16, float32
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache
from pygpukit.core.stream import thread_device

from .. import _cpu
from .._kernels import NAMESPACE, Groups, c_param, group, launch, pointer, register_enumerator, size_param
from .._layout import is_cuda
from .tensor import _IDS, QUANT_FORMATS, QuantizedTensor

__all__ = ["GROUPED_MAX_ROWS", "QuantizedExperts", "quantize_experts", "quantized_moe_mlp"]


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
"""Up to this many routed rows (tokens x k) the experts run through one grouped GEMV launch per
projection (native/kernels/quant/gguf_grouped_gemv.cu: the expert offsets read on the device, no host
synchronisation, capturable); beyond, one quantized linear per expert after a host read of the offsets."""
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
        for e in range(w.experts):
            lo, hi = int(bounds[e]), int(bounds[e + 1])
            if hi > lo:
                weight = _cpu.host(w.expert(e).dequantize(float32)).astype(np.float64)
                _cpu.store(out[lo:hi], _cpu.host(x[lo:hi]).astype(np.float64) @ weight.T)
        return
    launch(_kernel(w.format, x.dtype), (x.device_ptr, w.data.device_ptr, out.device_ptr, offsets.device_ptr,
                                        w.experts, rows, n, k, k, n), (-(-n // 8), rows))  # fmt: skip


def _project(x: GPUArray, w: QuantizedExperts, bounds: np.ndarray[Any, Any], out: GPUArray) -> None:
    from ..gemm.api import linear

    for e in range(w.experts):
        lo, hi = int(bounds[e]), int(bounds[e + 1])
        if hi > lo:
            linear(x[lo:hi], w.expert(e), out=out[lo:hi])


def quantized_moe_mlp(x: GPUArray, router_logits: GPUArray, w_gate_up: QuantizedExperts, w_down: QuantizedExperts,
                      k: int, renormalize: bool = False, activation: str = "silu", *,
                      scoring: str = "softmax") -> GPUArray:  # fmt: skip
    """The sparse MoE MLP of :func:`pygpukit.ops.moe_mlp` (HF "nk" layout: ``w_gate_up`` (E, 2I, H) with
    the gate in each expert's first I rows, ``w_down`` (E, H, I)) on quantized experts; see the module
    docstring for how it runs."""
    from ..gated import geglu, swiglu
    from ..moe import moe_permute, moe_topk_gating, moe_unpermute

    op = "moe_mlp"
    if not isinstance(w_gate_up, QuantizedExperts) or not isinstance(w_down, QuantizedExperts):
        raise DTypeError(f"{op}: quantized experts need both w_gate_up and w_down as QuantizedExperts, got "
                         f"{type(w_gate_up).__name__} and {type(w_down).__name__}")  # fmt: skip
    if not isinstance(x, GPUArray) or x.ndim != 2:
        raise ShapeError(f"{op}: x must be a (tokens, hidden) GPUArray, got {getattr(x, 'shape', type(x).__name__)}")
    tokens, hidden = x.shape
    experts, two_inter, h1 = w_gate_up.shape
    e2, h2, inter = w_down.shape
    if h1 != hidden or h2 != hidden or two_inter != 2 * inter or e2 != experts:
        raise ShapeError(f"{op}: experts {w_gate_up.shape} and {w_down.shape} do not fit x {x.shape} (want "
                         f"(E, 2I, {hidden}) and (E, {hidden}, I))")  # fmt: skip
    if router_logits.shape != (tokens, experts):
        raise ShapeError(f"{op}: router_logits must be ({tokens}, {experts}), got {router_logits.shape}")
    if activation not in ("silu", "gelu", "gelu_tanh"):
        raise ArgumentError(f"{op}: activation must be 'silu', 'gelu' or 'gelu_tanh', got {activation!r}")
    weights, ids = moe_topk_gating(router_logits, k, renormalize, scoring=scoring)  # type: ignore[arg-type]
    x_perm, offsets, permutation = moe_permute(x if x.is_contiguous else x.contiguous(), ids, experts)
    rows = tokens * int(k)
    grouped = rows <= GROUPED_MAX_ROWS
    bounds = None if grouped else offsets.to_numpy()  # the host needs the groups: one synchronisation
    gate_up = empty((rows, two_inter), x.dtype)
    if grouped:
        _grouped(x_perm, w_gate_up, offsets, gate_up)
    else:
        _project(x_perm, w_gate_up, bounds, gate_up)  # type: ignore[arg-type]
    act = swiglu(gate_up) if activation == "silu" else geglu(gate_up, approximate="tanh" if activation == "gelu_tanh"
                                                                 else "none")  # fmt: skip
    down = empty((rows, hidden), x.dtype)
    if grouped:
        _grouped(act, w_down, offsets, down)
    else:
        _project(act, w_down, bounds, down)  # type: ignore[arg-type]
    return moe_unpermute(down, permutation, weights)


def _enumerate() -> Groups:
    return {_FILE: [(_expression(f, d),) for f in QUANT_FORMATS for d in _DTYPES]}


register_enumerator(_enumerate)
