"""Long-form transcription: sequential 30 s windows that seek by the decoded timestamps, with temperature
fallback (compression ratio and average log-probability thresholds), no-speech detection, the previous
text as prompt, an initial prompt, and language detection for multilingual models.

The window loop follows faster-whisper's ``generate_segments`` (without word timestamps, clip timestamps
or hallucination skipping): features of the whole recording (160 samples of padding), a window of up to
3000 frames zero-padded in the feature domain, segments cut at consecutive timestamp pairs, and the seek
moved to the last complete timestamp (or the end of the window when the text ends with one timestamp).
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, asarray
from pygpukit.core.dtypes import float32
from pygpukit.core.errors import ArgumentError, PyGPUkitError

from .decoding import DecodeResult, TokenRules, decode_window
from .features import HOP_LENGTH, N_FRAMES, SAMPLE_RATE, log_mel_spectrogram, pad_or_trim
from .words import Word, add_word_timestamps

__all__ = [
    "DEFAULT_TEMPERATURES",
    "DecodeRequest",
    "EncodeRequest",
    "Segment",
    "TranscriptionResult",
    "detect_language",
    "language_probabilities",
    "load_audio",
    "transcribe",
    "transcription",
]

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
TIME_PRECISION = 0.02  # seconds per timestamp token
INPUT_STRIDE = 2  # feature frames per encoder position
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH


@dataclass
class Segment:
    """A transcribed span: start and end in seconds, its text and tokens, and how it was decoded."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None = None


@dataclass
class TranscriptionResult:
    """The transcription of one recording: the full text, the segments, the language and the duration (s)."""

    text: str
    segments: list[Segment] = field(default_factory=list)
    language: str = "en"
    duration: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def load_audio(source: Any) -> GPUArray:
    """A path (decoded with pygpukit.audio.load, mixed to mono, resampled to 16 kHz) or samples at 16 kHz
    (NumPy array or GPUArray, (samples,)) as a float32 GPUArray."""
    if isinstance(source, (str, os.PathLike)):
        from pygpukit.audio import load, resample

        samples, rate = load(source, mono=True, dtype=float32)
        if rate != SAMPLE_RATE:
            samples = resample(samples, orig_sr=rate, target_sr=SAMPLE_RATE)
        return samples
    x = source if isinstance(source, GPUArray) else asarray(np.asarray(source, dtype=np.float32))
    if x.ndim != 1:
        raise ArgumentError(f"transcribe: audio samples must be 1-D (samples,) at 16 kHz, got shape {x.shape}")
    return x if x.dtype == float32 else x.astype(float32)


def _temperatures(value: Any) -> tuple[float, ...]:
    temps = (float(value),) if isinstance(value, (int, float)) else tuple(float(t) for t in value)
    if not temps or any(t < 0 for t in temps):
        raise ArgumentError(f"transcribe: temperature must be >= 0 (a number or a sequence), got {value!r}")
    return temps


def _split(tokens: list[int], tsb: int, time_offset: float, segment_size: int, segment_duration: float,
           seek: int) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    """Segments of one window's tokens and the next seek (faster-whisper's _split_segments_by_timestamps)."""
    segments: list[dict[str, Any]] = []
    single_ending = len(tokens) >= 2 and tokens[-2] < tsb <= tokens[-1]
    consecutive = [i for i in range(1, len(tokens)) if tokens[i] >= tsb and tokens[i - 1] >= tsb]
    if consecutive:
        slices = consecutive + ([len(tokens)] if single_ending else [])
        last = 0
        for cut in slices:
            part = tokens[last:cut]
            segments.append({"seek": seek, "start": time_offset + (part[0] - tsb) * TIME_PRECISION,
                             "end": time_offset + (part[-1] - tsb) * TIME_PRECISION, "tokens": part})  # fmt: skip
            last = cut
        if single_ending:
            seek += segment_size
        else:
            seek += (tokens[last - 1] - tsb) * INPUT_STRIDE
    else:
        duration = segment_duration
        stamps = [t for t in tokens if t >= tsb]
        if stamps and stamps[-1] != tsb:
            duration = (stamps[-1] - tsb) * TIME_PRECISION
        segments.append({"seek": seek, "start": time_offset, "end": time_offset + duration, "tokens": tokens})
        seek += segment_size
    return segments, seek


