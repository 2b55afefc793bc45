"""Batched transcription of many recordings: ``transcribe_batch(model, [a, b, ...], batch_size=16, ...)``.

The first 30 s window of up to ``batch_size`` recordings is encoded in one batch and, when decoding is
greedy (temperature starting at 0, ``beam_size=1``) with a known language, decoded in one batch too (the
windows share their prompt); every later step (temperature fallback, further windows of long recordings,
word timestamps) runs per recording exactly as :func:`~pygpukit.asr.transcribe` does, so the results equal
those of transcribing the recordings one by one. Recordings of at most 30 s, the common case, are then
transcribed entirely in batches. With ``vad_filter`` the recordings are transcribed one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pygpukit.core.errors import ArgumentError

from .decoding import decode_batch
from .features import HOP_LENGTH, N_FRAMES, log_mel_batch, pad_or_trim
from .longform import DEFAULT_TEMPERATURES, TranscriptionResult, load_audio, token_rules, transcribe

__all__ = ["transcribe_batch"]


def transcribe_batch(model: Any, audios: Sequence[Any], *, batch_size: int = 16, **options: Any
                     ) -> list[TranscriptionResult]:  # fmt: skip
    """Transcribe every item of ``audios`` (paths or 16 kHz samples) with the options of
    :func:`~pygpukit.asr.transcribe` (same defaults); one result per item, in order."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"transcribe_batch: batch_size must be a positive int, got {batch_size!r}")
    if options.get("vad_filter"):
        return [transcribe(model, audio, **options) for audio in audios]
    tok = model.tokenizer
    temps = options.get("temperature", DEFAULT_TEMPERATURES)
    first_temp = float(temps) if isinstance(temps, (int, float)) else float(next(iter(temps)))
    language = options.get("language")
    greedy = options.get("beam_size", 5) == 1 and first_temp == 0.0 and (language is not None or not tok.multilingual)
    results: list[TranscriptionResult] = []
    for begin in range(0, len(audios), batch_size):
        group = [load_audio(audio) for audio in audios[begin : begin + batch_size]]
        # The features of the whole group in one batch (they go to transcribe below: each recording's are
        # computed once).
        features = log_mel_batch(group, model.config.n_mels, padding=HOP_LENGTH)
        windows = [pad_or_trim(mel[:, : min(N_FRAMES, max(mel.shape[-1] - 1, 1))].contiguous()) for mel in features]
        from pygpukit.ops import stack

        encoder_out = model.encode(stack(windows, axis=0))
        decoded: list[Any] = [None] * len(group)
        if greedy:
            prompt = _first_prompt(model, options)
            get = options.get
            rules = token_rules(model, get("suppress_tokens", (-1,)), get("suppress_blank", True),
                                get("without_timestamps", False), get("max_initial_timestamp", 1.0))  # fmt: skip
            sot_index = prompt.index(tok.sot)
            decoded = decode_batch(model, encoder_out, prompt, rules, sot_index=sot_index, no_speech=tok.no_speech)
        for row, samples in enumerate(group):
            first = (encoder_out[row : row + 1], decoded[row], features[row])
            results.append(transcribe(model, samples, _first=first, **options))
    return results


def _first_prompt(model: Any, options: dict[str, Any]) -> list[int]:
    """The prompt of a recording's first window (the same for every recording)."""
    tok = model.tokenizer
    initial = options.get("initial_prompt")
    previous: list[int] = []
    if initial is not None:
        previous = tok.encode(" " + initial.strip()) if isinstance(initial, str) else [int(t) for t in initial]
    ctx = model.config.n_text_ctx
    prompt = [tok.sot_prev, *previous[-(ctx // 2 - 1) :]] if previous else []
    prompt += tok.sot_sequence(options.get("language"), options.get("task", "transcribe"))
    if options.get("without_timestamps", False):
        prompt.append(tok.no_timestamps)
    return prompt
