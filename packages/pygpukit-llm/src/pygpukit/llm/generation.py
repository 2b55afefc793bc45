"""Text generation with a :class:`~pygpukit.llm.model.CausalTransformerModel`: prefill, a decode loop
over the KV cache, GPU sampling, stop conditions, streaming and timing.

Per decode step the host reads back only the sampled token ids (one small copy); the logits, the
sampling and the positions stay on the device. The same seed gives the same tokens.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

import numpy as np

import pygpukit.ops as ops
from pygpukit.core.array import GPUArray, from_numpy, full
from pygpukit.core.dtypes import int32
from pygpukit.core.errors import ArgumentError

if TYPE_CHECKING:
    from .model import CausalTransformerModel

__all__ = ["GenerationStats", "SamplingParams", "generate", "generate_stream", "render_chat"]


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is picked (transformers' order: repetition penalty, temperature, top-k,
    top-p, min-p). ``temperature == 0`` is greedy."""

    temperature: float = 1.0
    top_k: int | None = 50
    top_p: float | None = 0.9
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 and not self.repetition_penalty


@dataclass
class GenerationStats:
    """Timing of the last generation: time to first token (prefill and first sample, until the id is on
    the host) and decode speed over the remaining tokens."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    time_to_first_token_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    total_s: float = 0.0
    finish_reason: str = "length"
    batch: int = 1
    backend: str = ""
    strategy: str = ""
    # Figures of the multi-token strategies: acceptance_rate, tokens_per_forward, iterations_per_token.
    decode_info: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"ttft {self.time_to_first_token_s:.3f} s, {self.new_tokens} tokens, "
            f"{self.decode_tokens_per_s:.1f} tokens/s ({self.backend})"
        )


def render_chat(model: CausalTransformerModel, messages: Sequence[Mapping[str, Any]],
                add_generation_prompt: bool = True, **template_kwargs: Any) -> str:  # fmt: skip
    """``messages`` rendered with the model's chat template."""
    if model.chat_template is None:
        raise ArgumentError("this model has no chat template (tokenizer_config.json or GGUF metadata)")
    return model.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **template_kwargs)


def _tokenizer(model: CausalTransformerModel) -> Any:
    if model.tokenizer is None:
        raise ArgumentError("a text prompt needs a tokenizer; this model has none (pass token ids)")
    return model.tokenizer


def _prompts(model: CausalTransformerModel, prompt: Any, add_special_tokens: bool) -> tuple[list[list[int]], str]:
    """Token id lists and the prompt kind: "text", "ids", "texts" or "ids_batch"."""
    if isinstance(prompt, str):
        return [_tokenizer(model).encode(prompt, add_special_tokens=add_special_tokens)], "text"
    if isinstance(prompt, GPUArray):
        prompt = prompt.to_numpy()
    if isinstance(prompt, np.ndarray):
        prompt = prompt.tolist()
    if not isinstance(prompt, Sequence) or len(prompt) == 0:
        raise ArgumentError(f"prompt must be a str, token ids or a non-empty list of either, got {type(prompt)}")
    if all(isinstance(p, str) for p in prompt):
        tok = _tokenizer(model)
        return [tok.encode(p, add_special_tokens=add_special_tokens) for p in prompt], "texts"
    if all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in prompt):
        return [[int(t) for t in prompt]], "ids"
    if all(isinstance(p, Sequence) and not isinstance(p, str) for p in prompt):
        return [[int(t) for t in p] for p in prompt], "ids_batch"
    raise ArgumentError("prompt must be a str, a list of str, a list of token ids or a list of such lists")


def _check_ids(model: CausalTransformerModel, prompts: list[list[int]]) -> None:
    vocab = model.config.vocab_size
    for row, ids in enumerate(prompts):
        if not ids:
            raise ArgumentError(f"prompt {row} is empty (no tokens)")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ArgumentError(f"prompt {row}: token id {bad[0]} is outside the vocabulary [0, {vocab})")


