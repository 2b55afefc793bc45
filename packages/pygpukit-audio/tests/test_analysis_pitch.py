"""yin and pyin against librosa (0.11) in float64 on random, synthetic and real (batched) signals: yin within 1e-4
relative, pyin with the same voiced frames and f0; typed errors for bad input. Runs on the backend in use; the
GPU-marked test checks the device kernel in float32 and float64 against the module's NumPy path (which the
librosa tests tie to librosa) where librosa is absent."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio
from pygpukit.audio import pitch
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

Array = np.ndarray[Any, Any]
TOL = 1e-4


def _lib(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not installed")


def _voices(seed: int = 0, sr: int = 16000, seconds: float = 1.0) -> Array:
    """A batch (3, T): a gliding harmonic tone with a quiet gap, a steady vowel-like tone, and noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(sr * seconds)) / sr
    glide = np.sin(2 * np.pi * 180 * t * (1 + 0.4 * t)) + 0.3 * np.sin(4 * np.pi * 180 * t * (1 + 0.4 * t))
    glide += 0.02 * rng.standard_normal(t.size)
    glide[int(0.4 * sr) : int(0.55 * sr)] = 1e-3 * rng.standard_normal(int(0.55 * sr) - int(0.4 * sr))
    vowel = sum(np.sin(2 * np.pi * 310 * k * t + rng.uniform(0, 6)) / k for k in range(1, 6))
    return np.stack([glide, vowel, 0.3 * rng.standard_normal(t.size)])


def _rel(got: Array, want: Array) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.max(np.abs(got - want) / np.abs(want)))


@pytest.mark.parametrize("kw", [
    {"fmin": 65.0, "fmax": 2093.0},
    {"fmin": 100.0, "fmax": 800.0, "frame_length": 1024, "hop_length": 160, "trough_threshold": 0.2},
    {"fmin": 80.0, "fmax": 1000.0, "center": False},
    {"fmin": 70.0, "fmax": 1500.0, "pad_mode": "reflect", "frame_length": 2048, "hop_length": 333},
])  # fmt: skip
def test_yin_matches_librosa(kw: dict[str, Any]) -> None:
    librosa = _lib("librosa")
    y = _voices(1)
    want = librosa.yin(y, sr=16000, **kw)
    got = audio.yin(y, sr=16000, **kw)
    assert got.dtype.name == "float64"
    assert _rel(got.to_numpy(), want) <= TOL
    assert _rel(audio.yin(y[1], sr=16000, **kw).to_numpy(), want[1]) <= TOL  # mono = a row of the batch


def test_yin_float32_stays_float32() -> None:
    librosa = _lib("librosa")
    y = _voices(2)[:2]
    got = audio.yin(y.astype(np.float32), fmin=80.0, fmax=1000.0, sr=16000)
    assert got.dtype.name == "float32"
    want = librosa.yin(y, fmin=80.0, fmax=1000.0, sr=16000)
    assert float(np.median(np.abs(got.to_numpy() - want) / want)) <= 1e-4


@pytest.mark.parametrize("kw", [
    {"fmin": 65.0, "fmax": 2093.0},
    {"fmin": 100.0, "fmax": 700.0, "frame_length": 1024, "hop_length": 200, "resolution": 0.25, "switch_prob": 0.05},
])  # fmt: skip
def test_pyin_matches_librosa(kw: dict[str, Any]) -> None:
    librosa = _lib("librosa")
    y = _voices(3)
    want_f0, want_flag, want_prob = librosa.pyin(y, sr=16000, **kw)
    f0, flag, prob = audio.pyin(y, sr=16000, **kw)
    np.testing.assert_array_equal(flag.to_numpy().astype(bool), want_flag)
    np.testing.assert_allclose(f0.to_numpy(), want_f0, rtol=1e-9, equal_nan=True)
    np.testing.assert_allclose(prob.to_numpy(), want_prob, rtol=0, atol=1e-9)
    _, _, prob_no_fill = audio.pyin(y[:1], sr=16000, fill_na=None, **kw)
    assert prob_no_fill.shape == (1, want_prob.shape[-1])


@pytest.mark.audio_data
def test_pitch_on_real_speech(speech_16k: list[Path]) -> None:
    librosa = _lib("librosa")
    sf = _lib("soundfile")
    signals = [sf.read(str(path), dtype="float64")[0][: 16000 * 4] for path in speech_16k[:2]]
    length = min(len(s) for s in signals)
    y = np.stack([s[:length] for s in signals])
    kw: dict[str, Any] = {"fmin": 60.0, "fmax": 500.0, "sr": 16000, "frame_length": 1024, "hop_length": 160}
    assert _rel(audio.yin(y, **kw).to_numpy(), librosa.yin(y, **kw)) <= TOL
    want_f0, want_flag, _ = librosa.pyin(y[0], **kw)
    f0, flag, _ = audio.pyin(y[0], **kw)
    np.testing.assert_array_equal(flag.to_numpy().astype(bool), want_flag)
    np.testing.assert_allclose(f0.to_numpy(), want_f0, rtol=1e-9, equal_nan=True)