def token_rules(model: Any, suppress_tokens: Sequence[int] | None, suppress_blank: bool, without_timestamps: bool,
                max_initial_timestamp: float) -> TokenRules:  # fmt: skip
    """The logit rules of a transcription with these options."""
    tok = model.tokenizer
    return TokenRules(eot=tok.eot, no_timestamps=tok.no_timestamps, timestamp_begin=tok.timestamp_begin,
                      vocab_size=model.config.n_vocab, suppress=tok.suppressed_tokens(suppress_tokens),
                      suppress_blank=(*tok.encode(" "), tok.eot) if suppress_blank else (),
                      timestamps=not without_timestamps,
                      max_initial_timestamp_index=round(max_initial_timestamp / TIME_PRECISION))  # fmt: skip


def _last_end(pieces: list[dict[str, Any]]) -> float | None:
    """faster-whisper's get_end: the end of the last word, else of the last segment."""
    for piece in reversed(pieces):
        for word in reversed(piece.get("words") or []):
            return float(word.end)
    return float(pieces[-1]["end"]) if pieces else None


def language_probabilities(model: Any, encoder_out: GPUArray) -> list[tuple[str, float]]:
    """(code, probability) of every language token, most probable first: the softmax over the language
    tokens of the logits after <|startoftranscript|> (the first window's ``encoder_out``, batch 1)."""
    tok = model.tokenizer
    state = model.new_state(encoder_out, max_len=1)
    logits = np.asarray(model.logits(model.decode(np.array([[tok.sot]]), state)[:, -1]).to_numpy(), np.float64)[0]
    ids = sorted(i for i in tok.language_tokens if i < logits.shape[0])
    chosen = logits[ids] - logits[ids].max()
    probs = np.exp(chosen) / np.exp(chosen).sum()
    order = np.argsort(-probs, kind="stable")
    return [(str(tok.language_tokens[ids[i]]), float(probs[i])) for i in order]


def _detect_language(model: Any, encoder_out: GPUArray) -> str:
    return language_probabilities(model, encoder_out)[0][0]


def detect_language(model: Any, audio: Any) -> tuple[str, float, list[tuple[str, float]]]:
    """The language of the first 30 s of ``audio`` (a path, or 16 kHz samples) as a multilingual model
    hears it: (code, its probability, every (code, probability) most probable first), as faster-whisper's
    ``detect_language``. ``transcribe`` with ``language=None`` takes the same first choice."""
    tok = model.tokenizer
    if tok is None or not tok.multilingual:
        raise ArgumentError("detect_language: needs a multilingual model with its tokenizer (this one is "
                            f"{'without a tokenizer' if tok is None else 'English-only'})")  # fmt: skip
    features = log_mel_spectrogram(load_audio(audio), model.config.n_mels, padding=HOP_LENGTH)
    window = pad_or_trim(features[:, : min(N_FRAMES, features.shape[-1] - 1)].contiguous())
    probs = language_probabilities(model, model.encode(window))
    return probs[0][0], probs[0][1], probs


