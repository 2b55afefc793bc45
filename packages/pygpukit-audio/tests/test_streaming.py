"""Streaming buffers and the energy VAD: the ring buffer against a Python list model, chunks against slices of
the signal, the streaming STFT against the offline stft for random chunk sizes, and VAD against
librosa.effects.split on the real recordings and on synthetic bursts."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio
from pygpukit.audio import filters
from pygpukit.core.errors import ArgumentError, ShapeError


def _lib(name: str) -> Any:
    """A reference library (librosa, soundfile), imported by the test that needs it: the GPU tests of this
    file compare with float64 loops and run where the references are not installed."""
    return pytest.importorskip(name)


Array = np.ndarray[Any, Any]


def _chunks(rng: np.random.Generator, y: Array, largest: int) -> list[Array]:
    cuts = [0]
    while cuts[-1] < y.shape[-1]:
        cuts.append(min(y.shape[-1], cuts[-1] + int(rng.integers(0, largest + 1))))
    return [y[..., a:b] for a, b in itertools.pairwise(cuts)]


def test_ring_buffer_is_a_fifo() -> None:
    rng = np.random.default_rng(0)
    ring = audio.AudioRingBuffer(100, dtype="float64")
    model: list[float] = []
    for _ in range(300):
        if rng.random() < 0.5:
            values = rng.standard_normal(int(rng.integers(0, 40)))
            if len(values) > ring.space:
                with pytest.raises(audio.BufferFullError, match="capacity 100"):
                    ring.write(values)
                continue
            ring.write(values)
            model.extend(values.tolist())
        else:
            n = int(rng.integers(0, len(model) + 1))
            np.testing.assert_array_equal(ring.peek(n), model[:n])
            np.testing.assert_array_equal(ring.read(n), model[:n])
            del model[:n]
        assert len(ring) == ring.available == len(model)
        assert ring.space == 100 - len(model)
    with pytest.raises(ArgumentError, match="available"):
        ring.read(len(model) + 1)


def test_ring_buffer_overwrite_and_channels() -> None:
    ring = audio.AudioRingBuffer(8, channels=2, dtype="float64", overwrite=True)
    data = np.arange(30, dtype=np.float64).reshape(2, 15)
    assert ring.write(data[:, :5]) == 0
    assert ring.write(data[:, 5:11]) == 3  # the three oldest are dropped
    np.testing.assert_array_equal(ring.peek(8), data[:, 3:11])
    assert ring.write(data) == 8 + 15 - 8
    np.testing.assert_array_equal(ring.read(8), data[:, 7:])
    with pytest.raises(ShapeError, match=r"\(2, n\)"):
        ring.write(np.zeros(4))
    with pytest.raises(ArgumentError, match="non-finite"):
        ring.write(np.array([[0.0], [np.nan]]))


@pytest.mark.parametrize(("chunk", "hop", "window"), [(320, None, None), (400, 160, "hann"), (256, 256, "hamming")])
def test_stream_chunks_are_windowed_slices(chunk: int, hop: int | None, window: Any) -> None:
    rng = np.random.default_rng(chunk)
    y = rng.standard_normal(5000)
    stream = audio.AudioStream(chunk, hop_size=hop, window=window, dtype="float64", capacity=4096)
    step = chunk if hop is None else hop
    w = np.ones(chunk) if window is None else filters.get_window(window, chunk)
    popped = 0
    for part in _chunks(rng, y, 700):
        stream.push(part)
        while stream.has_chunk():
            got = stream.pop_chunk().to_numpy()
            np.testing.assert_allclose(got, y[popped * step : popped * step + chunk] * w, rtol=0, atol=1e-15)
            popped += 1
    assert popped == 1 + (5000 - chunk) // step
    with pytest.raises(ArgumentError, match="has_chunk"):
        stream.pop_chunk()
    with pytest.raises(ArgumentError, match="hop_size"):
        audio.AudioStream(100, hop_size=200)


@pytest.mark.parametrize(("n_fft", "hop", "center", "channels"),
                         [(512, 128, True, None), (400, 160, True, 2), (256, 100, False, None),
                          (64, None, True, None)])  # fmt: skip
def test_streaming_stft_equals_the_offline_stft(n_fft: int, hop: int | None, center: bool,
                                                channels: int | None) -> None:  # fmt: skip
    rng = np.random.default_rng(n_fft)
    shape = (4321,) if channels is None else (channels, 4321)
    y = rng.standard_normal(shape)
    want = audio.complex_to_numpy(audio.stft(y, n_fft=n_fft, hop_length=hop, center=center))
    for largest in (1, 37, 700, 5000):
        streaming = audio.StreamingSTFT(n_fft=n_fft, hop_length=hop, center=center, channels=channels,
                                        dtype="float64")  # fmt: skip
        parts = [streaming.push(part) for part in _chunks(rng, y, largest)]
        parts.append(streaming.flush())
        got = np.concatenate([audio.complex_to_numpy(p) for p in parts if p is not None], axis=-1)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
        assert streaming.frames_out == want.shape[-1]
        assert streaming.flush() is None
        with pytest.raises(ArgumentError, match="flushed"):
            streaming.push(y[..., :10])


def test_streaming_stft_float32_and_short_streams() -> None:
    y = np.random.default_rng(1).standard_normal(3000).astype(np.float32)
    streaming = audio.StreamingSTFT(n_fft=256, hop_length=64)
    parts = [streaming.push(y[i : i + 160]) for i in range(0, 3000, 160)] + [streaming.flush()]
    got = np.concatenate([audio.complex_to_numpy(p) for p in parts if p is not None], axis=-1)
    want = audio.complex_to_numpy(audio.stft(y, n_fft=256, hop_length=64))
    assert got.dtype == np.complex64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    short = audio.StreamingSTFT(n_fft=256, hop_length=64, center=False)
    assert short.push(np.zeros(100)) is None
    with pytest.raises(ShapeError, match="too large"):
        short.flush()


def _bursts(sr: int) -> tuple[Array, list[tuple[float, float]]]:
    rng = np.random.default_rng(2)
    y = 1e-4 * rng.standard_normal(3 * sr)
    spans = [(0.5, 1.0), (1.05, 1.4), (2.0, 2.03), (2.5, 2.9)]
    for a, b in spans:
        y[int(a * sr) : int(b * sr)] += 0.3 * np.sin(2 * np.pi * 220 * np.arange(int(b * sr) - int(a * sr)) / sr)
    return y, spans


def test_vad_on_synthetic_bursts() -> None:
    sr = 16000
    y, _ = _bursts(sr)
    plain = audio.VAD(sr, top_db=30, frame_length=400, hop_length=160)
    np.testing.assert_array_equal(plain.intervals(y), _lib("librosa").effects.split(y, top_db=30, frame_length=400,
                                                                              hop_length=160))  # fmt: skip
    assert len(plain(y)) == 4
    joined = audio.VAD(sr, top_db=30, frame_length=400, hop_length=160, min_silence_duration=0.1,
                       min_speech_duration=0.1)(y)  # fmt: skip
    # the 50 ms pause closes, the 30 ms click goes
    assert [(round(s.start, 1), round(s.end, 1)) for s in joined] == [(0.5, 1.4), (2.5, 2.9)]
    assert all(isinstance(s, audio.SpeechSegment) and s.duration > 0.3 for s in joined)
    assert joined[0].start_sample == round(joined[0].start * sr)
    fixed = audio.VAD(sr, top_db=20, ref=0.3, frame_length=400, hop_length=160)(y)
    assert len(fixed) == 4
    with pytest.raises(ShapeError, match="mono"):
        plain(np.stack([y, y]))
    with pytest.raises(ShapeError, match="empty"):
        plain(np.zeros(0))
    with pytest.raises(ArgumentError, match="non-finite"):
        plain(np.array([0.0, np.inf]))
    with pytest.raises(ArgumentError, match="sr"):
        audio.VAD(0)


@pytest.mark.audio_data
def test_vad_matches_librosa_split_on_real_recordings(speech_16k: list[Path], speech_8k: list[Path]) -> None:
    for path in [*speech_16k[:4], *speech_8k[:4]]:
        y, sr = _lib("soundfile").read(str(path), dtype="float64")
        for top_db in (20, 30, 40):
            got = audio.VAD(sr, top_db=top_db).intervals(y)
            np.testing.assert_array_equal(got, _lib("librosa").effects.split(y, top_db=top_db), err_msg=str(path))
        segments = audio.VAD(sr, top_db=30, min_silence_duration=0.3, min_speech_duration=0.1)(y)
        assert segments, path
        assert all(0 <= s.start < s.end <= len(y) / sr for s in segments)
        assert all(a.end < b.start for a, b in itertools.pairwise(segments))
