"""Harmonic-percussive source separation with librosa's names, defaults and results: ``hpss`` (as
librosa.decompose.hpss), ``harmonic`` and ``percussive`` (as librosa.effects.harmonic / percussive).

The harmonic part is a median filter along time (``kernel_size[0]`` frames), the percussive part one along
frequency (``kernel_size[1]`` bins), both as scipy.ndimage.median_filter with mode="reflect"; the soft masks
are librosa.util.softmask with ``power`` and ``margin`` (split zeros when both margins are 1). On the CUDA
backend each median filter is one kernel of native/kernels/audio/music.cu (the stable rank of each value in
its window, so ties give scipy's result) and one more kernel makes both masks and applies them (to the
complex spectrogram itself, which keeps its phase). On the CPU backend NumPy computes the same in float64.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.errors import ArgumentError, ShapeError

from ._common import Array, as_signal, complex_from_numpy, host, is_cuda, number
from ._launch import check_finite
from .music import launch

__all__ = ["harmonic", "hpss", "percussive"]


def _pair(name: str, what: str, value: Any) -> tuple[Any, Any]:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ArgumentError(f"{name}: {what} must be a number or a pair, got {value!r}")
        return value[0], value[1]
    return value, value


def _kernel_size(name: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ArgumentError(f"{name}: kernel_size must be a positive int (or a pair of them), got {value!r}")
    return int(value)


def _median_host(x: Array, size: int, axis: int) -> Array:
    """scipy.ndimage.median_filter(x, size along axis, mode="reflect") in NumPy: the value of rank size // 2
    of each window of the symmetrically padded axis (in chunks, to bound the window array's memory)."""
    moved = np.moveaxis(x, axis, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    half = size // 2
    padded = np.pad(flat, ((0, 0), (half, size - 1 - half)), mode="symmetric")
    out = np.empty_like(flat)
    step = max(1, (1 << 24) // max(1, flat.shape[-1] * size))
    for start in range(0, flat.shape[0], step):
        windows = np.lib.stride_tricks.sliding_window_view(padded[start : start + step], size, axis=-1)
        out[start : start + step] = np.partition(windows, half, axis=-1)[..., half]
    result: Array = np.moveaxis(out.reshape(moved.shape), -1, axis)
    return result


def _softmask_host(x: Array, ref: Array, power: float, split_zeros: bool, tiny: float) -> Array:
    z = np.maximum(x, ref)
    bad = z < tiny
    if math.isinf(power):
        return (x > ref).astype(np.float64)
    z = np.where(bad, 1.0, z)
    mask = (x / z) ** power
    ref_mask = (ref / z) ** power
    with np.errstate(invalid="ignore", divide="ignore"):
        result = mask / (mask + ref_mask)
    result[bad] = 0.5 if split_zeros else 0.0
    return result


def hpss(S: Any, *, kernel_size: Any = 31, power: float = 2.0, mask: bool = False,  # noqa: N803 - librosa's name
         margin: Any = 1.0) -> tuple[GPUArray, GPUArray]:  # fmt: skip
    """(harmonic, percussive) parts of a spectrogram S, as librosa.decompose.hpss: real (..., n_freq, n_frames)
    (a magnitude or power spectrogram), or complex: a NumPy complex array or a GPUArray of 3 or more
    dimensions whose last is 2, (..., n_freq, n_frames, 2) as stft gives (the parts keep its phase). With
    ``mask=True`` the two soft masks (..., n_freq, n_frames) instead."""
    name = "hpss"
    if isinstance(S, np.ndarray) and S.dtype.kind == "c":
        S = complex_from_numpy(S)  # noqa: N806
        is_complex = True
    else:
        is_complex = isinstance(S, GPUArray) and S.ndim >= 3 and S.shape[-1] == 2
    spec = as_signal(name, "S", S, min_ndim=2)
    win_harm, win_perc = (_kernel_size(name, k) for k in _pair(name, "kernel_size", kernel_size))
    margin_harm, margin_perc = (number(name, "margin", m) for m in _pair(name, "margin", margin))
    if margin_harm < 1 or margin_perc < 1:
        raise ArgumentError(f"{name}: margins must be >= 1.0, got {margin!r}")
    if isinstance(power, (int, float)) and math.isinf(power) and power > 0:
        p = math.inf
    else:
        p = number(name, "power", power, minimum=0.0, exclusive=True)
    split = margin_harm == 1 and margin_perc == 1
    if is_complex:
        from .spectral import magnitude

        data = spec if spec.is_contiguous else spec.contiguous()
        mag = magnitude(data)
        mag = mag if mag.is_contiguous else mag.contiguous()
    else:
        data = spec if spec.is_contiguous else spec.contiguous()
        mag = data
    if mag.size == 0:
        raise ShapeError(f"{name}: S is empty (shape {spec.shape})")
    check_finite(name, "S", data)
    dt = mag.dtype
    tiny = float(np.finfo(dt.numpy).tiny)
    n_freq, n_frames = mag.shape[-2], mag.shape[-1]
    out_shape = data.shape if (is_complex and not mask) else mag.shape
    out_h, out_p = empty(out_shape, dt), empty(out_shape, dt)
    if is_cuda():
        harm, perc = empty(mag.shape, dt), empty(mag.shape, dt)
        n = mag.size
        launch("median_filter", dt, n, mag.device_ptr, harm.device_ptr, n, 1, n_frames, win_harm)
        launch("median_filter", dt, n, mag.device_ptr, perc.device_ptr, n, n_frames, n_freq, win_perc)
        mode = 0 if mask else (2 if is_complex else 1)
        launch("hpss_mask", dt, n, mag.device_ptr, harm.device_ptr, perc.device_ptr,
               data.device_ptr if is_complex else 0, out_h.device_ptr, out_p.device_ptr, n, margin_harm,
               margin_perc, p, int(split), mode, tiny)  # fmt: skip
        return out_h, out_p
    m = host(mag).astype(np.float64)
    harm64 = _median_host(m, win_harm, m.ndim - 1)
    perc64 = _median_host(m, win_perc, m.ndim - 2)
    mask_h = _softmask_host(harm64, perc64 * margin_harm, p, split, tiny)
    mask_p = _softmask_host(perc64, harm64 * margin_perc, p, split, tiny)
    if mask:
        parts = (mask_h, mask_p)
    elif is_complex:
        d = host(data).astype(np.float64)
        parts = (d * mask_h[..., None], d * mask_p[..., None])
    else:
        parts = (m * mask_h, m * mask_p)
    host(out_h)[...] = parts[0].astype(dt.numpy)
    host(out_p)[...] = parts[1].astype(dt.numpy)
    return out_h, out_p


def _separate(name: str, y: Any, part: int, kwargs: dict[str, Any]) -> GPUArray:
    from .spectral import istft, stft

    signal = as_signal(name, "y", y)
    if signal.shape[-1] == 0:
        raise ShapeError(f"{name}: y is empty (shape {signal.shape})")
    keys = ("kernel_size", "power", "margin")
    hpss_kw = {k: kwargs.pop(k) for k in keys if k in kwargs}
    spec = stft(signal, **kwargs)
    parts = hpss(spec, **hpss_kw)
    inverse = {k: kwargs[k] for k in ("hop_length", "win_length", "n_fft", "window", "center")}
    return istft(parts[part], length=signal.shape[-1], **inverse)


def harmonic(y: Any, *, kernel_size: Any = 31, power: float = 2.0, margin: Any = 1.0, n_fft: int = 2048,
             hop_length: int | None = None, win_length: int | None = None, window: Any = "hann",
             center: bool = True, pad_mode: str = "constant") -> GPUArray:  # fmt: skip
    """The harmonic part of ``y`` (..., T), as librosa.effects.harmonic: istft of the harmonic part of stft(y)."""
    kw = {"kernel_size": kernel_size, "power": power, "margin": margin, "n_fft": n_fft, "hop_length": hop_length,
          "win_length": win_length, "window": window, "center": center, "pad_mode": pad_mode}  # fmt: skip
    return _separate("harmonic", y, 0, kw)


def percussive(y: Any, *, kernel_size: Any = 31, power: float = 2.0, margin: Any = 1.0, n_fft: int = 2048,
               hop_length: int | None = None, win_length: int | None = None, window: Any = "hann",
               center: bool = True, pad_mode: str = "constant") -> GPUArray:  # fmt: skip
    """The percussive part of ``y`` (..., T), as librosa.effects.percussive."""
    kw = {"kernel_size": kernel_size, "power": power, "margin": margin, "n_fft": n_fft, "hop_length": hop_length,
          "win_length": win_length, "window": window, "center": center, "pad_mode": pad_mode}  # fmt: skip
    return _separate("percussive", y, 1, kw)
