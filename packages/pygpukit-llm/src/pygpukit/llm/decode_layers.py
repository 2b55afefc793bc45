"""The decoder layers of a decode step with preallocated buffers, written once for every such step.

:class:`LayerStep` runs the model's layers over the residual stream ``residual`` and then its final
norm and lm head into ``logits``, every op writing into a buffer the subclass allocated (``out=``):
with dense weights nothing is allocated, so the step can be captured in a CUDA graph. Per layer: the
attention input (the norm, after the residual add of the previous layer's MLP output ``proj``), the
q, k and v projections, the QK norms, the attention into ``attn``, the output projection into
``proj``, the residual add and the MLP's norm, the MLP into ``proj``. The rows are ``residual``'s
leading dimensions: (batch, 1) for one token per sequence, (1, m) for a window of m tokens.

What differs between the steps is in the methods they override:

- :meth:`LayerStep._attend` (required): RoPE, the KV-cache write and the attention of ``q`` into
  ``attn`` (:class:`~pygpukit.llm.decode.DecodeM1`: the fixed cache at ``state.lengths``;
  :class:`~pygpukit.llm.engine_step.PagedDecodeStep`: the paged cache; the window forward of
  :mod:`pygpukit.llm.decode_spec`: prefill attention of the window's rows);
- :meth:`LayerStep._project`: the three projections here, one GEMV over the stacked weight in DecodeM1;
- :meth:`LayerStep._attention_input`, :meth:`LayerStep._block_output` and
  :meth:`LayerStep._final_norm`: DecodeM1's ``fuse="all"`` (the norms and residual adds inside its GEMVs);
- :meth:`LayerStep._mlp`: the dense MLP here; MoE blocks in the subclasses (they allocate).

:func:`capture_step` captures such a step in a CUDA graph (after one eager warm-up run).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING

import pygpukit.ops as ops
from pygpukit.core.array import GPUArray
from pygpukit.core.errors import PyGPUkitError
from pygpukit.core.graph import CudaGraph
from pygpukit.core.stream import Stream, current_stream
from pygpukit.ops.quant import (
    QUANT_GEMV_MAX_ROWS,
    BlockFP8Tensor,
    ChannelQuantizedTensor,
    Int4Tensor,
    NVF4Tensor,
    QuantizedTensor,
    quantized_gemv,
    quantized_linear,
)

if TYPE_CHECKING:
    from .model import CausalTransformerModel, LayerWeights, LinearWeight

__all__ = ["LayerStep", "capture_step"]

# The weight-only types whose decode GEMV writes into a given buffer (quantized_linear(out=)).
_OUT_WEIGHTS = (ChannelQuantizedTensor, Int4Tensor, BlockFP8Tensor, NVF4Tensor)

# The CPU backend's CudaGraph records calls into pygpukit made from outside pygpukit; the steps built
# on this class capture graphs, so this module opts in too: the ops it calls inside a capture are
# recorded (pygpukit.core._recording), as the calls of decode.py are. Without it they would count as
# pygpukit's own internal calls and the CPU graphs would replay without the layers.
__pygpukit_record_calls__ = True


class LayerStep(abc.ABC):
    """The layers, final norm and lm head of a preallocated decode step (see the module). Subclasses
    allocate the buffers below and implement :meth:`_attend`."""

    model: CausalTransformerModel
    residual: GPUArray  # (rows..., hidden_size): the residual stream
    normed: GPUArray  # the norm of the residual stream: the projections' input
    q: GPUArray  # (rows..., num_heads, head_dim)
    k: GPUArray  # (rows..., num_kv_heads, head_dim)
    v: GPUArray
    qn: GPUArray | None  # the QK norms' outputs (models with q_norm)
    kn: GPUArray | None
    attn: GPUArray  # the attention output (rows of num_heads * head_dim values)
    proj: GPUArray  # (rows..., hidden_size): the attention output projected; the MLP output
    hidden: GPUArray | None  # the MLP's gate-up product and its activation (dense MLP)
    activated: GPUArray | None
    final: GPUArray  # (rows, hidden_size): the final norm's output
    logits: GPUArray  # (rows, vocab_size)

    # The most rows whose GGUF block-quantized products run quantized_gemv straight into the buffer;
    # more rows (and other quantized weights) run ops.linear, which allocates.
    quantized_gemv_rows = QUANT_GEMV_MAX_ROWS

    def _linear(self, x: GPUArray, w: LinearWeight, bias: GPUArray | None, out: GPUArray) -> None:
        """``out = x @ w.T + bias`` into the preallocated ``out`` (dense weights, and GGUF block weights
        up to ``quantized_gemv_rows`` rows: nothing allocated)."""
        rows = x.reshape(-1, x.shape[-1])
        dest = out.reshape(rows.shape[0], -1)
        if type(w) is GPUArray:
            ops.matmul(rows, w.T, out=dest)
            if bias is not None:
                ops.add(dest, bias, out=dest)
        elif type(w) is QuantizedTensor and rows.shape[0] <= self.quantized_gemv_rows:
            quantized_gemv(rows, w, dest, bias=bias)  # the packed blocks read once, straight into dest
        elif isinstance(w, _OUT_WEIGHTS) and rows.shape[0] <= QUANT_GEMV_MAX_ROWS:
            quantized_linear(rows, w, bias, out=dest)  # FP8/INT8, INT4, block-FP8, NVF4: their GEMV into dest
        else:
            dest.copy_(ops.linear(rows, w, bias))

    def _norm(self, x: GPUArray, weight: GPUArray, bias: GPUArray | None, out: GPUArray) -> None:
        eps = self.model.config.norm_eps
        if self.model.spec.norm == "layernorm":
            ops.layernorm(x, weight, bias, eps, out=out)
        else:
            ops.rmsnorm(x, weight, eps, out=out)

    def _add_norm(self, weight: GPUArray, bias: GPUArray | None, out: GPUArray) -> None:
        """``residual += proj``, then ``out`` = the norm of ``residual`` (RMSNorm: one kernel)."""
        if self.model.spec.norm == "rmsnorm":
            ops.add_rmsnorm(self.proj, self.residual, weight, self.model.config.norm_eps, out=out,
                            residual_out=self.residual)  # fmt: skip
        else:
            ops.add(self.residual, self.proj, out=self.residual)
            self._norm(self.residual, weight, bias, out)

    def _project(self, layer: LayerWeights) -> tuple[GPUArray, GPUArray, GPUArray]:
        """q, k, v of ``normed``: three products into ``q``, ``k`` and ``v``."""
        self._linear(self.normed, layer.wq, layer.bq, self.q)
        self._linear(self.normed, layer.wk, layer.bk, self.k)
        self._linear(self.normed, layer.wv, layer.bv, self.v)
        return self.q, self.k, self.v

    def _attention_input(self, index: int, layer: LayerWeights) -> tuple[GPUArray, GPUArray, GPUArray]:
        """The attention's norm into ``normed`` (after the residual add of the previous layer's MLP
        output, past the first layer) and q, k, v projected from it."""
        if index == 0:
            self._norm(self.residual, layer.attn_norm, layer.attn_norm_bias, self.normed)
        else:
            self._add_norm(layer.attn_norm, layer.attn_norm_bias, self.normed)
        return self._project(layer)

    @abc.abstractmethod
    def _attend(self, index: int, q: GPUArray, k: GPUArray, v: GPUArray) -> None:
        """RoPE, the KV-cache write of layer ``index`` and the attention of ``q`` into ``attn`` (each
        decode strategy its own: DecodeM1, the engine's paged step, the speculative window forward)."""

    def _mlp(self, layer: LayerWeights) -> None:
        """The dense MLP of ``normed`` into ``proj`` (MoE blocks: the subclasses)."""
        assert layer.w_gate_up is not None
        assert layer.w_down is not None
        assert self.hidden is not None
        assert self.activated is not None
        self._linear(self.normed, layer.w_gate_up, layer.b_gate_up, self.hidden)
        if self.model.spec.activation == "gelu_tanh":
            ops.gelu_tanh(self.hidden, out=self.activated)
        else:
            ops.swiglu(self.hidden, out=self.activated)
        self._linear(self.activated, layer.w_down, layer.b_down, self.proj)

    def _block_output(self, layer: LayerWeights) -> None:
        """After the attention: its output projection into ``proj``, the residual add and the MLP's norm
        into ``normed``, the MLP into ``proj`` (added to the residual by the next norm)."""
        c = self.model.config
        self._linear(self.attn.reshape(*self.proj.shape[:-1], c.q_size), layer.wo, layer.bo, self.proj)
        self._add_norm(layer.mlp_norm, layer.mlp_norm_bias, self.normed)
        self._mlp(layer)

    def _final_norm(self, out: GPUArray) -> None:
        """The last residual add and the final norm into ``out``."""
        w = self.model.weights
        self._add_norm(w.final_norm, w.final_norm_bias, out)

    def _layers(self) -> None:
        """Every layer over ``residual`` (the embedded tokens), then the final norm and the lm head into
        ``logits``."""
        model = self.model
        c, w = model.config, model.weights
        for index, layer in enumerate(w.layers):
            q, k, v = self._attention_input(index, layer)
            if layer.q_norm is not None and layer.k_norm is not None:
                assert self.qn is not None
                assert self.kn is not None
                q = ops.rmsnorm(q, layer.q_norm, c.norm_eps, out=self.qn)
                k = ops.rmsnorm(k, layer.k_norm, c.norm_eps, out=self.kn)
            self._attend(index, q, k, v)
            self._block_output(layer)
        self._final_norm(self.final.reshape(*self.proj.shape))
        self._linear(self.final, w.lm_head, None, self.logits)


def capture_step(step: Callable[[], None], failure: str, prepare: Callable[[], None] | None = None) -> CudaGraph:
    """``step`` captured once in a new CUDA graph. It runs eagerly first, after ``prepare`` (which
    writes the inputs the warm-up reads), on the capture stream itself: per-stream state (the ops'
    completion counters, made by a memset on first use) then exists before the capture, as do the
    plans, kernels and workspaces, so nothing is allocated inside the capture. Raises
    :class:`PyGPUkitError` with the message ``failure`` when nothing was captured."""
    graph = CudaGraph()
    stream = Stream()
    current_stream().synchronize()  # the buffers' allocation and the weights are ready
    with stream:
        if prepare is not None:
            prepare()
        step()
    stream.synchronize()
    with graph.capture(stream):
        step()  # recorded (the CPU backend also runs it once)
    if not graph.is_ready:
        raise PyGPUkitError(failure)
    graph.synchronize()
    return graph
