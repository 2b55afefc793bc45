"""trim and split against librosa (identical intervals), the Butterworth high-pass against scipy (float64,
batched), short-term energy, the noise gate and the spectral gate against NumPy float64 references, load(sr=)
resampling, and typed errors. The GPU-marked test checks the IIR and gate kernels against the module's NumPy
paths where librosa and scipy are absent."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio
from pygpukit.audio import dynamics
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

Array = np.ndarray[Any, Any]


def _lib(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not installed")


def _gappy(seed: int = 0, n: int = 30000) -> Array:
    """A batch (2, T) of noise with quiet stretches of different depths (-40 to -120 dB)."""
    rng = np.random.default_rng(seed)
    y = 0.2 * rng.standard_normal((2, n))
    y[:, :4000] *= 1e-4
    y[0, 9000:13000] *= 1e-2
    y[1, 15000:21000] *= 1e-6
    y[:, 26000:] *= 1e-3
    return y


@pytest.mark.parametrize("kw", [
    {}, {"top_db": 30}, {"top_db": 50, "frame_length": 1024, "hop_length": 256}, {"top_db": 20, "ref": 0.05},
    {"top_db": 45, "aggregate": np.mean},
])  # fmt: skip
def test_trim_and_split_match_librosa(kw: dict[str, Any]) -> None:
    librosa = _lib("librosa")
    y = _gappy(1)
    for signal in (y, y[0], y[1]):
        np.testing.assert_array_equal(audio.split(signal, **kw), librosa.effects.split(signal, **kw))
        got, index = audio.trim(signal, **kw)
        want, want_index = librosa.effects.trim(signal, **kw)
        np.testing.assert_array_equal(index, want_index)
        np.testing.assert_array_equal(got.to_numpy(), want)


@pytest.mark.audio_data
def test_trim_and_split_on_real_speech(speech_8k: list[Path]) -> None:
    librosa = _lib("librosa")
    sf = _lib("soundfile")
    for path in speech_8k[:4]:
        y = sf.read(str(path), dtype="float64")[0]
        for top_db in (20, 40, 60):
            np.testing.assert_array_equal(audio.split(y, top_db=top_db), librosa.effects.split(y, top_db=top_db))
            np.testing.assert_array_equal(audio.trim(y, top_db=top_db)[1], librosa.effects.trim(y, top_db=top_db)[1])


@pytest.mark.parametrize(("order", "cutoff", "sr"), [(1, 100.0, 16000), (2, 80.0, 8000), (4, 300.0, 22050),
                                                     (5, 1000.0, 44100), (8, 60.0, 16000)])  # fmt: skip
def test_highpass_matches_scipy(order: int, cutoff: float, sr: int) -> None:
    signal = _lib("scipy.signal")
    y = np.random.default_rng(order).standard_normal((3, 4000))
    sos = signal.butter(order, cutoff, "highpass", fs=sr, output="sos")
    np.testing.assert_allclose(dynamics.butter_highpass_sos(order, cutoff, sr).prod(axis=0), sos.prod(axis=0),
                               rtol=1e-9)  # fmt: skip
    want = signal.sosfilt(sos, y)
    got = audio.highpass_filter(y, sr=sr, cutoff=cutoff, order=order)
    assert float(np.abs(got.to_numpy() - want).max() / np.abs(want).max()) <= 1e-9


def _rms_frames(y: Array, frame: int, hop: int) -> Array:
    padded = np.pad(y, [(0, 0)] * (y.ndim - 1) + [(frame // 2, frame // 2)])
    frames = np.lib.stride_tricks.sliding_window_view(padded, frame, axis=-1)[..., ::hop, :]
    result: Array = np.sqrt(np.mean(frames**2, axis=-1))
    return result


def test_energy_and_gates() -> None:
    y = _gappy(2)
    level = _rms_frames(y, 2048, 512)
    np.testing.assert_allclose(audio.short_term_energy(y).to_numpy()[:, 0], 2048 * level**2, rtol=1e-10)
    for threshold_db, reduction_db in ((-40.0, None), (-70.0, -20.0)):
        floor = 0.0 if reduction_db is None else 10 ** (reduction_db / 20)
        gain = np.where(level >= 10 ** (threshold_db / 20), 1.0, floor)
        index = np.minimum((np.arange(y.shape[-1]) + 256) // 512, level.shape[-1] - 1)
        got = audio.noise_gate(y, threshold_db=threshold_db, reduction_db=reduction_db).to_numpy()
        np.testing.assert_allclose(got, y * gain[:, index], rtol=1e-12, atol=0)
    rng = np.random.default_rng(3)
    t = np.arange(16000) / 16000
    tone = np.sin(2 * np.pi * 440 * t)
    noisy = tone + 0.05 * rng.standard_normal(t.size)
    cleaned = audio.spectral_gate(noisy, sr=16000, noise=0.05 * rng.standard_normal(8000), n_fft=512).to_numpy()
    assert cleaned.shape == noisy.shape
    assert np.std(cleaned[2000:-2000] - tone[2000:-2000]) < 0.5 * np.std(noisy - tone)
    untouched = audio.spectral_gate(noisy, prop_decrease=0.0, n_fft=512).to_numpy()
    np.testing.assert_allclose(untouched, noisy, rtol=0, atol=1e-9)


@pytest.mark.audio_data
def test_load_resamples_on_the_way_in(speech_16k: list[Path]) -> None:
    path = speech_16k[0]
    native, rate = audio.load(path, dtype="float64")
    assert rate == 16000
    resampled, new_rate = audio.load(path, sr=8000, dtype="float64")
    assert new_rate == 8000
    want = audio.resample(native, orig_sr=16000, target_sr=8000).to_numpy()
    np.testing.assert_array_equal(resampled.to_numpy(), want)
    same, same_rate = audio.load(path, sr=16000, dtype="float64")
    assert same_rate == 16000
    np.testing.assert_array_equal(same.to_numpy(), native.to_numpy())
    with pytest.raises(ArgumentError, match="sr"):
        audio.load(path, sr=22050.5)  # type: ignore[arg-type]


def test_dynamics_bad_input_raises_typed_errors() -> None:
    y = _gappy()[0]
    with pytest.raises(ShapeError, match="empty"):
        audio.trim(np.zeros(0))
    with pytest.raises(ShapeError, match="empty"):
        audio.split(np.zeros((2, 0)))
    with pytest.raises(ArgumentError, match="Nyquist"):
        audio.highpass_filter(y, sr=8000, cutoff=4000.0)
    with pytest.raises(ArgumentError, match="order"):
        audio.highpass_filter(y, order=0)
    with pytest.raises(ArgumentError, match="order"):
        audio.highpass_filter(y, order=40)
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.highpass_filter(np.array([0.0, np.nan, 1.0]))
    with pytest.raises(DTypeError):
        audio.noise_gate(np.zeros(100, dtype=np.int32))
    with pytest.raises(ArgumentError, match="prop_decrease"):
        audio.spectral_gate(y, prop_decrease=2.0)
    with pytest.raises(ArgumentError, match="hop_length"):
        audio.split(y, hop_length=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_iir_and_gate_kernels_on_device(dtype: Any) -> None:
    y = _gappy(4).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for order, cutoff in ((1, 100.0), (4, 200.0), (7, 50.0)):
        want = dynamics._host_sosfilt(dynamics.butter_highpass_sos(order, cutoff, 16000), y.astype(np.float64))
        got = audio.highpass_filter(y, sr=16000, cutoff=cutoff, order=order)
        assert got.dtype.name == np.dtype(dtype).name
        assert float(np.abs(got.to_numpy() - want).max() / np.abs(want).max()) <= tol
    level = audio.rms(y).to_numpy()[:, 0].astype(np.float64)
    index = np.minimum((np.arange(y.shape[-1]) + 256) // 512, level.shape[-1] - 1)
    gain = np.where(level >= 10 ** (-40 / 20), 1.0, 0.1)
    gated = audio.noise_gate(y, threshold_db=-40.0, reduction_db=-20.0).to_numpy()
    np.testing.assert_allclose(gated, (y * gain[:, index]).astype(dtype), rtol=tol, atol=0)
    expected = dynamics.split(y.astype(np.float64), top_db=30)
    np.testing.assert_array_equal(audio.split(y, top_db=30), expected)


def test_float32_stays_float32() -> None:
    y = _gappy(5).astype(np.float32)
    for result in (audio.highpass_filter(y), audio.noise_gate(y), audio.short_term_energy(y), audio.spectral_gate(y)):
        assert result.dtype.name == "float32"
    trimmed, _ = audio.trim(y)
    assert trimmed.dtype.name == "float32"
