"""Decoding several tokens per forward of the model: :class:`DecodeSpeculative` and :class:`DecodeJacobi`.

Both keep one sequence's committed tokens in a KV cache and run the model over a window of m tokens
at positions L .. L + m - 1 in ONE forward (keys and values appended to the cache there, causal
attention of the m queries over the cache with ``ops.prefill_attention``, logits of all m positions,
a greedy pick per position). That forward reads L from the device (``state.lengths``) and writes
into buffers allocated once, so with dense weights it allocates nothing and on the CUDA backend is
captured once as a CUDA graph and replayed (``graph``); only windows cut short by the cache's last
positions run the model's allocating forward. The window's first token is the last committed one, so its prediction
is always right; each further prediction is right as long as the window's tokens before it equal the
predictions for them. The longest such prefix is accepted and the cache is rolled back to it by
setting the sequence's length (the rejected positions are overwritten later). The output is
therefore the greedy decode's, token for token (up to the kernels' rounding: on the GPU the m-row
GEMMs and prefill attention round differently from the 1-row decode step, which can flip an
argmax between two logits that are nearly tied).

- :class:`DecodeSpeculative` fills the window with n tokens drafted one by one by a draft model (a
  smaller model with the same vocabulary, or the model's own first ``draft_layers`` blocks plus its
  final norm and lm head: self-speculation); the draft runs :class:`~pygpukit.llm.decode.DecodeM1`'s
  preallocated step (one CUDA graph replay per drafted token where the model allows it), its tokens
  stay on the device, and its cache is rolled back with the target's.
- :class:`DecodeJacobi` fills it with the previous iteration's predictions (Jacobi fixed-point
  iteration: the window converges from the left); no draft model.

Greedy only (the acceptance rule compares greedy picks), batch 1; both raise
:class:`~pygpukit.llm.decode.UnsupportedStrategyError` for anything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import pygpukit.ops as ops
from pygpukit.core.array import GPUArray, empty, from_numpy
from pygpukit.core.dtypes import int32
from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.core.graph import CudaGraph

from .decode import DecodeM1, DecodeM1Graph, UnsupportedStrategyError, graph_unsupported_reason
from .decode_layers import LayerStep, capture_step

if TYPE_CHECKING:
    from .generation import SamplingParams
    from .model import CausalTransformerModel, LayerWeights

__all__ = ["DecodeJacobi", "DecodeSpeculative", "early_exit_model", "multi_token_unsupported_reason"]

_MAX_WINDOW = 64

# The CPU backend's CudaGraph records calls into pygpukit made from outside pygpukit; this module
# opts in, so the ops the window forward calls inside a capture are recorded (as in decode.py).
__pygpukit_record_calls__ = True


def multi_token_unsupported_reason(batch: int, sampling: SamplingParams | None) -> str | None:
    """Why speculative / Jacobi decoding cannot run this batch and sampling (None when it can)."""
    if batch != 1:
        return f"batch {batch} (one sequence at a time)"
    if sampling is not None and not sampling.greedy:
        what = "repetition_penalty" if sampling.repetition_penalty else f"sampling (temperature {sampling.temperature})"
        return f"{what}: only greedy decoding (temperature=0) is verified"
    return None


def _int_in(owner: str, name: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not low <= value <= high:
        raise ArgumentError(f"{owner}: {name} must be an int in [{low}, {high}], got {value!r}")
    return int(value)


def early_exit_model(model: CausalTransformerModel, num_layers: int) -> CausalTransformerModel:
    """The model's first ``num_layers`` blocks with its embedding, final norm and lm head, sharing the
    weights (no copy): the draft of self-speculative decoding."""
    from .model import CausalTransformerModel, ModelWeights

    count = _int_in("early_exit_model", "num_layers", num_layers, 1, model.config.num_layers)
    w = model.weights
    weights = ModelWeights(w.embed, w.layers[:count], w.final_norm, w.lm_head, w.final_norm_bias, w.position_embed)
    draft = CausalTransformerModel(model.config.with_(num_layers=count), weights, model.dtype, model.tokenizer,
                                   model.chat_template)  # fmt: skip
    draft.rope = model.rope  # the same tables
    return draft


class _WindowForward(LayerStep):
    """The model over a window of m tokens at positions ``lengths .. lengths + m - 1`` read on the
    device, every intermediate in a buffer allocated once: writes the window's keys and values into
    the cache and greedy picks of all m positions into ``predictions``, without touching ``lengths``.
    With dense weights it allocates nothing and, with ``graph``, is captured once and replayed. The
    layers are :class:`~pygpukit.llm.decode_layers.LayerStep`'s (three q/k/v projections)."""

    quantized_gemv_rows = 0  # every quantized product runs ops.linear (which allocates), never quantized_gemv

    def __init__(self, model: CausalTransformerModel, state: Any, m: int, graph: bool) -> None:
        c, dt, w = model.config, model.dtype, model.weights
        self.model, self.state, self.m = model, state, m
        self.ids = empty((1, m), int32)  # the window's tokens (written by the caller)
        self.offsets = from_numpy(np.arange(m, dtype=np.int32).reshape(1, m))
        self.positions = empty((1, m), int32)
        self.residual = empty((1, m, c.hidden_size), dt)
        self.normed = empty((1, m, c.hidden_size), dt)
        self.position_rows = empty((1, m, c.hidden_size), dt) if w.position_embed is not None else None
        self.q = empty((1, m, c.num_heads, c.head_dim), dt)
        self.k = empty((1, m, c.num_kv_heads, c.head_dim), dt)
        self.v = empty((1, m, c.num_kv_heads, c.head_dim), dt)
        self.qn = empty(self.q.shape, dt) if w.layers[0].q_norm is not None else None
        self.kn = empty(self.k.shape, dt) if w.layers[0].q_norm is not None else None
        self.attn = empty((1, m, c.num_heads, c.head_dim), dt)
        self.proj = empty((1, m, c.hidden_size), dt)
        self.hidden = self.activated = None
        if w.layers[0].w_gate_up is not None:
            width = int(w.layers[0].w_gate_up.shape[0])
            self.hidden = empty((1, m, width), dt)
            self.activated = empty((1, m, width if model.spec.activation == "gelu_tanh" else width // 2), dt)
        self.final = empty((m, c.hidden_size), dt)
        self.logits = empty((m, c.vocab_size), dt)
        self.predictions = empty(m, int32)
        self.graph: CudaGraph | None = None
        if graph:
            saved = state.lengths.to_numpy()
            failure = "DecodeSpeculative/DecodeJacobi: the window forward was not captured"
            self.graph = capture_step(self._run, failure, self._scratch)
            state.lengths.copy_(saved)

    def _scratch(self) -> None:
        """The warm-up's inputs: position 0 and token 0 (overwritten later)."""
        self.state.lengths.copy_(np.zeros(1, np.int32))
        self.ids.copy_(np.zeros((1, self.m), np.int32))

    def _mlp(self, layer: LayerWeights) -> None:
        if layer.w_router is not None or self.hidden is None or self.activated is None:  # MoE: allocates
            self.proj.copy_(self.model._mlp(layer, self.normed))
            return
        super()._mlp(layer)

    def _attend(self, index: int, q: GPUArray, k: GPUArray, v: GPUArray) -> None:
        """RoPE at ``positions``, the keys and values written into the cache from ``lengths`` on, causal
        attention of the window's rows over the cache."""
        model, st = self.model, self.state
        lengths = st.lengths
        if model.rope is not None:
            model.rope(q, k, self.positions)
        st.cache.append(index, k, v, lengths)
        ops.prefill_attention(q, st.cache.k(index), st.cache.v(index), lengths, out=self.attn)

    def _run(self) -> None:
        w = self.model.weights
        lengths = self.state.lengths  # the committed tokens: the window starts there
        ops.add(self.offsets, lengths.reshape(1, 1), out=self.positions)
        ops.embedding(w.embed, self.ids, out=self.residual)
        if w.position_embed is not None and self.position_rows is not None:
            ops.embedding(w.position_embed, self.positions, out=self.position_rows)
            ops.add(self.residual, self.position_rows, out=self.residual)
        self._layers()
        ops.greedy(self.logits, out=self.predictions)

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._run()


class _WindowDecoder:
    """One sequence, a KV cache with room for a window past ``max_seq_len``, and the window forward."""

    name = "window decoder"

    def __init__(self, model: CausalTransformerModel, max_seq_len: int, window: int, span: int,
                 graph: bool | None) -> None:  # fmt: skip
        self.model = model
        self.max_seq_len = _int_in(self.name, "max_seq_len", max_seq_len, 1, 2**31 - 1)
        self.window = window
        if graph not in (None, True, False):
            raise ArgumentError(f"{self.name}: graph must be None, True or False, got {graph!r}")
        reason = graph_unsupported_reason(model, None)
        if graph and reason is not None:
            raise UnsupportedStrategyError(f"{self.name}(graph=True) does not support {reason}; pass graph=False")
        self.graph = bool(model.backend == "cuda" and reason is None if graph is None else graph)
        limit = model.config.max_position_embeddings
        self.capacity = min(self.max_seq_len + window + 1, limit)
        self.state = model.new_state(1, self.capacity)
        # The window forward of ``span`` tokens, preallocated (and captured with graph); windows that
        # the cache's last positions cut shorter run the model's allocating forward (_forward).
        self.full = _WindowForward(model, self.state, span, self.graph)
        self.length = 0  # committed tokens in the cache (the last sampled token is not among them)
        self.last = 0  # the last committed token's id: the next window's first token
        # The last forward's greedy picks on the device and where self.last lies in them: the next
        # window is filled from there by device copies (a steady-state step uploads nothing).
        self.picks: GPUArray = self.full.predictions
        self.last_index = 0
        self.forwards = 0  # model forwards (the prefill excluded)
        self.tokens = 0  # tokens produced by those forwards

    def _prefill(self, ids: Any) -> np.ndarray[Any, Any]:
        host = np.asarray(ids.to_numpy() if isinstance(ids, GPUArray) else ids, dtype=np.int32)
        if host.ndim == 1:
            host = host[None]
        if host.ndim != 2 or host.shape[0] != 1 or host.shape[1] == 0:
            raise ShapeError(f"{self.name}.start: ids must be (1, seq) or (seq,) with seq >= 1, got shape {host.shape}")
        if host.shape[1] > self.max_seq_len:
            raise ArgumentError(f"{self.name}.start: a {host.shape[1]}-token prompt exceeds max_seq_len "
                                f"{self.max_seq_len}")  # fmt: skip
        logits = self.model.prefill(from_numpy(host), self.state)
        self.length = host.shape[1]
        self.picks, self.last_index = ops.greedy(logits), 0
        self.last = int(self.picks.to_numpy()[0])
        self.forwards = self.tokens = 0
        return host

    def _room(self, wanted: int) -> int:
        """The window size that fits the cache now (at least 1; 0 when the cache is full)."""
        if self.length >= self.capacity:
            raise ArgumentError(f"{self.name}.step: the KV cache holds {self.capacity} positions and is full")
        return min(wanted, self.capacity - self.length)

    def _forward_full(self) -> np.ndarray[Any, Any]:
        """:meth:`_forward` of the full window ``self.full.ids``: preallocated, one replay with graph."""
        self.full.run()
        self.forwards += 1
        self.picks = self.full.predictions
        return self.picks.to_numpy()

    def _forward(self, ids: GPUArray) -> np.ndarray[Any, Any]:
        """Greedy predictions (m,) on the host after each of the tokens ``ids`` int32 (1, m) at positions
        length .. length + m - 1, whose keys and values the forward writes into the cache."""
        model, state, start = self.model, self.state, self.length
        c = model.config
        m = ids.shape[1]
        positions = from_numpy(np.arange(start, start + m, dtype=np.int32).reshape(1, m))
        starts = from_numpy(np.array([start], np.int32))
        h = model._embed(ids, positions)

        def attend(index: int, layer: LayerWeights, normed: GPUArray) -> GPUArray:
            q, k, v = model._qkv(layer, normed, 1, m)
            if model.rope is not None:
                model.rope(q, k, positions)
            state.cache.write_prefill(index, k, v, start)
            out = ops.prefill_attention(q, state.cache.k(index), state.cache.v(index), starts)
            return ops.linear(out.reshape(1, m, c.q_size), layer.wo, layer.bo)

        h = model._blocks(h, attend)
        logits = model._logits(h.reshape(m, c.hidden_size))
        self.forwards += 1
        self.picks = ops.greedy(logits)
        return self.picks.to_numpy()

    def _commit(self, window: np.ndarray[Any, Any], predictions: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Accept the predictions up to the first window token that differs from its prediction: the
        window's tokens ``window[1:]`` were guesses for ``predictions[:-1]``. Rolls the cache's length
        to the accepted inputs; returns the new tokens (1 .. m)."""
        m = len(predictions)
        accepted = 0
        while accepted < m - 1 and window[accepted + 1] == predictions[accepted]:
            accepted += 1
        new = predictions[: accepted + 1].astype(np.int32)
        self.length += accepted + 1  # the inputs window[0 .. accepted] are right
        ops.add(self.state.lengths, accepted + 1, out=self.state.lengths)  # on the device: nothing uploaded
        self.state.host_lengths = [self.length]
        self.last, self.last_index = int(new[-1]), accepted
        self.tokens += len(new)
        return new

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.forwards if self.forwards else 0.0


class DecodeSpeculative(_WindowDecoder):
    """Speculative decoding, greedy, batch 1 (the seeds' ``DecodeSpeculative``).

    Each :meth:`step` drafts ``num_draft_tokens`` (n) tokens with the draft, verifies them with one
    forward of the model over n + 1 positions, and returns the accepted drafts plus the model's own
    next token (1 .. n + 1 tokens, equal to greedy decoding). The draft is ``draft`` (a model with the
    same vocabulary size, on the same backend) or, when None, the model's first ``draft_layers``
    blocks (default: a quarter of them, at least one) with its final norm and lm head. ``graph``:
    the draft's step and the verifying forward as CUDA graph replays (None: where the backend and
    the models allow it; the CPU backend records and replays the op calls)."""

    name = "DecodeSpeculative"

    def __init__(self, model: CausalTransformerModel, max_seq_len: int, draft: CausalTransformerModel | None = None,
                 draft_layers: int | None = None, num_draft_tokens: int = 4,
                 graph: bool | None = None) -> None:  # fmt: skip
        n = _int_in(self.name, "num_draft_tokens", num_draft_tokens, 1, _MAX_WINDOW)
        super().__init__(model, max_seq_len, n, n + 1, graph)
        layers = model.config.num_layers
        if draft is not None:
            if draft_layers is not None:
                raise ArgumentError(f"{self.name}: pass a draft model or draft_layers, not both")
            if not hasattr(draft, "config") or not hasattr(draft, "prefill"):
                raise ArgumentError(f"{self.name}: draft must be a CausalTransformerModel, got {type(draft).__name__}")
            if draft.config.vocab_size != model.config.vocab_size:
                raise ShapeError(f"{self.name}: the draft's vocabulary has {draft.config.vocab_size} tokens, the "
                                 f"model's {model.config.vocab_size}")  # fmt: skip
            if draft.backend != model.backend:
                raise ArgumentError(f"{self.name}: the draft runs on {draft.backend}, the model on {model.backend}")
            self.draft = draft
            self.draft_layers = None
        else:
            if layers < 2:
                raise UnsupportedStrategyError(f"{self.name}: self-speculation needs a model of 2 layers or more, "
                                               f"this one has {layers}; pass a draft model")  # fmt: skip
            k = max(1, layers // 4) if draft_layers is None else draft_layers
            self.draft_layers = _int_in(self.name, "draft_layers", k, 1, layers - 1)
            self.draft = early_exit_model(model, self.draft_layers)
        self.num_draft_tokens = n
        reason = graph_unsupported_reason(self.draft, None)
        if graph and reason is not None:
            raise UnsupportedStrategyError(f"{self.name}(graph=True): the draft has {reason}")
        use_graph = self.draft.backend == "cuda" and reason is None if graph is None else bool(graph)
        kind = DecodeM1Graph if use_graph else DecodeM1
        self.drafter: DecodeM1 = kind(self.draft, 1, self.capacity)
        self.draft_length = 0  # positions of the draft's cache holding committed tokens
        self.pending: list[int] = []  # indices in self.ids of committed tokens the draft has not seen yet
        self.ids = self.full.ids.reshape(n + 1)  # the window: the last committed token and the drafts
        self.drafted = 0
        self.accepted = 0

    def start(self, ids: Any) -> np.ndarray[Any, Any]:
        """Run the prompt (model and draft) and pick the first token; returns it, shape (1,)."""
        host = self._prefill(ids)
        self.drafter.start(host)  # the draft's cache holds the prompt; its own pick is not used
        self.draft_length = host.shape[1]
        self.pending = []
        self.drafted = self.accepted = 0
        return np.array([self.last], np.int32)

    def _set_draft_length(self, length: int) -> None:
        st = self.drafter.state
        if length != self.draft_length:
            ops.add(st.lengths, length - self.draft_length, out=st.lengths)
        st.host_lengths = [length]
        self.drafter._lengths_host = [length]
        self.draft_length = length

    def _draft_step(self) -> None:
        """One draft token: reads drafter.tokens at the draft's length, writes the pick there."""
        self.drafter._advance()
        if isinstance(self.drafter, DecodeM1Graph):
            self.drafter.graph.replay()
        else:
            self.drafter._step()
        self.draft_length += 1

    def step(self) -> np.ndarray[Any, Any]:
        """Draft, verify in one forward, accept; returns the new tokens (1 .. num_draft_tokens + 1)."""
        n = self._room(self.num_draft_tokens + 1) - 1
        tokens = self.drafter.tokens
        for index in self.pending:  # catch the draft's cache up with the committed tokens (in self.ids)
            tokens.copy_(self.ids[index : index + 1])
            self._draft_step()
        self.pending = []
        tokens.copy_(self.picks[self.last_index : self.last_index + 1])  # device to device
        self.ids[0:1].copy_(tokens)
        base = self.draft_length
        for i in range(n):  # the drafts stay on the device: each step's pick is the next one's input
            self._draft_step()
            self.ids[i + 1 : i + 2].copy_(tokens)
        window = self.ids[: n + 1]
        predictions = self._forward_full() if n == self.num_draft_tokens else self._forward(window.reshape(1, n + 1))
        drafts = window.to_numpy()
        new = self._commit(drafts, predictions)
        accepted = len(new) - 1
        self.drafted += n
        self.accepted += accepted
        # The draft's cache holds base + [the window's first n tokens]; the first accepted + 1 are right.
        right = min(accepted + 1, n)
        self._set_draft_length(base + right)
        self.pending = list(range(right, accepted + 1))  # all n accepted: the last draft (its index in ids)
        return new

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over drafted tokens since :meth:`start`."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def stats(self) -> dict[str, float]:
        return {"acceptance_rate": self.acceptance_rate, "tokens_per_forward": self.tokens_per_forward,
                "drafted": float(self.drafted), "accepted": float(self.accepted)}  # fmt: skip


class DecodeJacobi(_WindowDecoder):
    """Jacobi decoding, greedy, batch 1 (the seeds' ``DecodeJacobi``).

    A window of ``window`` (n) tokens, the last committed one and n - 1 guesses, runs through the
    model in one forward per iteration; every guess is replaced by the prediction for its position
    (a Jacobi fixed-point update) and the converged prefix is committed. :meth:`step` runs one
    iteration and returns its new tokens (1 .. n), equal to greedy decoding; ``iterations_per_token``
    says how many forwards each token cost (1.0 means no gain). ``graph``: the window forward as one
    CUDA graph replay (None: on the CUDA backend where the model allows it)."""

    name = "DecodeJacobi"

    def __init__(self, model: CausalTransformerModel, max_seq_len: int, window: int = 4,
                 graph: bool | None = None) -> None:  # fmt: skip
        n = _int_in(self.name, "window", window, 1, _MAX_WINDOW)
        super().__init__(model, max_seq_len, n, n, graph)
        self.guesses: list[int] = []

    def start(self, ids: Any) -> np.ndarray[Any, Any]:
        """Run the prompt and pick the first token; returns it, shape (1,)."""
        self._prefill(ids)
        self.guesses = []  # the first window guesses repeats of the first token
        return np.array([self.last], np.int32)

    def step(self) -> np.ndarray[Any, Any]:
        """One iteration; returns the tokens it committed (1 .. window)."""
        m = self._room(self.window)
        # The window: the last committed token, then the previous iteration's picks after it (the
        # Jacobi update), padded with the last of them; self.picks holds them all on the device.
        tail = [self.last, *self.guesses]
        window = np.array((tail + tail[-1:] * m)[:m], np.int32)
        if m == self.window:
            ids, first, count = self.full.ids.reshape(m), self.last_index, min(len(tail), m)
            ids[:count].copy_(self.picks[first : first + count])
            end = first + len(tail) - 1
            for i in range(count, m):
                ids[i : i + 1].copy_(self.picks[end : end + 1])
            predictions = self._forward_full()
        else:
            predictions = self._forward(from_numpy(window.reshape(1, m)))
        new = self._commit(window, predictions)
        self.guesses = [int(t) for t in predictions[len(new) :]]
        return new

    @property
    def iterations_per_token(self) -> float:
        return self.forwards / self.tokens if self.tokens else 0.0

    def stats(self) -> dict[str, float]:
        return {"iterations_per_token": self.iterations_per_token, "tokens_per_forward": self.tokens_per_forward}