def _stop_ids(model: CausalTransformerModel, stop_token_ids: Sequence[int] | None, ignore_eos: bool) -> set[int]:
    ids: set[int] = {int(t) for t in stop_token_ids or ()}
    if not ignore_eos:
        tok = model.tokenizer
        ids.update(getattr(tok, "eos_token_ids", ()) or ())
        if tok is None or not getattr(tok, "eos_token_ids", ()):
            ids.update(model.config.eos_token_ids)
    return ids


class _Run:
    """One batch being generated: yields the new token ids of every row, step by step."""

    def __init__(self, model: CausalTransformerModel, prompts: list[list[int]], max_new_tokens: int,
                 sampling: SamplingParams, strategy: str | None = None,
                 strategy_options: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ArgumentError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        _check_ids(model, prompts)
        self.model = model
        self.prompts = prompts
        self.sampling = sampling
        longest = max(len(p) for p in prompts)
        limit = model.config.max_position_embeddings
        if longest > limit:
            raise ArgumentError(f"a {longest}-token prompt exceeds the model's {limit} positions")
        self.max_new_tokens = min(max_new_tokens, limit - longest)
        self.longest = longest
        from .decode import choose_strategy

        self.strategy = choose_strategy(model, len(prompts), sampling, strategy)
        self.options = _strategy_options(len(prompts), sampling, self.strategy, strategy_options)
        self.stats = GenerationStats(prompt_tokens=sum(len(p) for p in prompts), batch=len(prompts),
                                     backend=model.backend, strategy=self.strategy)  # fmt: skip

    def tokens(self) -> Iterator[np.ndarray[Any, Any]]:
        model, s = self.model, self.sampling
        batch = len(self.prompts)
        if self.max_new_tokens == 0:
            return
        pad = 0
        ids = np.full((batch, self.longest), pad, np.int32)
        for row, p in enumerate(self.prompts):
            ids[row, : len(p)] = p
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        if self.strategy in ("batch", "speculative", "jacobi"):
            yield from self._multi_tokens(ids, seed)
            return
        if self.strategy != "eager":
            yield from self._decoder_tokens(ids, seed)
            return
        state = model.new_state(batch, self.longest + self.max_new_tokens)
        vocab = model.config.vocab_size
        sampler = None
        if not s.greedy:
            sampler = ops.Sampler(seed, batch, vocab, model.dtype)
        history = history_host = None
        if s.repetition_penalty:
            history_host = np.full((batch, self.longest + self.max_new_tokens), -1, np.int32)
            history_host[:, : self.longest] = np.where(
                np.arange(self.longest)[None, :] < np.array([len(p) for p in self.prompts])[:, None], ids, -1
            )
            history = from_numpy(history_host)
        out = full(batch, 0, int32)
        settings: dict[str, Any] = {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
                                        "repetition_penalty": s.repetition_penalty, "history": history}  # fmt: skip
        start = self._start_clock()
        try:
            yield from self._loop(model, ids, state, sampler, settings, out, history, history_host, start)
        finally:
            self._stop_clock(start)

    def _start_clock(self) -> float:
        """Starts the clock (once the decoder or the state is built) and returns the start."""
        self._first = time.perf_counter()
        return self._first

    def _produced(self, step: int, start: float) -> None:
        """Counts the tokens of step ``step`` (0: the first, whose time is the time to first token)."""
        if step == 0:
            self._first = time.perf_counter()
            self.stats.time_to_first_token_s = self._first - start
        self.stats.new_tokens = step + 1

    def _stop_clock(self, start: float) -> None:
        """The total time and the decode speed after the first token."""
        end = time.perf_counter()
        self.stats.total_s = end - start
        if self.stats.new_tokens > 1 and end > self._first:
            self.stats.decode_tokens_per_s = (self.stats.new_tokens - 1) / (end - self._first)

    def _decoder_tokens(self, ids: np.ndarray[Any, Any], seed: int) -> Iterator[np.ndarray[Any, Any]]:
        """The loop over a DecodeM1 / DecodeM1Graph (pygpukit.llm.decode), built (and captured) before
        the clock starts."""
        from .decode import DecodeM1, DecodeM1Graph

        kind = DecodeM1Graph if self.strategy == "graph" else DecodeM1
        decoder = kind(self.model, len(self.prompts), self.longest + self.max_new_tokens, self.sampling, seed)
        start = self._start_clock()
        try:
            host = decoder.start(ids, [len(p) for p in self.prompts])
            for step in range(self.max_new_tokens):
                self._produced(step, start)
                yield host
                if step + 1 == self.max_new_tokens:
                    break
                host = decoder.step()
        finally:
            self._stop_clock(start)

    def _multi_tokens(self, ids: np.ndarray[Any, Any], seed: int) -> Iterator[np.ndarray[Any, Any]]:
        """The loop over a DecodeBatch (pygpukit.llm.decode_batch) or a DecodeSpeculative / DecodeJacobi
        (pygpukit.llm.decode_spec; batch 1: their steps return several tokens, yielded one by one)."""
        from .decode_batch import DecodeBatch
        from .decode_spec import DecodeJacobi, DecodeSpeculative

        length = self.longest + self.max_new_tokens
        decoder: Any
        if self.strategy == "batch":
            size = self.options.get("batch_size", len(self.prompts))
            decoder = DecodeBatch(self.model, size, length, self.sampling, seed, self.options.get("graph"))
        elif self.strategy == "speculative":
            decoder = DecodeSpeculative(self.model, length, **self.options)
        else:
            decoder = DecodeJacobi(self.model, length, **self.options)
        start = self._start_clock()
        try:
            if isinstance(decoder, DecodeBatch):
                pieces: Iterator[np.ndarray[Any, Any]] = decoder.iterate(self.prompts, self.max_new_tokens)
            else:
                pieces = self._single(decoder, ids)
            for step, host in enumerate(pieces):
                self._produced(step, start)
                yield host
        finally:
            self._stop_clock(start)
            if not isinstance(decoder, DecodeBatch):
                self.stats.decode_info = decoder.stats()

    def _single(self, decoder: Any, ids: np.ndarray[Any, Any]) -> Iterator[np.ndarray[Any, Any]]:
        """One row's tokens, (1,) arrays, from a decoder whose steps return several."""
        produced = 0
        new = decoder.start(ids)
        while True:
            for token in new.tolist():
                yield np.array([token], np.int32)
                produced += 1
                if produced == self.max_new_tokens:
                    return
            new = decoder.step()

    def _loop(self, model: CausalTransformerModel, ids: np.ndarray[Any, Any], state: Any, sampler: Any,
              settings: dict[str, Any], out: GPUArray, history: GPUArray | None,
              history_host: np.ndarray[Any, Any] | None, start: float) -> Iterator[np.ndarray[Any, Any]]:  # fmt: skip
        logits = model.prefill(from_numpy(ids), state, [len(p) for p in self.prompts])
        for step in range(self.max_new_tokens):
            if sampler is None:
                ops.greedy(logits, out)
            else:
                sampler.sample(logits, out, **settings)
            host = out.to_numpy()  # the one read-back per step
            self._produced(step, start)
            yield host
            if step + 1 == self.max_new_tokens:
                break
            if history is not None and history_host is not None:
                history_host[:, self.longest + step] = host
                history.copy_(history_host)
            logits = model.decode_step(out, state)


_OPTIONS = {"batch": ("batch_size", "graph"), "speculative": ("draft", "draft_layers", "num_draft_tokens", "graph"),
            "jacobi": ("window", "graph")}  # fmt: skip


def _strategy_options(batch: int, sampling: SamplingParams, strategy: str,
                      options: Mapping[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """The checked ``strategy_options`` of ``strategy`` (UnsupportedStrategyError where the strategy
    cannot run this batch and sampling)."""
    from .decode import UnsupportedStrategyError
    from .decode_spec import multi_token_unsupported_reason

    given = dict(options or {})
    allowed = _OPTIONS.get(strategy, ())
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        accepted = ", ".join(allowed) if allowed else "none"
        raise ArgumentError(f"strategy_options {unknown} do not apply to strategy={strategy!r} (it takes: {accepted})")
    if strategy in ("speculative", "jacobi"):
        reason = multi_token_unsupported_reason(batch, sampling)
        if reason is not None:
            raise UnsupportedStrategyError(f"strategy={strategy!r} does not support {reason}")
    if strategy == "batch":
        size = given.get("batch_size", batch)
        if not isinstance(size, int) or isinstance(size, bool) or size < batch:
            raise ArgumentError(f"strategy_options batch_size must be an int >= the {batch} prompts, got {size!r} "
                                "(DecodeBatch.generate runs more prompts in groups)")  # fmt: skip
    return given


def _normalize_stop(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not all(isinstance(s, str) for s in stop):
        raise ArgumentError("stop must be a string or a list of strings")
    return list(stop)


def _sampling(temperature: float, top_k: int | None, top_p: float | None, min_p: float | None,
              repetition_penalty: float | None, seed: int | None) -> SamplingParams:  # fmt: skip
    if not isinstance(temperature, (int, float)) or temperature < 0 or temperature != temperature:
        raise ArgumentError(f"temperature must be a number >= 0, got {temperature!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ArgumentError(f"seed must be a non-negative int, got {seed!r}")
    return SamplingParams(float(temperature), top_k, top_p, min_p, repetition_penalty, seed)


def _events(model: CausalTransformerModel, run: _Run, stop_ids: set[int], stops: list[str],
            skip_special_tokens: bool) -> Iterator[tuple[int, int | None, str, bool]]:  # fmt: skip
    """For every step and live row: (row, token, new text, finished). ``token`` is None when the row
    ended without a new token (the run's last flush). The text never ends inside a possible stop
    string and never splits a UTF-8 character; a stop string cuts it."""
    from .chat import StopChecker
    from .tokenizer import StreamDecoder

    tok = model.tokenizer
    if stops and tok is None:
        raise ArgumentError("stop strings need a tokenizer; this model has none (use stop_token_ids)")
    batch = len(run.prompts)
    decoders = [StreamDecoder(tok, skip_special_tokens=skip_special_tokens) for _ in range(batch)] if tok else None
    checkers = [StopChecker((), stops) for _ in range(batch)]
    hold = max((len(s) for s in stops), default=1) - 1  # a partial stop string is held back
    texts, emitted, done = [""] * batch, [0] * batch, [False] * batch

    def finish(row: int, text: str) -> str:
        done[row] = True
        cut = checkers[row].find(text)
        return text[emitted[row] : cut if cut >= 0 else len(text)]

    for host in run.tokens():
        for row in range(batch):
            if done[row]:
                continue
            token = int(host[row])
            if decoders is None:
                done[row] = token in stop_ids
                yield row, token, "", done[row]
            elif token in stop_ids:
                yield row, token, finish(row, texts[row] + decoders[row].flush()), True
            else:
                texts[row] += decoders[row].push(token)
                if checkers[row].check(token, texts[row]):
                    yield row, token, finish(row, texts[row]), True
                    continue
                safe = max(emitted[row], len(texts[row]) - hold)
                yield row, token, texts[row][emitted[row] : safe], False
                emitted[row] = safe
            if done[row]:
                run.stats.finish_reason = "stop"
        if all(done):
            return
    for row in range(batch):
        if not done[row]:
            yield row, None, finish(row, texts[row] + (decoders[row].flush() if decoders else "")), True


_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True)
class _Request:
    """The parameters of :func:`generate` and :func:`generate_stream` (generate documents them), and
    the steps from them to the run's events that both take."""

    model: CausalTransformerModel
    prompt: Any
    max_new_tokens: int = 128
    _: KW_ONLY
    # sampling: SamplingParams' defaults
    temperature: float = SamplingParams.temperature
    top_k: int | None = SamplingParams.top_k
    top_p: float | None = SamplingParams.top_p
    min_p: float | None = SamplingParams.min_p
    repetition_penalty: float | None = SamplingParams.repetition_penalty
    seed: int | None = SamplingParams.seed
    stop: str | Sequence[str] | None = None
    stop_token_ids: Sequence[int] | None = None
    ignore_eos: bool = False
    add_special_tokens: bool = True
    skip_special_tokens: bool = True
    strategy: str | None = None
    strategy_options: Mapping[str, Any] | None = None

    def prompts(self) -> tuple[list[list[int]], str]:
        return _prompts(self.model, self.prompt, self.add_special_tokens)

    def run(self, prompts: list[list[int]]) -> tuple[_Run, set[int]]:
        """The checked run of ``prompts`` and its stop ids."""
        sampling = _sampling(self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty, self.seed)
        run = _Run(self.model, prompts, self.max_new_tokens, sampling, self.strategy, self.strategy_options)
        return run, _stop_ids(self.model, self.stop_token_ids, self.ignore_eos)

    def events(self, run: _Run, stop_ids: set[int]) -> Iterator[tuple[int, int | None, str, bool]]:
        return _events(self.model, run, stop_ids, _normalize_stop(self.stop), self.skip_special_tokens)


def _parameters_of(source: Callable[_P, object]) -> Callable[[Callable[..., _R]], Callable[_P, _R]]:
    """Declares the decorated function with ``source``'s parameters, for type checkers and in its
    signature (help(), inspect); the function passes its arguments on to ``source``."""

    def declare(function: Callable[..., _R]) -> Callable[_P, _R]:
        returns = inspect.signature(function).return_annotation
        cast(Any, function).__signature__ = inspect.signature(source).replace(return_annotation=returns)
        return function

    return declare


def _request(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Request:
    """The parameters of a call of ``name``; a wrong argument is a TypeError naming ``name``."""
    try:
        return _Request(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(str(exc).replace("_Request.__init__()", f"{name}()")) from None


@_parameters_of(_Request)
def generate(*args: Any, **kwargs: Any) -> Any:
    """Generate up to ``max_new_tokens`` tokens after ``prompt``.

    ``prompt``: a str (returns the new text), a list of token ids (returns prompt + new ids, as
    transformers does, the stopping token included), or a list of either (a batch: returns a list).
    Generation of a row stops at an end-of-sequence id (the tokenizer's, unless ``ignore_eos``), at one
    of ``stop_token_ids``, or when its text contains one of the ``stop`` strings (the text is cut
    before it). ``temperature=0`` is
    greedy; the same ``seed`` gives the same tokens. ``model.last_stats`` holds the timing.

    ``strategy``: how the decode steps run (pygpukit.llm.decode): ``"graph"`` (the whole step one
    CUDA graph replay), ``"m1"`` (preallocated buffers, no per-step allocation) or ``"eager"``. The
    default is "graph" on the CUDA backend for batch 1 when the model and sampling allow it, else
    "m1". ``"batch"`` decodes the prompts together with DecodeBatch (each row stops on its own;
    options ``batch_size``, ``graph``); ``"speculative"`` (DecodeSpeculative: options ``draft``,
    ``draft_layers``, ``num_draft_tokens``, ``graph``) and ``"jacobi"`` (DecodeJacobi: options
    ``window``, ``graph``) produce several tokens per forward, for one prompt, greedy only. ``strategy_options``
    holds those options. An explicit strategy that cannot run raises UnsupportedStrategyError."""
    request = _request("generate", args, kwargs)
    prompts, kind = request.prompts()
    run, stop_ids = request.run(prompts)
    batch = len(prompts)
    new_ids: list[list[int]] = [[] for _ in range(batch)]
    texts = [""] * batch
    for row, token, piece, _ in request.events(run, stop_ids):
        texts[row] += piece
        if token is not None:
            new_ids[row].append(token)
    request.model.last_stats = run.stats
    if kind in ("text", "texts"):
        return texts[0] if kind == "text" else texts
    results = [p + n for p, n in zip(prompts, new_ids, strict=True)]
    return results[0] if kind == "ids" else results


@_parameters_of(_Request)
def generate_stream(*args: Any, **kwargs: Any) -> Iterator[str]:
    """Like :func:`generate` for one prompt (a str or token ids), yielding the new text in pieces as
    the tokens are sampled; the pieces never split a UTF-8 character and never show a stop string."""
    request = _request("generate_stream", args, kwargs)
    prompts, kind = request.prompts()
    if kind not in ("text", "ids"):
        raise ArgumentError("generate_stream takes one prompt; use generate for a batch")
    _tokenizer(request.model)
    run, stop_ids = request.run(prompts)
    try:
        for _, _, piece, _ in request.events(run, stop_ids):
            if piece:
                yield piece
    finally:
        request.model.last_stats = run.stats
