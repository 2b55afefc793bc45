"""griffin_lim, phase_vocoder, time_stretch and pitch_shift against librosa in float64 (relative to the largest
reference value), batched, on random, synthetic and real signals. Runs on whatever backend is in use: the CPU
simulation here, the GPU kernels on a GPU (the ``gpu`` tests compare the device with the float64 sums)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio
from pygpukit.audio import phase
from pygpukit.core.errors import ArgumentError, ShapeError


def _lib(name: str) -> Any:
    """A reference library (librosa, soundfile), imported by the test that needs it: the GPU tests of this
    file compare with float64 loops and run where the references are not installed."""
    return pytest.importorskip(name)


Array = np.ndarray[Any, Any]
TOL = 1e-4


def _rel(got: Any, want: Array) -> float:
    values = audio.complex_to_numpy(got) if got.ndim == want.ndim + 1 and got.shape[-1] == 2 else got.to_numpy()
    assert values.shape == want.shape, (values.shape, want.shape)
    return float(np.abs(values - want).max() / max(float(np.abs(want).max()), 1e-300))


def _signals(seed: int, length: int = 8000) -> Array:
    rng = np.random.default_rng(seed)
    t = np.arange(length) / 16000.0
    chirp = 0.5 * np.sin(2 * np.pi * (200 + 900 * t) * t) + 0.2 * np.sin(2 * np.pi * 3100 * t) + 0.05
    return np.stack([0.3 * rng.standard_normal(length), chirp])


def _tones(seed: int, fmax: float, length: int = 16000) -> Array:
    rng = np.random.default_rng(seed)
    t = np.arange(length) / 16000.0
    freqs, phases = rng.uniform(100, fmax, 6), rng.uniform(0, 6.28, 6)
    values: Array = (0.1 * np.sin(2 * np.pi * freqs[:, None] * t[None] + phases[:, None])).sum(0)
    return values


@pytest.mark.parametrize(("n_fft", "hop", "momentum", "init", "length"),
                         [(512, 128, 0.99, "random", None), (400, 100, 0.0, "random", None),
                          (256, None, 0.5, None, 5000)])  # fmt: skip
def test_griffin_lim_matches_librosa_with_a_seed(n_fft: int, hop: int | None, momentum: float, init: Any,
                                                 length: int | None) -> None:  # fmt: skip
    y = _signals(1, 5000)
    mags = np.abs(_lib("librosa").stft(y, n_fft=n_fft, hop_length=hop))
    kw: dict[str, Any] = {"n_fft": n_fft, "hop_length": hop, "momentum": momentum, "init": init, "length": length}
    got = audio.griffin_lim(mags, n_iter=16, random_state=7, **kw)
    want = _lib("librosa").griffinlim(mags, n_iter=16, random_state=7, **kw)
    assert _rel(got, want) <= 1e-8
    # a Generator is used as given, as librosa does
    got = audio.griffin_lim(mags[0], n_iter=4, random_state=np.random.default_rng(3), **kw)
    want = _lib("librosa").griffinlim(mags[0], n_iter=4, random_state=np.random.default_rng(3), **kw)
    assert _rel(got, want) <= 1e-8


def test_griffin_lim_refuses_bad_arguments() -> None:
    mags = np.abs(np.random.default_rng(0).standard_normal((129, 10)))
    with pytest.raises(ArgumentError, match="momentum"):
        audio.griffin_lim(mags, momentum=-0.1)
    with pytest.raises(ArgumentError, match="init"):
        audio.griffin_lim(mags, init="zeros")
    with pytest.raises(ArgumentError, match="random_state"):
        audio.griffin_lim(mags, random_state="seed")
    with pytest.raises(ShapeError, match="n_fft >= 2"):
        audio.griffin_lim(np.ones((1, 4)))
    mags[3, 3] = np.nan
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.griffin_lim(mags)
    with pytest.warns(UserWarning, match="unstable"):
        audio.griffin_lim(np.abs(mags[:, :3]) * 0 + 1.0, n_iter=1, momentum=1.5)


@pytest.mark.parametrize("rate", [0.5, 0.8, 1.0, 1.25, 2.0, 3.3])
def test_phase_vocoder_and_time_stretch_match_librosa(rate: float) -> None:
    y = _signals(2)
    spec = _lib("librosa").stft(y, n_fft=512, hop_length=128)
    got = audio.phase_vocoder(audio.stft(y, n_fft=512, hop_length=128), rate=rate)
    want = _lib("librosa").phase_vocoder(spec, rate=rate)
    assert _rel(got, want) <= 1e-8  # phases accumulate over frames: rounding grows, far below 1e-4
    stretched = audio.time_stretch(y, rate=rate, n_fft=512)
    assert _rel(stretched, _lib("librosa").effects.time_stretch(y, rate=rate, n_fft=512)) <= 1e-8
    default = audio.time_stretch(y[1], rate=rate)  # n_fft=2048, hop 512
    assert _rel(default, _lib("librosa").effects.time_stretch(y[1], rate=rate)) <= 1e-8


@pytest.mark.parametrize("n_steps", [3, -4, 0.5, 12])
def test_pitch_shift_matches_librosa_away_from_the_edges(n_steps: float) -> None:
    fmax = 5000.0 * min(1.0, 2.0 ** (-n_steps / 12))  # the shifted tones stay below 0.8 of the Nyquist rate
    y = np.stack([_tones(3, fmax), _tones(4, fmax)])
    got = audio.pitch_shift(y, sr=16000, n_steps=n_steps, n_fft=512).to_numpy()
    want = _lib("librosa").effects.pitch_shift(y, sr=16000, n_steps=n_steps, n_fft=512)
    assert got.shape == want.shape == y.shape
    # soxr treats the first and last samples its own way; inside, the two resamplers agree to soxr_hq's error
    # (up to 2e-5 of full scale against the exact answer: test_resample.py)
    inner = slice(300, -300)
    assert np.abs(got - want)[:, inner].max() / np.abs(want).max() <= 5e-5
    # everywhere: librosa's time_stretch (checked above) then the float64 windowed sinc at sr / rate -> sr
    rate = 2.0 ** (-n_steps / 12)
    stretched = _lib("librosa").effects.time_stretch(y, rate=rate, n_fft=512)
    exact = audio.resample(stretched, orig_sr=16000 / rate, target_sr=16000).to_numpy()
    exact = _lib("librosa").util.fix_length(exact, size=y.shape[-1])
    assert np.abs(got - exact).max() <= 1e-10


def test_phase_refuses_bad_arguments() -> None:
    y = _signals(0)
    with pytest.raises(ArgumentError, match="rate"):
        audio.time_stretch(y, rate=0.0)
    with pytest.raises(ArgumentError, match="bins_per_octave"):
        audio.pitch_shift(y, sr=16000, n_steps=2, bins_per_octave=0)
    with pytest.raises(ArgumentError, match="sr"):
        audio.pitch_shift(y, sr=-1, n_steps=2)
    with pytest.raises(ShapeError, match="complex"):
        audio.phase_vocoder(audio.stft(y, n_fft=64)[..., 0], rate=2.0)
    with pytest.raises(ShapeError, match="no sample"):
        audio.time_stretch(np.ones(1), rate=3.0, n_fft=4)


@pytest.mark.audio_data
def test_real_recordings(speech_16k: list[Path], music_8k: list[Path]) -> None:
    for files, n_fft in ((speech_16k[:2], 512), (music_8k[:1], 1024)):
        signals = [_lib("soundfile").read(str(p), dtype="float64")[0][:24000] for p in files]
        length = min(len(s) for s in signals)
        y = np.stack([s[:length] for s in signals])
        assert _rel(audio.time_stretch(y, rate=1.3, n_fft=n_fft),
                    _lib("librosa").effects.time_stretch(y, rate=1.3, n_fft=n_fft)) <= TOL  # fmt: skip
        mags = np.abs(_lib("librosa").stft(y, n_fft=n_fft))
        assert _rel(audio.griffin_lim(mags, n_iter=8, random_state=0),
                    _lib("librosa").griffinlim(mags, n_iter=8, random_state=0)) <= TOL  # fmt: skip


@pytest.mark.nvrtc
def test_the_kernel_file_compiles() -> None:
    from pygpukit.audio import _kernels
    from pygpukit.core.compiler import compile_source

    names = [f"phase_vocoder_{s}" for s in ("f32", "f64")]
    file = phase._FILE
    program = compile_source(_kernels.SOURCES.source(file), arch=80, name=file, name_expressions=names,
                             include_dirs=_kernels.SOURCES.include_dirs(file))  # fmt: skip
    assert set(program.lowered_names) >= set(names)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_phase_vocoder_matches_the_float64_loop(dtype: Any) -> None:
    y = _signals(5, 16000).astype(dtype)
    spec = audio.stft(y, n_fft=512, hop_length=128)
    values = audio.complex_to_numpy(spec).astype(np.complex128)
    for rate in (0.7, 1.6):
        got = audio.phase_vocoder(spec, rate=rate)
        frames = np.swapaxes(values, -1, -2)
        n_out = len(np.arange(0, values.shape[-1], rate))
        want = np.swapaxes(phase._host_vocoder(frames, rate, n_out), -1, -2)
        # float32 inputs: phases accumulate in double from float32 bins
        assert _rel(got, want) <= (2e-4 if dtype == np.float32 else 1e-10)
    mags = np.abs(_lib("librosa").stft(y.astype(np.float64), n_fft=512, hop_length=128)).astype(dtype)
    got_gl = audio.griffin_lim(mags, n_iter=8, hop_length=128, random_state=1)
    want_gl = _lib("librosa").griffinlim(mags.astype(np.float64), n_iter=8, hop_length=128, random_state=1)
    assert _rel(got_gl, want_gl) <= (1e-3 if dtype == np.float32 else 1e-8)
