"""onset_strength, onset_detect, tempo and beat_track against librosa (0.11) in float64 on random, synthetic and
real music (asterisk-moh-opsound-wav): onset strength within 1e-4 relative (batched), onset and beat frames
within one hop; typed errors. The GPU-marked test checks the flux kernel in float32/float64 against the module's
NumPy path (tied to librosa by the other tests) where librosa is absent."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio
from pygpukit.audio import onset
from pygpukit.core.errors import ArgumentError, ShapeError

Array = np.ndarray[Any, Any]
TOL = 1e-4
SR = 22050


def _lib(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not installed")


def _rel(got: Any, want: Array) -> float:
    values = got.to_numpy() if hasattr(got, "to_numpy") else np.asarray(got)
    assert values.shape == want.shape, (values.shape, want.shape)
    return float(np.abs(values - want).max() / max(float(np.abs(want).max()), 1e-300))


def _clicks(seed: int, bpm: float, seconds: float = 6.0, sr: int = SR) -> Array:
    """Noise with a decaying tone burst on every beat at ``bpm``, the bursts of random loudness."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    y = 0.01 * rng.standard_normal(n)
    burst = np.hanning(300) * np.sin(np.arange(300) * 0.3)
    for start in np.arange(1000, n - 400, sr * 60.0 / bpm).astype(int):
        y[start : start + 300] += rng.uniform(0.5, 1.0) * burst
    return y


def _same_within_one(got: Array, want: Array) -> None:
    assert len(got) == len(want), (got, want)
    assert np.all(np.abs(np.asarray(got) - want) <= 1), (got, want)


@pytest.mark.parametrize("kw", [
    {}, {"lag": 2, "max_size": 3}, {"aggregate": np.median}, {"detrend": True},
    {"center": False, "n_fft": 1024, "hop_length": 256, "n_mels": 64, "fmax": 8000.0},
])  # fmt: skip
def test_onset_strength_matches_librosa(kw: dict[str, Any]) -> None:
    librosa = _lib("librosa")
    rng = np.random.default_rng(0)
    y = np.stack([rng.standard_normal(SR * 2), _clicks(1, 128, seconds=2.0)])
    assert _rel(audio.onset_strength(y, sr=SR, **kw), librosa.onset.onset_strength(y=y, sr=SR, **kw)) <= TOL
    S = librosa.power_to_db(librosa.feature.melspectrogram(y=y, sr=SR))  # noqa: N806
    assert _rel(audio.onset_strength(S=S, sr=SR), librosa.onset.onset_strength(S=S, sr=SR)) <= TOL


@pytest.mark.parametrize(("seed", "bpm"), [(2, 128.0), (3, 93.0), (4, 150.0)])
def test_onsets_tempo_and_beats_match_librosa(seed: int, bpm: float) -> None:
    librosa = _lib("librosa")
    y = _clicks(seed, bpm)
    _same_within_one(audio.onset_detect(y, sr=SR), librosa.onset.onset_detect(y=y, sr=SR))
    want = librosa.onset.onset_detect(y=y, sr=SR, backtrack=True)
    _same_within_one(audio.onset_detect(y, sr=SR, backtrack=True), want)
    np.testing.assert_allclose(audio.onset_detect(y, sr=SR, units="time"),
                               librosa.onset.onset_detect(y=y, sr=SR, units="time"), atol=512 / SR)  # fmt: skip
    np.testing.assert_array_equal(audio.tempo(y, sr=SR), librosa.feature.tempo(y=y, sr=SR))
    tempo, beats = audio.beat_track(y, sr=SR)
    want_tempo, want_beats = librosa.beat.beat_track(y=y, sr=SR)
    np.testing.assert_array_equal(tempo, want_tempo)
    _same_within_one(beats, want_beats)
    env = librosa.onset.onset_strength(y=y, sr=SR, aggregate=np.median)
    _same_within_one(audio.beat_track(onset_envelope=env, sr=SR, bpm=100.0, trim=False)[1],
                     librosa.beat.beat_track(onset_envelope=env, sr=SR, bpm=100.0, trim=False)[1])  # fmt: skip