def transcribe(model: Any, audio: Any, *, language: str | None = None, task: str = "transcribe",
               temperature: float | Sequence[float] = DEFAULT_TEMPERATURES, beam_size: int = 5, best_of: int = 5,
               patience: float = 1.0, length_penalty: float = 1.0, compression_ratio_threshold: float | None = 2.4,
               log_prob_threshold: float | None = -1.0, no_speech_threshold: float | None = 0.6,
               condition_on_previous_text: bool = True, prompt_reset_on_temperature: float = 0.5,
               initial_prompt: str | Sequence[int] | None = None, suppress_blank: bool = True,
               suppress_tokens: Sequence[int] | None = (-1,), without_timestamps: bool = False,
               max_initial_timestamp: float = 1.0, progress: bool | Callable[[float, float], None] = False,
               seed: int = 0, vad_filter: bool = False, vad_options: Any = None,
               word_timestamps: bool = False) -> TranscriptionResult:  # fmt: skip
    """Transcribe ``audio`` (a path, or 16 kHz samples) with ``model`` (a :class:`WhisperModel` with a
    tokenizer). ``temperature`` is tried in order while a window fails the thresholds; 0 decodes greedily
    (``beam_size`` 1) or by beam search, higher values sample ``best_of`` candidates. ``progress``: True
    for a bar on stderr, or a callable (done_seconds, total_seconds). ``vad_filter`` transcribes only the
    speech stretches found by energy-based voice activity detection (``vad_options``: a dict of
    :class:`~pygpukit.asr.speech.VadOptions` fields) and maps the timestamps back. ``word_timestamps``
    adds each segment's words with their times (cross-attention alignment, :mod:`pygpukit.asr.words`)."""
    steps = transcription(model, audio, language=language, task=task, temperature=temperature, beam_size=beam_size,
                          best_of=best_of, patience=patience, length_penalty=length_penalty,
                          compression_ratio_threshold=compression_ratio_threshold,
                          log_prob_threshold=log_prob_threshold, no_speech_threshold=no_speech_threshold,
                          condition_on_previous_text=condition_on_previous_text,
                          prompt_reset_on_temperature=prompt_reset_on_temperature, initial_prompt=initial_prompt,
                          suppress_blank=suppress_blank, suppress_tokens=suppress_tokens,
                          without_timestamps=without_timestamps, max_initial_timestamp=max_initial_timestamp,
                          progress=progress, seed=seed, vad_filter=vad_filter, vad_options=vad_options,
                          word_timestamps=word_timestamps)  # fmt: skip
    reply: Any = None
    try:
        request = next(steps)
        while True:
            # the encoder output of a window; None for its decoding: the window decodes itself
            reply = model.encode(request.window) if isinstance(request, EncodeRequest) else None
            request = steps.send(reply)
    except StopIteration as finished:
        result: TranscriptionResult = finished.value
        return result


@dataclass
class EncodeRequest:
    """What :func:`transcription` asks for first at each window: the encoder output (1, n_audio_ctx, d) of
    ``window`` (n_mels, 3000)."""

    window: GPUArray


@dataclass
class DecodeRequest:
    """What :func:`transcription` asks for next: the window's greedy decoding at temperature 0 after
    ``prompt`` (``sot_index``: the <|startoftranscript|> position), or None to let the window decode itself
    (beam search, sampling, or the caller's choice). ``greedy`` says whether a greedy result may be given
    (the first temperature is 0 and beam_size is 1)."""

    prompt: list[int]
    sot_index: int
    rules: TokenRules
    greedy: bool


