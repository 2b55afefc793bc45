"""Greedy decoding of Whisper with the decoder step captured in a CUDA graph (issue 17, item 3).

:class:`GraphDecoder` holds, for one model and one batch size, every buffer a decode step touches: the
self-attention KV cache (``n_text_ctx`` positions), the cross-attention keys/values of each layer, the
activations, the logits and the state of the token rules (:mod:`pygpukit.asr.token_step`). The step reads
the previous tokens and the positions (``lengths``) from device memory and writes the next tokens there,
so it is captured once in a :class:`pygpukit.CudaGraph` and replayed at every position of every window:

- ``start`` (eager, once per window): the cross-attention keys/values of the encoder output copied into
  the decoder's buffers, the prompt run through :meth:`WhisperModel.decode` into its KV cache, the
  no-speech probability, and the first token chosen by the rules on the device;
- ``step`` (the graph): embedding + position of each row's last token, the decoder layers (self-attention
  through ``KVCache.append`` and ``decode_attention`` at the device positions, cross-attention through
  ``decode_attention`` too: the split-K kernel over the encoder's keys and values read in place as (batch,
  heads, frames, dim) views with every row's length the frame count, which on an H100 took a fifth of the
  time ``sdpa``'s prefill kernel took for one query over 1500 keys, the MLP), the logits, then
  :func:`~pygpukit.asr.token_step.greedy_rules_step` (filters, argmax, log-probability sum) on the device.
  The host reads back the chosen token of each row (batch int32 values) and, at the end of the window, the
  log-probability sums.

The step computes what :meth:`WhisperModel.decode` computes for one token, through the ops' ``out=``
forms (``linear`` with the same fused bias and GELU epilogues as ``decode``), so nothing is allocated
inside the capture. :class:`BeamGraphDecoder` captures beam search's step the same way (with the KV cache
rows reordered by the beams' parents first and the candidate kernel last), and :class:`SampleGraphDecoder`
the sampled step of the temperature fallback (best_of rows of one window, the temperature and the seed read
from device memory by :func:`~pygpukit.asr.token_step.sample_rules_step`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

import pygpukit.ops as ops
from pygpukit.core.array import GPUArray, from_numpy, zeros
from pygpukit.core.dtypes import float64, int32, uint8, uint64
from pygpukit.core.errors import ArgumentError, PyGPUkitError, ShapeError
from pygpukit.core.graph import CudaGraph
from pygpukit.core.stream import Stream, current_stream

from .model import DecoderState
from .token_step import (
    STATE_FIELDS,
    beam_rules_topk,
    greedy_rules_step,
    rules_arrays,
    sample_rules_step,
    sampling_array,
)
from .weights import HEAD_DIM

__all__ = [
    "BeamGraphDecoder",
    "GraphDecoder",
    "SampleGraphDecoder",
    "beam_graph_decoder",
    "graph_decoder",
    "greedy_graph_decode",
    "per_row_prompts",
    "sample_graph_decoder",
    "sampled_graph_decode",
    "use_graph",
]

# The CPU backend's CudaGraph records calls into pygpukit made from outside pygpukit; this module opts in
# (as pygpukit.llm.decode does), so the ops it calls inside a capture are recorded (pygpukit.core._recording).
__pygpukit_record_calls__ = True

_EPS = 1e-5
_MAX_DECODERS = 4  # graph decoders kept per model (one per batch size in use)

Array = np.ndarray[Any, Any]


def use_graph(model: Any) -> bool:
    """Whether greedy decoding of ``model`` runs through :class:`GraphDecoder`: ``model.graph_decode``
    when it is True or False, else (None, the default) on the CUDA backend."""
    flag = getattr(model, "graph_decode", False)
    if flag is None:
        from pygpukit.core import backend

        return backend.backend_state().name == "cuda"
    return bool(flag)


class GraphDecoder:
    """Buffers and the captured greedy decode step of ``model`` for ``batch`` rows."""

    def __init__(self, model: Any, batch: int) -> None:
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ArgumentError(f"GraphDecoder: batch must be an int >= 1, got {batch!r}")
        self.model = model
        self.batch = batch
        c = model.config
        self.max_len = c.n_text_ctx
        self._allocate()
        self._rules: Any = None
        self.graph = CudaGraph()
        self._capture()

    # -- buffers ------------------------------------------------------------------------------------
    def _allocate(self) -> None:
        model, b = self.model, self.batch
        c, dt, w = model.config, model.dtype, model.w
        d, heads = c.d_model, c.decoder_heads
        self.cache = ops.KVCache(c.decoder_layers, b, heads, self.max_len, HEAD_DIM, dt)
        self.cache.reset(clear=True)
        self.cross_kv = [zeros((b, c.n_audio_ctx, 2 * d), dt) for _ in range(c.decoder_layers)]
        views = [kv.reshape(b, c.n_audio_ctx, 2, heads, HEAD_DIM) for kv in self.cross_kv]
        self.cross = [(v[:, :, 0], v[:, :, 1]) for v in views]
        # The window's decoder state (start() runs the prompt through it); its scratch gives the step the
        # decode workspaces and cross lengths WhisperModel.decode uses for one token, so both match.
        self.window = DecoderState(self.cache, self.cross, 0)
        # The same keys and values as decode_attention's (batch, heads, frames, dim) caches: views, no copy.
        self.cross_cache = [(k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)) for k, v in self.cross]
        self.cross_lens = self.window.cross_lengths(c.n_audio_ctx)
        self.cross_workspace = self.window.workspace(heads, HEAD_DIM, c.n_audio_ctx)
        self.tokens = zeros(b, int32)
        self.lengths = zeros(b, int32)
        self.positions = zeros(b, int32)
        self.state = zeros((b, len(STATE_FIELDS)), int32)
        self.sum_lp = zeros(b, float64)
        self.suppress = zeros(c.n_vocab, uint8)
        self.blank = zeros(c.n_vocab, uint8)
        self.params = zeros(5, int32)
        self.x = zeros((b, 1, d), dt)
        self.h = zeros((b, 1, d), dt)
        self.pos_rows = zeros((b, 1, d), dt)
        self.qkv = zeros((b, 1, 3 * d), dt)
        qkv = self.qkv.reshape(b, 1, 3, heads, HEAD_DIM)
        self.q_view, self.k_view, self.v_view = qkv[:, 0, 0], qkv[:, :, 1], qkv[:, :, 2]
        self.q = zeros((b, heads, HEAD_DIM), dt)
        self.attn = zeros((b, heads, HEAD_DIM), dt)
        self.proj = zeros((b, 1, d), dt)
        self.cq = zeros((b, heads, HEAD_DIM), dt)
        self.cattn = zeros((b, heads, HEAD_DIM), dt)
        self.ffn = zeros((b, 1, w["dec.0.fc1.w"].shape[0]), dt)
        self.logits = zeros((b, c.n_vocab), dt)
        self.k_cache = [self.cache.k(i) for i in range(c.decoder_layers)]
        self.v_cache = [self.cache.v(i) for i in range(c.decoder_layers)]
        self.workspace = self.window.workspace(heads, HEAD_DIM, self.max_len)
        self.embed_t = w["dec.embed"].T

    # -- the captured step --------------------------------------------------------------------------
    def _linear(self, x: GPUArray, name: str, out: GPUArray, activation: str | None = None) -> None:
        """``out = activation(x @ w.T + b)`` into ``out`` (allocation-free; the bias and the activation in the
        GEMM's epilogue, as WhisperModel._linear)."""
        w = self.model.w
        ops.linear(x.reshape(self.batch, -1), w[name + ".w"], w.get(name + ".b"), activation,
                   out=out.reshape(self.batch, -1))  # fmt: skip

    def _ln(self, name: str) -> None:
        w = self.model.w
        ops.layernorm(self.x, w[name + ".g"], w[name + ".b"], _EPS, out=self.h)

    def _step(self) -> None:
        """One decode step, device work only: what DecodeM1-style graphs capture."""
        self._decode_step()
        self._choose(self.logits)

    def _choose(self, logits: GPUArray) -> None:
        """Each row's next token from ``logits`` by the token rules (greedy here), into ``tokens``."""
        greedy_rules_step(logits, self.tokens, self.state, self.sum_lp, self.suppress, self.blank, self.params)

    def _decode_step(self) -> None:
        """The decoder on each row's last token at its position, to the logits."""
        c, w, b = self.model.config, self.model.w, self.batch
        lengths = self.lengths
        ops.add(lengths, 1, out=lengths)  # now counts the token being decoded
        ops.sub(lengths, 1, out=self.positions)
        ops.embedding(w["dec.embed"], self.tokens.reshape(b, 1), out=self.x)
        ops.embedding(w["dec.pos"], self.positions.reshape(b, 1), out=self.pos_rows)
        ops.add(self.x, self.pos_rows, out=self.x)
        for i in range(c.decoder_layers):
            p = f"dec.{i}"
            self._ln(p + ".attn_ln")
            self._linear(self.h, p + ".qkv", self.qkv)
            self.q.copy_(self.q_view)
            self.cache.append(i, self.k_view, self.v_view, lengths, offset=-1)
            ops.decode_attention(self.q, self.k_cache[i], self.v_cache[i], lengths, out=self.attn,
                                 workspace=self.workspace)  # fmt: skip
            self._linear(self.attn, p + ".out", self.proj)
            ops.add(self.x, self.proj, out=self.x)
            self._ln(p + ".cross_ln")
            self._linear(self.h, p + ".cross_q", self.cq)
            ck, cv = self.cross_cache[i]
            ops.decode_attention(self.cq, ck, cv, self.cross_lens, out=self.cattn, workspace=self.cross_workspace)
            self._linear(self.cattn, p + ".cross_out", self.proj)
            ops.add(self.x, self.proj, out=self.x)
            self._ln(p + ".mlp_ln")
            self._linear(self.h, p + ".fc1", self.ffn, "gelu")
            self._linear(self.ffn, p + ".fc2", self.proj)
            ops.add(self.x, self.proj, out=self.x)
        self._ln("dec.ln")
        ops.matmul(self.h.reshape(b, c.d_model), self.embed_t, out=self.logits)

    def _capture(self) -> None:
        # As DecodeM1Graph: one eager warm-up on the capture stream (plans, kernels, per-stream state),
        # then the capture; both on scratch values that start() overwrites.
        stream = Stream()
        current_stream().synchronize()
        with stream:
            self._step()
        stream.synchronize()
        with self.graph.capture(stream):
            self._step()
        if not self.graph.is_ready:
            raise PyGPUkitError("GraphDecoder: the decode step was not captured")
        self.graph.synchronize()

    @property
    def num_nodes(self) -> int:
        """Nodes of the captured step (CPU backend: recorded calls)."""
        return self.graph.num_nodes

    # -- driving ------------------------------------------------------------------------------------
    def start(self, encoder_out: GPUArray, prompt: list[int] | Sequence[list[int]], rules: Any,
              sot_index: int | Sequence[int], no_speech: int) -> Array:  # fmt: skip
        """Prepare a window: cross keys/values of ``encoder_out`` ((batch, n_audio_ctx, d), or (1,
        n_audio_ctx, d) for every row), the ``prompt`` in the KV cache, the first token of each row chosen
        (read back with :meth:`read`). Returns the no-speech probability of each row (float64 (batch,)).
        ``prompt`` and ``sot_index`` may be given per row (a list of prompts, of any lengths, and their
        <|startoftranscript|> positions): each row then runs its own prompt, and the step continues every
        row at its own position."""
        model, b = self.model, self.batch
        c = model.config
        if tuple(encoder_out.shape) not in ((b, c.n_audio_ctx, c.d_model), (1, c.n_audio_ctx, c.d_model)):
            raise ShapeError(f"GraphDecoder.start: encoder output must be ({b} or 1, {c.n_audio_ctx}, {c.d_model}), "
                             f"got {encoder_out.shape}")  # fmt: skip
        prompts, sots = per_row_prompts(prompt, sot_index, b, "GraphDecoder.start")
        for row_prompt in prompts:
            if not 1 <= len(row_prompt) < self.max_len:
                raise ArgumentError(f"GraphDecoder.start: a prompt of {len(row_prompt)} tokens does not fit the "
                                    f"{self.max_len}-token context")  # fmt: skip
        if rules != self._rules:
            suppress, blank, params = rules_arrays(rules)
            if suppress.shape[0] != c.n_vocab:
                raise ShapeError(f"GraphDecoder.start: the rules' vocabulary is {suppress.shape[0]}, the model's "
                                 f"{c.n_vocab}")  # fmt: skip
            self.suppress.copy_(suppress)
            self.blank.copy_(blank)
            self.params.copy_(params)
            self._rules = rules
        for i in range(c.decoder_layers):
            kv = model._linear(encoder_out, f"dec.{i}.cross_kv")
            if encoder_out.shape[0] == b:
                self.cross_kv[i].copy_(kv)
            else:  # one window for every row (best_of samples)
                for r in range(b):
                    self.cross_kv[i][r].copy_(kv[0])
        if all(row_prompt == prompts[0] for row_prompt in prompts) and len(set(sots)) == 1:
            self.window.length = 0
            hidden = model.decode(np.tile(np.asarray(prompts[0], np.int64), (b, 1)), self.window)
            first_hidden = hidden[:, sots[0] : sots[0] + 1]
            last_hidden = hidden[:, -1]
        else:
            first_hidden, last_hidden = self._start_rows(prompts, sots)
        # decoding._log_softmax (float64) on the device: only the no-speech column comes back to the host
        first = model.logits(first_hidden).astype(float64)
        no_speech_lp = ops.log_softmax(first, axis=-1)[:, 0, no_speech].to_numpy()
        no_speech_probs = np.exp(np.asarray(no_speech_lp, np.float64).reshape(b))
        initial = np.tile(np.array([0, -1, -1, -1, 0], np.int32), (b, 1))
        self.state.copy_(initial)
        self.sum_lp.copy_(np.zeros(b, np.float64))
        self.lengths.copy_(np.array([len(row_prompt) for row_prompt in prompts], np.int32))
        self.start_logits = model.logits(last_hidden)  # the first step's (beam search reads them)
        self._choose(self.start_logits)
        return no_speech_probs

    def _start_rows(self, prompts: list[list[int]], sots: list[int]) -> tuple[GPUArray, GPUArray]:
        """Different prompts per row, in one batch: each prompt right-padded to the longest with
        <|startoftranscript|>'s id (any token would do) and run through WhisperModel.decode into the KV cache
        (causal attention: a row's positions before its padding see none of it; the cache entries of the
        padding are past the row's length, never attended, and the step overwrites them in order); returns the
        hidden states at each row's <|startoftranscript|> (batch, 1, d) and at its last prompt token (batch, d),
        gathered on the device."""
        model, b = self.model, self.batch
        width = max(len(row_prompt) for row_prompt in prompts)
        ids = np.empty((b, width), np.int64)
        for r, (row_prompt, sot) in enumerate(zip(prompts, sots, strict=True)):
            ids[r, : len(row_prompt)] = row_prompt
            ids[r, len(row_prompt) :] = row_prompt[sot]
        self.window.length = 0
        hidden = model.decode(ids, self.window)
        flat = hidden.reshape(b * width, model.config.d_model)
        starts = np.arange(b, dtype=np.int32) * width
        firsts = starts + np.asarray(sots, np.int32)
        lasts = starts + np.asarray([len(row_prompt) - 1 for row_prompt in prompts], np.int32)
        gathered = ops.embedding(flat, from_numpy(np.concatenate([firsts, lasts])))
        return gathered[:b].reshape(b, 1, -1), gathered[b:]

    def read(self) -> Array:
        """The tokens chosen by the last step (int32 (batch,), on the host: the step's one synchronization)."""
        return self.tokens.to_numpy()

    def step(self) -> Array:
        """Decode one token per row (a finished row is fed <|endoftext|>) and return the new ones."""
        self.graph.replay(current_stream())  # launched on the stream of start() and read(): no events needed
        return self.read()


class BeamGraphDecoder(GraphDecoder):
    """Beam search's step captured for ``beam`` rows (the beams of one window): each replay first
    reorders the self-attention KV cache rows by ``parents`` (the beam each row continues), then runs the
    decoder on ``tokens`` at the device positions and the token rules with each row's 2 x beam best
    candidates (:func:`~pygpukit.asr.token_step.beam_rules_topk` into ``cand_idx`` / ``cand_val``, from
    ``state`` and ``scores``). The host writes parents, tokens, state and scores before a replay and reads
    the candidates after it."""

    def __init__(self, model: Any, beam: int) -> None:
        self.candidates = 2 * beam
        super().__init__(model, beam)

    def _allocate(self) -> None:
        super()._allocate()
        b = self.batch
        self.parents = zeros(b, int32)
        self.scores = zeros(b, float64)
        self.cand_idx = zeros((b, self.candidates), int32)
        self.cand_val = zeros((b, self.candidates), float64)
        self.row_tmp = zeros((b, int(np.prod(self.k_cache[0].shape[1:]))), self.model.dtype)

    def _step(self) -> None:
        for cache in (*self.k_cache, *self.v_cache):
            rows = cache.reshape(self.batch, -1)
            ops.embedding(rows, self.parents, out=self.row_tmp)
            rows.copy_(self.row_tmp)
        self._decode_step()
        beam_rules_topk(self.logits, self.state, self.scores, self.suppress, self.blank, self.params, self.candidates,
                        out_idx=self.cand_idx, out_val=self.cand_val)  # fmt: skip

    def step_beams(self, parents: Array, tokens: Array, states: Array, scores: Array) -> tuple[Array, Array]:
        """One replay: the beams continue ``parents`` with ``tokens`` (their state and scores after them);
        returns the candidates (indices (beam, 2 beam) int32, scores float64) on the host."""
        self.parents.copy_(np.asarray(parents, np.int32))
        self.tokens.copy_(np.asarray(tokens, np.int32))
        self.state.copy_(np.asarray(states, np.int32))
        self.scores.copy_(np.asarray(scores, np.float64))
        self.graph.replay(current_stream())
        return self.cand_idx.to_numpy(), self.cand_val.to_numpy()


class SampleGraphDecoder(GraphDecoder):
    """The greedy step with each row's token sampled instead (:func:`~pygpukit.asr.token_step.
    sample_rules_step`): the temperature and the seed are device memory (``sampling``, set by
    :meth:`set_sampling` before :meth:`start`), so one captured step serves every temperature of the
    fallback and every window. Each row draws its own tokens (the counter of the Gumbel keys includes the
    row), so ``best_of`` rows of one window are ``best_of`` samples."""

    def _allocate(self) -> None:
        super()._allocate()
        self.sampling = zeros(2, uint64)

    def _choose(self, logits: GPUArray) -> None:
        sample_rules_step(logits, self.tokens, self.state, self.sum_lp, self.suppress, self.blank, self.params,
                          self.sampling)  # fmt: skip

    def set_sampling(self, temperature: float, seed: int) -> None:
        """Sample at ``temperature`` (> 0) with ``seed`` from the next :meth:`start` on."""
        self.sampling.copy_(sampling_array(temperature, seed))


def sample_graph_decoder(model: Any, rows: int) -> SampleGraphDecoder:
    """The model's :class:`SampleGraphDecoder` for ``rows`` rows, made (and captured) on first use."""
    found: SampleGraphDecoder = _kept(model, "_sample_graph_decoders", rows, SampleGraphDecoder)
    return found


def beam_graph_decoder(model: Any, beam: int) -> BeamGraphDecoder:
    """The model's :class:`BeamGraphDecoder` for ``beam`` rows, made (and captured) on first use."""
    found: BeamGraphDecoder = _kept(model, "_beam_graph_decoders", beam, BeamGraphDecoder)
    return found


def graph_decoder(model: Any, batch: int) -> GraphDecoder:
    """The model's :class:`GraphDecoder` for ``batch`` rows, made (and captured) on first use; a few are
    kept per model, the least recently made dropped first."""
    found: GraphDecoder = _kept(model, "_graph_decoders", batch, GraphDecoder)
    return found


def _kept(model: Any, attribute: str, rows: int, kind: Any) -> Any:
    """``kind(model, rows)`` kept in the model's dict ``attribute`` (at most _MAX_DECODERS, the least
    recently made dropped first), made on first use."""
    decoders: dict[int, Any] | None = getattr(model, attribute, None)
    if decoders is None:
        decoders = {}
        setattr(model, attribute, decoders)
    found = decoders.get(rows)
    if found is None:
        while len(decoders) >= _MAX_DECODERS:
            decoders.pop(next(iter(decoders)))
        found = decoders[rows] = kind(model, rows)
    return found


def per_row_prompts(prompt: list[int] | Sequence[list[int]], sot_index: int | Sequence[int], rows: int,
                    what: str) -> tuple[list[list[int]], list[int]]:  # fmt: skip
    """``prompt`` and ``sot_index`` as one per row: a prompt (list of ints) shared by every row, or a list
    of ``rows`` prompts; an int, or ``rows`` ints."""
    items: Sequence[Any] = prompt
    if items and all(isinstance(t, (int, np.integer)) for t in items):
        prompts = [[int(t) for t in items]] * rows
    else:
        prompts = [[int(t) for t in row] for row in items]
    sots = [int(sot_index)] * rows if isinstance(sot_index, (int, np.integer)) else [int(v) for v in sot_index]
    if len(prompts) != rows or len(sots) != rows:
        raise ArgumentError(f"{what}: {len(prompts)} prompts and {len(sots)} <|startoftranscript|> positions for "
                            f"{rows} rows")  # fmt: skip
    return prompts, sots


def greedy_graph_decode(model: Any, encoder_out: GPUArray, prompt: list[int] | Sequence[list[int]], rules: Any, *,
                        sot_index: int | Sequence[int], no_speech: int,
                        max_new: int | Sequence[int]) -> tuple[list[list[int]], Array, Array] | None:  # fmt: skip
    """Greedy decoding of every row of ``encoder_out`` after ``prompt`` through the graph decoder: the
    tokens of each row (without <|endoftext|>), the sums of their log-probabilities (the end token's
    included) and the no-speech probabilities, as the eager loop of :mod:`pygpukit.asr.decoding` gives
    them. ``prompt``, ``sot_index`` and ``max_new`` may be given per row (GraphDecoder.start). None when
    the step cannot be captured and ``model.graph_decode`` is None (automatic): a warning says why, the
    flag becomes False and the caller decodes eagerly."""
    rows = int(encoder_out.shape[0])
    return _graph_rows(model, encoder_out, prompt, rules, sot_index, no_speech, max_new, rows, None,
                       "greedy_graph_decode")  # fmt: skip


def sampled_graph_decode(model: Any, encoder_out: GPUArray, prompt: list[int], rules: Any, *, sot_index: int,
                         no_speech: int, max_new: int, rows: int, temperature: float,
                         seed: int) -> tuple[list[list[int]], Array, Array] | None:  # fmt: skip
    """``rows`` samples at ``temperature`` of the one window ``encoder_out`` (batch 1) through
    :class:`SampleGraphDecoder`, as :func:`greedy_graph_decode` returns them (the eager loop of
    :mod:`pygpukit.asr.decoding` with the same ``seed`` draws the same tokens)."""
    return _graph_rows(model, encoder_out, prompt, rules, sot_index, no_speech, max_new, rows, (temperature, seed),
                       "sampled_graph_decode")  # fmt: skip


def _graph_rows(model: Any, encoder_out: GPUArray, prompt: list[int] | Sequence[list[int]], rules: Any,
                sot_index: int | Sequence[int], no_speech: int, max_new: int | Sequence[int], rows: int,
                sampling: tuple[float, int] | None,
                what: str) -> tuple[list[list[int]], Array, Array] | None:  # fmt: skip
    prompts, sots = per_row_prompts(prompt, sot_index, rows, what)
    caps = [int(max_new)] * rows if isinstance(max_new, (int, np.integer)) else [int(v) for v in max_new]
    if len(caps) != rows:
        raise ArgumentError(f"{what}: {len(caps)} token limits for {rows} rows")
    for row_prompt, cap in zip(prompts, caps, strict=True):
        if cap < 1 or len(row_prompt) + cap > model.config.n_text_ctx + 1:
            raise ArgumentError(f"{what}: {cap} new tokens after a prompt of {len(row_prompt)} do not fit the "
                                f"{model.config.n_text_ctx}-token context")  # fmt: skip
    try:
        decoder = graph_decoder(model, rows) if sampling is None else sample_graph_decoder(model, rows)
    except PyGPUkitError as exc:
        if getattr(model, "graph_decode", None) is not None:
            raise  # asked for explicitly: the failure is the answer
        kind = "greedy decoding" if sampling is None else "sampling"
        warnings.warn(f"{kind} through a CUDA graph is unavailable ({exc}); the eager loop decodes instead "
                      "(model.graph_decode set to False)", RuntimeWarning, stacklevel=3)  # fmt: skip
        model.graph_decode = False
        return None
    if isinstance(decoder, SampleGraphDecoder) and sampling is not None:
        decoder.set_sampling(*sampling)
    no_speech_probs = decoder.start(encoder_out, prompts, rules, sots, no_speech)
    eot = int(rules.eot)
    seqs: list[list[int]] = [[] for _ in range(rows)]
    done = np.zeros(rows, bool)
    capped: dict[int, float] = {}  # rows stopped at their limit: their sums then (the step goes on adding)
    tokens = decoder.read()
    for step in range(max(caps)):
        reached = []
        for r in range(rows):
            if done[r]:
                continue
            if int(tokens[r]) == eot:
                done[r] = True
            else:
                seqs[r].append(int(tokens[r]))
                if step + 1 == caps[r]:
                    done[r] = True
                    reached.append(r)
        if done.all():
            break
        if reached:  # a row at its limit while others go on (different prompt lengths): its sum now
            sums_now = np.asarray(decoder.sum_lp.to_numpy(), np.float64)
            capped.update((r, float(sums_now[r])) for r in reached)
        tokens = decoder.step()
    sums = np.asarray(decoder.sum_lp.to_numpy(), np.float64)
    for r, value in capped.items():
        sums[r] = value
    return seqs, sums, no_speech_probs
