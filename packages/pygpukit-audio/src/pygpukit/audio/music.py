"""Chroma and spectral contrast with librosa.feature's names, defaults and results, and the helpers the music
modules share (the launches of native/kernels/audio/music.cu, per-frame normalisation, tuning estimation).

``chroma_stft`` projects the power spectrogram with librosa's chroma filterbank (:func:`chroma_filter`, a
matmul through pygpukit.ops) and normalises each frame (``norm=np.inf`` by default) in one kernel;
``spectral_contrast`` sorts each octave band of each frame in shared memory (a bitonic sort, one block per
frame and band) and takes librosa's quantile means, then its decibel difference. ``tuning=None`` estimates
the tuning as librosa.estimate_tuning does (piptrack and a histogram of the peaks' deviations), on the host
from the spectrogram: a data-dependent scalar decision. On the CPU backend NumPy computes the same in
float64 and rounds once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, ShapeError

from . import _kernels as kern
from . import filters
from ._common import Array, as_signal, host, is_cuda, number, positive_int
from ._launch import device_table

__all__ = ["chroma_filter", "chroma_stft", "cq_to_chroma", "estimate_tuning", "spectral_contrast"]

_P = kern.pointer
_Q = "long long"
PARAMS = {
    "median_filter": (_P("x"), _P("out"), kern.c_param("n", _Q), kern.c_param("stride", _Q),
                      kern.c_param("len", _Q), kern.c_param("k", "int")),
    "hpss_mask": (_P("s"), _P("harm"), _P("perc"), _P("d"), _P("out_h"), _P("out_p"), kern.c_param("n", _Q),
                  kern.c_param("margin_h", "double"), kern.c_param("margin_p", "double"),
                  kern.c_param("power", "double"), kern.c_param("split_zeros", "int"), kern.c_param("mode", "int"),
                  kern.c_param("tiny", "double")),
    "band_contrast": (_P("s"), _P("bands"), _P("peak"), _P("valley"), kern.c_param("n_frames", _Q),
                      kern.c_param("n_bands", "int"), kern.c_param("s_row", _Q), kern.c_param("s_freq", _Q),
                      kern.c_param("s_frame", _Q)),
    "normalize_rows": (_P("x"), _P("out"), kern.c_param("rows", _Q), kern.c_param("width", "int"),
                       kern.c_param("norm_code", "int"), kern.c_param("p", "double"), kern.c_param("floor", "double"),
                       kern.c_param("tiny", "double")),
    "stack_block": (_P("src"), _P("dst"), kern.c_param("groups", _Q), kern.c_param("n_frames", _Q),
                    kern.c_param("src_frames", _Q), kern.c_param("src_width", _Q), kern.c_param("dst_width", _Q),
                    kern.c_param("src_off", _Q), kern.c_param("dst_off", _Q), kern.c_param("width", _Q)),
    "spectrum_crop": (_P("src"), _P("dst"), kern.c_param("rows", _Q), kern.c_param("src_bins", _Q),
                      kern.c_param("dst_bins", _Q), kern.c_param("scale", "double"), kern.c_param("doubled", _Q)),
}  # fmt: skip


def launch(name: str, dtype: DType, work: int, *args: Any, grid: Any = None, block: int = kern.BLOCK,
           shared_mem: int = 0) -> None:  # fmt: skip
    """One launch of a music.cu kernel (a grid-stride launch over ``work`` items unless ``grid`` is given)."""
    blocks = grid if grid is not None else kern.grid_for(work)
    kern.kernel(name, dtype, PARAMS[name])(*args, grid=blocks, block=block, shared_mem=shared_mem)


# -- normalisation ---------------------------------------------------------------------------------------------
def _norm_code(name: str, norm: Any) -> tuple[int, float] | None:
    """(kernel code, p) of a librosa norm: None (no normalisation), np.inf, or a number > 0."""
    if norm is None:
        return None
    value = number(name, "norm", norm, minimum=0.0, exclusive=True) if norm != np.inf else math.inf
    if math.isinf(value):
        return 0, 0.0
    if value == 1.0:
        return 1, 1.0
    if value == 2.0:
        return 2, 2.0
    return 3, value


def normalize_frames(name: str, frame_major: GPUArray, norm: Any, floor: float = 0.0) -> GPUArray:
    """librosa.util.normalize over the last axis of a contiguous (..., width) array (values below ``floor``
    zeroed first when floor > 0); a new array."""
    code = _norm_code(name, norm)
    width = frame_major.shape[-1]
    rows = frame_major.size // max(width, 1)
    dt = frame_major.dtype
    tiny = float(np.finfo(dt.numpy).tiny)
    out = empty(frame_major.shape, dt)
    if out.size == 0:
        return out
    if is_cuda():
        # norm=None: a 1-norm whose threshold (infinity) leaves every row divided by 1, after the floor
        c, p = (1, 1.0) if code is None else code
        launch("normalize_rows", dt, rows, frame_major.device_ptr, out.device_ptr, rows, width, c, p, floor,
               tiny if code is not None else math.inf)  # fmt: skip
        return out
    x = host(frame_major).astype(np.float64)
    if floor > 0.0:
        x = np.where(x < floor, 0.0, x)
    if code is None:
        host(out)[...] = x.astype(dt.numpy)
        return out
    mag = np.abs(x)
    c, p = code
    length = mag.max(axis=-1, keepdims=True) if c == 0 else np.sum(mag**p, axis=-1, keepdims=True) ** (1.0 / p)
    length = np.where(length < tiny, 1.0, length)
    host(out)[...] = (x / length).astype(dt.numpy)
    return out


def project_frames(S: GPUArray, basis: Array | Callable[[], Array], key: tuple[Any, ...]) -> GPUArray:  # noqa: N803
    """basis (out, n_in) (or a function making it, called once per key) applied along axis -2 of S
    (..., n_in, n_frames), as frame-major contiguous (..., n_frames, out)."""
    from .features import _project

    def make() -> Array:
        values = basis() if callable(basis) else basis
        result: Array = np.asarray(values).T
        return result

    basis_t = device_table(key, make, S.dtype)
    result = _project(S, basis_t)
    k = result.ndim - 2
    frame_major = result.transpose(*range(k), k + 1, k)
    return frame_major if frame_major.is_contiguous else frame_major.contiguous()


def frames_last(frame_major: GPUArray) -> GPUArray:
    k = frame_major.ndim - 2
    return frame_major.transpose(*range(k), k + 1, k)


# -- filterbanks --------------------------------------------------------------------------------------------------
def hz_to_octs(frequencies: Any, *, tuning: float = 0.0, bins_per_octave: int = 12) -> Array:
    a440 = 440.0 * 2.0 ** (tuning / bins_per_octave)
    result: Array = np.log2(np.asarray(frequencies, dtype=np.float64) / (a440 / 16))
    return result


def chroma_filter(*, sr: float, n_fft: int, n_chroma: int = 12, tuning: float = 0.0, ctroct: float = 5.0,
                  octwidth: float | None = 2, norm: float | None = 2, base_c: bool = True) -> Array:  # fmt: skip
    """librosa.filters.chroma in float64: (n_chroma, 1 + n_fft // 2)."""
    frequencies = np.linspace(0, sr, n_fft, endpoint=False)[1:]
    frqbins = n_chroma * hz_to_octs(frequencies, tuning=tuning, bins_per_octave=n_chroma)
    frqbins = np.concatenate(([frqbins[0] - 1.5 * n_chroma], frqbins))
    binwidthbins = np.concatenate((np.maximum(frqbins[1:] - frqbins[:-1], 1.0), [1]))
    d = np.subtract.outer(frqbins, np.arange(0, n_chroma, dtype="d")).T
    n_chroma2 = np.round(float(n_chroma) / 2)
    d = np.remainder(d + n_chroma2 + 10 * n_chroma, n_chroma) - n_chroma2
    wts = np.exp(-0.5 * (2 * d / np.tile(binwidthbins, (n_chroma, 1))) ** 2)
    if norm is not None:
        mag = np.abs(wts)
        length = mag.max(axis=0, keepdims=True) if norm == np.inf else np.sum(mag**norm, axis=0, keepdims=True) ** (
            1.0 / norm)  # fmt: skip
        wts = wts / np.where(length < np.finfo(np.float64).tiny, 1.0, length)
    if octwidth is not None:
        wts *= np.tile(np.exp(-0.5 * ((frqbins / n_chroma - ctroct) / octwidth) ** 2), (n_chroma, 1))
    if base_c:
        wts = np.roll(wts, -3 * (n_chroma // 12), axis=0)
    return np.ascontiguousarray(wts[:, : int(1 + n_fft / 2)])


def hz_to_midi(frequencies: Any) -> Array:
    result: Array = 12 * (np.log2(np.asarray(frequencies, dtype=np.float64)) - np.log2(440.0)) + 69
    return result


C1 = 440.0 * 2.0 ** ((24 - 69) / 12.0)  # librosa.note_to_hz("C1")


def cq_to_chroma(n_input: int, *, bins_per_octave: int = 12, n_chroma: int = 12, fmin: float | None = None,
                 base_c: bool = True) -> Array:  # fmt: skip
    """librosa.filters.cq_to_chroma (without ``window``) in float64: (n_chroma, n_input)."""
    n_merge = float(bins_per_octave) / n_chroma
    if n_merge % 1 != 0:
        raise ArgumentError(f"cq_to_chroma: bins_per_octave={bins_per_octave} must be a multiple of "
                            f"n_chroma={n_chroma}")  # fmt: skip
    matrix = np.repeat(np.eye(n_chroma), int(n_merge), axis=1)
    matrix = np.roll(matrix, -int(n_merge // 2), axis=1)
    n_octaves = math.ceil(float(n_input) / bins_per_octave)
    matrix = np.tile(matrix, n_octaves)[:, :n_input]
    midi_0 = np.mod(hz_to_midi(C1 if fmin is None else fmin), 12)
    roll = midi_0 if base_c else midi_0 - 9
    return np.roll(matrix, int(np.round(roll * (n_chroma / 12.0))), axis=0)


# -- tuning -----------------------------------------------------------------------------------------------------
def _piptrack(S: Array, sr: float, n_fft: int, fmin: float = 150.0, fmax: float = 4000.0,  # noqa: N803
              threshold: float = 0.1) -> tuple[Array, Array]:  # fmt: skip
    """librosa.piptrack of a magnitude spectrogram (..., n_freq, n_frames) in float64."""
    fmax = min(fmax, float(sr) / 2)
    freqs = filters.fft_frequencies(sr=sr, n_fft=n_fft)
    avg = np.gradient(S, axis=-2)
    shift = np.zeros_like(S)
    a = S[..., 2:, :] + S[..., :-2, :] - 2 * S[..., 1:-1, :]
    b = (S[..., 2:, :] - S[..., :-2, :]) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        shift[..., 1:-1, :] = np.where(np.abs(b) >= np.abs(a), 0.0, -b / np.where(a == 0, 1.0, a))
    dskew = 0.5 * avg * shift
    ref = threshold * S.max(axis=-2, keepdims=True)
    x = S * (ref < S)
    local = np.zeros(S.shape, dtype=bool)
    local[..., 1:-1, :] = (x[..., 1:-1, :] > x[..., :-2, :]) & (x[..., 1:-1, :] >= x[..., 2:, :])
    local[..., -1, :] = x[..., -1, :] > x[..., -2, :]
    mask = ((fmin <= freqs) & (freqs < fmax))[:, None] & local
    pitches = np.where(mask, (np.arange(S.shape[-2])[:, None] + shift) * float(sr) / n_fft, 0.0)
    mags = np.where(mask, S + dskew, 0.0)
    return pitches, mags


def _pitch_tuning(frequencies: Array, resolution: float, bins_per_octave: int) -> float:
    frequencies = frequencies[frequencies > 0]
    if frequencies.size == 0:
        return 0.0
    residual = np.mod(bins_per_octave * hz_to_octs(frequencies), 1.0)
    residual[residual >= 0.5] -= 1.0
    bins = np.linspace(-0.5, 0.5, int(np.ceil(1.0 / resolution)) + 1)
    counts, edges = np.histogram(residual, bins)
    return float(edges[np.argmax(counts)])


def estimate_tuning(*, y: Any = None, sr: float = 22050, S: Any = None, n_fft: int = 2048,  # noqa: N803
                    resolution: float = 0.01, bins_per_octave: int = 12) -> float:  # fmt: skip
    """librosa.estimate_tuning: the tuning deviation (fractions of a bin) of the spectral peaks of ``y`` or of a
    magnitude/power spectrogram ``S`` (one number for the whole batch, as librosa)."""
    name = "estimate_tuning"
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    if S is None:
        if y is None:
            raise ArgumentError(f"{name}: give y (audio) or S (a spectrogram)")
        from .spectral import magnitude, stft

        spec = magnitude(stft(y, n_fft=positive_int(name, "n_fft", n_fft)))
        n = n_fft
    else:
        spec = as_signal(name, "S", S, min_ndim=2)
        n = 2 * (spec.shape[-2] - 1)
    values = np.abs(spec.to_numpy().astype(np.float64))
    pitch, mag = _piptrack(values, rate, n)
    found = pitch > 0
    limit = float(np.median(mag[found])) if found.any() else 0.0
    return _pitch_tuning(pitch[(mag >= limit) & found], resolution, positive_int(name, "bins_per_octave",
                                                                                   bins_per_octave))  # fmt: skip


# -- chroma_stft ------------------------------------------------------------------------------------------------
def chroma_stft(*, y: Any = None, sr: float = 22050, S: Any = None, norm: Any = np.inf, n_fft: int = 2048,  # noqa: N803
                hop_length: int = 512, win_length: int | None = None, window: Any = "hann", center: bool = True,
                pad_mode: str = "constant", tuning: float | None = None, n_chroma: int = 12,
                **kwargs: Any) -> GPUArray:  # fmt: skip
    """Chromagram (..., n_chroma, n_frames) of the power spectrogram, as librosa.feature.chroma_stft."""
    from .features import _spectrogram

    name = "chroma_stft"
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    n_chroma = positive_int(name, "n_chroma", n_chroma)
    spec, n = _spectrogram(name, y, S, n_fft, hop_length, 2.0, win_length, window, center, pad_mode)
    if tuning is None:
        tuning = estimate_tuning(S=spec, sr=rate, bins_per_octave=n_chroma)
    tune = number(name, "tuning", tuning)
    basis = chroma_filter(sr=rate, n_fft=n, tuning=tune, n_chroma=n_chroma, **kwargs)
    key = ("chroma_t", rate, n, tune, n_chroma, tuple(sorted(kwargs.items())))
    raw = project_frames(spec, basis, key)
    return frames_last(normalize_frames(name, raw, norm))


# -- spectral_contrast ------------------------------------------------------------------------------------------
def _bands(name: str, freq: Array, sr: float, fmin: float, n_bands: int, quantile: float) -> Array:
    """(first bin, bins, quantile count) per band, as librosa.feature.spectral_contrast selects them."""
    octa = np.zeros(n_bands + 2)
    octa[1:] = fmin * 2.0 ** np.arange(0, n_bands + 1)
    if np.any(octa[:-1] >= 0.5 * sr):
        raise ArgumentError(f"{name}: frequency band exceeds the Nyquist rate {0.5 * sr}: reduce fmin={fmin} or "
                            f"n_bands={n_bands}")  # fmt: skip
    rows = []
    for k, (f_low, f_high) in enumerate(itertools.pairwise(octa)):
        band = np.logical_and(freq >= f_low, freq <= f_high)
        idx = np.flatnonzero(band)
        if idx.size == 0:
            raise ShapeError(f"{name}: band {k} ({f_low:.1f}-{f_high:.1f} Hz) holds no frequency bin; use a larger "
                             f"n_fft or fmin")  # fmt: skip
        if k > 0:
            band[idx[0] - 1] = True
        if k == n_bands:
            band[idx[-1] + 1 :] = True
        chosen = np.flatnonzero(band)
        length = chosen.size - (1 if k < n_bands else 0)
        count = int(max(np.rint(quantile * chosen.size), 1))
        rows.append((int(chosen[0]), length, count))
    return np.asarray(rows, dtype=np.float64)


def spectral_contrast(*, y: Any = None, sr: float = 22050, S: Any = None, n_fft: int = 2048,  # noqa: N803
                      hop_length: int = 512, win_length: int | None = None, window: Any = "hann",
                      center: bool = True, pad_mode: str = "constant", freq: Any = None, fmin: float = 200.0,
                      n_bands: int = 6, quantile: float = 0.02, linear: bool = False) -> GPUArray:  # fmt: skip
    """Spectral contrast (..., n_bands + 1, n_frames) of the magnitude spectrogram, as
    librosa.feature.spectral_contrast."""
    from pygpukit.ops import sub

    from .features import _spectrogram
    from .spectral import power_to_db

    name = "spectral_contrast"
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    n_bands = positive_int(name, "n_bands", n_bands)
    q = number(name, "quantile", quantile, minimum=0.0, exclusive=True)
    if q >= 1.0:
        raise ArgumentError(f"{name}: quantile must lie in (0, 1), got {q}")
    fmin = number(name, "fmin", fmin, minimum=0.0, exclusive=True)
    spec, n = _spectrogram(name, y, S, n_fft, hop_length, 1.0, win_length, window, center, pad_mode)
    freqs = filters.fft_frequencies(sr=rate, n_fft=n) if freq is None else np.atleast_1d(np.asarray(freq, float))
    if freqs.ndim != 1 or freqs.shape[0] != spec.shape[-2]:
        raise ShapeError(f"{name}: freq must have shape ({spec.shape[-2]},), got {freqs.shape}")
    bands = _bands(name, freqs, rate, fmin, n_bands, q)
    lead, n_frames = spec.shape[:-2], spec.shape[-1]
    rows = math.prod(lead)
    dt = spec.dtype
    peak = empty((*lead, n_bands + 1, n_frames), dt)
    valley = empty((*lead, n_bands + 1, n_frames), dt)
    if peak.size == 0:
        raise ShapeError(f"{name}: the spectrogram has no frames (shape {spec.shape})")
    if is_cuda():
        n_freq, item = spec.shape[-2], dt.itemsize
        frame_major = frames_last(spec)
        if frame_major.is_contiguous:  # stft's layout: each frame's spectrum contiguous
            full, s_freq, s_frame = frame_major, 1, n_freq
        else:
            full = spec if spec.is_contiguous else spec.contiguous()
            s_freq, s_frame = n_frames, 1
        s_row = n_freq * n_frames
        widest = int(bands[:, 1].max())
        shared = (1 << max(0, (widest - 1).bit_length())) * item  # the bitonic sort's power-of-two buffer
        if shared > 48 * 1024:
            raise ShapeError(f"{name}: a band of {widest} bins exceeds the {48 * 1024 // item} a block can sort "
                             f"(rounded up to a power of two); use a smaller n_fft")  # fmt: skip
        table = device_table(("contrast", bands.tobytes()), lambda: bands, dt)
        launch("band_contrast", dt, 0, full.device_ptr, table.device_ptr, peak.device_ptr, valley.device_ptr,
               n_frames, n_bands + 1, s_row, s_freq, s_frame, grid=(n_frames, n_bands + 1, rows),
               shared_mem=shared)  # fmt: skip
    else:
        values = host(spec.contiguous() if not spec.is_contiguous else spec).astype(np.float64)
        values = values.reshape(rows, *spec.shape[-2:])
        hp, hv = host(peak).reshape(rows, n_bands + 1, n_frames), host(valley).reshape(rows, n_bands + 1, n_frames)
        for k, (first, length, count) in enumerate(bands.astype(int)):
            ordered = np.sort(values[:, first : first + length, :], axis=-2)
            hv[:, k] = ordered[:, :count].mean(axis=-2).astype(dt.numpy)
            hp[:, k] = ordered[:, -count:].mean(axis=-2).astype(dt.numpy)
    if linear:
        return sub(peak, valley)
    return sub(power_to_db(peak), power_to_db(valley))
