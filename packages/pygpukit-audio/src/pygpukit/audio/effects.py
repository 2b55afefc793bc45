"""Pre- and de-emphasis (librosa.effects), DC removal and autocorrelation (librosa.autocorrelate) on batches.

``preemphasis`` and ``deemphasis`` filter along the last axis with librosa's default initial state (linear
extrapolation of the first samples) or a given ``zi`` (a number, or one per signal), and return the final
state with ``return_zf=True``. De-emphasis is a first-order IIR filter: on the GPU a block-wide scan per
signal (native/kernels/audio/spectral.cu). ``autocorrelate`` is the inverse real FFT of the power spectrum
of the zero-padded signal, on pygpukit's own FFTs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty, from_numpy, full
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ShapeError

from ._common import Array, as_signal, host, is_cuda, normalize_axis, number, positive_int
from ._launch import launch, signal_rows
from .fft import irfft, rfft, to_complex
from .filters import next_fast_len
from .spectral import power_spectrum

__all__ = ["autocorrelate", "deemphasis", "preemphasis", "remove_dc"]


def _initial_state(name: str, zi: Any, lead: tuple[int, ...], rows: int, dtype: DType) -> GPUArray:
    """zi (a number, or an array of shape lead or lead + (1,)) as rows contiguous values on the device."""
    if isinstance(zi, GPUArray):
        values = zi.astype(dtype) if zi.dtype != dtype else zi
        if values.size != rows:
            raise ShapeError(f"{name}: zi must hold one value per signal ({rows}), got shape {values.shape}")
        return values.contiguous().reshape(rows)
    array = np.asarray(zi, dtype=np.float64)
    if array.size == 1:
        return full(rows, float(array.reshape(())), dtype)
    if array.size != rows:
        raise ShapeError(f"{name}: zi must be a number or hold one value per signal ({rows}), got shape {array.shape}")
    return from_numpy(array.reshape(rows).astype(dtype.numpy))


def _signal(name: str, y: Any) -> tuple[GPUArray, tuple[int, ...], int, int]:
    data, lead, rows, length = signal_rows(name, as_signal(name, "y", y))
    if length == 0:
        raise ShapeError(f"{name}: y is empty (shape {data.shape})")
    return data, lead, rows, length


def preemphasis(y: Any, *, coef: float = 0.97, zi: Any = None, return_zf: bool = False) -> Any:
    """y[t] - coef y[t - 1] along the last axis, as librosa.effects.preemphasis (scipy.signal.lfilter with
    initial state zi, default 2 y[0] - y[1]). With ``return_zf`` also the final state -coef y[-1], (..., 1)."""
    name = "preemphasis"
    c = number(name, "coef", coef)
    data, lead, rows, length = _signal(name, y)
    dt = data.dtype
    state = None if zi is None else _initial_state(name, zi, lead, rows, dt)
    out = empty(data.shape, dt)
    if is_cuda():
        launch("preemphasis", dt, out.size, data.device_ptr, out.device_ptr, rows, length, c,
               state.device_ptr if state is not None else 0)  # fmt: skip
    else:
        x = host(data).reshape(rows, length).astype(np.float64)
        if state is not None:
            first = host(state).astype(np.float64)
        else:
            first = 2 * x[:, 0] - x[:, 1] if length > 1 else x[:, 0]
        result = np.empty_like(x)
        result[:, 0] = x[:, 0] + first
        result[:, 1:] = x[:, 1:] - c * x[:, :-1]
        host(out)[...] = result.reshape(data.shape).astype(dt.numpy)
    if not return_zf:
        return out
    from pygpukit.ops import mul

    return out, mul(data[..., length - 1 :], -c)


def deemphasis(y: Any, *, coef: float = 0.97, zi: Any = None, return_zf: bool = False) -> Any:
    """The inverse of :func:`preemphasis`, y[t] = x[t] + coef y[t - 1], as librosa.effects.deemphasis (with
    librosa's default initial state; the final state with ``return_zf``, (..., 1))."""
    name = "deemphasis"
    c = number(name, "coef", coef)
    data, lead, rows, length = _signal(name, y)
    dt = data.dtype
    state = None if zi is None else _initial_state(name, zi, lead, rows, dt)
    out = empty(data.shape, dt)
    zf = empty((*lead, 1), dt)
    if is_cuda():
        launch("deemphasis", dt, rows, data.device_ptr, out.device_ptr, zf.device_ptr, rows, length, c,
               state.device_ptr if state is not None else 0, int(state is None), grid=min(rows, 65535))  # fmt: skip
    else:
        x = host(data).reshape(rows, length).astype(np.float64)
        zero_state = _iir(x, c)
        powers = c ** np.arange(length, dtype=np.float64)
        if state is None:
            second = x[:, 1] if length > 1 else np.zeros(rows)
            init = -((2 - c) * x[:, 0] - second) / (3 - c)
            final = c * zero_state[:, -1]
        else:
            init = host(state).astype(np.float64)
            final = c * (zero_state[:, -1] + init * powers[-1])
        host(out)[...] = (zero_state + init[:, None] * powers).reshape(data.shape).astype(dt.numpy)
        host(zf)[...] = final.reshape(zf.shape).astype(dt.numpy)
    return (out, zf) if return_zf else out


def _iir(x: Array, c: float) -> Array:
    out = np.empty_like(x)
    acc = np.zeros(x.shape[0])
    for t in range(x.shape[1]):
        acc = x[:, t] + c * acc
        out[:, t] = acc
    return out


def remove_dc(y: Any) -> GPUArray:
    """Each signal (last axis) minus its mean."""
    from pygpukit.ops import mean, sub

    data, _, _, _ = _signal("remove_dc", y)
    return sub(data, mean(data, axis=-1, keepdims=True))


def autocorrelate(y: Any, *, max_size: int | None = None, axis: int = -1) -> GPUArray:
    """The autocorrelation of real signals along ``axis``, lags 0 .. max_size - 1 (default all), as
    librosa.autocorrelate: irfft(|rfft(y, n_pad)|^2, n_pad) with n_pad >= 2 T - 1."""
    name = "autocorrelate"
    signal = as_signal(name, "y", y)
    ax = normalize_axis(name, axis, signal.ndim)
    length = signal.shape[ax]
    size = length if max_size is None else positive_int(name, "max_size", max_size)
    if length == 0:
        raise ShapeError(f"{name}: y is empty along axis {axis} (shape {signal.shape})")
    n_pad = next_fast_len(2 * length - 1)
    spectrum = rfft(signal, n=n_pad, axis=ax)
    result = irfft(to_complex(power_spectrum(spectrum, power=2.0)), n=n_pad, axis=ax)
    index = [slice(None)] * result.ndim
    index[ax] = slice(0, min(size, length))
    return result[tuple(index)]
