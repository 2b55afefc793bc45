"""Filter banks, windows and frequency grids, computed in float64 on the host as librosa computes them.

These are parameters, not data: small tables made once per set of arguments (the GPU functions keep their
device copies per argument set). ``get_window`` gives scipy.signal.get_window's periodic windows (``hann``,
``hamming``, ``blackman``, ``bartlett``, ``boxcar``/``rectangular``/``ones``) or checks a given array;
``mel`` is librosa.filters.mel (Slaney or HTK mel scale, ``norm="slaney"`` area normalisation, a p-norm, or
None); ``dct`` the DCT-II matrix of scipy.fft.dct (``norm="ortho"`` or None).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pygpukit.core.errors import ArgumentError

from ._common import Array, number, positive_int

__all__ = [
    "dct",
    "fft_frequencies",
    "get_window",
    "hz_to_mel",
    "mel",
    "mel_frequencies",
    "mel_to_hz",
    "next_fast_len",
    "pad_center",
    "savgol_coefficients",
]

_WINDOWS = ("hann", "hamming", "blackman", "bartlett", "boxcar", "rectangular", "ones")


def get_window(window: Any, length: int, *, fftbins: bool = True) -> Array:
    """A window of ``length`` samples as float64: a name of :data:`_WINDOWS` (periodic when ``fftbins``, as
    scipy.signal.get_window), or an array of that length (returned as float64)."""
    length = positive_int("get_window", "length", length)
    if isinstance(window, str):
        name = window.lower()
        if name in ("hanning",):
            name = "hann"
        if name not in _WINDOWS:
            raise ArgumentError(f"get_window: unknown window {window!r}; supported: {', '.join(_WINDOWS)}, or an array")
        if length == 1:
            return np.ones(1)
        points = length + 1 if fftbins else length  # periodic: the symmetric window one longer, truncated
        n = np.arange(points, dtype=np.float64)
        phase = 2.0 * np.pi * n / (points - 1)
        if name == "hann":
            values = 0.5 - 0.5 * np.cos(phase)
        elif name == "hamming":
            values = 0.54 - 0.46 * np.cos(phase)
        elif name == "blackman":
            values = 0.42 - 0.5 * np.cos(phase) + 0.08 * np.cos(2.0 * phase)
        elif name == "bartlett":
            values = np.where(n <= (points - 1) / 2.0, 2.0 * n / (points - 1), 2.0 - 2.0 * n / (points - 1))
        else:
            values = np.ones(points)
        result: Array = values[:length]
        return result
    array = np.asarray(window)
    if array.ndim != 1 or array.dtype.kind not in "fiu":
        raise ArgumentError(f"get_window: window must be a name ({', '.join(_WINDOWS)}) or a 1-D real array, "
                            f"got {type(window).__name__}")  # fmt: skip
    if array.shape[0] != length:
        raise ArgumentError(f"get_window: a window array must have length {length}, got {array.shape[0]}")
    return array.astype(np.float64)


def pad_center(data: Array, size: int) -> Array:
    """``data`` (1-D) centred in ``size`` samples with zeros (librosa.util.pad_center)."""
    n = data.shape[-1]
    if size < n:
        raise ArgumentError(f"pad_center: target size {size} is shorter than the data ({n})")
    left = (size - n) // 2
    return np.pad(data, (left, size - n - left))


def fft_frequencies(sr: float = 22050, n_fft: int = 2048) -> Array:
    """The centre frequencies of the n_fft // 2 + 1 rfft bins (librosa.fft_frequencies)."""
    return np.fft.rfftfreq(n=positive_int("fft_frequencies", "n_fft", n_fft), d=1.0 / sr)


_F_SP = 200.0 / 3
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(frequencies: Any, *, htk: bool = False) -> Array:
    """Hz to mels: HTK's 2595 log10(1 + f / 700), or Slaney's (linear below 1 kHz, logarithmic above)."""
    f = np.asanyarray(frequencies, dtype=np.float64)
    if htk:
        result: Array = 2595.0 * np.log10(1.0 + f / 700.0)
        return result
    mels = f / _F_SP
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = _MIN_LOG_MEL + np.log(np.maximum(f, 1e-300) / _MIN_LOG_HZ) / _LOGSTEP
    out: Array = np.where(f >= _MIN_LOG_HZ, logs, mels)
    return out


