"""Decoding one 30 s window: greedy, sampling (temperature > 0, best of N) and beam search (size, patience),
with Whisper's token rules applied to the logits of each step on the device (:mod:`pygpukit.asr.token_step`:
float64 sums; :meth:`TokenRules.apply` is their host statement, the tests' reference):

- the suppressed tokens (non-speech symbols and the task/start tokens) at every step, and a leading blank
  or <|endoftext|> at the first step (``suppress_blank``);
- the timestamp rules: <|notimestamps|> never; the first token a timestamp of at most
  ``max_initial_timestamp``; timestamps in pairs except before <|endoftext|>; timestamps never decrease;
  a timestamp is forced when the timestamps' total probability beats every text token.

The rules, step counting, candidate handling of the beam search (2 x beam candidates, finished hypotheses
replaced by the next unfinished candidate, ``round(beam x patience)`` finished hypotheses, scores divided
by length) and the scores (sum of log-probabilities; average over tokens + 1) follow CTranslate2's
Whisper generation as faster-whisper calls it, so greedy decoding gives the same tokens.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import float64
from pygpukit.core.errors import ArgumentError
from pygpukit.ops import log_softmax, stack

from .graph_decode import greedy_graph_decode, per_row_prompts, sampled_graph_decode, use_graph
from .token_step import beam_rules_topk, greedy_rules_step, row_state, rules_arrays, sample_rules_step, sampling_array

__all__ = ["DecodeResult", "TokenRules", "decode_batch", "decode_window"]

Array = np.ndarray[Any, Any]
_NEG = -np.inf


@dataclass
class DecodeResult:
    """One window's decoding: generated tokens (without <|endoftext|>), the sum of their log-probabilities
    (with the end token's), the average (sum / (len + 1)), the no-speech probability and the temperature."""

    tokens: list[int]
    sum_logprob: float
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    candidates: list[tuple[list[int], float]] = field(default_factory=list)


@dataclass(frozen=True)
class TokenRules:
    """The token ids and options the logit rules need."""

    eot: int
    no_timestamps: int
    timestamp_begin: int
    vocab_size: int
    suppress: tuple[int, ...] = ()
    suppress_blank: tuple[int, ...] = ()
    timestamps: bool = True
    max_initial_timestamp_index: int = 50

    def apply(self, logits: Array, generated: list[list[int]], step: int) -> Array:
        """Mask ``logits`` (rows, vocab) float64 in place for each row's ``generated`` tokens; returns it."""
        if self.suppress:
            logits[:, list(self.suppress)] = _NEG
        if step == 0 and self.suppress_blank:
            logits[:, list(self.suppress_blank)] = _NEG
        if not self.timestamps:
            return logits
        tsb, last_ts = self.timestamp_begin, self.vocab_size - 1
        logits[:, self.no_timestamps] = _NEG
        check: list[int] = []
        for row, seq in enumerate(generated):
            if step == 0:
                logits[row, :tsb] = _NEG
                logits[row, tsb + self.max_initial_timestamp_index + 1 : last_ts + 1] = _NEG
                continue
            last = seq[-1]
            if last >= tsb:
                penultimate = seq[-2] if len(seq) >= 2 else last
                if penultimate >= tsb:
                    logits[row, tsb:] = _NEG
                else:
                    logits[row, : self.eot] = _NEG
                    logits[row, tsb:last] = _NEG
                    check.append(row)
            else:
                check.append(row)
                for token in reversed(seq):
                    if token >= tsb:
                        logits[row, tsb : token + 1] = _NEG
                        break
        for row in check:
            lp = _log_softmax(logits[row])
            stamps = lp[tsb:]
            top = stamps.max()
            total = top + np.log(np.exp(stamps - top).sum()) if np.isfinite(top) else _NEG
            if total > lp[:tsb].max():
                logits[row, :tsb] = _NEG
        return logits


def _log_softmax(x: Array) -> Array:
    top = x.max(axis=-1, keepdims=True)
    shifted = x - top
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # type: ignore[no-any-return]


def _no_speech_probs(model: Any, hidden: GPUArray, sot_index: int, no_speech: int) -> Array:
    """The probability of <|nospeech|> at the <|startoftranscript|> position of each row of ``hidden``, before
    any rule: the log-softmax on the device in float64 (the host formula); one value per row comes back."""
    first = model.logits(hidden[:, sot_index : sot_index + 1]).astype(float64)
    column = log_softmax(first, axis=-1)[:, 0, no_speech : no_speech + 1]
    return np.exp(np.asarray(column.to_numpy(), np.float64).reshape(-1))


def decode_window(model: Any, encoder_out: GPUArray, prompt: list[int], rules: TokenRules, *, sot_index: int,
                  no_speech: int, temperature: float = 0.0, beam_size: int = 1, patience: float = 1.0,
                  best_of: int = 1, length_penalty: float = 1.0, max_length: int | None = None,
                  rng: np.random.Generator | None = None) -> DecodeResult:  # fmt: skip
    """Decode one window (``encoder_out`` of batch 1) after ``prompt``; ``sot_index`` is the position of
    <|startoftranscript|> in the prompt, whose logits give the no-speech probability."""
    if beam_size < 1 or best_of < 1 or patience <= 0:
        raise ArgumentError(f"beam_size and best_of must be >= 1 and patience > 0, got {beam_size}, {best_of}, "
                            f"{patience}")  # fmt: skip
    if encoder_out.shape[0] != 1:
        raise ArgumentError(f"decode_window decodes one window, got encoder output {encoder_out.shape}")
    ctx = model.config.n_text_ctx
    total = ctx if max_length is None else min(int(max_length), ctx)
    start_step = len(prompt) - 1
    max_new = min(total // 2, total - start_step)
    if max_new < 1:
        raise ArgumentError(f"the prompt of {len(prompt)} tokens leaves no room in the {ctx}-token context")
    sampling = temperature > 0
    if beam_size > 1 and not sampling and use_graph(model):  # the captured beam step (graph_decode.py)
        beamed = _beam_graphed(model, encoder_out, prompt, rules, sot_index, no_speech, beam_size, patience,
                               length_penalty, max_new)  # fmt: skip
        if beamed is not None:
            return beamed
    rows = best_of if sampling else beam_size
    # The seed of this window's samples is drawn before either path runs, so both draw the same tokens.
    generator = rng if rng is not None else np.random.default_rng(0)
    seed = int(generator.integers(0, 2**63)) if sampling else 0
    graphed = None
    if beam_size == 1 and not sampling and use_graph(model):  # the captured decode step (graph_decode.py)
        graphed = greedy_graph_decode(model, encoder_out, prompt, rules, sot_index=sot_index, no_speech=no_speech,
                                      max_new=max_new)  # fmt: skip
    elif sampling and use_graph(model):  # the captured sampled step, best_of rows of this window
        graphed = sampled_graph_decode(model, encoder_out, prompt, rules, sot_index=sot_index, no_speech=no_speech,
                                       max_new=max_new, rows=rows, temperature=temperature, seed=seed)  # fmt: skip
    if graphed is not None:
        seqs, sums, ns_probs = graphed
        return _best(seqs, np.asarray(sums, np.float64), float(ns_probs[0]), temperature, length_penalty)
    state = model.new_state(encoder_out, repeat=rows, max_len=min(ctx, len(prompt) + max_new))
    hidden = model.decode(np.tile(np.asarray(prompt, np.int64), (rows, 1)), state)
    no_speech_prob = float(_no_speech_probs(model, hidden[:1], sot_index, no_speech)[0])
    if beam_size > 1 and not sampling:
        return _beam(model, state, model.logits(hidden[:, -1]), rules, beam_size, patience, length_penalty, max_new,
                     no_speech_prob)  # fmt: skip
    seqs, sums = _sample_rows(model, state, model.logits(hidden[:, -1]), rules, temperature, max_new, seed)
    return _best(seqs, sums, no_speech_prob, temperature, length_penalty)


def _best(seqs: list[list[int]], sums: Array, no_speech_prob: float, temperature: float,
          length_penalty: float) -> DecodeResult:  # fmt: skip
    """The decode result of the row with the best length-penalized score (the first of equal ones)."""
    lengths = np.array([max(len(s), 1) for s in seqs], dtype=np.float64)
    scores = sums / lengths**length_penalty
    best = int(np.argmax(scores))
    return DecodeResult(seqs[best], float(sums[best]), float(sums[best] / (len(seqs[best]) + 1)), no_speech_prob,
                        float(temperature), [(s, float(v)) for s, v in zip(seqs, scores, strict=True)])  # fmt: skip


def _sample_rows(model: Any, state: Any, logits: GPUArray, rules: TokenRules, temperature: float, max_new: int,
                 seed: int) -> tuple[list[list[int]], Array]:  # fmt: skip
    """Greedy (temperature 0) or sampled continuation of every row of ``state`` from its first ``logits``
    (rows, vocab) on the device: the tokens of each row (without <|endoftext|>) and the sums of their
    log-probabilities. The token rules, the choice and the sums run on the device
    (:func:`~pygpukit.asr.token_step.greedy_rules_step`, :func:`~pygpukit.asr.token_step.sample_rules_step`
    with ``seed``); each step the host reads back one token per row. Finished rows are fed <|endoftext|>."""
    rows = logits.shape[0]
    seqs: list[list[int]] = [[] for _ in range(rows)]
    suppress, blank, params = (from_numpy(a) for a in rules_arrays(rules))
    tokens_dev = from_numpy(np.zeros(rows, np.int32))
    states = from_numpy(np.tile(np.array([0, -1, -1, -1, 0], np.int32), (rows, 1)))
    sums_dev = from_numpy(np.zeros(rows, np.float64))
    sampling = from_numpy(sampling_array(temperature, seed)) if temperature > 0 else None
    done = np.zeros(rows, bool)
    for step in range(max_new):
        if sampling is not None:
            sample_rules_step(logits, tokens_dev, states, sums_dev, suppress, blank, params, sampling)
        else:
            greedy_rules_step(logits, tokens_dev, states, sums_dev, suppress, blank, params)
        tokens = tokens_dev.to_numpy()
        for r in range(rows):
            if done[r]:
                continue
            if int(tokens[r]) == rules.eot:
                done[r] = True
            else:
                seqs[r].append(int(tokens[r]))
        if done.all() or step + 1 == max_new:
            break
        hidden = model.decode(tokens.astype(np.int64).reshape(rows, 1), state)  # finished rows: <|endoftext|>
        logits = model.logits(hidden[:, -1])
    return seqs, np.asarray(sums_dev.to_numpy(), np.float64)


def decode_batch(model: Any, encoder_out: GPUArray, prompt: list[int] | Sequence[list[int]], rules: TokenRules, *,
                 sot_index: int | Sequence[int], no_speech: int,
                 max_length: int | None = None) -> list[DecodeResult]:  # fmt: skip
    """Greedy decoding of a batch of windows (``encoder_out`` (batch, n_audio_ctx, d)) after ``prompt``:
    one result per window, each as :func:`decode_window` with temperature 0 gives it. ``prompt`` and
    ``sot_index`` may be given per row (a list of prompts and a list of positions): the graph decoder
    runs them in one batch; the eager loop decodes each group of rows with the same prompt together."""
    ctx = model.config.n_text_ctx
    total = ctx if max_length is None else min(int(max_length), ctx)
    rows = encoder_out.shape[0]
    prompts, sots = per_row_prompts(prompt, sot_index, rows, "decode_batch")
    caps = [min(total // 2, total - (len(p) - 1)) for p in prompts]
    if min(caps) < 1:
        longest = max(len(p) for p in prompts)
        raise ArgumentError(f"the prompt of {longest} tokens leaves no room in the {ctx}-token context")
    shared = all(p == prompts[0] for p in prompts) and len(set(sots)) == 1
    graphed = None
    if use_graph(model):
        graphed = greedy_graph_decode(model, encoder_out, prompts if not shared else prompts[0], rules,
                                      sot_index=sots if not shared else sots[0], no_speech=no_speech,
                                      max_new=caps if not shared else caps[0])  # fmt: skip
    if graphed is not None:
        seqs, sums, no_speech_probs = graphed
    elif not shared:  # the eager loop keeps one length for every row: one batch per distinct prompt
        groups: dict[tuple[tuple[int, ...], int], list[int]] = {}
        for r, (row_prompt, sot) in enumerate(zip(prompts, sots, strict=True)):
            groups.setdefault((tuple(row_prompt), sot), []).append(r)
        found: list[DecodeResult | None] = [None] * rows
        for (key, sot), members in groups.items():
            part = encoder_out if len(members) == rows else stack([encoder_out[r] for r in members], axis=0)
            part_results = decode_batch(model, part, list(key), rules, sot_index=sot, no_speech=no_speech,
                                        max_length=max_length)  # fmt: skip
            for r, result in zip(members, part_results, strict=True):
                found[r] = result
        return [result for result in found if result is not None]
    else:
        prompt0, max_new = prompts[0], caps[0]
        state = model.new_state(encoder_out, max_len=min(ctx, len(prompt0) + max_new))
        hidden = model.decode(np.tile(np.asarray(prompt0, np.int64), (rows, 1)), state)
        no_speech_probs = _no_speech_probs(model, hidden, sots[0], no_speech)
        seqs, sums = _sample_rows(model, state, model.logits(hidden[:, -1]), rules, 0.0, max_new, 0)
    return [DecodeResult(seq, float(total_lp), float(total_lp / (len(seq) + 1)), float(ns), 0.0)
            for seq, total_lp, ns in zip(seqs, sums, no_speech_probs, strict=True)]  # fmt: skip


def _beam(model: Any, state: Any, logits: GPUArray, rules: TokenRules, beam: int, patience: float,
          length_penalty: float, max_new: int, no_speech_prob: float) -> DecodeResult:  # fmt: skip
    """Beam search for one window through the eager decoder (the state holds ``beam`` identical rows;
    ``logits`` are their (beam, vocab) logits on the device): :func:`_beam_search` with each step's
    cache reorder, decode and candidates (:func:`~pygpukit.asr.token_step.beam_rules_topk`) run eagerly."""
    suppress, blank, params = (from_numpy(a) for a in rules_arrays(rules))
    k = min(2 * beam, logits.shape[1])

    def candidates(rows_logits: GPUArray, states: Array, scores: Array) -> tuple[Array, Array]:
        idx, val = beam_rules_topk(rows_logits, from_numpy(states), from_numpy(scores), suppress, blank, params, k)
        return idx.to_numpy(), val.to_numpy()

    def advance(parents: Array, tokens: Array, states: Array, scores: Array) -> tuple[Array, Array]:
        model.reorder(state, parents)
        hidden = model.decode(np.asarray(tokens, np.int64).reshape(-1, 1), state)
        return candidates(model.logits(hidden[:, -1]), states, scores)

    return _beam_search(lambda states, scores: candidates(logits[:1], states, scores), advance, rules, beam,
                        patience, length_penalty, max_new, no_speech_prob, logits.shape[1])  # fmt: skip


def _beam_graphed(model: Any, encoder_out: GPUArray, prompt: list[int], rules: TokenRules, sot_index: int,
                  no_speech: int, beam: int, patience: float, length_penalty: float,
                  max_new: int) -> DecodeResult | None:  # fmt: skip
    """Beam search for one window through the captured step (:class:`~pygpukit.asr.graph_decode.
    BeamGraphDecoder`: cache reorder, decoder and candidates in one replay per step). None where the step
    cannot be captured and ``model.graph_decode`` is None (a warning says why; the caller decodes eagerly)."""
    from pygpukit.core.errors import PyGPUkitError
    from pygpukit.ops import concatenate

    from .graph_decode import beam_graph_decoder

    vocab = model.config.n_vocab
    if 2 * beam > vocab:
        return None
    try:
        decoder = beam_graph_decoder(model, beam)
    except PyGPUkitError as exc:
        if getattr(model, "graph_decode", None) is not None:
            raise
        warnings.warn(f"beam search through a CUDA graph is unavailable ({exc}); the eager loop decodes instead "
                      "(model.graph_decode set to False)", RuntimeWarning, stacklevel=3)  # fmt: skip
        model.graph_decode = False
        return None
    no_speech_probs = decoder.start(concatenate([encoder_out] * beam, axis=0), prompt, rules, sot_index, no_speech)

    def first(states: Array, scores: Array) -> tuple[Array, Array]:
        idx, val = beam_rules_topk(decoder.start_logits[:1], from_numpy(states), from_numpy(scores), decoder.suppress,
                                   decoder.blank, decoder.params, 2 * beam)  # fmt: skip
        return idx.to_numpy(), val.to_numpy()

    return _beam_search(first, decoder.step_beams, rules, beam, patience, length_penalty, max_new,
                        float(no_speech_probs[0]), vocab)  # fmt: skip


def _beam_search(first: Any, advance: Any, rules: TokenRules, beam: int, patience: float, length_penalty: float,
                 max_new: int, no_speech_prob: float, vocab: int) -> DecodeResult:  # fmt: skip
    """CTranslate2's beam search for one window. ``first(states, scores)`` gives the first step's candidates
    (from the prompt's last logits, one row) and ``advance(parents, tokens, states, scores)`` those of the
    next step after the beams continue ``parents`` with ``tokens``: each row's best candidates as indices
    and scores (rows, k) on the host (:func:`~pygpukit.asr.token_step.beam_rules_topk`). The host picks the
    best ``2 x beam`` of all rows (larger score first, ties by row and token) and keeps the hypotheses'
    bookkeeping."""
    candidates_n = 2 * beam
    wanted = max(1, round(beam * patience))
    seqs: list[list[int]] = [[]]
    scores = np.zeros(1)
    finished: list[tuple[list[int], float, float]] = []  # tokens, cumulative log-probability, normalized score

    def states_of(rows: list[list[int]]) -> Array:
        return np.array([row_state(seq, rules.timestamp_begin) for seq in rows], np.int32)

    idx2, val2 = first(states_of(seqs), np.asarray(scores, np.float64))
    for step in range(max_new):
        rows = len(seqs)
        idx, val = np.asarray(idx2)[:rows].reshape(-1), np.asarray(val2)[:rows].reshape(-1)
        flat = np.repeat(np.arange(rows, dtype=np.int64), np.asarray(idx2).shape[1]) * vocab + idx
        valid = np.flatnonzero(idx >= 0)
        order = valid[np.lexsort((flat[valid], -val[valid]))][:candidates_n]
        cand_beam, cand_tok, cand_score = flat[order] // vocab, flat[order] % vocab, val[order]
        last = step + 1 == max_new
        keep: list[int] = []
        secondary = beam
        for k in range(min(beam, len(order))):
            chosen = k
            if int(cand_tok[k]) == rules.eot or last:
                tokens = seqs[cand_beam[k]] + ([] if int(cand_tok[k]) == rules.eot else [int(cand_tok[k])])
                finished.append(
                    (tokens, float(cand_score[k]), float(cand_score[k]) / max(len(tokens), 1) ** length_penalty)
                )
                for j in range(secondary, len(order)):
                    if int(cand_tok[j]) != rules.eot:
                        chosen, secondary = j, j + 1
                        break
            keep.append(chosen)
        if last or len(finished) >= wanted:
            break
        parents = cand_beam[keep]
        seqs = [seqs[p] + [int(cand_tok[c])] for p, c in zip(parents, keep, strict=True)]
        scores = cand_score[keep]
        idx2, val2 = advance(parents, np.array([s[-1] for s in seqs]), states_of(seqs), np.asarray(scores, np.float64))
    if not finished:
        finished = [
            (s, float(v), float(v) / max(len(s), 1) ** length_penalty) for s, v in zip(seqs, scores, strict=True)
        ]
    finished.sort(key=lambda f: -f[2])
    tokens, cum, _ = finished[0]
    return DecodeResult(tokens, cum, cum / (len(tokens) + 1), no_speech_prob, 0.0,
                        [(t, s) for t, _, s in finished])  # fmt: skip
