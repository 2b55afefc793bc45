"""Streaming transcription: audio arrives in pieces, segments come out as partial (may still change) and
final (will not change).

``StreamingTranscriber(model, chunk_length=5.0, overlap=1.0, **options)``: :meth:`feed` appends 16 kHz
samples and, every ``chunk_length`` seconds of new audio, transcribes the buffer of not yet final audio
(at most 30 s) with :func:`~pygpukit.asr.transcribe` (greedy by default). Segments that end at least
``overlap`` seconds before the buffer's end are final: they are emitted once with ``final=True`` and their
audio leaves the buffer; the text of the last final segments conditions the next decode (as the previous
window's text does in long-form transcription). The others are emitted as partial and decoded again with
more audio. :meth:`finish` transcribes what is left and makes it final.

Latency: a spoken word shows up as partial at the first decode after it, that is within ``chunk_length``
seconds plus the decode time, and becomes final at the first decode that has ``overlap`` seconds of audio
after it, within ``chunk_length + overlap`` seconds plus the decode time (or at :meth:`finish`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray
from pygpukit.core.errors import ArgumentError

from . import longform

__all__ = ["StreamSegment", "StreamingTranscriber", "transcribe_streaming"]

SAMPLE_RATE = 16000
_MAX_BUFFER = 30.0
_PROMPT_TOKENS = 223


@dataclass
class StreamSegment:
    """A segment of the stream: start and end (seconds from the stream's start), text, and whether final."""

    start: float
    end: float
    text: str
    final: bool


class StreamingTranscriber:
    """Incremental transcription of a 16 kHz stream (see the module's documentation)."""

    def __init__(self, model: Any, *, chunk_length: float = 5.0, overlap: float = 1.0, **options: Any) -> None:
        if not 0 < chunk_length <= 25:
            raise ArgumentError(f"chunk_length must be in (0, 25] seconds, got {chunk_length}")
        if not 0 <= overlap < _MAX_BUFFER - chunk_length:
            raise ArgumentError(f"overlap must be in [0, {_MAX_BUFFER - chunk_length}) seconds, got {overlap}")
        if options.get("vad_filter"):
            raise ArgumentError("StreamingTranscriber does not take vad_filter (its buffer is the unit of decoding)")
        self.model = model
        self.chunk_length = float(chunk_length)
        self.overlap = float(overlap)
        options.setdefault("beam_size", 1)
        options.setdefault("temperature", 0.0)
        self.options = options
        self._prompt: list[int] = []
        initial = options.pop("initial_prompt", None)
        if initial is not None:
            tok = model.tokenizer
            self._prompt = tok.encode(" " + initial.strip()) if isinstance(initial, str) else [int(t) for t in initial]
        self._buffer = np.zeros(0, np.float32)
        self._offset = 0.0  # stream time of the buffer's first sample
        self._pending = 0  # samples fed since the last decode
        self.decodes = 0

    def feed(self, samples: Any) -> list[StreamSegment]:
        """Append samples ((n,) at 16 kHz); returns the segments of a decode when one ran, else []."""
        values = samples.to_numpy() if isinstance(samples, GPUArray) else np.asarray(samples)
        if values.ndim != 1:
            raise ArgumentError(f"feed: samples must be 1-D (n,) at 16 kHz, got shape {values.shape}")
        self._buffer = np.concatenate([self._buffer, values.astype(np.float32, copy=False)])
        self._pending += len(values)
        if self._pending < self.chunk_length * SAMPLE_RATE:
            return []
        self._pending = 0
        return self._decode(final=False)

    def finish(self) -> list[StreamSegment]:
        """Transcribe the rest of the buffer; every returned segment is final."""
        if len(self._buffer) == 0:
            return []
        return self._decode(final=True)

    def _decode(self, final: bool) -> list[StreamSegment]:
        buffer = self._buffer[: int(_MAX_BUFFER * SAMPLE_RATE)]
        duration = len(buffer) / SAMPLE_RATE
        prompt = self._prompt[-_PROMPT_TOKENS:] or None
        result = longform.transcribe(self.model, buffer, initial_prompt=prompt, **self.options)
        self.decodes += 1
        segments = result.segments
        if final:
            cut = len(segments)
        else:
            cut = sum(1 for s in segments if s.end <= duration - self.overlap)
            if cut == 0 and len(self._buffer) >= (_MAX_BUFFER - self.chunk_length) * SAMPLE_RATE and segments:
                cut = max(1, len(segments) - 1)  # keep the buffer within one window
        out = [StreamSegment(round(self._offset + s.start, 3), round(self._offset + s.end, 3), s.text, i < cut)
               for i, s in enumerate(segments)]  # fmt: skip
        if cut:
            end = duration if final else min(segments[cut - 1].end, duration)
            for segment in segments[:cut]:
                self._prompt.extend(segment.tokens)
            drop = round(end * SAMPLE_RATE)
            self._buffer = self._buffer[drop:]
            self._offset += drop / SAMPLE_RATE
        if final:
            self._buffer = np.zeros(0, np.float32)
        return out


def transcribe_streaming(model: Any, chunks: Iterable[Any], *, chunk_length: float = 5.0, overlap: float = 1.0,
                         **options: Any) -> Iterator[StreamSegment]:  # fmt: skip
    """Feed ``chunks`` (pieces of 16 kHz audio, any sizes) to a :class:`StreamingTranscriber` and yield its
    partial and final segments as they come, ending with the final segments of the rest."""
    streamer = StreamingTranscriber(model, chunk_length=chunk_length, overlap=overlap, **options)
    for chunk in chunks:
        yield from streamer.feed(chunk)
    yield from streamer.finish()