def mel_to_hz(mels: Any, *, htk: bool = False) -> Array:
    """The inverse of :func:`hz_to_mel`."""
    m = np.asanyarray(mels, dtype=np.float64)
    if htk:
        result: Array = 700.0 * (10.0 ** (m / 2595.0) - 1.0)
        return result
    out: Array = np.where(m >= _MIN_LOG_MEL, _MIN_LOG_HZ * np.exp(_LOGSTEP * (m - _MIN_LOG_MEL)), _F_SP * m)
    return out


def mel_frequencies(n_mels: int = 128, *, fmin: float = 0.0, fmax: float = 11025.0, htk: bool = False) -> Array:
    """``n_mels`` frequencies evenly spaced on the mel scale from fmin to fmax (librosa.mel_frequencies)."""
    mels = np.linspace(hz_to_mel(fmin, htk=htk), hz_to_mel(fmax, htk=htk), n_mels)
    return mel_to_hz(mels, htk=htk)


def mel(*, sr: float, n_fft: int, n_mels: int = 128, fmin: float = 0.0, fmax: float | None = None,
        htk: bool = False, norm: Any = "slaney") -> Array:  # fmt: skip
    """The (n_mels, 1 + n_fft // 2) mel filterbank of librosa.filters.mel, in float64."""
    sr = number("mel", "sr", sr, minimum=0.0, exclusive=True)
    n_fft = positive_int("mel", "n_fft", n_fft)
    n_mels = positive_int("mel", "n_mels", n_mels)
    fmin = number("mel", "fmin", fmin, minimum=0.0)
    fmax = sr / 2.0 if fmax is None else number("mel", "fmax", fmax)
    if fmax <= fmin:
        raise ArgumentError(f"mel: fmax ({fmax}) must be above fmin ({fmin})")
    fftfreqs = fft_frequencies(sr, n_fft)
    mel_f = mel_frequencies(n_mels + 2, fmin=fmin, fmax=fmax, htk=htk)
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights: Array = np.maximum(0.0, np.minimum(lower, upper))
    if isinstance(norm, str):
        if norm != "slaney":
            raise ArgumentError(f"mel: norm must be 'slaney', a number (a p-norm) or None, got {norm!r}")
        weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    elif norm is not None:
        order = number("mel", "norm", norm, minimum=0.0, exclusive=True) if norm != np.inf else np.inf
        lengths = np.linalg.norm(weights, ord=order, axis=-1, keepdims=True)
        weights = weights / np.where(lengths < np.finfo(np.float64).tiny, 1.0, lengths)
    return weights


def dct(n_out: int, n_in: int, *, norm: str | None = "ortho") -> Array:
    """The (n_out, n_in) matrix of scipy.fft.dct type II over n_in points, first n_out coefficients."""
    n = np.arange(n_in, dtype=np.float64)
    k = np.arange(n_out, dtype=np.float64)[:, None]
    basis: Array = np.cos(np.pi * k * (2.0 * n + 1.0) / (2.0 * n_in))
    if norm == "ortho":
        basis *= np.sqrt(2.0 / n_in)
        basis[0] *= np.sqrt(0.5)
    elif norm is None:
        basis *= 2.0
    else:
        raise ArgumentError(f"dct: norm must be 'ortho' or None, got {norm!r}")
    return basis


def savgol_coefficients(width: int, order: int) -> Array:
    """Savitzky-Golay derivative weights of scipy.signal.savgol_filter(deriv=order, polyorder=order,
    mode="interp"), as rows: [centre (width), left edge (width // 2 rows), right edge (width // 2 rows)] x width.
    A row holds the weights of the samples its output reads (the window, or the first / last ``width``)."""
    half = width // 2
    x = np.arange(width, dtype=np.float64)
    vander = np.vander(x, order + 1, increasing=True)  # (width, order + 1)
    fit = np.linalg.pinv(vander)  # polynomial coefficients from the samples

    def at(position: float) -> Array:
        # d^order/dx^order of sum_j p_j x^j at `position`, as weights on the samples.
        powers = np.array([math.perm(j, order) * position ** (j - order) if j >= order else 0.0
                           for j in range(order + 1)])  # fmt: skip
        weights: Array = powers @ fit
        return weights

    rows = [at(half)] + [at(t) for t in range(half)] + [at(width - half + t) for t in range(half)]
    return np.stack(rows)


def next_fast_len(target: int) -> int:
    """The smallest 2^a 3^b 5^c >= target (scipy.fft.next_fast_len for real transforms)."""
    best = 1 << max(0, (target - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            quotient = -(-target // p35)
            p2 = 1 << max(0, (quotient - 1).bit_length())
            best = min(best, p2 * p35)
            p35 *= 3
        p5 *= 5
    return best
