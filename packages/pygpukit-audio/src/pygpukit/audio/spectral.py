"""STFT and ISTFT, power and magnitude spectra and decibels, with librosa's parameter names and defaults.

``stft(y)`` of a signal or a batch (..., T) gives the complex spectrogram (..., 1 + n_fft // 2, n_frames, 2)
(a trailing dimension of 2: real, imaginary) as librosa.stft does: ``n_fft=2048``, ``hop_length`` None for
win_length // 4, ``win_length`` None for n_fft, ``window="hann"`` (periodic), ``center=True`` with
``pad_mode="constant"`` (librosa >= 0.10). The result is a transposed view of frame-major memory
(..., n_frames, 1 + n_fft // 2, 2), as torch.stft's is: each frame's spectrum is contiguous, which is what
the mel projection, the spectral features and ``istft`` read. ``istft`` inverts it with librosa's
window-sum-square normalisation and ``length``.

On the CUDA backend framing and windowing, the batched real FFTs, the overlap-add and the elementwise
spectra are kernels of native/kernels/audio; on the CPU backend NumPy computes the same in float64 and
rounds once.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.dtypes import DType, float32, float64
from pygpukit.core.errors import ArgumentError, ShapeError

from . import _fft_plan, filters
from ._common import Array, as_complex, as_signal, host, is_cuda, number, positive_int
from ._launch import check_finite, dense, device_table, launch, pad_mode_code, signal_rows, undo
from .fft import irfft_rows, rfft_rows

__all__ = ["amplitude_to_db", "db_to_power", "istft", "magnitude", "power_spectrum", "power_to_db", "stft"]

_STFT_PAD = ("constant", "reflect", "edge", "symmetric")


def _dtype(name: str, dtype: Any, default: DType) -> DType:
    if dtype is None:
        return default
    text = str(np.dtype(dtype.numpy if isinstance(dtype, DType) else dtype))
    if text in ("float32", "complex64"):
        return float32
    if text in ("float64", "complex128"):
        return float64
    raise ArgumentError(f"{name}: dtype must be None, float32/complex64 or float64/complex128, got {dtype!r}")


def _window_key(window: Any) -> Any:
    if isinstance(window, str):
        return window
    array = np.asarray(window)
    return ("array", array.shape, array.astype(np.float64).tobytes())


def fft_window(name: str, window: Any, win_length: int, n_fft: int, dtype: DType) -> GPUArray:
    """The periodic window of ``win_length`` centred in ``n_fft`` samples, on the device (kept per arguments)."""
    if win_length > n_fft:
        raise ArgumentError(f"{name}: win_length ({win_length}) must be <= n_fft ({n_fft})")
    key = ("window", _window_key(window), win_length, n_fft)
    return device_table(key, lambda: filters.pad_center(filters.get_window(window, win_length), n_fft), dtype)


def _lengths(name: str, n_fft: Any, hop_length: Any, win_length: Any) -> tuple[int, int, int]:
    n = positive_int(name, "n_fft", n_fft)
    win = n if win_length is None else positive_int(name, "win_length", win_length)
    hop = max(win // 4, 1) if hop_length is None else positive_int(name, "hop_length", hop_length)
    if hop_length is None and win // 4 < 1:
        raise ArgumentError(f"{name}: hop_length defaults to win_length // 4, which is 0 for win_length={win}")
    return n, hop, win


def stft(y: Any, *, n_fft: int = 2048, hop_length: int | None = None, win_length: int | None = None,
         window: Any = "hann", center: bool = True, dtype: Any = None,
         pad_mode: str = "constant") -> GPUArray:  # fmt: skip
    """Short-time Fourier transform of ``y`` (..., T), as librosa.stft: complex (..., 1 + n_fft // 2, n_frames, 2)."""
    return _stft(y, n_fft, hop_length, win_length, window, center, dtype, pad_mode, None)


def stft_power(y: Any, *, n_fft: int, hop_length: int | None, win_length: int | None, window: Any, center: bool,
               pad_mode: str, power: float) -> GPUArray:  # fmt: skip
    """``power_spectrum(stft(y, ...), power=power)``: (..., 1 + n_fft // 2, n_frames) in stft's layout. On the
    CUDA backend, where stft reads its frames in the FFT kernel, that kernel writes |X| ** power itself
    (kStoreR2cPower): one launch, and the complex spectrogram is never written. Used by melspectrogram and
    the spectral features."""
    p = number("power_spectrum", "power", power, minimum=0.0, exclusive=True)
    return _stft(y, n_fft, hop_length, win_length, window, center, None, pad_mode, p)


def _stft(y: Any, n_fft: Any, hop_length: Any, win_length: Any, window: Any, center: bool, dtype: Any,
          pad_mode: str, power: float | None) -> GPUArray:  # fmt: skip
    name = "stft"
    signal = as_signal(name, "y", y)
    n_fft, hop, win = _lengths(name, n_fft, hop_length, win_length)
    dt = _dtype(name, dtype, signal.dtype)
    if signal.dtype != dt:
        signal = signal.astype(dt)
    mode = pad_mode_code(name, pad_mode, _STFT_PAD)
    data, lead, rows, length = signal_rows(name, signal)
    if length == 0:
        raise ShapeError(f"{name}: y is empty (shape {signal.shape})")
    check_finite(name, "y", data, deferred=isinstance(y, GPUArray))  # NumPy input: the copy waited anyway
    pad = n_fft // 2 if center else 0
    if length + 2 * pad < n_fft:
        raise ShapeError(f"{name}: n_fft={n_fft} is too large for a signal of {length} samples"
                         f"{' (padded to ' + str(length + 2 * pad) + ')' if center else ''}")  # fmt: skip
    n_frames = 1 + (length + 2 * pad - n_fft) // hop
    n_freq = n_fft // 2 + 1
    window_values = fft_window(name, window, win, n_fft, dt)
    k = len(lead)
    plan = _fft_plan.stft_plan(n_fft, rows, n_frames, length, hop, pad, mode, window_values, dt) if is_cuda() else None
    if plan is not None and power is not None:
        fused = _fft_plan.stft_plan(n_fft, rows, n_frames, length, hop, pad, mode, window_values, dt, power)
        assert fused is not None  # the same conditions as the plan above
        powers = empty((rows * n_frames, n_freq), dt)
        fused.run(data, powers, dt)
        return powers.reshape(*lead, n_frames, n_freq).transpose(*range(k), k + 1, k)
    if plan is not None:  # the framing and windowing happen in the FFT's read of the signal
        spectra = empty((rows * n_frames, n_freq, 2), dt)
        plan.run(data, spectra, dt)
    elif is_cuda():
        frames = empty((rows * n_frames, n_fft), dt)
        launch("frame_signal", dt, frames.size, data.device_ptr, frames.device_ptr, window_values.device_ptr, rows,
               length, length, n_frames, n_fft, hop, pad, mode)  # fmt: skip
        spectra = rfft_rows(frames, n_fft)
    else:
        spectra = empty((rows * n_frames, n_freq, 2), dt)
        framed = _host_frames(host(data).reshape(rows, length), n_fft, hop, pad, pad_mode) * host(window_values)
        values = np.fft.rfft(framed.reshape(rows * n_frames, n_fft), axis=-1)
        host(spectra)[...] = np.stack([values.real, values.imag], axis=-1).astype(dt.numpy)
    frame_major = spectra.reshape(*lead, n_frames, n_freq, 2)
    result = frame_major.transpose(*range(k), k + 1, k, k + 2)
    return result if power is None else power_spectrum(result, power=power)


def _host_frames(x: Array, frame_length: int, hop: int, pad: int, pad_mode: str) -> Array:
    """(rows, n_frames, frame_length) float64 frames of the padded rows of ``x`` (NumPy's padding)."""
    padded = (
        np.pad(x.astype(np.float64), ((0, 0), (pad, pad)), mode=cast(Any, pad_mode)) if pad else x.astype(np.float64)
    )
    windows: Array = np.lib.stride_tricks.sliding_window_view(padded, frame_length, axis=-1)[:, ::hop]
    return windows


def istft(stft_matrix: Any, *, hop_length: int | None = None, win_length: int | None = None,
          n_fft: int | None = None, window: Any = "hann", center: bool = True, dtype: Any = None,
          length: int | None = None) -> GPUArray:  # fmt: skip
    """Inverse STFT of a complex (..., 1 + n_fft // 2, n_frames, 2) spectrogram, as librosa.istft."""
    name = "istft"
    spec = as_complex(name, "stft_matrix", stft_matrix) if not isinstance(stft_matrix, GPUArray) else stft_matrix
    if spec.ndim < 3 or spec.shape[-1] != 2:
        raise ShapeError(f"{name}: stft_matrix must be complex (..., n_freq, n_frames, 2), got shape {spec.shape}")
    as_signal(name, "stft_matrix", spec)  # dtype check
    n_freq, frames_in = spec.shape[-3], spec.shape[-2]
    n = 2 * (n_freq - 1) if n_fft is None else positive_int(name, "n_fft", n_fft)
    n, hop, win = _lengths(name, n, hop_length, win_length)
    if n // 2 + 1 != n_freq:
        raise ShapeError(f"{name}: stft_matrix has {n_freq} frequencies, n_fft={n} needs {n // 2 + 1}")
    dt = _dtype(name, dtype, spec.dtype)
    pad = n // 2 if center else 0
    n_frames = frames_in
    if length is not None:
        length = positive_int(name, "length", length, minimum=0)
        n_frames = min(frames_in, math.ceil((length + 2 * pad) / hop))
    out_len = length if length is not None else n + hop * (n_frames - 1) - 2 * pad
    if n_frames < 1 or out_len < 0:
        raise ShapeError(f"{name}: stft_matrix with {frames_in} frame(s) gives no signal")
    lead = spec.shape[:-3]
    rows = math.prod(lead)
    k = len(lead)
    frame_major = spec.transpose(*range(k), k + 1, k, k + 2)[..., :n_frames, :, :]
    if frame_major.dtype != dt:
        frame_major = frame_major.astype(dt)
    frame_major = frame_major.contiguous() if not frame_major.is_contiguous else frame_major
    check_finite(name, "stft_matrix", frame_major, deferred=isinstance(stft_matrix, GPUArray))
    window_values = fft_window(name, window, win, n, dt)
    out = empty((*lead, out_len), dt)
    tiny = float(np.finfo(dt.numpy).tiny)
    if out.size == 0:
        return out
    if is_cuda():
        frames = irfft_rows(frame_major.reshape(rows * n_frames, n_freq, 2), n)
        launch("overlap_add", dt, out.size, frames.device_ptr, window_values.device_ptr, out.device_ptr, rows,
               n_frames, n, hop, pad, out_len, tiny)  # fmt: skip
        return out
    values = host(frame_major).astype(np.float64).reshape(rows, n_frames, n_freq, 2)
    frames64 = np.fft.irfft(values[..., 0] + 1j * values[..., 1], n=n, axis=-1)
    w = host(window_values).astype(np.float64)
    total = n + hop * (n_frames - 1)
    acc = np.zeros((rows, total))
    wss = np.zeros(total)
    for f in range(n_frames):
        acc[:, f * hop : f * hop + n] += frames64[:, f] * w
        wss[f * hop : f * hop + n] += w * w
    acc = acc[:, pad : pad + out_len]
    wss = wss[pad : pad + out_len]
    if acc.shape[-1] < out_len:  # `length` past the frames: zeros, as librosa's fix_length
        acc = np.pad(acc, ((0, 0), (0, out_len - acc.shape[-1])))
        wss = np.pad(wss, (0, out_len - wss.shape[-1]))
    result = np.where(wss > tiny, acc / np.where(wss > tiny, wss, 1.0), acc)
    host(out)[...] = result.reshape(out.shape).astype(dt.numpy)
    return out


def power_spectrum(S: Any, *, power: float = 2.0) -> GPUArray:  # noqa: N803 - librosa's name
    """|S| ** power of a complex array (trailing dimension 2), in the layout of S (a transposed view stays one)."""
    name = "power_spectrum"
    spec = S if isinstance(S, GPUArray) else as_complex(name, "S", S)
    if spec.ndim < 2 or spec.shape[-1] != 2:
        raise ShapeError(f"{name}: S must be complex (a trailing dimension of 2), got shape {spec.shape}")
    as_signal(name, "S", spec)
    p = number(name, "power", power, minimum=0.0, exclusive=True)
    data, order = dense(spec, keep_last=1)
    out = empty(data.shape[:-1], data.dtype)
    if out.size:
        if is_cuda():
            launch("spectrum_power", data.dtype, out.size, data.device_ptr, out.device_ptr, out.size, p)
        else:
            values = host(data).astype(np.float64)
            host(out)[...] = ((values[..., 0] ** 2 + values[..., 1] ** 2) ** (p / 2.0)).astype(data.dtype.numpy)
    return undo(out, order[:-1])


def magnitude(S: Any) -> GPUArray:  # noqa: N803 - librosa's name
    """|S| of a complex array (trailing dimension 2)."""
    return power_spectrum(S, power=1.0)


def _ref(name: str, ref: Any) -> float | None:
    """None for ref="max" (or np.max / np.amax: the input's maximum), else |ref| as a float."""
    if isinstance(ref, str) and ref == "max":
        return None
    if ref is np.max or ref is np.amax:
        return None
    if callable(ref):
        raise ArgumentError(f"{name}: ref must be a number, 'max' or np.max; other callables cannot run on the GPU")
    return abs(number(name, "ref", ref))


def power_to_db(S: Any, *, ref: Any = 1.0, amin: float = 1e-10, top_db: float | None = 80.0) -> GPUArray:  # noqa: N803 - librosa's name
    """10 log10(S / ref) with librosa's amin floor and top_db limit (librosa.power_to_db). ``ref`` is a number,
    or "max" / np.max for the maximum of S (over the whole array, batch included, as librosa does)."""
    name = "power_to_db"
    values = as_signal(name, "S", S, min_ndim=0)
    amin = number(name, "amin", amin, minimum=0.0, exclusive=True)
    if top_db is not None:
        top_db = number(name, "top_db", top_db, minimum=0.0)
    ref_value = _ref(name, ref)
    data, order = dense(values)
    out = empty(data.shape, data.dtype)
    if out.size == 0:
        return undo(out, order)
    if is_cuda():
        from pygpukit.ops import max as device_max

        peak = device_max(data) if (ref_value is None or top_db is not None) else None
        peak_ptr = peak.device_ptr if peak is not None else 0
        launch("apply_scale_db", data.dtype, out.size, data.device_ptr, out.device_ptr, out.size, amin,
               1.0 if ref_value is None else ref_value, peak_ptr if ref_value is None else 0,
               -1.0 if top_db is None else top_db, peak_ptr)  # fmt: skip
        return undo(out, order)
    x = host(data).astype(np.float64)
    reference = float(x.max()) if ref_value is None else ref_value
    log_spec = 10.0 * np.log10(np.maximum(amin, x)) - 10.0 * np.log10(max(amin, reference))
    if top_db is not None:
        log_spec = np.maximum(log_spec, log_spec.max() - top_db)
    host(out)[...] = log_spec.astype(data.dtype.numpy)
    return undo(out, order)


def amplitude_to_db(S: Any, *, ref: Any = 1.0, amin: float = 1e-5, top_db: float | None = 80.0) -> GPUArray:  # noqa: N803 - librosa's name
    """20 log10(|S| / ref), as librosa.amplitude_to_db: power_to_db(S ** 2, ref=ref ** 2, amin=amin ** 2)."""
    name = "amplitude_to_db"
    values = as_signal(name, "S", S, min_ndim=0)
    amin = number(name, "amin", amin, minimum=0.0, exclusive=True)
    ref_value = _ref(name, ref)
    from pygpukit.ops import mul

    squared = mul(values, values)
    return power_to_db(squared, ref="max" if ref_value is None else ref_value**2, amin=amin**2, top_db=top_db)


def db_to_power(S_db: Any, *, ref: float = 1.0) -> GPUArray:  # noqa: N803 - librosa's name
    """ref * 10 ** (S_db / 10), the inverse of power_to_db without its floor (librosa.db_to_power)."""
    from pygpukit.ops import exp, mul

    values = as_signal("db_to_power", "S_db", S_db, min_ndim=0)
    factor = number("db_to_power", "ref", ref)
    return mul(exp(mul(values, math.log(10.0) / 10.0)), factor)
