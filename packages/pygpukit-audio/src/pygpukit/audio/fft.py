"""Discrete Fourier transforms with numpy.fft's semantics, on pygpukit's own FFT kernels.

``fft``, ``ifft``, ``rfft`` and ``irfft`` take ``n`` (the transform length: the input is cropped or zero-padded
to it), ``axis`` (default the last) and ``norm`` ("backward", the default, scales the inverse by 1/n;
"ortho" both ways by 1/sqrt(n); "forward" the forward one by 1/n), as numpy.fft does, for any length >= 1 and
any batch. float32 inputs compute in float32 (complex64), float64 inputs in float64 (complex128).

Complex arrays are float32/float64 GPUArrays with a trailing dimension of 2 (real, imaginary): ``fft(x)``
of a complex array of shape (..., N, 2) gives shape (..., n, 2), ``rfft`` of a real (..., N) gives
(..., n // 2 + 1, 2) and ``irfft`` of a complex (..., M, 2) a real (..., n) with n = 2 (M - 1) by default.
``axis`` counts the complex dimensions only (the trailing 2 is not one). :func:`complex_from_numpy` and
:func:`complex_to_numpy` convert from and to NumPy's complex arrays; :func:`to_complex` makes a real
GPUArray complex on the device.

On the CUDA backend the transforms run on the kernels of native/kernels/audio/fft.cu (plans:
pygpukit/audio/_fft_plan.py); on the CPU simulation backend with numpy.fft in float64, rounded once to the
input's precision.
"""

from __future__ import annotations

import math
from typing import Any, Literal, cast

import numpy as np

from pygpukit.core.array import GPUArray, empty, zeros
from pygpukit.core.errors import ArgumentError, ShapeError

from . import _fft_plan
from ._common import (
    Array,
    as_complex,
    as_signal,
    complex_from_numpy,
    complex_to_numpy,
    host,
    is_cuda,
    normalize_axis,
    positive_int,
)

__all__ = ["complex_from_numpy", "complex_to_numpy", "fft", "ifft", "irfft", "rfft", "to_complex"]

_NORMS = ("backward", "ortho", "forward")
Norm = Literal["backward", "ortho", "forward"]


def _norm(name: str, norm: Any) -> Norm:
    if norm is None:
        return "backward"
    if norm not in _NORMS:
        raise ArgumentError(f"{name}: norm must be None, 'backward', 'ortho' or 'forward', got {norm!r}")
    return cast(Norm, norm)


def _length(name: str, n: Any, default: int) -> int:
    if n is None:
        if default < 1:
            raise ShapeError(f"{name}: invalid number of data points ({default}) along the transform axis")
        return default
    return positive_int(name, "n", n)


def to_complex(x: Any) -> GPUArray:
    """A real float32/float64 array as a complex one (a trailing dimension of 2, imaginary parts 0), on the device."""
    from pygpukit.ops import stack

    real = as_signal("to_complex", "x", x, min_ndim=0)
    return stack([real, zeros(real.shape, real.dtype)], axis=-1)


def _moved(x: GPUArray, axis: int, ndim: int) -> tuple[GPUArray, tuple[int, ...] | None]:
    """``x`` with logical axis ``axis`` (of ``ndim`` leading logical axes; complex arrays keep their pair last)
    moved last, contiguous, and the permutation that moves it back (None when nothing moved)."""
    if axis == ndim - 1:
        return (x if x.is_contiguous else x.contiguous()), None
    from pygpukit.ops import permute

    order = [a for a in range(ndim) if a != axis] + [axis] + list(range(ndim, x.ndim))
    back = tuple(int(i) for i in np.argsort(order))
    return permute(x, order), back


def _restore(result: GPUArray, back: tuple[int, ...] | None) -> GPUArray:
    if back is None:
        return result
    from pygpukit.ops import permute

    # rfft and irfft add or drop the complex pair dimension, which stays last.
    order = [a for a in back if a < result.ndim] + list(range(len(back), result.ndim))
    return permute(result, order)


