"""The music kernels on the device (cqt / vqt, chroma_cqt, chroma_stft, spectral_contrast, hpss, harmonic) against
the CPU backend's float64 NumPy results for the same inputs, computed in a subprocess with PYGPUKIT_BACKEND=cpu
(test_music_librosa.py ties those to librosa). Needs the CUDA backend, not librosa. float64 within 1e-9 of the
peak, float32 within 1e-4 (the bar of the linear features)."""

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
from pygpukit.core.errors import ArgumentError

pytestmark = pytest.mark.gpu

Array = np.ndarray[Any, Any]
TOL: dict[Any, float] = {np.float32: 1e-4, np.float64: 1e-9}
SR = 22050

# name -> (function, keyword arguments); "y" is the batch below, "S"/"D" spectrograms of it.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "cqt_fft": ("cqt", {"sr": SR, "res_type": "fft"}),
    "cqt_soxr": ("cqt", {"sr": SR, "hop_length": 256, "n_bins": 60, "fmin": 65.0}),
    "cqt_noscale": ("cqt", {"sr": SR, "hop_length": 1024, "scale": False, "n_bins": 48, "bins_per_octave": 24,
                            "res_type": "fft"}),
    "vqt": ("vqt", {"sr": SR, "n_bins": 72, "res_type": "fft"}),
    "pseudo_cqt": ("pseudo_cqt", {"sr": SR, "hop_length": 256, "n_bins": 48, "fmin": 200.0}),
    "hybrid_cqt": ("hybrid_cqt", {"sr": SR, "res_type": "fft"}),
    "chroma_cqt": ("chroma_cqt", {"sr": SR, "tuning": 0.0}),
    "chroma_stft": ("chroma_stft", {"sr": SR, "tuning": 0.1}),
    "chroma_stft_l2": ("chroma_stft", {"sr": SR, "tuning": 0.0, "norm": 2, "n_fft": 1024, "hop_length": 256}),
    "contrast": ("spectral_contrast", {"sr": SR}),
    "contrast_lin": ("spectral_contrast", {"sr": SR, "linear": True, "n_bands": 4, "fmin": 300.0, "quantile": 0.1}),
    "harmonic": ("harmonic", {"n_fft": 1024}),
    "percussive": ("percussive", {"margin": 2.0, "n_fft": 512}),
}  # fmt: skip
HPSS_CASES: dict[str, dict[str, Any]] = {
    "hpss": {}, "hpss_margin": {"margin": 3.0}, "hpss_inf": {"kernel_size": (17, 8), "power": np.inf},
    "hpss_mask": {"mask": True, "margin": (1.0, 2.0)}, "hpss_even": {"kernel_size": 4, "power": 1.0},
}  # fmt: skip


def _signals() -> Array:
    rng = np.random.default_rng(0)
    t = np.arange(int(1.5 * SR) + 3) / SR
    chord = sum(0.3 * np.sin(2 * np.pi * f * 1.004 * t) for f in (220.0, 277.18, 329.63))
    clicks = np.zeros_like(t)
    clicks[:: SR // 4] = 1.0
    # the noise floor of the second signal keeps spectral contrast's valleys above float32's rounding noise
    return np.stack([0.3 * rng.standard_normal(t.size), chord + clicks + 0.01 * rng.standard_normal(t.size)])


_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, sys.argv[2])
    import pygpukit.audio as audio
    from test_music_gpu import CASES, HPSS_CASES, _signals
    y = _signals()
    out = {}
    for key, (fn, kw) in CASES.items():
        f = getattr(audio, fn)
        r = f(y, **kw) if fn in ("cqt", "vqt", "pseudo_cqt", "hybrid_cqt", "harmonic", "percussive") else f(y=y, **kw)
        out[key] = audio.complex_to_numpy(r) if fn in ("cqt", "vqt") else r.to_numpy()
    D = audio.complex_to_numpy(audio.stft(y, n_fft=512))
    for key, kw in HPSS_CASES.items():
        h, p = audio.hpss(D, **kw)
        out[key + "_h"] = h.to_numpy() if kw.get("mask") else audio.complex_to_numpy(h)
        out[key + "_p"] = p.to_numpy() if kw.get("mask") else audio.complex_to_numpy(p)
        h, p = audio.hpss(np.abs(D), **kw)
        out[key + "_mh"], out[key + "_mp"] = h.to_numpy(), p.to_numpy()
    np.savez(sys.argv[1], **out)
