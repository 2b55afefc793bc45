"""Phase reconstruction and phase-vocoder effects, as librosa: ``griffin_lim`` (librosa.griffinlim),
``phase_vocoder``, ``time_stretch`` and ``pitch_shift`` (librosa.effects).

Spectrograms are the complex (..., 1 + n_fft // 2, n_frames, 2) arrays of :func:`~pygpukit.audio.stft`
(magnitudes: real (..., 1 + n_fft // 2, n_frames)). The work is laid out frame-major (each frame's spectrum
contiguous, as stft computes it), so the transposes below are views.

``griffin_lim`` runs librosa's fast Griffin-Lim (momentum) with the package's stft / istft and elementwise
ops (pygpukit.ops) on the device; its random initial phases are drawn on the host with librosa's generator
(``random_state``: an int seeds numpy.random.RandomState, as librosa does), so a seed gives librosa's result.
``phase_vocoder`` is librosa's loop over output frames; on the CUDA backend one thread per (row, frequency)
runs it (native/kernels/audio/phase.cu), on the CPU backend NumPy does, in float64.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty, from_numpy
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.core.jit import JITKernel

from . import _kernels as kern
from ._common import Array, as_complex, as_signal, host, is_cuda, number, positive_int
from ._launch import check_finite, device_table
from .spectral import istft, magnitude, stft

__all__ = ["griffin_lim", "phase_vocoder", "pitch_shift", "time_stretch"]

_FILE = "audio/phase.cu"
_PARAMS = (
    kern.pointer("d"), kern.pointer("phi"), kern.pointer("out"), kern.c_param("rows", "long long"),
    kern.c_param("n_in", "long long"), kern.c_param("n_out", "long long"), kern.c_param("n_freq", "int"),
    kern.c_param("rate", "double"),
)  # fmt: skip


@functools.cache
def _kernel(dtype: DType) -> JITKernel:
    names = [f"phase_vocoder_{s}" for s in ("f32", "f64")]
    return JITKernel(
        kern.SOURCES.source(_FILE),
        kern.entry("phase_vocoder", dtype),
        name_expressions=names,
        include_dirs=kern.SOURCES.include_dirs(_FILE),
        cache_salt=kern.SOURCES.headers_digest(),
        params=list(_PARAMS),
    )


def _swap(x: GPUArray, complex_: bool) -> GPUArray:
    """(..., a, b[, 2]) as a (..., b, a[, 2]) view."""
    k = x.ndim - (3 if complex_ else 2)
    tail = (k + 1, k, k + 2) if complex_ else (k + 1, k)
    return x.transpose(*range(k), *tail)


def _rng(name: str, random_state: Any) -> Any:
    if random_state is None:
        return np.random.default_rng()
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, (bool, np.bool_)):
        return np.random.RandomState(seed=int(random_state))
    if isinstance(random_state, (np.random.RandomState, np.random.Generator)):
        return random_state
    raise ArgumentError(f"{name}: random_state must be None, an int, a numpy RandomState or Generator, got "
                        f"{random_state!r}")  # fmt: skip


def griffin_lim(S: Any, *, n_iter: int = 32, hop_length: int | None = None, win_length: int | None = None,  # noqa: N803
                n_fft: int | None = None, window: Any = "hann", center: bool = True, length: int | None = None,
                pad_mode: str = "constant", momentum: float = 0.99, init: str | None = "random",
                random_state: Any = None) -> GPUArray:  # fmt: skip
    """A signal whose STFT magnitude approximates ``S`` (..., 1 + n_fft // 2, n_frames), as librosa.griffinlim
    (fast Griffin-Lim with ``momentum``); (..., T) in the dtype of ``S``."""
    name = "griffin_lim"
    mags = as_signal(name, "S", S, min_ndim=2)
    n_iter = positive_int(name, "n_iter", n_iter, minimum=0)
    momentum = number(name, "momentum", momentum)
    if momentum < 0:
        raise ArgumentError(f"{name}: momentum must be >= 0, got {momentum}")
    if momentum > 1:
        warnings.warn(f"{name}: momentum={momentum} > 1 can be unstable", stacklevel=2)
    if init not in ("random", None):
        raise ArgumentError(f"{name}: init must be 'random' or None, got {init!r}")
    n_freq, n_frames = mags.shape[-2], mags.shape[-1]
    if n_freq < 2 or n_frames < 1:
        raise ShapeError(f"{name}: S must be (..., 1 + n_fft // 2, n_frames) with n_fft >= 2, got {mags.shape}")
    check_finite(name, "S", mags.contiguous() if not mags.is_contiguous else mags)
    n = 2 * (n_freq - 1) if n_fft is None else positive_int(name, "n_fft", n_fft)
    dt = mags.dtype
    rng = _rng(name, random_state)
    from pygpukit.ops import add, div, mul, sub

    frame_major = _swap(mags, False).contiguous()  # (..., n_frames, n_freq)
    if init == "random":
        phases = np.exp(1j * 2 * np.pi * rng.random(size=mags.shape))  # librosa's draw, in S's shape
        pairs = np.stack([phases.real, phases.imag], axis=-1).astype(dt.numpy)
        angles = from_numpy(np.ascontiguousarray(np.swapaxes(pairs, -2, -3)))
        angles = mul(angles, frame_major.reshape(*frame_major.shape, 1))
    else:
        angles = mul(from_numpy(np.stack([np.ones(1), np.zeros(1)], axis=-1).astype(dt.numpy)),
                     frame_major.reshape(*frame_major.shape, 1))  # fmt: skip
    kw: dict[str, Any] = {"hop_length": hop_length, "win_length": win_length, "window": window, "center": center}
    eps = float(np.finfo(dt.numpy).tiny)
    beta = momentum / (1.0 + momentum)
    previous: GPUArray | None = None
    for _ in range(n_iter):
        inverse = istft(_swap(angles, True), n_fft=n, length=length, **kw)
        rebuilt = _swap(stft(inverse, n_fft=n, pad_mode=pad_mode, **kw), True)  # frame-major, contiguous
        if rebuilt.shape != angles.shape:
            raise ShapeError(f"{name}: the STFT of the estimate has shape {tuple(_swap(rebuilt, True).shape)}, S "
                             f"has {tuple(mags.shape)}; pass a length that keeps the frame count")  # fmt: skip
        estimate = rebuilt if previous is None else sub(rebuilt, mul(previous, beta))
        scale = div(frame_major, add(magnitude(estimate), eps))
        angles = mul(estimate, scale.reshape(*scale.shape, 1))
        previous = rebuilt
    return istft(_swap(angles, True), n_fft=n, length=length, **kw)


def _host_vocoder(d: Array, rate: float, n_out: int) -> Array:
    """librosa.phase_vocoder on frame-major complex128 rows (rows, n_in, n_freq) -> (rows, n_out, n_freq)."""
    rows, _, n_freq = d.shape
    hop = (2 * (n_freq - 1)) // 4
    phi = np.linspace(0, np.pi * hop, n_freq)
    padded = np.concatenate([d, np.zeros((rows, 2, n_freq), dtype=d.dtype)], axis=1)
    out = np.empty((rows, n_out, n_freq), dtype=np.complex128)
    acc = np.angle(d[:, 0])
    for t in range(n_out):
        step = t * rate
        i = int(step)
        alpha = step % 1.0
        a, b = padded[:, i], padded[:, i + 1]
        mag = (1.0 - alpha) * np.abs(a) + alpha * np.abs(b)
        out[:, t] = mag * (np.cos(acc) + 1j * np.sin(acc))
        dphase = np.angle(b) - np.angle(a) - phi
        dphase = dphase - 2.0 * np.pi * np.round(dphase / (2.0 * np.pi))
        acc = acc + phi + dphase
    return out


def phase_vocoder(D: Any, *, rate: float) -> GPUArray:  # noqa: N803 - librosa's name
    """``D`` (..., 1 + n_fft // 2, n_frames, 2) sped up by ``rate``, as librosa.phase_vocoder (hop n_fft // 4):
    ceil(n_frames / rate) frames."""
    name = "phase_vocoder"
    spec = D if isinstance(D, GPUArray) else as_complex(name, "D", D)
    if spec.ndim < 3 or spec.shape[-1] != 2:
        raise ShapeError(f"{name}: D must be complex (..., n_freq, n_frames, 2), got shape {spec.shape}")
    as_signal(name, "D", spec)
    rate = number(name, "rate", rate, minimum=0.0, exclusive=True)
    n_freq, n_in = spec.shape[-3], spec.shape[-2]
    if n_freq < 2 or n_in < 1:
        raise ShapeError(f"{name}: D needs n_freq >= 2 and a frame, got shape {spec.shape}")
    lead = spec.shape[:-3]
    rows = math.prod(lead)
    n_out = len(np.arange(0, n_in, rate, dtype=np.float64))  # librosa's frame count
    frame_major = _swap(spec, True)
    frame_major = frame_major if frame_major.is_contiguous else frame_major.contiguous()
    check_finite(name, "D", frame_major)
    dt = spec.dtype
    out = empty((*lead, n_out, n_freq, 2), dt)
    if is_cuda():
        hop = (2 * (n_freq - 1)) // 4
        phi = device_table(("phase_advance", n_freq, hop), lambda: np.linspace(0, np.pi * hop, n_freq), dt)
        work = rows * n_freq
        _kernel(dt)(frame_major.device_ptr, phi.device_ptr, out.device_ptr, rows, n_in, n_out, n_freq, rate,
                    grid=kern.grid_for(work), block=kern.BLOCK)  # fmt: skip
        return _swap(out, True)
    values = host(frame_major).astype(np.float64).reshape(rows, n_in, n_freq, 2)
    result = _host_vocoder(values[..., 0] + 1j * values[..., 1], rate, n_out)
    host(out)[...] = np.stack([result.real, result.imag], axis=-1).reshape(out.shape).astype(dt.numpy)
    return _swap(out, True)


def time_stretch(y: Any, *, rate: float, n_fft: int = 2048, hop_length: int | None = None,
                 win_length: int | None = None, window: Any = "hann", center: bool = True,
                 pad_mode: str = "constant") -> GPUArray:  # fmt: skip
    """``y`` (..., T) played ``rate`` times faster at the same pitch, as librosa.effects.time_stretch:
    stft, phase_vocoder, istft to round(T / rate) samples."""
    name = "time_stretch"
    signal = as_signal(name, "y", y)
    rate = number(name, "rate", rate, minimum=0.0, exclusive=True)
    kw: dict[str, Any] = {"n_fft": n_fft, "hop_length": hop_length, "win_length": win_length, "window": window,
                          "center": center}  # fmt: skip
    spec = stft(signal, pad_mode=pad_mode, **kw)
    stretched = phase_vocoder(spec, rate=rate)
    length = round(signal.shape[-1] / rate)
    if length < 1:
        raise ShapeError(f"{name}: rate={rate} leaves no sample of a signal of {signal.shape[-1]}")
    return istft(stretched, length=length, **kw)


def pitch_shift(y: Any, *, sr: float, n_steps: float, bins_per_octave: int = 12, res_type: str = "soxr_hq",
                scale: bool = False, n_fft: int = 2048, hop_length: int | None = None, win_length: int | None = None,
                window: Any = "hann", center: bool = True, pad_mode: str = "constant") -> GPUArray:  # fmt: skip
    """``y`` (..., T) shifted by ``n_steps`` steps of 1 / ``bins_per_octave`` octave, as
    librosa.effects.pitch_shift: time_stretch by 2 ** (-n_steps / bins_per_octave), resample from sr / rate
    to sr, and cut or zero-pad to T samples."""
    from .resampling import resample

    name = "pitch_shift"
    signal = as_signal(name, "y", y)
    rate_sr = number(name, "sr", sr, minimum=0.0, exclusive=True)
    steps = number(name, "n_steps", n_steps)
    bins = positive_int(name, "bins_per_octave", bins_per_octave)
    rate = 2.0 ** (-steps / bins)
    stretched = time_stretch(signal, rate=rate, n_fft=n_fft, hop_length=hop_length, win_length=win_length,
                             window=window, center=center, pad_mode=pad_mode)  # fmt: skip
    shifted = resample(stretched, orig_sr=rate_sr / rate, target_sr=rate_sr, res_type=res_type, scale=scale)
    length = signal.shape[-1]
    have = shifted.shape[-1]
    if have > length:
        return shifted[..., :length].contiguous()
    if have < length:
        from pygpukit.core.array import zeros
        from pygpukit.ops import concatenate

        return concatenate([shifted, zeros((*shifted.shape[:-1], length - have), shifted.dtype)], axis=-1)
    return shifted
