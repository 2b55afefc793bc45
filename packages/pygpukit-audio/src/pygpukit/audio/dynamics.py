"""Silence trimming and splitting, gates, short-term energy and a Butterworth high-pass filter.

``trim`` and ``split`` are librosa.effects.trim and librosa.effects.split: the frame RMS (center=True,
zero padding) is computed on the device (native/kernels/audio/spectral.cu); its n_frames values per
channel (a few hundred bytes a second of audio) are then copied to the host, where the decibel threshold
and the interval bookkeeping run in float64 as librosa does (a host step: it is small and sequential).
A (channels, T) or (..., T) input is one multichannel signal, as in librosa: the decibels are aggregated
over the leading axes (``aggregate``, np.max by default) and one set of intervals is returned.

``highpass_filter`` is scipy.signal.sosfilt(scipy.signal.butter(order, cutoff, "highpass", fs=sr,
output="sos"), y): the second-order sections are designed on the host in float64 as scipy does, and the
cascade runs on the device as one thread per channel (native/kernels/audio/analysis.cu, state in double).
``noise_gate`` attenuates the frames whose RMS lies below a threshold, ``spectral_gate`` the
time-frequency bins below a per-frequency noise threshold (mean + n_std_thresh standard deviations of the
decibel magnitudes, the "stationary" spectral gate of noisereduce); both run on the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.errors import ArgumentError, ShapeError

from ._analysis_kernels import launch as launch_analysis
from ._common import Array, as_signal, host, is_cuda, number, positive_int
from ._launch import check_finite, device_table, signal_rows
from .features import rms

__all__ = ["butter_highpass_sos", "highpass_filter", "noise_gate", "short_term_energy", "spectral_gate", "split",
           "trim"]  # fmt: skip


# -- trim / split -----------------------------------------------------------------------------------------------
def _frame_nonsilent(name: str, y: GPUArray, frame_length: int, hop_length: int, top_db: float, ref: Any,
                     aggregate: Callable[..., Any]) -> Array:  # fmt: skip
    """librosa.effects._signal_to_frame_nonsilent: frames whose RMS in dB (re ``ref``) exceeds -top_db."""
    level = rms(y, frame_length=frame_length, hop_length=hop_length)  # (..., 1, n_frames) on the device
    magnitude = np.abs(level.to_numpy().astype(np.float64)[..., 0, :])  # host step: n_frames values a channel
    ref_value = float(ref(magnitude)) if callable(ref) else abs(number(name, "ref", ref))
    amin = 1e-10  # amplitude_to_db's amin (1e-5) squared
    db = 10.0 * np.log10(np.maximum(amin, magnitude**2)) - 10.0 * np.log10(max(amin, ref_value**2))
    if db.ndim > 1:
        db = np.apply_over_axes(aggregate, db, range(db.ndim - 1))
        db = np.squeeze(db, axis=tuple(range(db.ndim - 1)))
    result: Array = db > -top_db
    return result


def _silence_args(name: str, y: Any, top_db: Any, frame_length: Any, hop_length: Any) -> tuple[GPUArray, float,
                                                                                               int, int]:  # fmt: skip
    signal = as_signal(name, "y", y)
    if signal.shape[-1] == 0:
        raise ShapeError(f"{name}: y is empty (shape {signal.shape})")
    return (signal, number(name, "top_db", top_db), positive_int(name, "frame_length", frame_length),
            positive_int(name, "hop_length", hop_length))  # fmt: skip


def trim(y: Any, *, top_db: float = 60, ref: Any = np.max, frame_length: int = 2048, hop_length: int = 512,
         aggregate: Callable[..., Any] = np.max) -> tuple[GPUArray, Array]:  # fmt: skip
    """Leading and trailing silence removed, as librosa.effects.trim: (a view y[..., start:end] on the device,
    np.array([start, end]))."""
    name = "trim"
    signal, db, frame, hop = _silence_args(name, y, top_db, frame_length, hop_length)
    non_silent = _frame_nonsilent(name, signal, frame, hop, db, ref, aggregate)
    nonzero = np.flatnonzero(non_silent)
    if nonzero.size > 0:
        start = int(nonzero[0]) * hop
        end = min(signal.shape[-1], int(nonzero[-1] + 1) * hop)
    else:
        start, end = 0, 0
    return signal[..., start:end], np.asarray([start, end])


def split(y: Any, *, top_db: float = 60, ref: Any = np.max, frame_length: int = 2048, hop_length: int = 512,
          aggregate: Callable[..., Any] = np.max) -> Array:  # fmt: skip
    """Non-silent intervals (n, 2) of sample indices [start, end), as librosa.effects.split."""
    name = "split"
    signal, db, frame, hop = _silence_args(name, y, top_db, frame_length, hop_length)
    non_silent = _frame_nonsilent(name, signal, frame, hop, db, ref, aggregate)
    edges = [np.flatnonzero(np.diff(non_silent.astype(int))) + 1]
    if non_silent[0]:
        edges.insert(0, np.array([0]))
    if non_silent[-1]:
        edges.append(np.array([len(non_silent)]))
    samples = np.minimum(np.concatenate(edges) * hop, signal.shape[-1])
    result: Array = samples.reshape((-1, 2))
    return result


# -- energy and gates -------------------------------------------------------------------------------------------
def short_term_energy(y: Any, *, frame_length: int = 2048, hop_length: int = 512, center: bool = True,
                      pad_mode: str = "constant") -> GPUArray:  # fmt: skip
    """Sum of squares of each frame (..., 1, n_frames): frame_length * rms(y)**2 with the same framing."""
    from pygpukit.ops import mul

    level = rms(y, frame_length=frame_length, hop_length=hop_length, center=center, pad_mode=pad_mode)
    return mul(mul(level, level), float(positive_int("short_term_energy", "frame_length", frame_length)))


def noise_gate(y: Any, *, threshold_db: float = -40.0, ref: float = 1.0, frame_length: int = 2048,
               hop_length: int = 512, reduction_db: float | None = None) -> GPUArray:  # fmt: skip
    """``y`` with the samples of quiet frames attenuated: a sample belongs to the centred frame nearest to it
    (frame k centred on sample k * hop_length); a frame whose RMS is below ``ref * 10**(threshold_db / 20)``
    gets the gain ``10**(reduction_db / 20)`` (None: 0, silence), the others pass unchanged."""
    name = "noise_gate"
    signal = as_signal(name, "y", y)
    threshold = number(name, "ref", ref, minimum=0.0, exclusive=True) * 10.0 ** (
        number(name, "threshold_db", threshold_db) / 20.0
    )
    floor_gain = 0.0 if reduction_db is None else 10.0 ** (number(name, "reduction_db", reduction_db) / 20.0)
    hop = positive_int(name, "hop_length", hop_length)
    data, _, rows, length = signal_rows(name, signal)
    if length == 0:
        raise ShapeError(f"{name}: y is empty (shape {signal.shape})")
    level = rms(data, frame_length=frame_length, hop_length=hop)  # (..., 1, n_frames)
    n_frames = level.shape[-1]
    out = empty(data.shape, data.dtype)
    if is_cuda():
        launch_analysis("frame_gate", data.dtype, rows * length, data.device_ptr, level.device_ptr, out.device_ptr,
                        rows, length, n_frames, hop, threshold, floor_gain)  # fmt: skip
    else:
        frames = np.minimum((np.arange(length) + hop // 2) // hop, n_frames - 1)
        gains = np.where(host(level).reshape(rows, n_frames) >= threshold, 1.0, floor_gain)[:, frames]
        host(out)[...] = (host(data).reshape(rows, length) * gains).reshape(data.shape).astype(data.dtype.numpy)
    return out


def spectral_gate(y: Any, *, sr: float = 22050, noise: Any = None, n_fft: int = 2048, hop_length: int | None = None,
                  win_length: int | None = None, window: Any = "hann", n_std_thresh: float = 1.5,
                  prop_decrease: float = 1.0) -> GPUArray:  # fmt: skip
    """Stationary spectral gating (noisereduce's "stationary" mode): the STFT bins of ``y`` whose magnitude in
    dB does not exceed mean + n_std_thresh * std of that frequency's dB magnitudes over ``noise`` (a noise
    clip, default ``y`` itself) are scaled by 1 - prop_decrease; the result is resynthesised by istft to
    ``y``'s length. ``sr`` is accepted for librosa-style calls and does not change the result."""
    from pygpukit.ops import add, greater, mean, mul, std, where

    from .spectral import amplitude_to_db, istft, power_spectrum, stft

    name = "spectral_gate"
    number(name, "sr", sr, minimum=0.0, exclusive=True)
    signal = as_signal(name, "y", y)
    check_finite(name, "y", signal)
    spread = number(name, "n_std_thresh", n_std_thresh)
    decrease = number(name, "prop_decrease", prop_decrease)
    if not 0.0 <= decrease <= 1.0:
        raise ArgumentError(f"{name}: prop_decrease must lie in [0, 1], got {decrease}")
    kwargs: dict[str, Any] = {"n_fft": n_fft, "hop_length": hop_length, "win_length": win_length, "window": window}
    spectrum = stft(signal, **kwargs)  # (..., F, frames, 2)
    db = amplitude_to_db(power_spectrum(spectrum, power=1.0), top_db=None)
    if noise is None:
        noise_db = db
    else:
        clip = as_signal(name, "noise", noise)
        check_finite(name, "noise", clip)
        noise_db = amplitude_to_db(power_spectrum(stft(clip, **kwargs), power=1.0), top_db=None)
        if noise_db.ndim > db.ndim or noise_db.shape[-2] != db.shape[-2]:
            raise ShapeError(f"{name}: noise gives {noise_db.shape[-2]} frequencies in shape {noise_db.shape}; y "
                             f"gives shape {db.shape}")  # fmt: skip
    threshold = add(mean(noise_db, axis=-1, keepdims=True), mul(std(noise_db, axis=-1, keepdims=True), spread))
    gain = where(greater(db, threshold), 1.0, 1.0 - decrease).astype(spectrum.dtype)  # where gives float64
    gated = mul(spectrum, gain.reshape(*gain.shape, 1))
    return istft(gated, hop_length=hop_length, win_length=win_length, window=window, n_fft=n_fft,
                 length=signal.shape[-1])  # fmt: skip


