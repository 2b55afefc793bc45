"""Mel spectrograms, MFCC, deltas and frame features with librosa.feature's names, defaults and results.

``melspectrogram`` projects |stft|^power with the filterbank of :func:`pygpukit.audio.filters.mel` through
pygpukit.ops.matmul (exact float32 or float64, no TF32); ``mfcc`` is the DCT-II (``norm="ortho"``) of
power_to_db of it, also a matmul. Spectral centroid, bandwidth, rolloff and flatness, RMS and the
zero-crossing rate are per-frame reductions in native/kernels/audio/spectral.cu (one warp per frame);
``delta`` is a Savitzky-Golay derivative kernel with scipy's "interp" edges. Every function takes a batch
(..., T) or (..., n_freq, n_frames) and returns frame-axis-last results as librosa does; those computed
from stft are transposed views of frame-major memory (see pygpukit.audio.spectral).
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.errors import ArgumentError, ShapeError

from . import filters
from ._common import Array, as_signal, host, is_cuda, number, positive_int
from ._launch import check_finite, device_table, launch, pad_mode_code, signal_rows
from .spectral import power_to_db, stft_power

__all__ = [
    "delta",
    "log_melspectrogram",
    "melspectrogram",
    "mfcc",
    "rms",
    "spectral_bandwidth",
    "spectral_centroid",
    "spectral_flatness",
    "spectral_rolloff",
    "zero_crossing_rate",
]


def _sr(name: str, sr: Any) -> float:
    return number(name, "sr", sr, minimum=0.0, exclusive=True)


def _spectrogram(name: str, y: Any, S: Any, n_fft: int, hop_length: int, power: float, win_length: Any,  # noqa: N803
                 window: Any, center: bool, pad_mode: str) -> tuple[GPUArray, int]:  # fmt: skip
    """(|stft(y)| ** power, n_fft), or (S, 2 (n_freq - 1)) when S is given (librosa's _spectrogram)."""
    if S is not None:
        spec = as_signal(name, "S", S, min_ndim=2)
        check_finite(name, "S", spec)
        return spec, 2 * (spec.shape[-2] - 1)
    if y is None:
        raise ArgumentError(f"{name}: give y (audio) or S (a spectrogram)")
    spec = stft_power(y, n_fft=n_fft, hop_length=hop_length, win_length=win_length, window=window, center=center,
                      pad_mode=pad_mode, power=power)  # fmt: skip
    return spec, n_fft


def _project(S: GPUArray, basis_t: GPUArray) -> GPUArray:  # noqa: N803
    """basis (out, n_in) applied along axis -2 of S (..., n_in, n_frames): (..., out, n_frames), computed as
    frame-major (..., n_frames, n_in) @ basis^T (n_in, out) when S is a view of frame-major memory."""
    from pygpukit.ops import matmul

    k = S.ndim - 2
    frame_major = S.transpose(*range(k), k + 1, k)
    if not frame_major.is_contiguous:
        frame_major = frame_major.contiguous()
    product = matmul(frame_major, basis_t)  # (..., n_frames, out)
    return product.transpose(*range(k), k + 1, k)


def melspectrogram(y: Any = None, *, sr: float = 22050, S: Any = None, n_fft: int = 2048, hop_length: int = 512,  # noqa: N803
                   win_length: int | None = None, window: Any = "hann", center: bool = True,
                   pad_mode: str = "constant", power: float = 2.0, n_mels: int = 128, fmin: float = 0.0,
                   fmax: float | None = None, htk: bool = False, norm: Any = "slaney") -> GPUArray:  # fmt: skip
    """Mel spectrogram (..., n_mels, n_frames), as librosa.feature.melspectrogram."""
    name = "melspectrogram"
    rate = _sr(name, sr)
    spec, n = _spectrogram(name, y, S, n_fft, hop_length, power, win_length, window, center, pad_mode)
    key = ("mel_t", rate, n, positive_int(name, "n_mels", n_mels), float(fmin), fmax, bool(htk), str(norm))
    basis_t = device_table(key, lambda: filters.mel(sr=rate, n_fft=n, n_mels=n_mels, fmin=fmin, fmax=fmax,
                                                    htk=htk, norm=norm).T, spec.dtype)  # fmt: skip
    return _project(spec, basis_t)


def log_melspectrogram(y: Any = None, *, sr: float = 22050, ref: Any = 1.0, amin: float = 1e-10,
                       top_db: float | None = 80.0, **kwargs: Any) -> GPUArray:  # fmt: skip
    """power_to_db(melspectrogram(y, sr=sr, **kwargs), ref=ref, amin=amin, top_db=top_db)."""
    return power_to_db(melspectrogram(y, sr=sr, **kwargs), ref=ref, amin=amin, top_db=top_db)


def mfcc(y: Any = None, *, sr: float = 22050, S: Any = None, n_mfcc: int = 20, dct_type: int = 2,  # noqa: N803
         norm: str | None = "ortho", lifter: float = 0, **kwargs: Any) -> GPUArray:  # fmt: skip
    """Mel-frequency cepstral coefficients (..., n_mfcc, n_frames), as librosa.feature.mfcc: the DCT-II of
    power_to_db(melspectrogram(y, sr, **kwargs)) over the mel axis (or of the log-power mel spectrogram S)."""
    name = "mfcc"
    if dct_type != 2:
        raise ArgumentError(f"{name}: only dct_type=2 (DCT-II) is supported, got {dct_type!r}")
    n_mfcc = positive_int(name, "n_mfcc", n_mfcc)
    lift = number(name, "lifter", lifter, minimum=0.0)
    spec = as_signal(name, "S", power_to_db(melspectrogram(y, sr=sr, **kwargs)) if S is None else S, min_ndim=2)
    n_mels = spec.shape[-2]

    def make() -> Array:
        basis = filters.dct(n_mfcc, n_mels, norm=norm)
        if lift > 0:
            basis = basis * (1.0 + (lift / 2.0) * np.sin(np.pi * np.arange(1, 1 + n_mfcc) / lift))[:, None]
        result: Array = basis.T
        return result

    basis_t = device_table(("dct_t", n_mfcc, n_mels, norm, lift), make, spec.dtype)
    return _project(spec, basis_t)


# -- delta ---------------------------------------------------------------------------------------------------------
def delta(data: Any, *, width: int = 9, order: int = 1, axis: int = -1, mode: str = "interp") -> GPUArray:
    """Local derivative of ``data`` along ``axis`` (librosa.feature.delta: scipy.signal.savgol_filter with
    deriv=order, polyorder=order, mode="interp")."""
    name = "delta"
    values = as_signal(name, "data", data)
    if mode != "interp":
        raise ArgumentError(f"{name}: only mode='interp' is supported, got {mode!r}")
    width = positive_int(name, "width", width, minimum=3)
    if width % 2 == 0:
        raise ArgumentError(f"{name}: width must be an odd integer >= 3, got {width}")
    order = positive_int(name, "order", order)
    if not -values.ndim <= axis < values.ndim:
        raise ArgumentError(f"{name}: axis {axis} is out of bounds for {values.ndim} dimension(s)")
    ax = axis % values.ndim
    length = values.shape[ax]
    if width > length:
        raise ShapeError(f"{name}: width={width} cannot exceed data.shape[axis]={length} with mode='interp'")
    moved_order = [a for a in range(values.ndim) if a != ax] + [ax]
    moved = values.transpose(moved_order)
    moved_shape = moved.shape
    lead = moved.shape[:-1]
    if len(lead) > 2:  # the kernel addresses rows as (outer, inner) pairs
        moved = moved.contiguous()
        lead = moved.shape[:-1]
        moved = moved.reshape(math.prod(lead[:-1]), lead[-1], length)
        lead = moved.shape[:-1]
    coefs = device_table(("savgol", width, order), lambda: filters.savgol_coefficients(width, order), values.dtype)
    out = empty(moved.shape, values.dtype)
    if out.size and is_cuda():
        strides = moved._strides
        if len(lead) == 0:
            rows, inner, outer_s, inner_s = 1, 1, 0, 0
        elif len(lead) == 1:
            rows, inner, outer_s, inner_s = lead[0], 1, strides[0], 0
        else:
            rows, inner, outer_s, inner_s = lead[0] * lead[1], lead[1], strides[0], strides[1]
        launch("savgol_delta", values.dtype, out.size, moved.device_ptr, out.device_ptr, coefs.device_ptr, rows,
               inner, outer_s, inner_s, strides[-1], length, width)  # fmt: skip
    elif out.size:
        host(out)[...] = _host_delta(host(moved).astype(np.float64), host(coefs).astype(np.float64), width)
    back = tuple(int(i) for i in np.argsort(moved_order))
    return out.reshape(moved_shape).transpose(back)


def _host_delta(x: Array, coefs: Array, width: int) -> Array:
    half = width // 2
    length = x.shape[-1]
    windows = np.lib.stride_tricks.sliding_window_view(x, width, axis=-1)  # (..., length - width + 1, width)
    out = np.empty_like(x)
    out[..., half : length - half] = windows @ coefs[0]
    out[..., :half] = x[..., :width] @ coefs[1 : 1 + half].T
    out[..., length - half :] = x[..., length - width :] @ coefs[1 + half :].T
    return out


# -- per-frame spectral statistics ----------------------------------------------------------------------------------
_MODES = {"centroid": 0, "bandwidth": 1, "rolloff": 2, "flatness": 3, "rms": 4}


def _check_nonnegative(name: str, S: GPUArray) -> None:  # noqa: N803
    if is_cuda():
        from pygpukit.ops import min as device_min

        lowest = float(device_min(S).to_numpy())
    else:
        lowest = float(host(S).min()) if S.size else 0.0
    if lowest < 0:
        raise ArgumentError(
            f"{name}: S must be non-negative (a magnitude or power spectrogram); its minimum is {lowest}"
        )


def _frame_stats(name: str, S: GPUArray, freq: Array | None, mode: str, p: float = 2.0, param: float = 0.0,  # noqa: N803
                 norm: bool = True) -> GPUArray:  # fmt: skip
    """The per-frame statistic ``mode`` of S (..., n_freq, n_frames): (..., 1, n_frames)."""
    if S.ndim > 3:  # the kernel addresses frames as (batch, frame) pairs
        lead = S.shape[:-2]
        flat = _frame_stats(name, S.contiguous().reshape(-1, *S.shape[-2:]), freq, mode, p, param, norm)
        return flat.reshape(*lead, 1, S.shape[-1])
    batch_shape = S.shape[:-2]
    n_freq, n_frames = S.shape[-2:]
    out = empty((*batch_shape, 1, n_frames), S.dtype)
    tiny = float(np.finfo(S.dtype.numpy).tiny)
    freq_values = freq if freq is not None else np.zeros(n_freq)
    if freq_values.shape != (n_freq,):
        raise ShapeError(f"{name}: freq must have {n_freq} values (one per frequency bin), got {freq_values.shape}")
    if out.size == 0:
        return out
    if is_cuda():
        table = device_table(("freq", freq_values.tobytes()), lambda: freq_values, S.dtype)
        strides = S._strides
        batch = math.prod(batch_shape)
        outer = strides[0] if batch_shape else 0
        launch("spectral_moments", S.dtype, batch * n_frames, S.device_ptr, table.device_ptr, out.device_ptr,
               batch * n_frames, n_frames, outer, strides[-1], strides[-2], n_freq, _MODES[mode], p, param,
               int(norm), tiny, per_block=8)  # fmt: skip
        return out
    host(out)[...] = _host_stats(host(S).astype(np.float64), freq_values, mode, p, param, norm, tiny)
    return out


def _host_stats(s: Array, freq: Array, mode: str, p: float, param: float, norm: bool, tiny: float) -> Array:
    f = freq[:, None]
    if mode in ("centroid", "bandwidth"):
        total = np.abs(s).sum(axis=-2, keepdims=True)
        div = np.where(total < tiny, 1.0, total)
        centroid = (f * s).sum(axis=-2, keepdims=True) / div
        if mode == "centroid":
            return cast(Array, centroid)
        weights = s / div if norm else s
        return cast(Array, ((weights * np.abs(f - centroid) ** p).sum(axis=-2, keepdims=True)) ** (1.0 / p))
    if mode == "rolloff":
        cumulative = np.cumsum(s, axis=-2)
        threshold = param * cumulative[..., -1:, :]
        reached = cumulative >= threshold
        first = np.argmax(reached, axis=-2)[..., None, :]
        return cast(Array, freq[first])
    if mode == "flatness":
        clipped = np.maximum(param, s**p)
        return cast(Array, np.exp(np.mean(np.log(clipped), axis=-2, keepdims=True)) / clipped.mean(-2, keepdims=True))
    x = s**2  # rms from a magnitude spectrogram
    x[..., 0, :] *= 0.5
    if int(param) % 2 == 0:
        x[..., -1, :] *= 0.5
    return cast(Array, np.sqrt(2.0 * x.sum(axis=-2, keepdims=True) / param**2))


def _stat_input(name: str, y: Any, S: Any, sr: Any, n_fft: int, hop_length: int, win_length: Any, window: Any,  # noqa: N803
                center: bool, pad_mode: str, freq: Any) -> tuple[GPUArray, Array]:  # fmt: skip
    rate = _sr(name, sr)
    given = S is not None
    spec, n = _spectrogram(name, y, S, n_fft, hop_length, 1.0, win_length, window, center, pad_mode)
    if given:
        _check_nonnegative(name, spec)
    frequencies = filters.fft_frequencies(rate, n) if freq is None else np.asarray(freq, dtype=np.float64)
    if frequencies.ndim != 1:
        raise ShapeError(f"{name}: freq must be 1-D (one value per bin), got shape {frequencies.shape}")
    return spec, frequencies


def spectral_centroid(y: Any = None, *, sr: float = 22050, S: Any = None, n_fft: int = 2048, hop_length: int = 512,  # noqa: N803
                      freq: Any = None, win_length: int | None = None, window: Any = "hann", center: bool = True,
                      pad_mode: str = "constant") -> GPUArray:  # fmt: skip
    """Spectral centroid (..., 1, n_frames), as librosa.feature.spectral_centroid."""
    spec, f = _stat_input("spectral_centroid", y, S, sr, n_fft, hop_length, win_length, window, center, pad_mode, freq)
    return _frame_stats("spectral_centroid", spec, f, "centroid")


def spectral_bandwidth(y: Any = None, *, sr: float = 22050, S: Any = None, n_fft: int = 2048, hop_length: int = 512,  # noqa: N803
                       win_length: int | None = None, window: Any = "hann", center: bool = True,
                       pad_mode: str = "constant", freq: Any = None, norm: bool = True,
                       p: float = 2) -> GPUArray:  # fmt: skip
    """p-th order spectral bandwidth around the centroid (..., 1, n_frames), as librosa.feature.spectral_bandwidth."""
    name = "spectral_bandwidth"
    order = number(name, "p", p, minimum=0.0, exclusive=True)
    spec, f = _stat_input(name, y, S, sr, n_fft, hop_length, win_length, window, center, pad_mode, freq)
    return _frame_stats(name, spec, f, "bandwidth", p=order, norm=bool(norm))


def spectral_rolloff(y: Any = None, *, sr: float = 22050, S: Any = None, n_fft: int = 2048, hop_length: int = 512,  # noqa: N803
                     win_length: int | None = None, window: Any = "hann", center: bool = True,
                     pad_mode: str = "constant", freq: Any = None, roll_percent: float = 0.85) -> GPUArray:  # fmt: skip
    """The frequency below which ``roll_percent`` of each frame's energy lies, as librosa.feature.spectral_rolloff."""
    name = "spectral_rolloff"
    percent = number(name, "roll_percent", roll_percent)
    if not 0.0 < percent < 1.0:
        raise ArgumentError(f"{name}: roll_percent must lie in (0, 1), got {percent}")
    spec, f = _stat_input(name, y, S, sr, n_fft, hop_length, win_length, window, center, pad_mode, freq)
    return _frame_stats(name, spec, f, "rolloff", param=percent)


def spectral_flatness(y: Any = None, *, S: Any = None, n_fft: int = 2048, hop_length: int = 512,  # noqa: N803
                      win_length: int | None = None, window: Any = "hann", center: bool = True,
                      pad_mode: str = "constant", amin: float = 1e-10, power: float = 2.0) -> GPUArray:  # fmt: skip
    """Geometric over arithmetic mean of each frame's power spectrum, as librosa.feature.spectral_flatness."""
    name = "spectral_flatness"
    floor = number(name, "amin", amin, minimum=0.0, exclusive=True)
    exponent = number(name, "power", power, minimum=0.0, exclusive=True)
    spec, _ = _stat_input(name, y, S, 22050, n_fft, hop_length, win_length, window, center, pad_mode, None)
    return _frame_stats(name, spec, None, "flatness", p=exponent, param=floor)


# -- frame features of the signal -------------------------------------------------------------------------------------
Framing = tuple[GPUArray, tuple[int, ...], int, int, int, int, int]


def _framing(name: str, y: Any, frame_length: Any, hop_length: Any, center: bool) -> Framing:
    signal = as_signal(name, "y", y)
    frame_length = positive_int(name, "frame_length", frame_length)
    hop = positive_int(name, "hop_length", hop_length)
    data, lead, rows, length = signal_rows(name, signal)
    check_finite(name, "y", data)
    pad = frame_length // 2 if center else 0
    if length + 2 * pad < frame_length:
        raise ShapeError(f"{name}: frame_length={frame_length} is longer than the (padded) signal of "
                         f"{length + 2 * pad} samples")  # fmt: skip
    n_frames = 1 + (length + 2 * pad - frame_length) // hop
    return data, lead, rows, length, frame_length, hop, n_frames


def rms(y: Any = None, *, S: Any = None, frame_length: int = 2048, hop_length: int = 512, center: bool = True,  # noqa: N803
        pad_mode: str = "constant", dtype: Any = None) -> GPUArray:  # fmt: skip
    """Root-mean-square energy per frame (..., 1, n_frames), as librosa.feature.rms (from y, or from a magnitude
    spectrogram S). The result has the input's precision (librosa's ``dtype`` defaults to float32)."""
    name = "rms"
    if y is None and S is None:
        raise ArgumentError(f"{name}: give y (audio) or S (a magnitude spectrogram)")
    if y is None:
        spec = as_signal(name, "S", S, min_ndim=2)
        check_finite(name, "S", spec)
        frame_length = positive_int(name, "frame_length", frame_length)
        if spec.shape[-2] != frame_length // 2 + 1:
            raise ShapeError(f"{name}: S has {spec.shape[-2]} frequencies, frame_length={frame_length} needs "
                             f"{frame_length // 2 + 1}")  # fmt: skip
        result = _frame_stats(name, spec, None, "rms", param=float(frame_length))
        return result if dtype is None else result.astype(dtype)
    mode = pad_mode_code(name, pad_mode)
    data, lead, rows, length, frame_length, hop, n_frames = _framing(name, y, frame_length, hop_length, center)
    out = empty((*lead, 1, n_frames), data.dtype)
    pad = frame_length // 2 if center else 0
    if is_cuda():
        launch("frame_rms", data.dtype, rows * n_frames, data.device_ptr, out.device_ptr, rows, length, length,
               n_frames, frame_length, hop, pad, mode, per_block=8)  # fmt: skip
    else:
        frames = _frames64(host(data).reshape(rows, length), frame_length, hop, pad, pad_mode)
        host(out)[...] = np.sqrt(np.mean(frames**2, axis=-1)).reshape(out.shape).astype(data.dtype.numpy)
    return out if dtype is None else out.astype(dtype)


def _frames64(x: Array, frame_length: int, hop: int, pad: int, pad_mode: str) -> Array:
    padded = x.astype(np.float64)
    if pad:
        padded = np.pad(padded, ((0, 0), (pad, pad)), mode=cast(Any, pad_mode))
    frames: Array = np.lib.stride_tricks.sliding_window_view(padded, frame_length, axis=-1)[:, ::hop]
    return frames


def zero_crossing_rate(y: Any, *, frame_length: int = 2048, hop_length: int = 512, center: bool = True,
                       threshold: float | None = 1e-10, ref_magnitude: float | None = None, pad: bool = False,
                       zero_pos: bool = True) -> GPUArray:  # fmt: skip
    """Fraction of sign changes per frame (..., 1, n_frames), as librosa.feature.zero_crossing_rate (centring
    pads with the edge values; |y| <= threshold * ref_magnitude counts as zero)."""
    name = "zero_crossing_rate"
    limit = 0.0 if threshold is None else number(name, "threshold", threshold, minimum=0.0)
    if ref_magnitude is not None:
        limit *= number(name, "ref_magnitude", ref_magnitude)
    data, lead, rows, length, frame_length, hop, n_frames = _framing(name, y, frame_length, hop_length, center)
    out = empty((*lead, 1, n_frames), data.dtype)
    left = frame_length // 2 if center else 0
    if is_cuda():
        launch("zero_crossings", data.dtype, rows * n_frames, data.device_ptr, out.device_ptr, rows, length, length,
               n_frames, frame_length, hop, left, pad_mode_code(name, "edge"), limit, int(bool(zero_pos)),
               per_block=8)  # fmt: skip
    else:
        frames = _frames64(host(data).reshape(rows, length), frame_length, hop, left, "edge")
        if limit > 0:
            frames = np.where(np.abs(frames) <= limit, 0.0, frames)
        signs = np.signbit(frames) if zero_pos else np.sign(frames)
        crossings = (signs[..., 1:] != signs[..., :-1]).sum(axis=-1)
        host(out)[...] = (crossings / frame_length).reshape(out.shape).astype(data.dtype.numpy)
    if pad:
        from pygpukit.ops import add

        return add(out, 1.0 / frame_length)  # the first sample of each frame counts as a crossing
    return out
