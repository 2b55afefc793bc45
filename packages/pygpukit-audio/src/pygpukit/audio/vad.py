"""Energy-based voice activity detection: :class:`VAD` finds the stretches of a mono signal whose frame
energy is within ``top_db`` decibels of the loudest frame's (or above an absolute ``ref``), as
librosa.effects.split does, and returns them as :class:`SpeechSegment`s, after closing pauses shorter than
``min_silence_duration`` and dropping bursts shorter than ``min_speech_duration``.

The frame RMS (:func:`~pygpukit.audio.rms`, centred frames) runs on the device; the per-frame decisions
(a few values a second) are made on the host. With both durations 0 the segments are exactly
librosa.effects.split(y, top_db=..., frame_length=..., hop_length=...)'s intervals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pygpukit.core.errors import ShapeError

from ._common import Array, as_signal, number, positive_int
from .features import rms

__all__ = ["VAD", "SpeechSegment"]


@dataclass(frozen=True)
class SpeechSegment:
    """A stretch of speech: ``start`` and ``end`` in seconds (end exclusive), and the same in samples."""

    start: float
    end: float
    start_sample: int
    end_sample: int

    @property
    def duration(self) -> float:
        return self.end - self.start


class VAD:
    """Energy-based voice activity detection at sample rate ``sr`` (see the module's docs). ``ref`` is "max"
    (the loudest frame of each call, librosa's default) or a fixed RMS amplitude, which suits a stream."""

    def __init__(self, sr: float, *, top_db: float = 40.0, frame_length: int = 2048, hop_length: int = 512,
                 ref: Any = "max", min_speech_duration: float = 0.0,
                 min_silence_duration: float = 0.0) -> None:  # fmt: skip
        name = "VAD"
        self.sr = number(name, "sr", sr, minimum=0.0, exclusive=True)
        self.top_db = number(name, "top_db", top_db, minimum=0.0)
        self.frame_length = positive_int(name, "frame_length", frame_length)
        self.hop_length = positive_int(name, "hop_length", hop_length)
        if not (isinstance(ref, str) and ref == "max"):
            ref = number(name, "ref", ref, minimum=0.0, exclusive=True)
        self.ref: Any = ref
        self.min_speech_duration = number(name, "min_speech_duration", min_speech_duration, minimum=0.0)
        self.min_silence_duration = number(name, "min_silence_duration", min_silence_duration, minimum=0.0)

    def active_frames(self, y: Any) -> Array:
        """Per frame, whether its energy is within top_db of the reference (bool, (n_frames,))."""
        signal = as_signal("VAD", "y", y)
        if signal.ndim != 1:
            raise ShapeError(f"VAD: y must be mono (T,), got shape {signal.shape}; mix it down first (to_mono)")
        if signal.shape[0] == 0:
            raise ShapeError("VAD: y is empty (shape (0,))")
        power = rms(signal, frame_length=self.frame_length, hop_length=self.hop_length).to_numpy()[0].astype(
            np.float64
        ) ** 2  # fmt: skip
        amin = 1e-10
        reference = float(power.max()) if self.ref == "max" else float(self.ref) ** 2
        db = 10.0 * np.log10(np.maximum(amin, power)) - 10.0 * np.log10(max(amin, reference))
        active: Array = db > -self.top_db
        return active

    def intervals(self, y: Any) -> Array:
        """(n, 2) int64 [start, end) sample intervals of speech."""
        active = self.active_frames(y)
        length = int(as_signal("VAD", "y", y).shape[-1])
        edges = np.flatnonzero(np.diff(active.astype(np.int64))) + 1
        parts = [edges]
        if active[0]:
            parts.insert(0, np.array([0]))
        if active[-1]:
            parts.append(np.array([len(active)]))
        frames = np.concatenate(parts).reshape(-1, 2)
        samples = np.minimum(frames * self.hop_length, length)
        min_gap = round(self.min_silence_duration * self.sr)
        min_len = round(self.min_speech_duration * self.sr)
        merged: list[list[int]] = []
        for start, end in samples.tolist():
            if merged and start - merged[-1][1] < min_gap:
                merged[-1][1] = end
            else:
                merged.append([start, end])
        kept = [pair for pair in merged if pair[1] - pair[0] >= min_len and pair[1] > pair[0]]
        return np.array(kept, dtype=np.int64).reshape(-1, 2)

    def __call__(self, y: Any) -> list[SpeechSegment]:
        """The speech segments of the mono signal ``y``."""
        return [SpeechSegment(s / self.sr, e / self.sr, int(s), int(e)) for s, e in self.intervals(y).tolist()]