# -- Butterworth high-pass ----------------------------------------------------------------------------------------
def butter_highpass_sos(order: int, cutoff: float, sr: float) -> Array:
    """scipy.signal.butter(order, cutoff, "highpass", fs=sr, output="sos") in float64: (ceil(order / 2), 6)."""
    name = "highpass_filter"
    order = positive_int(name, "order", order)
    if order > 32:
        raise ArgumentError(f"{name}: order must be <= 32 (16 second-order sections), got {order}")
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    corner = number(name, "cutoff", cutoff, minimum=0.0, exclusive=True)
    if corner >= rate / 2:
        raise ArgumentError(f"{name}: cutoff {corner} Hz must lie below the Nyquist frequency {rate / 2} Hz")
    warped = 4.0 * math.tan(math.pi * (2.0 * corner / rate) / 2.0)  # scipy: fs = 2 after normalising Wn
    proto = -np.exp(1j * np.pi * np.arange(-order + 1, order, 2) / (2 * order))  # buttap poles
    poles_s = warped / proto  # lp2hp_zpk; its order zeros sit at s = 0
    gain_s = float(np.real(1.0 / np.prod(-proto)))
    poles = (4.0 + poles_s) / (4.0 - poles_s)  # bilinear_zpk with fs = 2; the zeros map to z = 1
    gain = gain_s * float(np.real(4.0**order / np.prod(4.0 - poles_s)))
    upper = sorted((p for p in poles if p.imag > 1e-12 * max(1.0, abs(p))), key=lambda p: -abs(p))
    real = [p.real for p in poles if abs(p.imag) <= 1e-12 * max(1.0, abs(p))]
    sections = [[1.0, -2.0, 1.0, 1.0, -2.0 * p.real, abs(p) ** 2] for p in upper]
    sections += [[1.0, -1.0, 0.0, 1.0, -r, 0.0] for r in real]
    sos = np.asarray(sections, dtype=np.float64)
    sos[0, :3] *= gain
    return sos


