"""Constant-Q and variable-Q transforms and the constant-Q chromagram, with librosa's names, defaults and
algorithm: ``cqt`` (librosa.cqt), ``vqt`` (librosa.vqt, equal-tempered intervals) and ``chroma_cqt``
(librosa.feature.chroma_cqt, cqt_mode="full").

librosa's algorithm is followed step by step, so its results are reproduced rather than approximated: the
signal is first downsampled by 2 as often as the top octave and the hop allow, then each octave (from the
top) is the STFT (window "ones", ``pad_mode``) at the current rate projected onto that octave's sparsified
FFT filter basis, after which the signal is downsampled by 2 (``resample(..., res_type, scale=True)``) for
the next octave. The filter bases are built on the host exactly as librosa builds them (complex64 wavelets,
NumPy's FFT, the same sparsification); the projection of each octave, with librosa's rate and length
scaling folded into the basis, is one real matmul (pygpukit.ops) of the interleaved (re, im) STFT frames;
the octaves are stacked by a kernel of native/kernels/audio/music.cu. The only difference from librosa is
the downsampler: librosa calls soxr, pygpukit.audio.resample is its own polyphase Kaiser sinc (soxr_hq's
passband within about 1e-6), so the lower octaves differ from librosa's by that much (the tests bound it).

Results are complex (..., n_bins, n_frames, 2) (a trailing dimension of 2), a transposed view of frame-major
memory as stft's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.errors import ArgumentError, ShapeError

from . import filters
from ._common import Array, as_signal, host, is_cuda, number, positive_int
from ._launch import check_finite, device_table, signal_rows
from .music import C1, cq_to_chroma, estimate_tuning, frames_last, launch, normalize_frames, project_frames

__all__ = ["chroma_cqt", "cqt", "hybrid_cqt", "pseudo_cqt", "vqt"]


def _window_bandwidth(window: Any) -> float:
    """librosa.filters.window_bandwidth: n sum(w^2) / sum(w)^2 of the window at n = 1000."""
    w = filters.get_window(window, 1000)
    return float(1000 * np.sum(w**2) / np.sum(w) ** 2)


def _relative_bandwidth(freqs: Array) -> Array:
    if freqs.size <= 1:
        r = 2 ** (1 / 12)
        return np.atleast_1d((r**2 - 1) / (r**2 + 1))
    logf = np.log2(freqs)
    bpo = np.empty_like(freqs)
    bpo[0] = 1 / (logf[1] - logf[0])
    bpo[-1] = 1 / (logf[-1] - logf[-2])
    bpo[1:-1] = 2 / (logf[2:] - logf[:-2])
    result: Array = (2.0 ** (2 / bpo) - 1) / (2.0 ** (2 / bpo) + 1)
    return result


def _wavelet_lengths(freqs: Array, sr: float, window: Any, filter_scale: float, gamma: float | None,
                     alpha: Array) -> tuple[Array, float]:  # fmt: skip
    gamma_: Any = alpha * 24.7 / 0.108 if gamma is None else gamma
    q = float(filter_scale) / alpha
    cutoff = float(np.max(freqs * (1 + 0.5 * _window_bandwidth(window) / q) + 0.5 * gamma_))
    lengths: Array = q * sr / (freqs + gamma_ / alpha)
    return lengths, cutoff


def _float_window(window: Any, n: float) -> Array:
    n_min, n_max = int(np.floor(n)), int(np.ceil(n))
    w = filters.get_window(window, n_min)
    if len(w) < n_max:
        w = np.pad(w, (0, n_max - len(w)))
    w[n_min:] = 0.0
    return w


def _filter_fft(sr: float, freqs: Array, filter_scale: float, norm: Any, sparsity: float, window: Any,
                gamma: float | None, alpha: Array, hop: int | None = None) -> tuple[Array, int]:  # fmt: skip
    """librosa's __vqt_filter_fft: (the sparsified FFT basis (n, n_fft // 2 + 1) complex128, n_fft)."""
    lengths, _ = _wavelet_lengths(freqs, sr, window, filter_scale, gamma, alpha)
    rows = []
    for ilen, freq in zip(lengths, freqs, strict=True):
        sig = np.exp(1j * (np.arange(-ilen // 2, ilen // 2, dtype=float) * 2 * np.pi * freq / sr))
        sig = sig * _float_window(window, len(sig))
        if norm is not None:
            mag = np.abs(sig)
            length = mag.max() if norm == np.inf else np.sum(mag**norm) ** (1.0 / norm)
            if length >= np.finfo(np.float64).tiny:
                sig = sig / length
        rows.append(sig)
    max_len = int(2.0 ** np.ceil(np.log2(max(lengths))))
    n_fft = max_len
    if hop is not None and n_fft < 2.0 ** (1 + np.ceil(np.log2(hop))):  # pseudo_cqt's lower bound
        n_fft = int(2.0 ** (1 + np.ceil(np.log2(hop))))
    basis = np.asarray([filters.pad_center(r, max_len) for r in rows], dtype=np.complex64)  # librosa's dtype
    basis *= lengths[:, np.newaxis] / float(n_fft)
    fft_basis = np.fft.fft(basis, n=n_fft, axis=1)[:, : n_fft // 2 + 1]
    mags = np.abs(fft_basis)
    norms = np.sum(mags, axis=1, keepdims=True)
    mag_sort = np.sort(mags, axis=1)
    cumulative = np.cumsum(mag_sort / norms, axis=1)
    threshold_idx = np.argmin(cumulative < sparsity, axis=1)
    sparse = np.zeros(fft_basis.shape, dtype=np.complex128)
    for i, j in enumerate(threshold_idx):
        keep = mags[i] >= mag_sort[i, j]
        sparse[i, keep] = fft_basis[i, keep]
    return sparse, n_fft


def _real_basis(basis: Array) -> Array:
    """The real (2 n_freq, 2 n) matrix W with [re, im]-interleaved frames @ W = interleaved basis @ frame."""
    n, n_freq = basis.shape
    w = np.zeros((2 * n_freq, 2 * n))
    w[0::2, 0::2] = basis.real.T
    w[1::2, 0::2] = -basis.imag.T
    w[0::2, 1::2] = basis.imag.T
    w[1::2, 1::2] = basis.real.T
    return w


def _octave_response(y: GPUArray, n_fft: int, hop: int, w: GPUArray, pad_mode: str) -> tuple[GPUArray, int]:
    """(frame-major (rows, n_frames, 2 n) response of y (rows, T) to the basis W, n_frames)."""
    from pygpukit.ops import matmul

    from .spectral import stft

    spec = stft(y, n_fft=n_fft, hop_length=hop, window="ones", pad_mode=pad_mode)  # (rows, n_freq, frames, 2)
    frame_major = spec.transpose(0, 2, 1, 3)
    if not frame_major.is_contiguous:
        frame_major = frame_major.contiguous()
    rows, n_frames, n_freq = frame_major.shape[:3]
    product = matmul(frame_major.reshape(rows * n_frames, 2 * n_freq), w)
    return product.reshape(rows, n_frames, w.shape[1]), n_frames


def _stack(parts: list[tuple[GPUArray, int, int]], rows: int, n_bins: int, pair: int = 2) -> GPUArray:
    """librosa's __trim_stack of the octaves (top first): (rows, max_col, n_bins, 2) frame-major (complex parts,
    pair=2) or (rows, max_col, n_bins) (real parts, pair=1)."""
    max_col = min(frames for _, frames, _ in parts)
    dt = parts[0][0].dtype
    out = empty((rows, max_col, n_bins * pair), dt)
    end = n_bins
    for part, frames, n_oct in parts:
        src_start, dst_start, count = (n_oct - end, 0, end) if end < n_oct else (0, end - n_oct, n_oct)
        if is_cuda():
            work = rows * max_col * pair * count
            launch("stack_block", dt, work, part.device_ptr, out.device_ptr, rows, max_col, frames, pair * n_oct,
                   pair * n_bins, pair * src_start, pair * dst_start, pair * count)  # fmt: skip
        else:
            src = host(part).reshape(rows, frames, n_oct * pair)
            host(out)[:, :, pair * dst_start : pair * (dst_start + count)] = src[
                :, :max_col, pair * src_start : pair * (src_start + count)
            ]
        end -= n_oct
        if end <= 0:
            break
    return out.reshape(rows, max_col, n_bins, 2) if pair == 2 else out.reshape(rows, max_col, n_bins)


def _fft_downsample(y: GPUArray, factor: int) -> GPUArray:
    """librosa.resample(y, orig_sr=factor, target_sr=1, res_type="fft", scale=True) of rows (rows, T): scipy's
    FFT resampling (the first num // 2 + 1 bins of rfft(y), the unpaired bin doubled, irfft to num =
    ceil(T / factor) points, times num / T) divided by sqrt(1 / factor)."""
    from .fft import irfft_rows, rfft_rows

    rows, length = y.shape
    num = -(-length // factor)
    keep = num // 2 + 1
    doubled = num // 2 if num % 2 == 0 and num != length else -1
    scale = (num / length) * math.sqrt(factor)
    spectrum = rfft_rows(y, length)  # (rows, length // 2 + 1, 2)
    cropped = empty((rows, keep, 2), y.dtype)
    if is_cuda():
        launch("spectrum_crop", y.dtype, rows * keep, spectrum.device_ptr, cropped.device_ptr, rows,
               spectrum.shape[1], keep, scale, doubled)  # fmt: skip
    else:
        values = host(spectrum).astype(np.float64)[:, :keep] * scale
        if doubled >= 0:
            values[:, doubled] *= 2.0
        host(cropped)[...] = values.astype(y.dtype.numpy)
    return irfft_rows(cropped, num)


def _downsample(y: GPUArray, factor: int, res_type: str) -> GPUArray:
    from .resampling import resample

    if res_type in ("fft", "scipy"):
        return _fft_downsample(y, factor)
    return resample(y, orig_sr=factor, target_sr=1, res_type=res_type, scale=True)


def _two_factors(x: int) -> int:
    count = 0
    while x > 0 and x % 2 == 0:
        x //= 2
        count += 1
    return count


def vqt(y: Any, *, sr: float = 22050, hop_length: int = 512, fmin: float | None = None, n_bins: int = 84,
        intervals: str = "equal", gamma: float | None = None, bins_per_octave: int = 12, tuning: float | None = 0.0,
        filter_scale: float = 1, norm: float | None = 1, sparsity: float = 0.01, window: Any = "hann",
        scale: bool = True, pad_mode: str = "constant", res_type: str = "soxr_hq",
        dtype: Any = None) -> GPUArray:  # fmt: skip
    """Variable-Q transform of ``y`` (..., T), as librosa.vqt (equal-tempered intervals): complex
    (..., n_bins, n_frames, 2)."""
    return _vqt("vqt", y, sr, hop_length, fmin, n_bins, intervals, gamma, bins_per_octave, tuning, filter_scale,
                norm, sparsity, window, scale, pad_mode, res_type, dtype)  # fmt: skip


def cqt(y: Any, *, sr: float = 22050, hop_length: int = 512, fmin: float | None = None, n_bins: int = 84,
        bins_per_octave: int = 12, tuning: float | None = 0.0, filter_scale: float = 1, norm: float | None = 1,
        sparsity: float = 0.01, window: Any = "hann", scale: bool = True, pad_mode: str = "constant",
        res_type: str = "soxr_hq", dtype: Any = None) -> GPUArray:  # fmt: skip
    """Constant-Q transform of ``y`` (..., T), as librosa.cqt (vqt with gamma=0): complex (..., n_bins,
    n_frames, 2)."""
    return _vqt("cqt", y, sr, hop_length, fmin, n_bins, "equal", 0.0, bins_per_octave, tuning, filter_scale, norm,
                sparsity, window, scale, pad_mode, res_type, dtype)  # fmt: skip


def _vqt(name: str, y: Any, sr: Any, hop_length: Any, fmin: Any, n_bins: Any, intervals: Any, gamma: Any,
         bins_per_octave: Any, tuning: Any, filter_scale: Any, norm: Any, sparsity: Any, window: Any, scale: bool,
         pad_mode: str, res_type: str, dtype: Any) -> GPUArray:  # fmt: skip
    from pygpukit.ops import mul

    from .spectral import _dtype, _window_key

    signal = as_signal(name, "y", y)
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    hop = positive_int(name, "hop_length", hop_length)
    n_bins = positive_int(name, "n_bins", n_bins)
    bpo = positive_int(name, "bins_per_octave", bins_per_octave)
    if intervals != "equal":
        raise ArgumentError(f"{name}: only intervals='equal' is supported, got {intervals!r}")
    f_scale = number(name, "filter_scale", filter_scale, minimum=0.0, exclusive=True)
    gam = None if gamma is None else number(name, "gamma", gamma, minimum=0.0)
    spars = number(name, "sparsity", sparsity, minimum=0.0)
    if spars >= 1.0:
        raise ArgumentError(f"{name}: sparsity must lie in [0, 1), got {spars}")
    if norm is not None:
        norm = math.inf if norm == np.inf else number(name, "norm", norm, minimum=0.0, exclusive=True)
    dt = _dtype(name, dtype, signal.dtype)
    if signal.dtype != dt:
        signal = signal.astype(dt)
    data, lead, rows, length = signal_rows(name, signal)
    if length == 0:
        raise ShapeError(f"{name}: y is empty (shape {signal.shape})")
    check_finite(name, "y", data)
    data = data.reshape(rows, length)
    f_min = C1 if fmin is None else number(name, "fmin", fmin, minimum=0.0, exclusive=True)
    tune = estimate_tuning(y=signal, sr=rate, bins_per_octave=bpo) if tuning is None else number(name, "tuning", tuning)
    f_min = f_min * 2.0 ** (tune / bpo)
    n_octaves = math.ceil(n_bins / bpo)
    n_filters = min(bpo, n_bins)
    ratios = 2.0 ** (np.arange(0, bpo, dtype=float) / bpo)
    freqs = np.sort(np.multiply.outer(2.0 ** np.arange(n_octaves), ratios).flatten()[:n_bins]) * f_min
    alpha = _relative_bandwidth(freqs) if n_bins > 1 else _relative_bandwidth(np.array([1.0]))
    if n_bins == 1:
        r = 2 ** (1 / bpo)
        alpha = np.atleast_1d((r**2 - 1) / (r**2 + 1))
    lengths, cutoff = _wavelet_lengths(freqs, rate, window, f_scale, gam, alpha)
    nyquist = rate / 2.0
    if cutoff > nyquist:
        raise ArgumentError(f"{name}: the wavelet basis reaches {cutoff:.1f} Hz, above the Nyquist rate {nyquist} of "
                            f"sr={rate}: reduce n_bins ({n_bins}) or fmin")  # fmt: skip
    from .resampling import RES_TYPES

    if res_type not in (*RES_TYPES, "fft", "scipy"):
        allowed = ", ".join(repr(r) for r in (*RES_TYPES, "fft", "scipy"))
        raise ArgumentError(f"{name}: res_type must be one of {allowed}, got {res_type!r}")
    # early downsampling (librosa's __early_downsample)
    count1 = max(0, int(np.ceil(np.log2(nyquist / cutoff)) - 1) - 1)
    count = min(count1, max(0, _two_factors(hop) - n_octaves + 1))
    my_y, my_sr, my_hop = data, rate, hop
    if count > 0:
        factor = 2**count
        if length < factor:
            raise ShapeError(f"{name}: a signal of {length} samples is too short for a {n_octaves}-octave transform")
        my_hop //= factor
        my_sr = rate / factor
        my_y = _downsample(my_y, factor, res_type)
        if not scale:
            my_y = mul(my_y, math.sqrt(factor))
    base_sr = my_sr  # librosa scales by the lengths and rates after the early downsampling
    lengths, _ = _wavelet_lengths(freqs, base_sr, window, f_scale, gam, alpha)
    parts: list[tuple[GPUArray, int, int]] = []
    for i in range(n_octaves):
        sl = slice(-n_filters, None) if i == 0 else slice(-n_filters * (i + 1), -n_filters * i)
        freqs_oct, alpha_oct = freqs[sl], alpha[sl]
        key = (name, my_sr, base_sr, freqs_oct.tobytes(), f_scale, norm, spars, _window_key(window), gam,
               alpha_oct.tobytes(), bool(scale), lengths[sl].tobytes())  # fmt: skip

        def make(sr_now: float = my_sr, fo: Array = freqs_oct, ao: Array = alpha_oct, ls: Array = lengths[sl]) -> Array:
            basis, _ = _filter_fft(sr_now, fo, f_scale, norm, spars, window, gam, ao)
            basis = basis * np.sqrt(base_sr / sr_now)
            if scale:
                basis = basis / np.sqrt(ls)[:, None]
            return _real_basis(basis)

        w = device_table(key, make, dt)
        n_fft = (w.shape[0] // 2 - 1) * 2
        response, frames = _octave_response(my_y, n_fft, my_hop, w, pad_mode)
        parts.append((response, frames, w.shape[1] // 2))
        if my_hop % 2 == 0 and i + 1 < n_octaves:
            my_hop //= 2
            my_sr /= 2.0
            my_y = _downsample(my_y, 2, res_type)
    stacked = _stack(parts, rows, n_bins)  # (rows, max_col, n_bins, 2)
    result = stacked.reshape(*lead, stacked.shape[1], n_bins, 2)
    k = len(lead)
    return result.transpose(*range(k), k + 1, k, k + 2)


def _tuned_frequencies(name: str, signal: GPUArray, rate: float, fmin: Any, n_bins: int, bpo: int,
                       tuning: Any) -> tuple[float, Array, Array]:  # fmt: skip
    """(tuned fmin, the equal-tempered frequencies, their relative bandwidths), as librosa's cqt functions."""
    f_min = C1 if fmin is None else number(name, "fmin", fmin, minimum=0.0, exclusive=True)
    tune = estimate_tuning(y=signal, sr=rate, bins_per_octave=bpo) if tuning is None else number(name, "tuning", tuning)
    f_min = f_min * 2.0 ** (tune / bpo)
    freqs = f_min * 2.0 ** (np.arange(n_bins, dtype=float) / bpo)
    if n_bins == 1:
        r = 2 ** (1 / bpo)
        return f_min, freqs, np.atleast_1d((r**2 - 1) / (r**2 + 1))
    return f_min, freqs, _relative_bandwidth(freqs)


def pseudo_cqt(y: Any, *, sr: float = 22050, hop_length: int = 512, fmin: float | None = None, n_bins: int = 84,
               bins_per_octave: int = 12, tuning: float | None = 0.0, filter_scale: float = 1,
               norm: float | None = 1, sparsity: float = 0.01, window: Any = "hann", scale: bool = True,
               pad_mode: str = "constant", dtype: Any = None) -> GPUArray:  # fmt: skip
    """Pseudo constant-Q magnitudes (..., n_bins, n_frames) of ``y``, as librosa.pseudo_cqt: one full-rate STFT
    (window "hann") whose magnitudes are projected onto the magnitudes of the whole filter basis."""
    from .spectral import _dtype, _window_key, magnitude, stft

    name = "pseudo_cqt"
    signal = as_signal(name, "y", y)
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    hop = positive_int(name, "hop_length", hop_length)
    n_bins = positive_int(name, "n_bins", n_bins)
    bpo = positive_int(name, "bins_per_octave", bins_per_octave)
    f_scale = number(name, "filter_scale", filter_scale, minimum=0.0, exclusive=True)
    spars = number(name, "sparsity", sparsity, minimum=0.0)
    if norm is not None:
        norm = math.inf if norm == np.inf else number(name, "norm", norm, minimum=0.0, exclusive=True)
    dt = _dtype(name, dtype, signal.dtype)
    if signal.dtype != dt:
        signal = signal.astype(dt)
    if signal.shape[-1] == 0:
        raise ShapeError(f"{name}: y is empty (shape {signal.shape})")
    check_finite(name, "y", signal)
    _, freqs, alpha = _tuned_frequencies(name, signal, rate, fmin, n_bins, bpo, tuning)
    lengths, _ = _wavelet_lengths(freqs, rate, window, f_scale, 0.0, alpha)
    max_len = int(2.0 ** np.ceil(np.log2(max(lengths))))
    n_fft = max(max_len, int(2.0 ** (1 + np.ceil(np.log2(hop)))))

    def make() -> Array:
        basis, _ = _filter_fft(rate, freqs, f_scale, norm, spars, window, 0.0, alpha, hop=hop)
        weights = np.abs(basis)
        return weights / np.sqrt(n_fft) if scale else weights * np.sqrt(lengths / n_fft)[:, None]

    spec = magnitude(stft(signal, n_fft=n_fft, hop_length=hop, window="hann", pad_mode=pad_mode))
    key = (name, rate, freqs.tobytes(), f_scale, norm, spars, _window_key(window), hop, bool(scale))
    return frames_last(project_frames(spec, make, key))


def hybrid_cqt(y: Any, *, sr: float = 22050, hop_length: int = 512, fmin: float | None = None, n_bins: int = 84,
               bins_per_octave: int = 12, tuning: float | None = 0.0, filter_scale: float = 1,
               norm: float | None = 1, sparsity: float = 0.01, window: Any = "hann", scale: bool = True,
               pad_mode: str = "constant", res_type: str = "soxr_hq", dtype: Any = None) -> GPUArray:  # fmt: skip
    """Constant-Q magnitudes (..., n_bins, n_frames) of ``y``, as librosa.hybrid_cqt: pseudo_cqt for the bins
    whose filters are shorter than twice the hop, |cqt| for the others."""
    from .spectral import magnitude

    name = "hybrid_cqt"
    signal = as_signal(name, "y", y)
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    hop = positive_int(name, "hop_length", hop_length)
    n_bins = positive_int(name, "n_bins", n_bins)
    bpo = positive_int(name, "bins_per_octave", bins_per_octave)
    f_scale = number(name, "filter_scale", filter_scale, minimum=0.0, exclusive=True)
    if signal.shape[-1] == 0:
        raise ShapeError(f"{name}: y is empty (shape {signal.shape})")
    f_min, freqs, alpha = _tuned_frequencies(name, signal, rate, fmin, n_bins, bpo, tuning)
    lengths, _ = _wavelet_lengths(freqs, rate, window, f_scale, 0.0, alpha)
    pseudo = 2.0 ** np.ceil(np.log2(lengths)) < 2 * hop
    n_pseudo = int(np.sum(pseudo))
    common: dict[str, Any] = {"sr": rate, "hop_length": hop, "bins_per_octave": bpo, "filter_scale": f_scale,
                              "norm": norm, "sparsity": sparsity, "window": window, "scale": scale,
                              "pad_mode": pad_mode, "dtype": dtype}  # fmt: skip
    parts: list[GPUArray] = []
    if n_pseudo > 0:
        parts.append(pseudo_cqt(signal, fmin=float(np.min(freqs[pseudo])), n_bins=n_pseudo, **common))
    if n_bins - n_pseudo > 0:
        parts.append(magnitude(cqt(signal, fmin=f_min, n_bins=n_bins - n_pseudo, res_type=res_type, **common)))
    lead = parts[0].shape[:-2]
    rows = math.prod(lead)
    frame_major = []
    for part in parts:
        fm = frames_last(part)
        fm = fm if fm.is_contiguous else fm.contiguous()
        frame_major.append((fm.reshape(rows, fm.shape[-2], fm.shape[-1]), fm.shape[-2], fm.shape[-1]))
    stacked = _stack(frame_major, rows, n_bins, pair=1)
    return frames_last(stacked.reshape(*lead, stacked.shape[1], n_bins))


def chroma_cqt(*, y: Any = None, sr: float = 22050, C: Any = None, hop_length: int = 512,  # noqa: N803
               fmin: float | None = None, norm: Any = np.inf, threshold: float = 0.0, tuning: float | None = None,
               n_chroma: int = 12, n_octaves: int = 7, window: Any = None, bins_per_octave: int | None = 36,
               cqt_mode: str = "full") -> GPUArray:  # fmt: skip
    """Constant-Q chromagram (..., n_chroma, n_frames), as librosa.feature.chroma_cqt."""
    from .spectral import magnitude

    name = "chroma_cqt"
    n_chroma = positive_int(name, "n_chroma", n_chroma)
    bpo = n_chroma if bins_per_octave is None else positive_int(name, "bins_per_octave", bins_per_octave)
    if bpo % n_chroma:
        raise ArgumentError(f"{name}: bins_per_octave={bpo} must be a multiple of n_chroma={n_chroma}")
    if cqt_mode not in ("full", "hybrid"):
        raise ArgumentError(f"{name}: cqt_mode must be 'full' or 'hybrid', got {cqt_mode!r}")
    if window is not None:
        raise ArgumentError(f"{name}: window (a smoothing of the chroma map) is not supported; pass None")
    floor = number(name, "threshold", 0.0 if threshold is None else threshold)
    if C is None:
        if y is None:
            raise ArgumentError(f"{name}: give y (audio) or C (a constant-Q magnitude spectrogram)")
        octaves = positive_int(name, "n_octaves", n_octaves)
        kw: dict[str, Any] = {"sr": sr, "hop_length": hop_length, "fmin": fmin, "n_bins": octaves * bpo,
                              "bins_per_octave": bpo, "tuning": tuning}  # fmt: skip
        spec = hybrid_cqt(y, **kw) if cqt_mode == "hybrid" else magnitude(cqt(y, **kw))
    else:
        spec = as_signal(name, "C", C, min_ndim=2)
        check_finite(name, "C", spec)
    basis = cq_to_chroma(spec.shape[-2], bins_per_octave=bpo, n_chroma=n_chroma, fmin=fmin)
    raw = project_frames(spec, basis, ("cq_to_chroma", spec.shape[-2], bpo, n_chroma, fmin))
    return frames_last(normalize_frames(name, raw, norm, floor=floor))
