"""Whisper's log-mel front end against a float64 NumPy implementation of transformers' feature extractor."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pygpukit.asr.features import log_mel_batch, log_mel_spectrogram, pad_or_trim, whisper_features
from pygpukit.core.array import asarray
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("seconds", [0.3, 4.0, 31.0])
def test_whisper_features_match_transformers_algorithm(n_mels: int, seconds: float) -> None:
    rng = np.random.default_rng(int(seconds * 10) + n_mels)
    audio = (0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32)
    ours = whisper_features(audio, n_mels).to_numpy()
    expected = ref.features(audio.astype(np.float64), n_mels)
    assert ours.shape == expected.shape == (n_mels, 3000)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-5)


def test_batched_features_equal_single_rows() -> None:
    rng = np.random.default_rng(5)
    audio = (0.2 * rng.standard_normal((2, 16000))).astype(np.float32)
    batch = whisper_features(audio).to_numpy()
    for row in range(2):
        np.testing.assert_allclose(batch[row], ref.features(audio[row].astype(np.float64)), rtol=0, atol=1e-5)


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_batch_equals_each_signal_alone(n_mels: int) -> None:
    """Signals of different lengths (shorter than a window, shorter than the reflection, a loud one that
    sets its own clamp) in one batch: each item equals log_mel_spectrogram of that signal alone, also
    against the float64 reference."""
    rng = np.random.default_rng(8)
    lengths = (16000 * 3 + 17, 150, 1, 16000, 8000 * 5 + 3)
    signals = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in lengths]
    signals[3] *= 50.0
    batch = log_mel_batch([asarray(s) for s in signals], n_mels, padding=160)
    assert len(batch) == len(signals)
    for signal, got in zip(signals, batch, strict=True):
        alone = log_mel_spectrogram(asarray(signal), n_mels, padding=160).to_numpy()
        assert got.shape == alone.shape == (n_mels, max(signal.size + 160, 201) // 160)
        np.testing.assert_allclose(got.to_numpy(), alone, rtol=0, atol=1e-6)
        padded = np.pad(signal.astype(np.float64), (0, 160 + max(0, 201 - signal.size - 160)))
        np.testing.assert_allclose(got.to_numpy(), ref.features(padded, n_mels, total=None), rtol=0, atol=1e-5)
    assert log_mel_batch([]) == []
    with pytest.raises(ShapeError, match="1-D"):
        log_mel_batch([asarray(np.zeros(500, np.float32)), asarray(np.zeros((2, 500), np.float32))])
    with pytest.raises(ArgumentError, match="padding"):
        log_mel_batch([np.zeros(1000, np.float32)], padding=-1)


def test_float64_audio_and_padding() -> None:
    rng = np.random.default_rng(6)
    audio = rng.standard_normal(16000 * 2) * 0.05
    ours = log_mel_spectrogram(asarray(audio), 80, padding=160).to_numpy()
    expected = ref.features(np.pad(audio, (0, 160)), 80, total=None)
    assert ours.shape == expected.shape == (80, 201)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-9)
    padded = pad_or_trim(asarray(ours)).to_numpy()
    assert padded.shape == (80, 3000)
    assert not padded[:, 201:].any()
    np.testing.assert_array_equal(pad_or_trim(asarray(expected), 100).to_numpy(), expected[:, :100])


@pytest.mark.audio_data
def test_real_speech_features(speech_16k: list[Path]) -> None:
    import soundfile as sf

    clip = next(p for p in speech_16k if p.name == "001.wav")
    audio, rate = sf.read(clip, dtype="float32")
    assert rate == 16000
    np.testing.assert_allclose(whisper_features(audio).to_numpy(), ref.features(audio.astype(np.float64)), atol=1e-5)


def test_bad_inputs_raise_typed_errors() -> None:
    with pytest.raises(ArgumentError, match="n_mels"):
        whisper_features(np.zeros(100, np.float32), 40)
    with pytest.raises(ShapeError, match=r"\(2, 2, 2\)"):
        whisper_features(np.zeros((2, 2, 2), np.float32))
    with pytest.raises(DTypeError, match="int32"):
        log_mel_spectrogram(asarray(np.zeros(100, np.int32)))
    with pytest.raises(ArgumentError, match="padding"):
        log_mel_spectrogram(np.zeros(1000, np.float32), padding=-1)