def _host_sosfilt(sos: Array, x: Array) -> Array:
    out = x.astype(np.float64)
    for b0, b1, b2, _, a1, a2 in sos:
        y = np.empty_like(out)
        z0 = np.zeros(out.shape[0])
        z1 = np.zeros(out.shape[0])
        for t in range(out.shape[1]):
            v = out[:, t]
            r = b0 * v + z0
            z0 = b1 * v - a1 * r + z1
            z1 = b2 * v - a2 * r
            y[:, t] = r
        out = y
    return out


def highpass_filter(y: Any, *, sr: float = 22050, cutoff: float = 80.0, order: int = 4) -> GPUArray:
    """``y`` (..., T) through an ``order``-th order Butterworth high-pass at ``cutoff`` Hz, as
    scipy.signal.sosfilt(scipy.signal.butter(order, cutoff, "highpass", fs=sr, output="sos"), y) along the
    last axis (zero initial state); one GPU thread per channel runs the cascade."""
    name = "highpass_filter"
    signal = as_signal(name, "y", y)
    sos = butter_highpass_sos(order, cutoff, sr)
    return apply_sos(name, signal, sos, ("butter_hp", int(order), float(cutoff), float(sr)))


def apply_sos(name: str, signal: GPUArray, sos: Array, key: tuple[Any, ...]) -> GPUArray:
    """The second-order sections ``sos`` (float64 (n, 6), kept on the device under ``key``) run along the last
    axis of ``signal`` (zero initial state): one GPU thread per row, or NumPy on the CPU backend."""
    data, _, rows, length = signal_rows(name, signal)
    check_finite(name, "y", data)
    out = empty(data.shape, data.dtype)
    if out.size == 0:
        return out
    if is_cuda():
        table = device_table(key, lambda: sos, _float64())
        launch_analysis("sos_filter", data.dtype, rows, data.device_ptr, out.device_ptr, table.device_ptr, rows,
                        length, sos.shape[0], block=64)  # fmt: skip
    else:
        filtered = _host_sosfilt(sos, host(data).reshape(rows, length))
        host(out)[...] = filtered.reshape(data.shape).astype(data.dtype.numpy)
    return out


def _float64() -> Any:
    from pygpukit.core.dtypes import float64

    return float64
