"""Whisper's log-mel front end against a float64 NumPy implementation of transformers' feature extractor."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pygpukit.asr.features import log_mel_spectrogram, pad_or_trim, whisper_features
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
