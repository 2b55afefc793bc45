"""Decode strategies with preallocated buffers: :class:`DecodeM1` and :class:`DecodeM1Graph`.

``DecodeM1`` runs one decode step with every intermediate (hidden states, q/k/v, attention output,
MLP activations, logits, the sampled token) in buffers allocated once, through the ops' ``out=``
arguments: a steady-state step allocates nothing from the pool and synchronizes with the host only
to read the sampled token. The sampled-token buffer is also the next step's input, and the positions
(``state.lengths``) advance on the device, so the host writes nothing between steps.

``DecodeM1Graph`` captures that same step once in a :class:`pygpukit.CudaGraph` (rope, the KV-cache
append and decode attention all read the positions from the device) and replays the one graph at
every position: one launch per token. Its tokens are bitwise equal to ``DecodeM1``'s (the same
kernels on the same buffers).

The layers themselves (norms, projections, MLP, final norm and lm head) are
:class:`~pygpukit.llm.decode_layers.LayerStep`'s, shared with the engine's paged step and the window
forward of the multi-token strategies; ``DecodeM1`` adds the fusions below and its fixed KV cache.

Fusions (``fuse=True``, the default): the q, k and v projections run as one GEMV over the stacked
weight of :meth:`CausalTransformerModel.fuse_qkv` (views of one output buffer feed the rest), and RoPE
runs fused with the KV-cache write (:func:`pygpukit.ops.rope_kv_append`: q rotated, k rotated and
written with v at the device-side position, one launch). The residual add and the next RMSNorm are
one kernel (``ops.add_rmsnorm``) and gate and up one GEMM in both modes. ``fuse=False`` runs the
separate kernels (three projections, rope, then the cache append), for comparisons. ``fuse="all"``
also runs each projection as :func:`pygpukit.ops.fused_gemv` where it can (batch 1, RMSNorm and
SwiGLU, dense weights the kernel takes): the norm inside the QKV and gate-up GEMVs, SwiGLU inside the
down GEMV and the residual adds inside the o and down GEMVs, six kernels a layer with the attention.

Dense weights and GGUF block-quantized weights run allocation-free (the GGUF GEMV writes into the
step's buffers, ``quantized_gemv(out=)``), so do FP8/INT8 per-channel, AWQ/GPTQ INT4, block-FP8 and
NVF4 weights up to 8 rows (their GEMVs through ``quantized_linear(out=)``), and MoE blocks with dense or
GGUF-quantized experts (the router GEMV into a preallocated logits buffer, :func:`pygpukit.ops.moe_mlp`
with ``out=`` and its ``workspace``; quantized experts through the grouped GEMV / GEMM that read the
expert offsets on the device). ``DecodeM1Graph`` refuses quantized experts in a float32 model, saying
why (beyond 32 routed rows their float32 path reads the groups on the host).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

import pygpukit.ops as ops
from pygpukit.core.array import GPUArray, empty, from_numpy
from pygpukit.core.dtypes import float32, int32, uint8
from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.ops.quant import BlockFP8Tensor, ChannelQuantizedTensor, Int4Tensor, NVF4Tensor, QuantizedTensor
from pygpukit.profiling import Range

from .decode_layers import LayerStep, capture_step

if TYPE_CHECKING:
    from .generation import SamplingParams
    from .model import CausalTransformerModel, LayerWeights

__all__ = [
    "STRATEGIES",
    "DecodeM1",
    "DecodeM1Graph",
    "UnsupportedStrategyError",
    "choose_strategy",
    "graph_unsupported_reason",
]

STRATEGIES = ("eager", "m1", "graph", "batch", "speculative", "jacobi")  # the last three: decode_batch/_spec.py

# The CPU backend's CudaGraph records calls into pygpukit made from outside pygpukit; this module
# opts in, so the ops it calls inside a capture are recorded (pygpukit.core._recording).
__pygpukit_record_calls__ = True


# Named ranges of pygpukit.profiling (nothing recorded, and almost no cost, while no profiler records).
_PREFILL = Range("llm.prefill")
_STEP = Range("llm.decode_step")


class UnsupportedStrategyError(ArgumentError):
    """A decode strategy that cannot run this model or these settings (names what is unsupported)."""


def graph_unsupported_reason(model: CausalTransformerModel, sampling: SamplingParams | None) -> str | None:
    """Why :class:`DecodeM1Graph` cannot run ``model`` with ``sampling`` (None when it can)."""
    if sampling is not None and sampling.repetition_penalty:
        return "repetition_penalty (its token history is written by the host each step)"
    for layer in model.weights.layers:
        if (layer.w_router is not None and not isinstance(layer.experts_gate_up, GPUArray)
                and model.dtype == float32):  # fmt: skip
            return ("quantized MoE experts with float32 activations (beyond 32 routed rows their groups are "
                    "read on the host)")  # fmt: skip
        for name in ("wq", "wk", "wv", "wo", "w_gate_up", "w_down"):
            weight = getattr(layer, name)
            if weight is not None and type(weight) not in _GRAPH_WEIGHTS:
                return (f"weights of type {type(weight).__name__} ({name}; dense, GGUF block and the weight-only "
                        "quantized types write into preallocated buffers)")  # fmt: skip
    if type(model.weights.lm_head) not in _GRAPH_WEIGHTS:
        return f"a quantized lm_head ({type(model.weights.lm_head).__name__})"
    return None


# Weight types whose decode product writes into a preallocated buffer (nothing allocated per step):
# dense arrays (matmul out=), GGUF block-quantized tensors (quantized_gemv out=) and the weight-only
# types (FP8/INT8 per channel, AWQ/GPTQ INT4, block-FP8, NVF4: quantized_linear out=, up to 8 rows).
_GRAPH_WEIGHTS = (GPUArray, QuantizedTensor, ChannelQuantizedTensor, Int4Tensor, BlockFP8Tensor, NVF4Tensor)


class DecodeM1(LayerStep):
    """Batch decode with preallocated buffers (the seeds' ``DecodeM1``).

    ``start(ids, lengths)`` runs the prompt and samples the first token; each ``step()`` decodes one
    token per sequence and returns the sampled ids (batch,) on the host. ``sampling`` None (or a
    greedy :class:`SamplingParams`) is greedy; ``seed`` seeds the sampler. ``fuse`` (default
    :attr:`fuse_default`) runs the fused kernels (module docstring); ``fusions`` names those in use."""

    fuse_default: bool | str = True  # what fuse=None means: a process-wide switch (benchmarks compare paths)

    def __init__(self, model: CausalTransformerModel, batch: int, max_seq_len: int,
                 sampling: SamplingParams | None = None, seed: int = 0,
                 fuse: bool | str | None = None) -> None:  # fmt: skip
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ArgumentError(f"{type(self).__name__}: batch must be an int >= 1, got {batch!r}")
        if not isinstance(max_seq_len, int) or isinstance(max_seq_len, bool) or max_seq_len < 1:
            raise ArgumentError(f"{type(self).__name__}: max_seq_len must be an int >= 1, got {max_seq_len!r}")
        c = model.config
        self.model = model
        self.batch = batch
        self.max_seq_len = max_seq_len
        # Two positions at least: DecodeM1Graph warms up and captures on positions 0 and 1.
        self.state = model.new_state(batch, min(max(max_seq_len, 2), c.max_position_embeddings))
        self.sampling = sampling
        self.seed = seed
        level = DecodeM1.fuse_default if fuse is None else fuse
        if level not in (True, False, "all"):
            raise ArgumentError(f"{type(self).__name__}: fuse must be True, False, 'all' or None, got {fuse!r}")
        self.fuse = level is not False
        self._fuse_all = level == "all"
        if self.fuse:
            model.fuse_qkv()  # once per model: wq, wk and wv become views of the stacked weight
        greedy = sampling is None or sampling.greedy
        self.sampler = None if greedy else ops.Sampler(seed, batch, c.vocab_size, model.dtype)
        self._settings: dict[str, Any] = {}
        self._history: GPUArray | None = None
        self._history_host: np.ndarray[Any, Any] | None = None
        if sampling is not None and not greedy:
            self._settings = {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                              "min_p": sampling.min_p, "repetition_penalty": sampling.repetition_penalty}  # fmt: skip
            if sampling.repetition_penalty:
                self._history_host = np.full((batch, self.state.max_seq_len), -1, np.int32)
                self._history = from_numpy(self._history_host)
                self._settings["history"] = self._history
        self._lengths_host = [0] * batch
        self._allocate()

    # -- buffers ------------------------------------------------------------------------------------
    def _allocate(self) -> None:
        c, b, dt = self.model.config, self.batch, self.model.dtype
        w = self.model.weights
        self.tokens = empty(b, int32)  # the sampled tokens: the next step's input
        self.residual = empty((b, 1, c.hidden_size), dt)
        self.normed = empty((b, 1, c.hidden_size), dt)
        self.q = empty((b, 1, c.num_heads, c.head_dim), dt)
        self.k = empty((b, 1, c.num_kv_heads, c.head_dim), dt)
        self.v = empty((b, 1, c.num_kv_heads, c.head_dim), dt)
        # Fused QKV: one (b, 1, heads + 2 kv_heads, head_dim) output; q, k and v are views of it (rope_kv
        # writes the rotated q into self.q). With QK-norm only at batch 1, where the views' rows merge
        # into one stride for rmsnorm.
        self.qkv = self.q_view = self.k_view = self.v_view = None
        first_layer = w.layers[0]
        if self.fuse and first_layer.w_qkv is not None and (first_layer.q_norm is None or b == 1):
            h, kv = c.num_heads, c.num_kv_heads
            self.qkv = empty((b, 1, h + 2 * kv, c.head_dim), dt)
            self.q_view, self.k_view = self.qkv[:, :, :h], self.qkv[:, :, h : h + kv]
            self.v_view = self.qkv[:, :, h + kv :]
        self.gemv = self._fuse_all and self._gemv_eligible()
        fused = {"qkv": self.qkv is not None, "rope_kv": self.fuse and self.model.rope is not None, "gemv": self.gemv}
        self.fusions = tuple(name for name, on in fused.items() if on)  # what this decoder fuses
        self.qn = self.kn = None
        if w.layers[0].q_norm is not None:
            self.qn = empty(self.q.shape, dt)
            self.kn = empty(self.k.shape, dt)
        self.attn = empty((b, c.num_heads, c.head_dim), dt)
        self.proj = empty((b, 1, c.hidden_size), dt)  # attention output projected; MLP output
        self.positions = self.position_rows = None
        if w.position_embed is not None:
            self.positions = empty(b, int32)
            self.position_rows = empty((b, 1, c.hidden_size), dt)
        first = w.layers[0]
        self.hidden = self.activated = None
        if first.w_gate_up is not None:
            width = _out_features(first.w_gate_up)
            self.hidden = empty((b, 1, width), dt)
            self.activated = empty((b, 1, width if self.model.spec.activation == "gelu_tanh" else width // 2), dt)
        self.final = empty((b, c.hidden_size), dt)
        # MoE blocks (dense or quantized experts): the router logits and moe_mlp's workspace (it writes
        # into proj).
        self.moe_logits = self.moe_workspace = None
        if c.num_experts and first.experts_down is not None:
            inter = first.experts_down.shape[2]
            self.moe_logits = empty((b, c.num_experts), dt)
            size = ops.moe_workspace_size(b, c.hidden_size, inter, c.num_experts, c.num_experts_per_tok, dt)
            self.moe_workspace = empty((size,), uint8)
        self.logits = empty((b, c.vocab_size), dt)

    def _gemv_eligible(self) -> bool:
        """Whether every layer can run its projections as ops.fused_gemv (fuse="all")."""
        model, dt = self.model, self.model.dtype
        if self.batch != 1 or self.qkv is None or model.spec.norm != "rmsnorm" or model.spec.activation == "gelu_tanh":
            return False
        for layer in model.weights.layers:
            weights = (layer.w_qkv, layer.wo, layer.w_gate_up, layer.w_down)
            if layer.w_router is not None or not all(ops.fused_gemv_supported(x, dt) for x in weights):
                return False
            vectors = (layer.attn_norm, layer.mlp_norm, layer.b_qkv, layer.bo, layer.b_gate_up, layer.b_down)
            if any(x is not None and x.dtype != dt for x in vectors):
                return False
        return True

    # -- the step: the layers are LayerStep's; these methods add the fusions and the fixed KV cache ---
    def _mlp(self, layer: LayerWeights) -> None:
        """MLP of ``self.normed`` into ``self.proj``."""
        c = self.model.config
        if layer.w_router is not None:
            assert layer.experts_gate_up is not None
            assert layer.experts_down is not None
            flat = self.normed.reshape(-1, c.hidden_size)
            assert self.moe_logits is not None
            assert self.moe_workspace is not None
            ops.linear(flat, layer.w_router, out=self.moe_logits)
            ops.moe_mlp(flat, self.moe_logits, layer.experts_gate_up, layer.experts_down, c.num_experts_per_tok,
                        renormalize=c.norm_topk_prob, activation="silu", out=self.proj.reshape(flat.shape),
                        workspace=self.moe_workspace)  # fmt: skip
            return
        super()._mlp(layer)

    def _project(self, layer: LayerWeights) -> tuple[GPUArray, GPUArray, GPUArray]:
        """q, k, v (b, 1, heads, head_dim) of ``self.normed``: one GEMV into ``self.qkv`` (views
        returned) when fused, else three into ``self.q``, ``self.k``, ``self.v``."""
        if self.qkv is not None and layer.w_qkv is not None:
            assert self.q_view is not None
            assert self.k_view is not None
            assert self.v_view is not None
            self._linear(self.normed, layer.w_qkv, layer.b_qkv, self.qkv)
            return self.q_view, self.k_view, self.v_view
        return super()._project(layer)

    def _attention_input(self, index: int, layer: LayerWeights) -> tuple[GPUArray, GPUArray, GPUArray]:
        if not self.gemv:
            return super()._attention_input(index, layer)
        # fuse="all": the attention's RMSNorm inside the QKV GEMV
        assert self.q_view is not None
        assert self.k_view is not None
        assert self.v_view is not None
        w_qkv = cast(GPUArray, layer.w_qkv)  # dense: checked by _gemv_eligible
        ops.fused_gemv(self.residual, w_qkv, prologue="rmsnorm", norm_weight=layer.attn_norm,
                       eps=self.model.config.norm_eps, bias=layer.b_qkv, out=self.qkv)  # fmt: skip
        return self.q_view, self.k_view, self.v_view

    def _attend(self, index: int, q: GPUArray, k: GPUArray, v: GPUArray) -> None:
        """RoPE and the KV-cache append at ``state.lengths`` (fused: one launch), decode attention."""
        st, rope = self.state, self.model.rope
        lengths = st.lengths
        if rope is not None and self.fuse:  # rotate q into self.q, k and v into the cache: one launch
            q = ops.rope_kv_append(q, k, v, st.cache.k(index), st.cache.v(index), rope.cos, rope.sin, lengths,
                                   style=rope.style, rotary_dim=rope.rotary_dim, position_offset=-1,
                                   q_out=self.q)  # fmt: skip
        else:
            if rope is not None:
                rope(q, k, lengths, position_offset=-1)
            st.cache.append(index, k, v, lengths, offset=-1)
        ops.decode_attention(q[:, 0], st.cache.k(index), st.cache.v(index), lengths, out=self.attn,
                             workspace=st.workspace)  # fmt: skip

    def _block_output(self, layer: LayerWeights) -> None:
        if not self.gemv:
            super()._block_output(layer)
            return
        # fuse="all": the residual adds inside the o and down GEMVs, the MLP's RMSNorm inside the gate-up
        # GEMV and SwiGLU inside the down GEMV (dense weights: checked by _gemv_eligible)
        assert self.hidden is not None
        wo, w_gate_up, w_down = (
            cast(GPUArray, layer.wo),
            cast(GPUArray, layer.w_gate_up),
            cast(GPUArray, layer.w_down),
        )
        ops.fused_gemv(self.attn, wo, bias=layer.bo, residual=self.residual, out=self.residual)
        ops.fused_gemv(self.residual, w_gate_up, prologue="rmsnorm", norm_weight=layer.mlp_norm,
                       eps=self.model.config.norm_eps, bias=layer.b_gate_up, out=self.hidden)  # fmt: skip
        ops.fused_gemv(self.hidden, w_down, prologue="swiglu", bias=layer.b_down, residual=self.residual,
                       out=self.residual)  # fmt: skip

    def _final_norm(self, out: GPUArray) -> None:
        if not self.gemv:
            super()._final_norm(out)
            return
        w = self.model.weights  # fuse="all": the residual is up to date (the last down GEMV added its output)
        ops.rmsnorm(self.residual, w.final_norm, self.model.config.norm_eps, out=out)

    def _step(self) -> None:
        """One decode step, device work only: reads ``tokens`` and ``lengths``, writes the KV cache,
        advances ``lengths`` and samples into ``tokens``. This is what DecodeM1Graph captures."""
        w, b = self.model.weights, self.batch
        lengths = self.state.lengths
        ops.add(lengths, 1, out=lengths)  # now counts the token being decoded
        ops.embedding(w.embed, self.tokens.reshape(b, 1), out=self.residual)
        if w.position_embed is not None:
            assert self.positions is not None
            assert self.position_rows is not None
            ops.sub(lengths, 1, out=self.positions)
            ops.embedding(w.position_embed, self.positions.reshape(b, 1), out=self.position_rows)
            ops.add(self.residual, self.position_rows, out=self.residual)
        self._layers()
        self._sample(self.logits)

    def _sample(self, logits: GPUArray) -> None:
        if self.sampler is None:
            ops.greedy(logits, out=self.tokens)
        else:
            self.sampler.sample(logits, self.tokens, **self._settings)

    # -- driving ------------------------------------------------------------------------------------
    def start(self, ids: Any, lengths: list[int] | None = None) -> np.ndarray[Any, Any]:
        """Run the prompt ``ids`` (int32 (batch, seq), rows right-padded; ``lengths`` the real ones,
        default seq) and sample the first token of each row; returns them (batch,) on the host."""
        host = np.asarray(ids.to_numpy() if isinstance(ids, GPUArray) else ids, dtype=np.int32)
        if host.ndim != 2 or host.shape[0] != self.batch:
            raise ShapeError(f"{type(self).__name__}.start: ids must be ({self.batch}, seq), got shape {host.shape}")
        rows = [host.shape[1]] * self.batch if lengths is None else [int(n) for n in lengths]
        if self.sampler is not None:
            self.sampler.reset(self.seed, 0)
        if self._history is not None and self._history_host is not None:
            self._history_host.fill(-1)
            for row, n in enumerate(rows):
                self._history_host[row, :n] = host[row, :n]
            self._history.copy_(self._history_host)
        with _PREFILL:
            logits = self.model.prefill(from_numpy(host), self.state, rows)
            self._lengths_host = list(rows)
            self._sample(logits)
            return self._read()

    def _read(self) -> np.ndarray[Any, Any]:
        """The sampled tokens on the host (the step's one synchronization); records them in the
        repetition-penalty history."""
        out = self.tokens.to_numpy()
        if self._history is not None and self._history_host is not None:
            for row, n in enumerate(self._lengths_host):
                if n < self._history_host.shape[1]:
                    self._history_host[row, n] = out[row]
            self._history.copy_(self._history_host)
        return out

    def _advance(self) -> None:
        if max(self._lengths_host) >= self.state.max_seq_len:
            raise ArgumentError(f"{type(self).__name__}.step: the KV cache holds {self.state.max_seq_len} positions "
                                "and is full")  # fmt: skip
        self._lengths_host = [n + 1 for n in self._lengths_host]
        self.state.host_lengths = self._lengths_host

    def step(self) -> np.ndarray[Any, Any]:
        """Decode one token per row after the last sampled ones; returns the new ones (batch,)."""
        with _STEP:
            self._advance()
            self._step()
            return self._read()


class DecodeM1Graph(DecodeM1):
    """:class:`DecodeM1` with the whole step captured once in a CUDA graph and replayed at every
    position (the seeds' ``DecodeM1Graph``). Capture happens at construction: one eager warm-up step
    (which fills the ops' plan caches) and the capture, both on scratch positions that ``start``
    overwrites. Tokens are bitwise equal to ``DecodeM1``'s."""

    def __init__(self, model: CausalTransformerModel, batch: int, max_seq_len: int,
                 sampling: SamplingParams | None = None, seed: int = 0,
                 fuse: bool | str | None = None) -> None:  # fmt: skip
        reason = graph_unsupported_reason(model, sampling)
        if reason is not None:
            raise UnsupportedStrategyError(f"DecodeM1Graph does not support {reason}; use DecodeM1 (strategy='m1')")
        super().__init__(model, batch, max_seq_len, sampling, seed, fuse)
        self.graph = capture_step(self._step, "DecodeM1Graph: the decode step was not captured", self._scratch)

    def _scratch(self) -> None:
        """The warm-up's inputs: position 0 and token 0 in every row (``start`` overwrites both)."""
        self.state.lengths.copy_(np.zeros(self.batch, np.int32))
        self.tokens.copy_(np.zeros(self.batch, np.int32))

    @property
    def num_nodes(self) -> int:
        """Nodes of the captured step (CPU backend: recorded calls)."""
        return self.graph.num_nodes

    def step(self) -> np.ndarray[Any, Any]:
        with _STEP:
            self._advance()
            self.graph.replay()
            return self._read()


def _out_features(w: Any) -> int:
    shape = getattr(w, "shape", None)
    if shape is None or len(shape) != 2:
        raise ShapeError(f"decode: a linear weight must be 2-D (out_features, in_features), got {shape}")
    return int(shape[0])


def choose_strategy(model: CausalTransformerModel, batch: int, sampling: SamplingParams | None,
                    strategy: str | None) -> str:  # fmt: skip
    """The decode strategy generate() runs: ``strategy`` when given (checked), else "graph" on the
    CUDA backend for batch 1 when :class:`DecodeM1Graph` supports the model and sampling, else "m1"."""
    if strategy is None:
        if model.backend == "cuda" and batch == 1 and graph_unsupported_reason(model, sampling) is None:
            return "graph"
        return "m1"
    if strategy not in STRATEGIES:
        raise ArgumentError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))} or None, got {strategy!r}")
    if strategy == "graph":
        reason = graph_unsupported_reason(model, sampling)
        if reason is not None:
            raise UnsupportedStrategyError(f"strategy='graph' does not support {reason}; use strategy='m1'")
    return strategy
