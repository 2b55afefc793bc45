"""The analysis functions on the device (yin, pyin, onset_strength, onset_detect, tempo, beat_track, trim, split,
highpass_filter, short_term_energy, noise_gate, spectral_gate) against the CPU backend's float64 NumPy results
for the same inputs, computed in a subprocess with PYGPUKIT_BACKEND=cpu (test_analysis_pitch.py,
test_analysis_onset.py and test_analysis_dynamics.py tie those to librosa and scipy). Needs the CUDA backend,
not librosa. Continuous results: float64 within 1e-9 of the peak, float32 within 1e-4; event frames within one
hop; intervals identical."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio

pytestmark = pytest.mark.gpu

Array = np.ndarray[Any, Any]
TOL: dict[Any, float] = {np.float32: 1e-4, np.float64: 1e-9}
SR = 22050

# name -> (function, keyword arguments); each is called on the batch of _signals() (or its first row: "mono").
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "yin": ("yin", {"fmin": 65.0, "fmax": 2093.0, "sr": SR}),
    "yin_short": ("yin", {"fmin": 100.0, "fmax": 1000.0, "sr": SR, "frame_length": 1024, "hop_length": 200,
                          "center": False}),
    "onset": ("onset_strength", {"sr": SR}),
    "onset_median": ("onset_strength", {"sr": SR, "aggregate": np.median, "lag": 2, "max_size": 3}),
    "onset_detrend": ("onset_strength", {"sr": SR, "detrend": True, "n_fft": 1024, "hop_length": 256}),
    "highpass": ("highpass_filter", {"sr": SR, "cutoff": 120.0, "order": 5}),
    "energy": ("short_term_energy", {}),
    "gate": ("noise_gate", {"threshold_db": -30.0, "reduction_db": -12.0}),
    "spectral_gate": ("spectral_gate", {"sr": SR, "n_fft": 1024}),
}  # fmt: skip


def _signals() -> Array:
    """A batch (2, T) of 3 s: a gliding tone with a click every 0.5 s and a quiet head, and noise."""
    rng = np.random.default_rng(0)
    t = np.arange(3 * SR) / SR
    tone = 0.5 * np.sin(2 * np.pi * 200 * t * (1 + 0.2 * t)) + 0.01 * rng.standard_normal(t.size)
    for start in range(SR // 4, t.size - 300, SR // 2):
        tone[start : start + 300] += np.hanning(300)
    tone[: SR // 5] *= 1e-4
    return np.stack([tone, 0.2 * rng.standard_normal(t.size)])


def _clicks() -> Array:
    """6 s of faint noise with a tone burst of random loudness every 60/128 s."""
    rng = np.random.default_rng(2)
    n = 6 * SR
    y = 0.01 * rng.standard_normal(n)
    burst = np.hanning(300) * np.sin(np.arange(300) * 0.3)
    for start in np.arange(1000, n - 400, SR * 60.0 / 128).astype(int):
        y[start : start + 300] += rng.uniform(0.5, 1.0) * burst
    return y


_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, sys.argv[2])
    import pygpukit.audio as audio
    from test_analysis_gpu import CASES, SR, _clicks, _signals
    y = _signals()
    out = {key: getattr(audio, fn)(y, **kw).to_numpy() for key, (fn, kw) in CASES.items()}
    f0, flag, prob = audio.pyin(y, fmin=65.0, fmax=1000.0, sr=SR)
    out["pyin_f0"], out["pyin_flag"], out["pyin_prob"] = f0.to_numpy(), flag.to_numpy(), prob.to_numpy()
    c = _clicks()
    out["onsets"] = audio.onset_detect(c, sr=SR)
    out["tempo"], out["beats"] = audio.beat_track(c, sr=SR)
    out["trim"] = audio.trim(y[0], top_db=40)[1]
    out["split"] = audio.split(c, top_db=30)
    np.savez(sys.argv[1], **out)
""")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Array]:
    path = tmp_path_factory.mktemp("analysis") / "reference.npz"
    env = {**os.environ, "PYGPUKIT_BACKEND": "cpu"}
    subprocess.run([sys.executable, "-c", _SCRIPT, str(path), str(Path(__file__).parent)], check=True, env=env,
                   timeout=900)  # fmt: skip
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _rel(got: Array, want: Array) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-300))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("key", sorted(CASES))
def test_analysis_matches_the_cpu_backend(reference: dict[str, Array], key: str, dtype: type) -> None:
    fn, kw = CASES[key]
    got = getattr(audio, fn)(_signals().astype(dtype), **kw)
    assert got.dtype.name == np.dtype(dtype).name
    values = got.to_numpy().astype(np.float64)
    if fn == "yin" and dtype is np.float32:  # a near-tie may pick another trough in float32: most frames agree
        rel = np.abs(values - reference[key]) / reference[key]
        assert float(np.mean(rel <= 1e-4)) >= 0.95
        return
    tol = TOL[dtype]
    if key == "spectral_gate" and dtype is np.float32:
        tol = 5e-3  # a bin within float32 rounding of its noise threshold may switch between kept and gated
    assert _rel(values, reference[key]) <= tol


def test_pyin_and_events_match_the_cpu_backend(reference: dict[str, Array]) -> None:
    y = _signals()
    f0, flag, prob = audio.pyin(y, fmin=65.0, fmax=1000.0, sr=SR)
    np.testing.assert_array_equal(flag.to_numpy(), reference["pyin_flag"])
    np.testing.assert_allclose(f0.to_numpy(), reference["pyin_f0"], rtol=1e-9, equal_nan=True)
    np.testing.assert_allclose(prob.to_numpy(), reference["pyin_prob"], rtol=0, atol=1e-9)
    c = _clicks()
    onsets = audio.onset_detect(c, sr=SR)
    assert len(onsets) == len(reference["onsets"])
    assert np.all(np.abs(onsets - reference["onsets"]) <= 1)
    tempo, beats = audio.beat_track(c, sr=SR)
    np.testing.assert_array_equal(tempo, reference["tempo"])
    assert len(beats) == len(reference["beats"])
    assert np.all(np.abs(beats - reference["beats"]) <= 1)
    np.testing.assert_array_equal(audio.trim(y[0], top_db=40)[1], reference["trim"])
    np.testing.assert_array_equal(audio.split(c, top_db=30), reference["split"])
