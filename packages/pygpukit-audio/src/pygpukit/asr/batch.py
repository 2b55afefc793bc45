"""Batched transcription of many recordings: ``transcribe_batch(model, [a, b, ...], batch_size=16, ...)``.

Up to ``batch_size`` recordings go through :func:`~pygpukit.asr.longform.transcription` in lockstep: their
log-mel features are computed in one batch, and at each step the next 30 s window of every recording not
finished yet is encoded in one batch and, when decoding is greedy (temperature starting at 0,
``beam_size=1``), decoded in one batch too, each row after its own prompt (the previous text of its
recording: the graph decoder runs rows of different prompts together). Everything else (temperature
fallback, thresholds, seeking, word timestamps) is each recording's, exactly as
:func:`~pygpukit.asr.transcribe` does it, so the results equal those of transcribing the recordings one by
one. With ``vad_filter`` the recordings are transcribed one by one.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from pygpukit.core.errors import ArgumentError
from pygpukit.ops import stack

from .decoding import DecodeResult, decode_batch
from .features import HOP_LENGTH, log_mel_batch
from .graph_decode import use_graph
from .longform import DecodeRequest, EncodeRequest, TranscriptionResult, load_audio, transcribe, transcription

__all__ = ["transcribe_batch"]

Steps = Generator[EncodeRequest | DecodeRequest, Any, TranscriptionResult]


def transcribe_batch(model: Any, audios: Sequence[Any], *, batch_size: int = 16, **options: Any
                     ) -> list[TranscriptionResult]:  # fmt: skip
    """Transcribe every item of ``audios`` (paths or 16 kHz samples) with the options of
    :func:`~pygpukit.asr.transcribe` (same defaults); one result per item, in order."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"transcribe_batch: batch_size must be a positive int, got {batch_size!r}")
    if options.get("vad_filter"):
        return [transcribe(model, audio, **options) for audio in audios]
    results: list[TranscriptionResult] = []
    for begin in range(0, len(audios), batch_size):
        group = [load_audio(audio) for audio in audios[begin : begin + batch_size]]
        # The features of the whole group in one batch (each recording's are computed once).
        features = log_mel_batch(group, model.config.n_mels, padding=HOP_LENGTH)
        pairs = zip(group, features, strict=True)
        steps = [transcription(model, samples, features=mel, **options) for samples, mel in pairs]
        results.extend(_lockstep(model, steps))
    return results


def _lockstep(model: Any, steps: list[Steps]) -> list[TranscriptionResult]:
    """Drive the recordings' transcriptions window by window: the windows of a step encoded together,
    the greedy ones decoded together."""
    finished: dict[int, TranscriptionResult] = {}
    pending: dict[int, Any] = {}

    def advance(i: int, value: Any) -> None:
        try:
            pending[i] = next(steps[i]) if value is _START else steps[i].send(value)
        except StopIteration as end:
            finished[i] = end.value
            pending.pop(i, None)

    for i in range(len(steps)):
        advance(i, _START)
    width = len(steps)  # graph decoders are made per batch size: keep one size for the whole group
    while pending:
        active = sorted(pending)
        encoder_out = model.encode(stack([pending[i].window for i in active], axis=0))
        for k, i in enumerate(active):
            advance(i, encoder_out[k : k + 1])
        greedy = [(k, i) for k, i in enumerate(active) if _greedy(pending.get(i))]
        decoded: dict[int, DecodeResult] = {}
        if greedy:
            rows = [k for k, _ in greedy]
            requests = [pending[i] for _, i in greedy]
            if use_graph(model) and len(rows) < width:
                # Rows repeated up to the group's size: the same graph decoder serves every step, and a
                # repeated row ends when its original does, so the batch decodes no step more.
                rows = rows + [rows[n % len(rows)] for n in range(width - len(rows))]
                requests = requests + [requests[n % len(requests)] for n in range(width - len(requests))]
            windows = encoder_out if rows == list(range(len(active))) else stack([encoder_out[k] for k in rows], axis=0)
            results = decode_batch(model, windows, [r.prompt for r in requests], requests[0].rules,
                                   sot_index=[r.sot_index for r in requests],
                                   no_speech=model.tokenizer.no_speech)  # fmt: skip
            # the repeated rows' results are dropped
            decoded = {i: result for (_, i), result in zip(greedy, results[: len(greedy)], strict=True)}
        for i in active:
            if isinstance(pending.get(i), DecodeRequest):
                advance(i, decoded.get(i))
    return [finished[i] for i in range(len(steps))]


_START = object()


def _greedy(request: Any) -> bool:
    return isinstance(request, DecodeRequest) and request.greedy