def test_pitch_bad_input_raises_typed_errors() -> None:
    y = _voices()[0]
    with pytest.raises(ArgumentError, match="fmax"):
        audio.yin(y, fmin=100.0, fmax=9000.0, sr=16000)
    with pytest.raises(ArgumentError, match="fmin"):
        audio.yin(y, fmin=500.0, fmax=400.0, sr=16000)
    with pytest.raises(ArgumentError, match="too small"):
        audio.pyin(y, fmin=5.0, fmax=400.0, sr=16000)
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.yin(np.full(4000, np.nan), fmin=100.0, fmax=400.0, sr=16000)
    with pytest.raises(ShapeError, match="shorter"):
        audio.yin(np.zeros(100), fmin=100.0, fmax=400.0, sr=16000, center=False)
    with pytest.raises(DTypeError):
        audio.yin(np.zeros(4000, dtype=np.int16), fmin=100.0, fmax=400.0, sr=16000)
    with pytest.raises(ArgumentError, match="pad_mode"):
        audio.yin(y, fmin=100.0, fmax=400.0, sr=16000, pad_mode="bogus")
    with pytest.raises(ArgumentError, match="resolution"):
        audio.pyin(y, fmin=100.0, fmax=400.0, sr=16000, resolution=2.0)


def test_beta_cdf_and_transition_tables() -> None:
    y = np.linspace(0, 1, 101)
    cdf = pitch._beta_cdf(y, 2.0, 18.0)
    # I_x(2, 18) in closed form: 1 - (1 - x)^19 - 19 x (1 - x)^18
    np.testing.assert_allclose(cdf, 1 - (1 - y) ** 19 - 19 * y * (1 - y) ** 18, rtol=0, atol=1e-14)
    table = pitch._transition(40, 9, 0.01)
    np.testing.assert_allclose(table.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert table[0, 5] == 0
    assert table[0, 0] > table[0, 1] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_yin_kernel_on_device(dtype: Any) -> None:
    y = _voices(4)
    cases: list[dict[str, Any]] = [
        {"fmin": 65.0, "fmax": 2093.0},
        {"fmin": 100.0, "fmax": 900.0, "frame_length": 1024, "hop_length": 128, "center": False},
    ]
    for kw in cases:
        frame = kw.get("frame_length", 2048)
        hop = kw.get("hop_length", frame // 4)
        lo, hi = pitch._periods(kw["fmin"], kw["fmax"], 16000.0, frame)
        frames = pitch._host_frames(y.astype(dtype), frame, hop, kw.get("center", True), "constant")
        c = pitch._host_cmndf(frames, lo, hi, float(np.finfo(dtype).tiny))
        want = pitch._host_yin_pick(c, 0.1, lo, 16000.0)
        got = audio.yin(y.astype(dtype), sr=16000, **kw)
        assert got.dtype.name == np.dtype(dtype).name
        rel = np.abs(got.to_numpy() - want) / want
        assert float(np.median(rel)) <= (1e-4 if dtype == np.float32 else 1e-9)
        if dtype == np.float64:
            assert float(rel.max()) <= TOL
    f0, flag, prob = audio.pyin(y, fmin=65.0, fmax=2093.0, sr=16000)
    assert f0.shape == flag.shape == prob.shape == (3, 1 + 16000 // 512)
    assert np.all(np.isnan(f0.to_numpy()) == (flag.to_numpy() == 0))


def _random_observations(seed: int, rows: int, n_states: int, n_frames: int) -> Array:
    rng = np.random.default_rng(seed)
    obs = rng.uniform(0, 1, (rows, n_states, n_frames)) * (rng.uniform(0, 1, (rows, n_states, n_frames)) < 0.2)
    result: Array = obs / np.maximum(obs.sum(axis=1, keepdims=True), 1e-12)
    return result


def test_host_viterbi_matches_librosa() -> None:
    librosa = _lib("librosa")
    table = pitch._transition(30, 7, 0.02)
    with np.errstate(divide="ignore"):
        log_trans = np.log(table + np.finfo(np.float64).tiny)
    for observation in _random_observations(5, 3, 60, 80):
        want = librosa.sequence.viterbi(observation, table, p_init=np.full(60, 1 / 60))
        np.testing.assert_array_equal(pitch._viterbi(observation, log_trans), want)


@pytest.mark.gpu
def test_viterbi_kernel_on_device() -> None:
    from pygpukit.core.array import from_numpy

    table = pitch._transition(301, 37, 0.01)
    log_trans = np.log(table + np.finfo(np.float64).tiny)
    observations = _random_observations(6, 3, 602, 150)
    got = pitch._device_viterbi(observations, from_numpy(log_trans))
    want = np.stack([pitch._viterbi(observation, log_trans) for observation in observations])
    np.testing.assert_array_equal(got, want)
