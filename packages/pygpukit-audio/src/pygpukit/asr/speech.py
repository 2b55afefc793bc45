"""Optional voice activity detection for transcription (``transcribe(..., vad_filter=True)``): the speech
stretches found by :class:`pygpukit.audio.VAD` (frame energy within ``top_db`` of the loudest frame),
widened by ``speech_pad`` seconds, short pauses closed, are cut out and concatenated; the transcript's
timestamps are then mapped back to the original recording (a timestamp on a boundary between two chunks
goes to the earlier chunk when it ends a segment, as faster-whisper's restore_speech_timestamps)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray
from pygpukit.core.errors import ArgumentError

__all__ = ["SpeechMap", "VadOptions", "concatenate_chunks", "speech_chunks"]

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class VadOptions:
    """``top_db``: frames quieter than the loudest by more than this are silence; ``min_speech_duration``
    and ``min_silence_duration`` (s) drop short bursts and close short pauses; ``speech_pad`` (s) widens
    every stretch on both sides; a recording whose peak amplitude is below ``silence_peak`` has no speech."""

    top_db: float = 40.0
    min_speech_duration: float = 0.25
    min_silence_duration: float = 2.0
    speech_pad: float = 0.4
    silence_peak: float = 1e-4

    @classmethod
    def of(cls, value: Any) -> VadOptions:
        if value is None:
            return cls()
        if isinstance(value, VadOptions):
            return value
        if isinstance(value, dict):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise ArgumentError(f"vad_options: unknown keys {sorted(unknown)}")
            return cls(**{k: float(v) for k, v in value.items()})
        raise ArgumentError(f"vad_options must be a dict or VadOptions, got {type(value).__name__}")


class SpeechMap:
    """Maps times in the concatenated speech back to the recording: ``chunks`` are [start, end) samples."""

    def __init__(self, chunks: list[tuple[int, int]]) -> None:
        self.chunks = chunks
        self.offsets: list[float] = []  # start of each chunk in the concatenation (s)
        total = 0
        for start, end in chunks:
            self.offsets.append(total / SAMPLE_RATE)
            total += end - start
        self.ends = [*self.offsets[1:], total / SAMPLE_RATE]

    def original(self, t: float, is_end: bool = False) -> float:
        index = bisect.bisect_right(self.offsets, t) - 1
        index = max(index, 0)
        if is_end and index > 0 and abs(t - self.offsets[index]) < 1e-9:
            index -= 1  # a segment ending exactly at a chunk boundary belongs to the earlier chunk
        return round(self.chunks[index][0] / SAMPLE_RATE + (t - self.offsets[index]), 3)


def speech_chunks(samples: GPUArray, options: VadOptions) -> list[tuple[int, int]]:
    """The [start, end) sample ranges to transcribe (padded, merged where they touch)."""
    from pygpukit.audio import VAD
    from pygpukit.ops import abs as absolute
    from pygpukit.ops import max as amax

    length = int(samples.shape[0])
    if length == 0 or float(amax(absolute(samples)).to_numpy()) < options.silence_peak:
        return []  # digital silence: the VAD's "max" reference would call all of it speech
    vad = VAD(SAMPLE_RATE, top_db=options.top_db, frame_length=400, hop_length=160,
              min_speech_duration=options.min_speech_duration,
              min_silence_duration=options.min_silence_duration)  # fmt: skip
    pad = round(options.speech_pad * SAMPLE_RATE)
    merged: list[list[int]] = []
    for start, end in np.asarray(vad.intervals(samples)).tolist():
        lo, hi = max(0, start - pad), min(length, end + pad)
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def concatenate_chunks(samples: GPUArray, chunks: list[tuple[int, int]]) -> GPUArray:
    from pygpukit.ops import concatenate

    parts = [samples[lo:hi] for lo, hi in chunks]
    return parts[0].contiguous() if len(parts) == 1 else concatenate([p.contiguous() for p in parts], axis=0)