def test_tempogram_matches_librosa() -> None:
    librosa = _lib("librosa")
    env = librosa.onset.onset_strength(y=_clicks(5, 110), sr=SR)
    assert _rel(audio.tempogram(onset_envelope=env, sr=SR), librosa.feature.tempogram(onset_envelope=env, sr=SR)) <= TOL
    kw: dict[str, Any] = {"win_length": 200, "norm": None, "center": False}
    assert _rel(audio.tempogram(onset_envelope=env, sr=SR, **kw),
                librosa.feature.tempogram(onset_envelope=env, sr=SR, **kw)) <= TOL  # fmt: skip


@pytest.mark.audio_data
def test_onsets_and_beats_on_real_music(music_8k: list[Path]) -> None:
    librosa = _lib("librosa")
    sf = _lib("soundfile")
    for path in music_8k[:3]:
        data, rate = sf.read(str(path), dtype="float64")
        y = data[: rate * 30]
        env = librosa.onset.onset_strength(y=y, sr=rate)
        assert _rel(audio.onset_strength(y, sr=rate), env) <= TOL
        _same_within_one(audio.onset_detect(y, sr=rate), librosa.onset.onset_detect(y=y, sr=rate))
        tempo, beats = audio.beat_track(y, sr=rate)
        want_tempo, want_beats = librosa.beat.beat_track(y=y, sr=rate)
        np.testing.assert_array_equal(tempo, want_tempo)
        _same_within_one(beats, want_beats)


def test_onset_bad_input_raises_typed_errors() -> None:
    y = _clicks(6, 120, seconds=1.0)
    with pytest.raises(ArgumentError, match="lag"):
        audio.onset_strength(y, lag=0)
    with pytest.raises(ArgumentError, match="aggregate"):
        audio.onset_strength(y, aggregate=np.max)
    with pytest.raises(ArgumentError, match="give y"):
        audio.onset_strength()
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.onset_strength(np.full(4096, np.inf))
    with pytest.raises(ShapeError, match="mono"):
        audio.onset_detect(np.stack([y, y]))
    with pytest.raises(ShapeError, match="mono"):
        audio.beat_track(np.stack([y, y]))
    with pytest.raises(ArgumentError, match="units"):
        audio.onset_detect(y, units="beats")
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.beat_track(onset_envelope=np.array([0.0, np.nan, 1.0]))
    with pytest.raises(ShapeError, match="empty"):
        audio.tempo(onset_envelope=np.zeros(0))
    assert audio.beat_track(onset_envelope=np.zeros(50))[1].size == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_onset_flux_kernel_on_device(dtype: Any) -> None:
    y = np.stack([_clicks(7, 128, seconds=3.0), _clicks(8, 97, seconds=3.0)]).astype(dtype)
    S = audio.power_to_db(audio.melspectrogram(y, sr=SR, fmax=SR / 2))  # noqa: N806
    s = S.to_numpy().astype(np.float64)
    for lag, max_size, code, aggregate in ((1, 1, 0, None), (2, 5, 1, np.median)):
        want = onset._host_flux(s, lag, max_size, lag + 2, code)
        got = audio.onset_strength(S=S, sr=SR, lag=lag, max_size=max_size, aggregate=aggregate)
        assert got.dtype.name == np.dtype(dtype).name
        assert _rel(got, want) <= (1e-5 if dtype == np.float32 else 1e-12)
    env = audio.onset_strength(y, sr=SR, detrend=True).to_numpy().astype(np.float64)
    plain = audio.onset_strength(y, sr=SR).to_numpy().astype(np.float64)
    from pygpukit.audio.dynamics import _host_sosfilt

    assert _rel(env, _host_sosfilt(np.array([[1.0, -1.0, 0.0, 1.0, -0.99, 0.0]]), plain)) <= 1e-4
    tempo, beats = audio.beat_track(y[0].astype(np.float64), sr=SR)
    assert 115 <= float(tempo[0]) <= 136
    assert len(beats) >= 4