def _run(kind: str, x: GPUArray, n: int, rows_shape: tuple[int, ...], in_row: int, out_shape: tuple[int, ...],
         norm: Norm) -> GPUArray:  # fmt: skip
    """Transform the contiguous rows of ``x`` into a new array of ``out_shape``."""
    out = empty(out_shape, x.dtype)
    rows = math.prod(rows_shape)
    if out.size == 0:
        return out
    if is_cuda():
        aligned = x.device_ptr % (2 * x.dtype.itemsize) == 0
        _fft_plan.get_plan(kind, n, in_row, rows, x.dtype, norm, aligned).run(x, out, x.dtype)
        return out
    values = host(x)
    result: Array
    if kind in ("fft", "ifft"):
        data = values.astype(np.float64).view(np.complex128)[..., 0]
        result = getattr(np.fft, kind)(data, n=n, axis=-1, norm=norm)
        out_values: Array = np.stack([result.real, result.imag], axis=-1)
    elif kind == "rfft":
        result = np.fft.rfft(values.astype(np.float64), n=n, axis=-1, norm=norm)
        out_values = np.stack([result.real, result.imag], axis=-1)
    else:
        data = values.astype(np.float64).view(np.complex128)[..., 0]
        out_values = np.fft.irfft(data, n=n, axis=-1, norm=norm)
    host(out)[...] = out_values.astype(x.dtype.numpy)
    return out


def _complex_transform(name: str, kind: str, x: Any, n: Any, axis: Any, norm: Any) -> GPUArray:
    data = as_complex(name, "x", x)
    mode = _norm(name, norm)
    ndim = data.ndim - 1
    ax = normalize_axis(name, axis, ndim)
    length = _length(name, n, data.shape[ax])
    moved, back = _moved(data, ax, ndim)
    lead = moved.shape[:-2]
    result = _run(kind, moved, length, lead, moved.shape[-2], (*lead, length, 2), mode)
    return _restore(result, back)


def fft(x: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> GPUArray:
    """The DFT of a complex array (trailing dimension 2) along ``axis``, as numpy.fft.fft."""
    return _complex_transform("fft", "fft", x, n, axis, norm)


def ifft(x: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> GPUArray:
    """The inverse DFT of a complex array (trailing dimension 2) along ``axis``, as numpy.fft.ifft."""
    return _complex_transform("ifft", "ifft", x, n, axis, norm)


def rfft(x: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> GPUArray:
    """The DFT of a real array along ``axis``: the n // 2 + 1 non-negative frequencies as a complex array
    (trailing dimension 2), as numpy.fft.rfft."""
    data = as_signal("rfft", "x", x)
    mode = _norm("rfft", norm)
    ax = normalize_axis("rfft", axis, data.ndim)
    length = _length("rfft", n, data.shape[ax])
    moved, back = _moved(data, ax, data.ndim)
    lead = moved.shape[:-1]
    result = _run("rfft", moved, length, lead, moved.shape[-1], (*lead, length // 2 + 1, 2), mode)
    return _restore(result, back)


def irfft(x: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> GPUArray:
    """The inverse of :func:`rfft`: a real array of ``n`` points (default 2 (M - 1) for M input frequencies)
    along ``axis``, as numpy.fft.irfft (imaginary parts of the DC and Nyquist terms are ignored)."""
    data = as_complex("irfft", "x", x)
    mode = _norm("irfft", norm)
    ndim = data.ndim - 1
    ax = normalize_axis("irfft", axis, ndim)
    if data.shape[ax] < 1:
        raise ShapeError(f"irfft: invalid number of data points ({data.shape[ax]}) along the transform axis")
    length = _length("irfft", n, 2 * (data.shape[ax] - 1))
    moved, back = _moved(data, ax, ndim)
    lead = moved.shape[:-2]
    result = _run("irfft", moved, length, lead, moved.shape[-2], (*lead, length), mode)
    return _restore(result, back)


def rfft_rows(frames: GPUArray, n: int) -> GPUArray:
    """rfft of the contiguous rows of a 2-D real array (rows, n): (rows, n // 2 + 1, 2). Used by stft."""
    return _run("rfft", frames, n, frames.shape[:-1], frames.shape[-1], (*frames.shape[:-1], n // 2 + 1, 2),
                "backward")  # fmt: skip


def irfft_rows(spectra: GPUArray, n: int) -> GPUArray:
    """irfft of the contiguous rows of a complex array (rows, m, 2): (rows, n) reals. Used by istft."""
    return _run("irfft", spectra, n, spectra.shape[:-2], spectra.shape[-2], (*spectra.shape[:-2], n), "backward")
