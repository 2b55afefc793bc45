"""CQT / VQT, chroma (stft and cqt), spectral contrast, tuning estimation and HPSS against librosa in float64 on
random and synthetic signals, batched (B, T), and on real recordings (audio_data). Runs on whatever backend is in
use (the CPU simulation here, the kernels on a GPU where librosa is installed); librosa is imported lazily.

Tolerances: max error relative to the largest reference value <= 1e-4 for the linear features. librosa's cqt
downsamples by 2 per octave with soxr; pygpukit.audio.resample is its own polyphase sinc, not soxr, so with the
default res_type="soxr_hq" the lower octaves differ by the two resamplers' passband difference (about 2e-3 of
the peak; bounded below at 5e-3). With res_type="fft" both sides resample the same way (scipy's FFT method)
and the 1e-4 bar holds for cqt, vqt and chroma_cqt; the same holds for any configuration that downsamples
nothing (an odd hop_length).
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

Array = np.ndarray[Any, Any]
TOL = 1e-4
SOXR_TOL = 5e-3
SR = 22050


def _lib(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not installed")


def _rel(got: Any, want: Array) -> float:
    values = audio.complex_to_numpy(got) if got.ndim == want.ndim + 1 and got.shape[-1] == 2 else got.to_numpy()
    assert values.shape == want.shape, (values.shape, want.shape)
    return float(np.abs(values - want).max() / max(float(np.abs(want).max()), 1e-300))


def _music(seed: int = 0, seconds: float = 1.5, sr: int = SR) -> Array:
    """A batch (2, T): noise, and a detuned chord with a percussive click train."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr) + 3) / sr
    chord = sum(0.3 * np.sin(2 * np.pi * f * 1.004 * t + rng.uniform(0, 6)) for f in (220.0, 277.18, 329.63))
    clicks = np.zeros_like(t)
    clicks[:: sr // 4] = 1.0
    return np.stack([0.3 * rng.standard_normal(t.size), chord + clicks])


@pytest.mark.parametrize("kw", [
    {}, {"hop_length": 256, "n_bins": 60, "fmin": 65.0, "bins_per_octave": 12},
    {"hop_length": 1024, "scale": False, "n_bins": 48, "bins_per_octave": 24, "filter_scale": 0.8},
    {"hop_length": 128, "n_bins": 1, "fmin": 440.0}, {"tuning": 0.2, "norm": 2, "sparsity": 0.0, "window": "hamming"},
])  # fmt: skip
def test_cqt_with_fft_resampling_matches(kw: dict[str, Any]) -> None:
    librosa = _lib("librosa")
    y = _music(1)
    want = librosa.cqt(y, sr=SR, res_type="fft", **kw)
    assert _rel(audio.cqt(y, sr=SR, res_type="fft", **kw), want) <= TOL


def test_cqt_default_soxr_and_without_downsampling() -> None:
    librosa = _lib("librosa")
    y = _music(2)
    assert _rel(audio.cqt(y, sr=SR), librosa.cqt(y, sr=SR)) <= SOXR_TOL
    # an odd hop: no octave is downsampled, so no resampler is involved
    kw: dict[str, Any] = {"hop_length": 501, "n_bins": 36, "fmin": 200.0}
    assert _rel(audio.cqt(y, sr=SR, **kw), librosa.cqt(y, sr=SR, **kw)) <= TOL
    assert _rel(audio.cqt(y[1], sr=SR, **kw), librosa.cqt(y[1], sr=SR, **kw)) <= TOL  # one signal (T,)


@pytest.mark.parametrize("gamma", [None, 0.0, 12.0])
def test_vqt(gamma: float | None) -> None:
    librosa = _lib("librosa")
    y = _music(3)
    want = librosa.vqt(y, sr=SR, gamma=gamma, n_bins=72, res_type="fft")
    assert _rel(audio.vqt(y, sr=SR, gamma=gamma, n_bins=72, res_type="fft"), want) <= TOL


@pytest.mark.parametrize("kw", [
    {}, {"hop_length": 256, "n_bins": 48, "fmin": 200.0},
    {"scale": False, "n_bins": 60, "fmin": 100.0, "hop_length": 128},
])  # fmt: skip
def test_pseudo_and_hybrid_cqt(kw: dict[str, Any]) -> None:
    librosa = _lib("librosa")
    y = _music(12)
    assert _rel(audio.pseudo_cqt(y, sr=SR, **kw), librosa.pseudo_cqt(y, sr=SR, **kw)) <= TOL
    want = librosa.hybrid_cqt(y, sr=SR, res_type="fft", **kw)
    assert _rel(audio.hybrid_cqt(y, sr=SR, res_type="fft", **kw), want) <= TOL


def test_chroma_cqt() -> None:
    librosa = _lib("librosa")
    y = _music(4)
    C = np.abs(librosa.cqt(y, sr=SR, n_bins=84, bins_per_octave=36, res_type="fft"))  # noqa: N806
    for kw in ({}, {"norm": 2, "threshold": 0.2}, {"norm": None}, {"n_chroma": 12, "bins_per_octave": 36}):
        assert _rel(audio.chroma_cqt(C=C, sr=SR, **kw), librosa.feature.chroma_cqt(C=C, sr=SR, **kw)) <= TOL
    ours = audio.chroma_cqt(C=np.abs(audio.complex_to_numpy(audio.cqt(y, sr=SR, n_bins=84, bins_per_octave=36,
                                                                       res_type="fft"))))  # fmt: skip
    assert _rel(ours, librosa.feature.chroma_cqt(C=C)) <= TOL
    # from audio, with librosa's tuning estimate and soxr downsampling
    assert _rel(audio.chroma_cqt(y=y, sr=SR), librosa.feature.chroma_cqt(y=y, sr=SR)) <= SOXR_TOL
    want = librosa.feature.chroma_cqt(y=y, sr=SR, cqt_mode="hybrid")
    assert _rel(audio.chroma_cqt(y=y, sr=SR, cqt_mode="hybrid"), want) <= SOXR_TOL


def test_estimate_tuning_and_chroma_stft() -> None:
    librosa = _lib("librosa")
    y = _music(5)
    for signal in (y[0], y[1], y):
        assert audio.estimate_tuning(y=signal, sr=SR) == pytest.approx(librosa.estimate_tuning(y=signal, sr=SR))
    for kw in ({}, {"tuning": 0.0, "norm": 2, "n_chroma": 24}, {"norm": None, "n_fft": 1024, "hop_length": 256},
               {"tuning": -0.3, "octwidth": None, "base_c": False}):  # fmt: skip
        want = librosa.feature.chroma_stft(y=y, sr=SR, **kw)
        # librosa rounds its chroma filterbank to float32 (filters.chroma's dtype): 1e-7 relative
        assert _rel(audio.chroma_stft(y=y, sr=SR, **kw), want) <= TOL
    S = np.abs(librosa.stft(y, n_fft=1024)) ** 2  # noqa: N806
    assert _rel(audio.chroma_stft(S=S, sr=SR), librosa.feature.chroma_stft(S=S, sr=SR)) <= TOL


@pytest.mark.parametrize("kw", [
    {}, {"linear": True}, {"n_bands": 4, "fmin": 300.0, "quantile": 0.1, "n_fft": 1024, "hop_length": 256},
    {"center": False, "window": "hamming", "quantile": 0.5},
])  # fmt: skip
def test_spectral_contrast(kw: dict[str, Any]) -> None:
    librosa = _lib("librosa")
    y = _music(6)
    want = librosa.feature.spectral_contrast(y=y, sr=SR, **kw)
    assert _rel(audio.spectral_contrast(y=y, sr=SR, **kw), want) <= TOL


def test_spectral_contrast_of_a_spectrogram_with_ties() -> None:
    librosa = _lib("librosa")
    rng = np.random.default_rng(7)
    S = np.round(np.abs(rng.standard_normal((2, 513, 40))), 1)  # noqa: N806 - many equal values
    want = librosa.feature.spectral_contrast(S=S, sr=16000)
    assert _rel(audio.spectral_contrast(S=S, sr=16000), want) <= TOL


@pytest.mark.parametrize("kw", [
    {}, {"margin": 3.0}, {"kernel_size": (17, 8), "power": np.inf}, {"mask": True, "margin": (1.0, 2.0)},
    {"kernel_size": 4, "power": 1.0},
])  # fmt: skip
def test_hpss_complex_and_magnitude(kw: dict[str, Any]) -> None:
    librosa = _lib("librosa")
    y = _music(8)
    D = librosa.stft(y, n_fft=512)  # noqa: N806
    want_h, want_p = librosa.decompose.hpss(D, **kw)
    got_h, got_p = audio.hpss(D, **kw)
    assert _rel(got_h, want_h) <= TOL
    assert _rel(got_p, want_p) <= TOL
    got_h, got_p = audio.hpss(audio.stft(y, n_fft=512), **kw)  # stft's layout (a transposed view)
    assert _rel(got_h, want_h) <= TOL
    assert _rel(got_p, want_p) <= TOL
    want_h, want_p = librosa.decompose.hpss(np.abs(D), **kw)
    got_h, got_p = audio.hpss(np.abs(D), **kw)
    assert _rel(got_h, want_h) <= TOL
    assert _rel(got_p, want_p) <= TOL


def test_harmonic_and_percussive() -> None:
    librosa = _lib("librosa")
    y = _music(9, seconds=1.0)
    assert _rel(audio.harmonic(y, n_fft=1024), librosa.effects.harmonic(y, n_fft=1024)) <= TOL
    assert _rel(audio.percussive(y, margin=2.0), librosa.effects.percussive(y, margin=2.0)) <= TOL


def test_float32_stays_float32() -> None:
    librosa = _lib("librosa")
    y = _music(10).astype(np.float32)
    got = audio.cqt(y, sr=SR, res_type="fft", n_bins=48)
    assert got.dtype.name == "float32"
    assert _rel(got, librosa.cqt(y.astype(np.float64), sr=SR, res_type="fft", n_bins=48)) <= 1e-4
    harm, _ = audio.hpss(np.abs(librosa.stft(y.astype(np.float64))).astype(np.float32))
    assert harm.dtype.name == "float32"


def test_typed_errors() -> None:
    y = _music(11, seconds=0.5)
    bad = y.copy()
    bad[1, 100] = np.nan
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.cqt(bad, sr=SR)
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.hpss(np.abs(bad[:, :1000].reshape(2, 20, 50)))
    with pytest.raises(ShapeError, match="empty"):
        audio.cqt(np.zeros((2, 0)), sr=SR)
    with pytest.raises(ShapeError, match="empty"):
        audio.hpss(np.zeros((0, 5)))
    with pytest.raises(ArgumentError, match="Nyquist"):  # 84 bins from C1 reach 4.2 kHz: too high for 8 kHz
        audio.cqt(y, sr=8000)
    with pytest.raises(ArgumentError, match="sr"):
        audio.cqt(y, sr=0)
    with pytest.raises(ArgumentError, match="Nyquist"):
        audio.spectral_contrast(y=y, sr=4000)
    with pytest.raises(ArgumentError, match="margins"):
        audio.hpss(np.ones((5, 6)), margin=0.5)
    with pytest.raises(ArgumentError, match="kernel_size"):
        audio.hpss(np.ones((5, 6)), kernel_size=0)
    with pytest.raises(ArgumentError, match="cqt_mode"):
        audio.chroma_cqt(y=y, sr=SR, cqt_mode="pseudo")
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.pseudo_cqt(bad, sr=SR)
    with pytest.raises(ShapeError, match="empty"):
        audio.hybrid_cqt(np.zeros(0), sr=SR)
    with pytest.raises(ArgumentError, match="multiple"):
        audio.chroma_cqt(y=y, sr=SR, bins_per_octave=30)
    with pytest.raises(ArgumentError, match="res_type"):
        audio.cqt(y, sr=SR, res_type="kaiser_best")
    with pytest.raises(DTypeError):
        audio.cqt(y.astype(np.int16), sr=SR)
    with pytest.raises(ShapeError, match="freq"):
        audio.spectral_contrast(S=np.ones((513, 4)), freq=np.arange(10.0))


@pytest.mark.audio_data
def test_real_recordings(speech_16k: list[Path], music_8k: list[Path]) -> None:
    librosa = _lib("librosa")
    sf = _lib("soundfile")
    cases = [(music_8k[:1], 8000, 512, 72), (speech_16k[:2], 16000, 256, 84)]
    for files, rate, hop, n_bins in cases:
        signals = [sf.read(str(path), dtype="float64")[0][: rate * 10] for path in files]
        length = min(s.shape[-1] for s in signals)
        y = np.stack([s[:length] for s in signals])  # a batch (B, T)
        kw: dict[str, Any] = {"sr": rate, "hop_length": hop, "n_bins": n_bins}
        want = librosa.cqt(y, res_type="fft", **kw)
        assert _rel(audio.cqt(y, res_type="fft", **kw), want) <= TOL
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # librosa warns about n_fft on the short top-octave filters
            want_chroma = librosa.feature.chroma_cqt(C=np.abs(want), bins_per_octave=12)
        assert _rel(audio.chroma_cqt(C=np.abs(want), bins_per_octave=12), want_chroma) <= TOL
        assert _rel(audio.cqt(y, **kw), librosa.cqt(y, **kw)) <= SOXR_TOL
        assert _rel(audio.spectral_contrast(y=y, sr=rate, n_bands=5, fmin=100.0),
                    librosa.feature.spectral_contrast(y=y, sr=rate, n_bands=5, fmin=100.0)) <= TOL  # fmt: skip
        assert _rel(audio.chroma_stft(y=y, sr=rate), librosa.feature.chroma_stft(y=y, sr=rate)) <= TOL
        D = librosa.stft(y, n_fft=1024, hop_length=256)  # noqa: N806
        for got, want_part in zip(audio.hpss(D, margin=2.0), librosa.decompose.hpss(D, margin=2.0), strict=True):
            assert _rel(got, want_part) <= TOL