""")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Array]:
    path = tmp_path_factory.mktemp("music") / "reference.npz"
    env = {**os.environ, "PYGPUKIT_BACKEND": "cpu"}
    subprocess.run([sys.executable, "-c", _SCRIPT, str(path), str(Path(__file__).parent)], check=True, env=env,
                   timeout=900)  # fmt: skip
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _rel(got: Any, want: Array) -> float:
    values = audio.complex_to_numpy(got) if got.ndim == want.ndim + 1 and got.shape[-1] == 2 else got.to_numpy()
    assert values.shape == want.shape, (values.shape, want.shape)
    return float(np.abs(values - want).max() / max(float(np.abs(want).max()), 1e-300))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("key", sorted(CASES))
def test_features_match_the_cpu_backend(reference: dict[str, Array], key: str, dtype: type) -> None:
    fn, kw = CASES[key]
    y: Array = _signals().astype(dtype)
    func = getattr(audio, fn)
    got = (
        func(y, **kw) if fn in ("cqt", "vqt", "pseudo_cqt", "hybrid_cqt", "harmonic", "percussive") else func(y=y, **kw)
    )
    assert got.dtype.name == np.dtype(dtype).name
    tol = TOL[dtype]
    if key == "cqt_soxr" and dtype is np.float32:
        tol = 2e-4  # the polyphase resampler's float32 taps, three octaves deep
    assert _rel(got, reference[key]) <= tol


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("key", sorted(HPSS_CASES))
def test_hpss_matches_the_cpu_backend(reference: dict[str, Array], key: str, dtype: type) -> None:
    kw = HPSS_CASES[key]
    D = audio.complex_to_numpy(audio.stft(_signals(), n_fft=512))  # noqa: N806 - float64, as the reference's
    spec = audio.complex_from_numpy(D, dtype=dtype)
    h, p = audio.hpss(spec, **kw)
    assert _rel(h, reference[key + "_h"]) <= TOL[dtype]
    assert _rel(p, reference[key + "_p"]) <= TOL[dtype]
    h, p = audio.hpss(np.abs(D).astype(dtype), **kw)
    assert _rel(h, reference[key + "_mh"]) <= TOL[dtype]
    assert _rel(p, reference[key + "_mp"]) <= TOL[dtype]


def test_median_filter_ties_and_wide_windows() -> None:
    """Exact order statistics: rounded values (many ties), windows wider than the axis (reflected repeatedly)."""
    rng = np.random.default_rng(1)
    S = np.round(np.abs(rng.standard_normal((3, 40, 7))), 1)  # noqa: N806
    from pygpukit.audio.decompose import _median_host

    mask_h, mask_p = audio.hpss(S, kernel_size=(31, 5), mask=True)
    harm, perc = _median_host(S, 31, 2), _median_host(S, 5, 1)
    z = np.maximum(harm, perc)
    safe = np.where(z < np.finfo(np.float64).tiny, 1.0, z)
    mh, mp = (harm / safe) ** 2, (perc / safe) ** 2
    want_h = np.where(z < np.finfo(np.float64).tiny, 0.5, mh / np.where(mh + mp == 0, 1.0, mh + mp))
    want_p = np.where(z < np.finfo(np.float64).tiny, 0.5, mp / np.where(mh + mp == 0, 1.0, mh + mp))
    np.testing.assert_allclose(mask_h.to_numpy(), want_h, rtol=0, atol=1e-12)
    np.testing.assert_allclose(mask_p.to_numpy(), want_p, rtol=0, atol=1e-12)


def test_nan_is_refused_on_the_device() -> None:
    y = _signals()
    y[0, 5] = np.nan
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.cqt(y, sr=SR)
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.spectral_contrast(y=y, sr=SR)
