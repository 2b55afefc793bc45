"""Fuzz target: audio files read by pygpukit.audio.io.load (libsndfile through soundfile: WAV, FLAC, OGG ...).

Contract: any file decodes to float samples of the documented layout, or raises AudioFileError (an
ArgumentError for an offset past the end). libsndfile is C: atheris cannot trace its coverage, but any
crash in it still ends the run with the input saved. The first input byte chooses ``mono`` and an
offset/duration; the rest is the file.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import instrumented, main, scratch_dir

with instrumented("pygpukit.audio.io"):
    from pygpukit.audio.io import AudioFileError, load
    from pygpukit.core.errors import ArgumentError

ERRORS = (AudioFileError, ArgumentError)
_FILE = scratch_dir("audio") / "input.audio"


def seeds() -> list[bytes]:
    import soundfile

    rng = np.random.default_rng(11)
    tone = np.sin(np.arange(800) / 7.0)[:, None] * np.array([[0.5, -0.25]])
    found = []
    for fmt, subtype, channels in (("WAV", "PCM_16", 1), ("WAV", "FLOAT", 2), ("FLAC", "PCM_24", 2),
                                   ("WAV", "PCM_U8", 1), ("OGG", "VORBIS", 1)):  # fmt: skip
        buffer = io.BytesIO()
        data = tone[:, :channels] + 0.01 * rng.standard_normal((800, channels))
        soundfile.write(buffer, data, 8000, format=fmt, subtype=subtype)
        found.append(b"\x00" + buffer.getvalue())
    return found


def one_input(data: bytes) -> None:
    if not data:
        return
    _FILE.write_bytes(data[1:])
    mono = bool(data[0] & 1)
    offset = (data[0] >> 1 & 3) * 0.01
    duration = None if data[0] & 8 else 0.05
    try:
        samples, rate = load(_FILE, mono=mono, offset=offset, duration=duration)
    except ERRORS:
        return
    assert isinstance(rate, int)
    assert samples.ndim == 1 or (samples.ndim == 2 and not mono), samples.shape
    assert samples.dtype.name == "float32"


if __name__ == "__main__":
    main("audio", one_input, seeds)
