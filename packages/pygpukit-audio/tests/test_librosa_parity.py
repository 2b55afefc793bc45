"""pygpukit.audio against librosa in float64 (max error relative to the largest reference value <= 1e-4; istft of
stft within 1e-6 of the signal) on random and synthetic signals and on real recordings (the audio_data tests),
batched (B, T) included. Runs on whatever backend is in use: the CPU simulation here, the GPU kernels on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio

librosa = pytest.importorskip("librosa")
sf = pytest.importorskip("soundfile")

Array = np.ndarray[Any, Any]
TOL = 1e-4


def _rel(got: Any, want: Array) -> float:
    values = audio.complex_to_numpy(got) if got.ndim == want.ndim + 1 and got.shape[-1] == 2 else got.to_numpy()
    assert values.shape == want.shape, (values.shape, want.shape)
    scale = max(float(np.abs(want).max()), 1e-300)
    return float(np.abs(values - want).max() / scale)


def _signals(seed: int | None = None) -> Array:
    """Two 0.75 s signals at 16 kHz: noise, and a chirp with harmonics and a DC offset."""
    rng = np.random.default_rng(seed)
    t = np.arange(12000) / 16000.0
    chirp = 0.5 * np.sin(2 * np.pi * (200 + 900 * t) * t) + 0.2 * np.sin(2 * np.pi * 3100 * t) + 0.05
    return np.stack([0.3 * rng.standard_normal(t.size), chirp])


@pytest.mark.parametrize(("n_fft", "hop", "win", "center", "pad_mode", "window"), [
    (2048, None, None, True, "constant", "hann"),
    (512, 128, 400, True, "reflect", "hamming"),
    (400, 160, None, True, "edge", "blackman"),
    (1024, 256, 1024, False, "constant", "hann"),
    (255, 64, 200, True, "constant", "hann"),
])  # fmt: skip
def test_stft_and_istft(n_fft: int, hop: int | None, win: int | None, center: bool, pad_mode: str,
                        window: str) -> None:  # fmt: skip
    y = _signals()
    kwargs = {"n_fft": n_fft, "hop_length": hop, "win_length": win, "window": window, "center": center}
    reference = librosa.stft(y, pad_mode=pad_mode, **kwargs)
    spec = audio.stft(y, pad_mode=pad_mode, **kwargs)
    assert _rel(spec, reference) <= TOL
    back = audio.istft(spec, length=y.shape[-1], **kwargs).to_numpy()
    expected = librosa.istft(reference, length=y.shape[-1], **kwargs)
    if center:
        np.testing.assert_allclose(back, y, rtol=0, atol=1e-6)
    inner = slice(n_fft, -n_fft)  # uncentred: the ends have a near-zero window sum on both sides
    np.testing.assert_allclose(back[..., inner], expected[..., inner], rtol=0, atol=1e-6 * np.abs(y).max())
    assert audio.istft(spec, **kwargs).shape == librosa.istft(reference, **kwargs).shape


def test_spectra_and_decibels() -> None:
    y = _signals()
    reference = librosa.stft(y, n_fft=512, hop_length=128)
    spec = audio.stft(y, n_fft=512, hop_length=128)
    power = np.abs(reference) ** 2
    assert _rel(audio.power_spectrum(spec), power) <= TOL
    assert _rel(audio.magnitude(spec), np.abs(reference)) <= TOL
    got_power = audio.power_spectrum(spec)
    for ref in (1.0, np.max, "max"):
        want = librosa.power_to_db(power, ref=np.max if ref == "max" else ref)
        assert _rel(audio.power_to_db(got_power, ref=ref), want) <= TOL
    assert _rel(audio.power_to_db(got_power, top_db=None, amin=1e-6), librosa.power_to_db(power, top_db=None,
                                                                                        amin=1e-6)) <= TOL  # fmt: skip
    magnitude = np.abs(reference)
    want = librosa.amplitude_to_db(magnitude, ref=np.max, top_db=60.0)
    assert _rel(audio.amplitude_to_db(audio.magnitude(spec), ref=np.max, top_db=60.0), want) <= TOL
    db = librosa.power_to_db(power, top_db=None)
    assert _rel(audio.db_to_power(db), librosa.db_to_power(db)) <= TOL


@pytest.mark.parametrize(("htk", "norm", "fmax"), [(False, "slaney", None), (True, None, 6000.0), (False, 2.0, 7000.0)])
def test_mel_spectrogram_and_mfcc(htk: bool, norm: Any, fmax: float | None) -> None:
    y = _signals()
    kw = {"sr": 16000, "n_fft": 512, "hop_length": 160, "n_mels": 40, "htk": htk, "norm": norm, "fmax": fmax}
    want = librosa.feature.melspectrogram(y=y, dtype=np.float64, **kw)
    got = audio.melspectrogram(y, **kw)
    assert _rel(got, want) <= TOL
    want_db = librosa.power_to_db(want)
    assert _rel(audio.log_melspectrogram(y, **kw), want_db) <= TOL
    got_db = audio.log_melspectrogram(y, **kw)
    for lifter in (0, 22):
        want_mfcc = librosa.feature.mfcc(S=want_db, n_mfcc=13, lifter=lifter)
        assert _rel(audio.mfcc(S=got_db, n_mfcc=13, lifter=lifter), want_mfcc) <= TOL
    mel_kw = {k: v for k, v in kw.items() if k != "norm"}  # mfcc's own norm is the DCT's, as in librosa
    want_mfcc = librosa.feature.mfcc(y=y, n_mfcc=13, dtype=np.float64, **mel_kw)
    assert _rel(audio.mfcc(y, n_mfcc=13, **mel_kw), want_mfcc) <= TOL
    np.testing.assert_allclose(audio.filters.mel(sr=16000, n_fft=512, n_mels=40, htk=htk, norm=norm, fmax=fmax),
                               librosa.filters.mel(sr=16000, n_fft=512, n_mels=40, htk=htk, norm=norm, fmax=fmax,
                                                   dtype=np.float64), rtol=1e-12, atol=1e-15)  # fmt: skip


def test_delta_orders_and_axes() -> None:
    rng = np.random.default_rng()
    data = rng.standard_normal((3, 20, 50))
    for width, order in ((9, 1), (5, 2), (3, 1)):
        for axis in (-1, 1, 0):
            if data.shape[axis] < width:
                continue
            want = librosa.feature.delta(data, width=width, order=order, axis=axis)
            assert _rel(audio.delta(data, width=width, order=order, axis=axis), want) <= TOL
    mfcc = audio.mfcc(_signals(), sr=16000, n_fft=512, hop_length=160, n_mels=40)  # a transposed view
    assert _rel(audio.delta(mfcc), librosa.feature.delta(mfcc.to_numpy())) <= TOL


def test_spectral_features() -> None:
    y = _signals()
    kw = {"n_fft": 1024, "hop_length": 256}
    checks = [
        (audio.spectral_centroid(y, sr=16000, **kw), librosa.feature.spectral_centroid(y=y, sr=16000, **kw)),
        (audio.spectral_bandwidth(y, sr=16000, **kw), librosa.feature.spectral_bandwidth(y=y, sr=16000, **kw)),
        (audio.spectral_bandwidth(y, sr=16000, p=3, norm=False, **kw),
         librosa.feature.spectral_bandwidth(y=y, sr=16000, p=3, norm=False, **kw)),
        (audio.spectral_flatness(y, **kw), librosa.feature.spectral_flatness(y=y, **kw)),
        (audio.rms(y, frame_length=1024, hop_length=256), librosa.feature.rms(y=y, frame_length=1024, hop_length=256,
                                                                              dtype=np.float64)),
        (audio.rms(y, frame_length=400, hop_length=100, center=False, pad_mode="reflect"),
         librosa.feature.rms(y=y, frame_length=400, hop_length=100, center=False, dtype=np.float64)),
        (audio.zero_crossing_rate(y, frame_length=512, hop_length=128),
         librosa.feature.zero_crossing_rate(y, frame_length=512, hop_length=128)),
        (audio.zero_crossing_rate(y, frame_length=512, hop_length=128, threshold=0.05, zero_pos=False, pad=True),
         librosa.feature.zero_crossing_rate(y, frame_length=512, hop_length=128, threshold=0.05, zero_pos=False,
                                            pad=True)),
    ]  # fmt: skip
    for got, want in checks:
        assert _rel(got, want) <= TOL
    S = np.abs(librosa.stft(y, **kw))  # noqa: N806
    rolloff = audio.spectral_rolloff(S=S, sr=16000, roll_percent=0.9).to_numpy()
    want = librosa.feature.spectral_rolloff(S=S, sr=16000, roll_percent=0.9)
    assert np.mean(rolloff == want) >= 0.98  # ties of the cumulative sum at the threshold may round either way
    bin_width = 16000 / 1024
    assert np.abs(rolloff - want).max() <= bin_width + 1e-9
    assert _rel(audio.rms(S=S, frame_length=1024), librosa.feature.rms(S=S, frame_length=1024, dtype=np.float64)) <= TOL


def test_effects() -> None:
    y = _signals()
    for zi in (None, np.array([[0.25], [-0.5]])):
        want, want_zf = librosa.effects.preemphasis(y, coef=0.95, zi=zi, return_zf=True)
        got, got_zf = audio.preemphasis(y, coef=0.95, zi=zi, return_zf=True)
        assert _rel(got, want) <= TOL
        np.testing.assert_allclose(got_zf.to_numpy().reshape(-1), np.asarray(want_zf).reshape(-1), rtol=1e-10)
        back, back_zf = librosa.effects.deemphasis(want, coef=0.95, zi=zi, return_zf=True)
        got_back, got_back_zf = audio.deemphasis(want, coef=0.95, zi=zi, return_zf=True)
        assert _rel(got_back, back) <= TOL
        np.testing.assert_allclose(got_back_zf.to_numpy().reshape(-1), np.asarray(back_zf).reshape(-1), rtol=1e-6)
    long = np.random.default_rng().standard_normal((2, 70001))  # several scan tiles on the GPU
    assert _rel(audio.deemphasis(long, coef=0.97), librosa.effects.deemphasis(long, coef=0.97)) <= TOL
    np.testing.assert_allclose(audio.remove_dc(y).to_numpy(), y - y.mean(axis=-1, keepdims=True), atol=1e-12)
    for max_size in (None, 300):
        assert _rel(audio.autocorrelate(y, max_size=max_size), librosa.autocorrelate(y, max_size=max_size)) <= TOL
    assert _rel(audio.autocorrelate(y.T, axis=0), librosa.autocorrelate(y.T, axis=0)) <= TOL


def _load(path: Path) -> tuple[Array, int]:
    data, rate = sf.read(str(path), dtype="float64")
    return data, rate


@pytest.mark.audio_data
def test_real_recordings(speech_16k: list[Path], speech_8k: list[Path], music_8k: list[Path]) -> None:
    cases = [(speech_16k[:3], 16000, 400, 160), (speech_8k[:3], 8000, 256, 80), (music_8k[:1], 8000, 1024, 256)]
    for files, rate, n_fft, hop in cases:
        signals = []
        for path in files:
            data, found = _load(path)
            assert found == rate, path
            signals.append(data[: rate * 20])  # at most 20 s each
        length = min(s.shape[-1] for s in signals)
        y = np.stack([s[:length] for s in signals])  # a batch (B, T)
        reference = librosa.stft(y, n_fft=n_fft, hop_length=hop)
        spec = audio.stft(y, n_fft=n_fft, hop_length=hop)
        assert _rel(spec, reference) <= TOL
        np.testing.assert_allclose(audio.istft(spec, hop_length=hop, length=length).to_numpy(), y, rtol=0, atol=1e-6)
        kw = {"sr": rate, "n_fft": n_fft, "hop_length": hop, "n_mels": 40}
        mel = librosa.feature.melspectrogram(y=y, dtype=np.float64, **kw)
        assert _rel(audio.melspectrogram(y, **kw), mel) <= TOL
        assert _rel(audio.mfcc(y, **kw), librosa.feature.mfcc(S=librosa.power_to_db(mel))) <= TOL
        assert _rel(audio.spectral_centroid(y, sr=rate, n_fft=n_fft, hop_length=hop),
                    librosa.feature.spectral_centroid(y=y, sr=rate, n_fft=n_fft, hop_length=hop)) <= TOL  # fmt: skip
        assert _rel(audio.rms(y, frame_length=n_fft, hop_length=hop),
                    librosa.feature.rms(y=y, frame_length=n_fft, hop_length=hop, dtype=np.float64)) <= TOL  # fmt: skip
        loaded, loaded_rate = audio.load(files[0], dtype="float64")
        assert loaded_rate == rate
        np.testing.assert_array_equal(loaded.to_numpy(), _load(files[0])[0])


def test_float32_inputs_stay_float32_and_close() -> None:
    y = _signals().astype(np.float32)
    spec = audio.stft(y, n_fft=512, hop_length=128)
    assert spec.dtype.name == "float32"
    want = librosa.stft(y.astype(np.float64), n_fft=512, hop_length=128)
    assert _rel(spec, want) <= 1e-5
    mel = audio.melspectrogram(y, sr=16000, n_fft=512, hop_length=128, n_mels=40)
    want_mel = librosa.feature.melspectrogram(y=y.astype(np.float64), sr=16000, n_fft=512, hop_length=128, n_mels=40)
    assert _rel(mel, want_mel) <= 1e-4