def transcription(model: Any, audio: Any, *, features: GPUArray | None = None, language: str | None = None,
                  task: str = "transcribe", temperature: float | Sequence[float] = DEFAULT_TEMPERATURES,
                  beam_size: int = 5, best_of: int = 5, patience: float = 1.0, length_penalty: float = 1.0,
                  compression_ratio_threshold: float | None = 2.4, log_prob_threshold: float | None = -1.0,
                  no_speech_threshold: float | None = 0.6, condition_on_previous_text: bool = True,
                  prompt_reset_on_temperature: float = 0.5, initial_prompt: str | Sequence[int] | None = None,
                  suppress_blank: bool = True, suppress_tokens: Sequence[int] | None = (-1,),
                  without_timestamps: bool = False, max_initial_timestamp: float = 1.0,
                  progress: bool | Callable[[float, float], None] = False, seed: int = 0, vad_filter: bool = False,
                  vad_options: Any = None, word_timestamps: bool = False,
                  ) -> Generator[EncodeRequest | DecodeRequest, Any, TranscriptionResult]:  # fmt: skip
    """:func:`transcribe` of one recording as a generator, so that a driver can serve several recordings'
    windows in batches (:func:`~pygpukit.asr.transcribe_batch`): at each 30 s window it yields an
    :class:`EncodeRequest` (send the encoder output) and then a :class:`DecodeRequest` (send the greedy
    :class:`~pygpukit.asr.decoding.DecodeResult` at temperature 0, or None); it returns the
    :class:`TranscriptionResult`. ``features``: the recording's log-mel features when already computed
    (``log_mel_spectrogram(samples, n_mels, padding=HOP_LENGTH)``). Whatever the driver sends, the result
    is transcribe's: a sent result is the one the window would decode first, and the fallback to higher
    temperatures, the thresholds and the seeking are this generator's."""
    tok = model.tokenizer
    if tok is None:
        raise PyGPUkitError("transcribe: the model has no tokenizer (tokenizer.json beside the weights)")
    if task not in ("transcribe", "translate"):
        raise ArgumentError(f"transcribe: task must be 'transcribe' or 'translate', got {task!r}")
    if task == "translate" and not tok.multilingual:
        raise ArgumentError("transcribe: task='translate' needs a multilingual model (this one is English-only)")
    if language is not None and not tok.multilingual and language != "en":
        raise ArgumentError(f"transcribe: the model is English-only, language {language!r} is not possible")
    temps = _temperatures(temperature)
    samples = load_audio(audio)
    speech_map = None
    if vad_filter:
        from .speech import SpeechMap, VadOptions, concatenate_chunks, speech_chunks

        chunks = speech_chunks(samples, VadOptions.of(vad_options))
        if not chunks:
            return TranscriptionResult("", [], language or "en", round(samples.shape[0] / SAMPLE_RATE, 3))
        speech_map = SpeechMap(chunks)
        full_duration = samples.shape[0] / SAMPLE_RATE
        samples = concatenate_chunks(samples, chunks)
        features = None  # the features of the speech stretches, not of the recording
    if features is None:
        features = log_mel_spectrogram(samples, model.config.n_mels, padding=HOP_LENGTH)
    content_frames = features.shape[-1] - 1
    duration = content_frames / FRAMES_PER_SECOND
    tsb = tok.timestamp_begin
    rules = token_rules(model, suppress_tokens, suppress_blank, without_timestamps, max_initial_timestamp)
    greedy = beam_size == 1 and temps[0] == 0.0
    all_tokens: list[int] = []
    if initial_prompt is not None:
        all_tokens.extend(tok.encode(" " + initial_prompt.strip()) if isinstance(initial_prompt, str)
                          else [int(t) for t in initial_prompt])  # fmt: skip
    prompt_reset_since = 0
    last_speech_timestamp = 0.0
    segments: list[Segment] = []
    rng = np.random.default_rng(seed)
    bar = _progress(progress, duration)
    seek = 0
    ctx = model.config.n_text_ctx
    while seek < content_frames:
        time_offset = seek / FRAMES_PER_SECOND
        segment_size = min(N_FRAMES, content_frames - seek)
        segment_duration = segment_size / FRAMES_PER_SECOND
        window = pad_or_trim(features[:, seek : seek + segment_size].contiguous())
        encoder_out = yield EncodeRequest(window)
        if tok.multilingual and language is None:
            language = _detect_language(model, encoder_out)
        previous = all_tokens[prompt_reset_since:]
        prompt = ([tok.sot_prev, *previous[-(ctx // 2 - 1) :]]) if previous else []
        sot_index = len(prompt)
        prompt += tok.sot_sequence(language, task)
        if without_timestamps:
            prompt.append(tok.no_timestamps)
        precomputed = yield DecodeRequest(prompt, sot_index, rules, greedy)
        result = _with_fallback(model, encoder_out, prompt, rules, sot_index, tok.no_speech, temps, beam_size,
                                best_of, patience, length_penalty, compression_ratio_threshold, log_prob_threshold,
                                no_speech_threshold, rng, precomputed if greedy else None)  # fmt: skip
        previous_seek = seek
        if (
            no_speech_threshold is not None
            and result.no_speech_prob > no_speech_threshold
            and not (log_prob_threshold is not None and result.avg_logprob > log_prob_threshold)
        ):
            seek += segment_size
            bar(min(content_frames, seek) / FRAMES_PER_SECOND)
            continue
        ratio = compression_ratio(tok.decode(result.tokens).strip())
        pieces, seek = _split(result.tokens, tsb, time_offset, segment_size, segment_duration, seek)
        if word_timestamps:
            add_word_timestamps(model, pieces, encoder_out, segment_size, last_speech_timestamp,
                                tok.sot_sequence(language, task), FRAMES_PER_SECOND)  # fmt: skip
            tokens = result.tokens
            if not (len(tokens) >= 2 and tokens[-2] < tsb <= tokens[-1]):  # not a single timestamp ending
                last_word_end = _last_end(pieces)
                if last_word_end is not None and last_word_end > time_offset:
                    seek = round(last_word_end * FRAMES_PER_SECOND)
            last_word_end = _last_end(pieces)
            if last_word_end is not None:
                last_speech_timestamp = last_word_end
        for piece in pieces:
            text = tok.decode(piece["tokens"])
            if piece["start"] == piece["end"] or not text.strip():
                continue
            all_tokens.extend(piece["tokens"])
            segments.append(Segment(len(segments) + 1, previous_seek, round(piece["start"], 3), round(piece["end"], 3),
                                    text, piece["tokens"], result.temperature, result.avg_logprob, ratio,
                                    result.no_speech_prob, piece.get("words")))  # fmt: skip
        if not condition_on_previous_text or result.temperature > prompt_reset_on_temperature:
            prompt_reset_since = len(all_tokens)
        bar(min(content_frames, seek) / FRAMES_PER_SECOND)
    bar(None)
    if speech_map is not None:
        for segment in segments:
            segment.start = speech_map.original(segment.start)
            segment.end = speech_map.original(segment.end, is_end=True)
            for word in segment.words or ():
                word.start = speech_map.original(word.start)
                word.end = speech_map.original(word.end, is_end=True)
        duration = full_duration
    text = "".join(s.text for s in segments).strip()
    return TranscriptionResult(text, segments, language or "en", round(duration, 3))


def _with_fallback(model: Any, encoder_out: GPUArray, prompt: list[int], rules: TokenRules, sot_index: int,
                   no_speech: int, temps: tuple[float, ...], beam_size: int, best_of: int, patience: float,
                   length_penalty: float, cr_threshold: float | None, lp_threshold: float | None,
                   ns_threshold: float | None, rng: np.random.Generator,
                   precomputed: DecodeResult | None = None) -> DecodeResult:  # fmt: skip
    """faster-whisper's generate_with_fallback: the first temperature whose result passes the thresholds
    (``precomputed``: the result at the first temperature, decoded already)."""
    tok = model.tokenizer
    results: list[tuple[DecodeResult, float]] = []
    below_cr: list[tuple[DecodeResult, float]] = []
    temperature = temps[0]
    for index, temperature in enumerate(temps):
        if index == 0 and precomputed is not None:
            result = precomputed
        else:
            result = decode_window(model, encoder_out, prompt, rules, sot_index=sot_index, no_speech=no_speech,
                                   temperature=temperature, beam_size=beam_size if temperature == 0 else 1,
                                   best_of=best_of if temperature > 0 else 1, patience=patience,
                                   length_penalty=length_penalty, rng=rng)  # fmt: skip
        ratio = compression_ratio(tok.decode(result.tokens).strip())
        results.append((result, ratio))
        fallback = False
        if cr_threshold is not None:
            if ratio > cr_threshold:
                fallback = True
            else:
                below_cr.append((result, ratio))
        if lp_threshold is not None and result.avg_logprob < lp_threshold:
            fallback = True
        if (ns_threshold is not None and result.no_speech_prob > ns_threshold and lp_threshold is not None
                and result.avg_logprob < lp_threshold):  # fmt: skip
            fallback = False  # silence
        if not fallback:
            return result
    best = max(below_cr or results, key=lambda r: r[0].avg_logprob)[0]
    best.temperature = temperature
    return best


def _progress(progress: Any, total: float) -> Callable[[float | None], None]:
    if callable(progress):
        return lambda done: None if done is None else progress(done, total)
    if not progress:
        return lambda done: None
    from tqdm.auto import tqdm

    bar = tqdm(total=round(total, 2), unit="s", file=sys.stderr, desc="transcribe")

    def update(done: float | None) -> None:
        if done is None:
            bar.close()
        else:
            bar.update(round(done, 2) - bar.n)

    return update
