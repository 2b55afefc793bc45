"""YIN and pYIN fundamental-frequency estimation with librosa 0.11's names, defaults and results.

``yin`` frames the (padded) signal on the device and runs one GPU block per frame
(native/kernels/audio/analysis.cu): the difference function of librosa 0.11 (d(k) = 2 (acf(0) - acf(k)) -
sum_{m<k} y[m]^2, summed directly in double; d(1) without its energy term, as librosa's in-place cumsum
leaves it), its cumulative mean normalisation, the first trough below
``trough_threshold`` (else the global minimum), librosa's parabolic refinement and f0 = sr / period. Only
f0 is copied back when asked for.

``pyin`` computes the same normalised difference frames on the device; they are then copied to the HOST
once (n_frames x (max_period - min_period + 1) doubles), where the per-frame trough probabilities (beta
prior over thresholds, Boltzmann prior over troughs) and the observation matrix are computed in NumPy
float64 as librosa computes them (a sequential per-frame loop). The log observations go back to the
device for the Viterbi decoding over 2 * n_pitch_bins states (one block per signal, the dense log
transition matrix kept on the device); the decoded states (n_frames ints) come back to the host, which maps
them to f0 and copies the three results to the device. On the CPU backend everything is NumPy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty, from_numpy
from pygpukit.core.dtypes import float64, int32
from pygpukit.core.errors import ArgumentError, ShapeError

from ._analysis_kernels import launch as launch_analysis
from ._common import Array, as_signal, host, is_cuda, number, positive_int
from ._launch import check_finite, device_table, launch, pad_mode_code, signal_rows

__all__ = ["pyin", "yin"]


Params = tuple[float, float, float, int, int]


def _params(name: str, fmin: Any, fmax: Any, sr: Any, frame_length: Any, hop_length: Any) -> Params:
    """librosa's __check_yin_params: 0 < fmin < fmax <= sr / 2 and sr / fmin < frame_length - 1."""
    if fmin is None or fmax is None:
        raise ArgumentError(f"{name}: both fmin and fmax must be given (Hz), got fmin={fmin!r}, fmax={fmax!r}")
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    low = number(name, "fmin", fmin, minimum=0.0, exclusive=True)
    high = number(name, "fmax", fmax)
    frame = positive_int(name, "frame_length", frame_length, minimum=3)
    if high > rate / 2:
        raise ArgumentError(f"{name}: fmax={high:.3f} cannot exceed the Nyquist frequency {rate / 2}")
    if low >= high:
        raise ArgumentError(f"{name}: fmin={low:.3f} must be less than fmax={high:.3f}")
    if rate / low >= frame - 1:
        needed = int(math.ceil(rate / low) + 1)
        raise ArgumentError(f"{name}: fmin={low:.3f} is too small for frame_length={frame} and sr={rate}; use fmin "
                            f">= {rate / (frame - 1):.3f} or frame_length >= {needed}")  # fmt: skip
    hop = frame // 4 if hop_length is None else positive_int(name, "hop_length", hop_length)
    return low, high, rate, frame, hop


def _periods(low: float, high: float, rate: float, frame: int) -> tuple[int, int]:
    min_period = int(np.floor(rate / high))
    max_period = min(int(np.ceil(rate / low)), frame - 1)
    return min_period, max_period


def _host_frames(x: Array, frame: int, hop: int, center: bool, pad_mode: str) -> Array:
    data = x.astype(np.float64)
    if center:
        data = np.pad(data, ((0, 0), (frame // 2, frame // 2)), mode=pad_mode)  # type: ignore[call-overload]
    if data.shape[-1] < frame:
        raise ShapeError(f"yin: the (padded) signal of {data.shape[-1]} samples is shorter than frame_length={frame}")
    frames: Array = np.lib.stride_tricks.sliding_window_view(data, frame, axis=-1)[:, ::hop]
    return frames  # (rows, n_frames, frame)


def _host_cmndf(frames: Array, min_period: int, max_period: int, tiny: float) -> Array:
    """librosa's _cumulative_mean_normalized_difference (frames (..., frame) float64 -> (..., n_lags))."""
    size = frames.shape[-1]
    spectrum = np.fft.rfft(frames, n=2 * size, axis=-1)
    acf = np.fft.irfft(spectrum * np.conj(spectrum), n=2 * size, axis=-1)[..., : max_period + 1]
    energy = np.cumsum(frames**2, axis=-1)
    energy[..., 0] = 0.0  # librosa zeroes it in place before d(1) reads it
    d = np.zeros_like(acf)
    d[..., 1:] = 2.0 * (acf[..., :1] - acf[..., 1:]) - energy[..., :max_period]
    cumulative = np.cumsum(d[..., 1:], axis=-1) / np.arange(1, max_period + 1)
    result: Array = d[..., min_period:] / (cumulative[..., min_period - 1 :] + tiny)
    return result


def _parabolic(c: Array) -> Array:
    shifts = np.zeros_like(c)
    a = c[..., 2:] + c[..., :-2] - 2.0 * c[..., 1:-1]
    b = (c[..., 2:] - c[..., :-2]) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        shifts[..., 1:-1] = np.where(np.abs(b) >= np.abs(a), 0.0, -b / a)
    return shifts


def _troughs(c: Array) -> Array:
    trough = np.zeros(c.shape, dtype=bool)
    trough[..., 1:-1] = (c[..., 1:-1] < c[..., :-2]) & (c[..., 1:-1] <= c[..., 2:])
    trough[..., -1] = c[..., -1] < c[..., -2]  # librosa's localmin pads by the edge value
    trough[..., 0] = c[..., 0] < c[..., 1]
    return trough


def _host_yin_pick(c: Array, threshold: float, min_period: int, rate: float) -> Array:
    below = _troughs(c) & (c < threshold)
    period = np.where(below.any(axis=-1), np.argmax(below, axis=-1), np.argmin(c, axis=-1))
    shift = np.take_along_axis(_parabolic(c), period[..., None], axis=-1)[..., 0]
    result: Array = rate / (min_period + period + shift)
    return result


Framed = tuple[GPUArray, Array | None, tuple[int, ...], int]


def _cmndf(name: str, y: Any, frame: int, hop: int, min_period: int, max_period: int, center: bool, pad_mode: str,
           threshold: float, rate: float, want_frames: bool) -> Framed:  # fmt: skip
    """(f0 on the device (..., n_frames), the normalised frames on the host (rows, n_frames, n_lags) when
    ``want_frames``, leading shape, n_frames)."""
    signal = as_signal(name, "y", y)
    mode = pad_mode_code(name, pad_mode)
    data, lead, rows, length = signal_rows(name, signal)
    check_finite(name, "y", data)
    if max_period - min_period + 1 < 3:
        raise ArgumentError(f"{name}: the period range [{min_period}, {max_period}] samples needs at least 3 lags; "
                            f"widen fmin/fmax")  # fmt: skip
    pad = frame // 2 if center else 0
    if length + 2 * pad < frame:
        raise ShapeError(f"{name}: the (padded) signal of {length + 2 * pad} samples is shorter than "
                         f"frame_length={frame}")  # fmt: skip
    n_frames = 1 + (length + 2 * pad - frame) // hop
    tiny = float(np.finfo(data.dtype.numpy).tiny)
    f0 = empty((*lead, n_frames), data.dtype)
    if not is_cuda():
        c = _host_cmndf(_host_frames(host(data).reshape(rows, length), frame, hop, center, pad_mode), min_period,
                        max_period, tiny)  # fmt: skip
        host(f0)[...] = _host_yin_pick(c, threshold, min_period, rate).reshape(f0.shape)
        return f0, (c if want_frames else None), lead, n_frames
    count = rows * n_frames
    framed = empty((count, frame), data.dtype)
    launch("frame_signal", data.dtype, count * frame, data.device_ptr, framed.device_ptr, 0, rows, length, length,
           n_frames, frame, hop, pad, mode)  # fmt: skip
    work = empty((count, max_period + 1), float64)
    launch_analysis("yin_frames", data.dtype, count, framed.device_ptr, work.device_ptr, f0.device_ptr, count, frame,
                    min_period, max_period, threshold, rate, tiny, grid=min(count, 65535), block=128)  # fmt: skip
    frames_host = None
    if want_frames:  # host step of pyin: one copy of the normalised frames
        frames_host = work.to_numpy()[:, min_period:].reshape(rows, n_frames, -1)
    return f0, frames_host, lead, n_frames


def yin(y: Any, *, fmin: float, fmax: float, sr: float = 22050, frame_length: int = 2048, hop_length: int | None = None,
        trough_threshold: float = 0.1, center: bool = True, pad_mode: str = "constant") -> GPUArray:  # fmt: skip
    """Fundamental frequency (..., n_frames) in Hz by YIN, as librosa.yin (0.11)."""
    name = "yin"
    low, high, rate, frame, hop = _params(name, fmin, fmax, sr, frame_length, hop_length)
    threshold = number(name, "trough_threshold", trough_threshold, minimum=0.0, exclusive=True)
    min_period, max_period = _periods(low, high, rate, frame)
    f0, _, _, _ = _cmndf(name, y, frame, hop, min_period, max_period, center, pad_mode, threshold, rate, False)
    return f0


# -- pYIN (host: trough probabilities and Viterbi) ------------------------------------------------------------------
def _beta_cdf(x: Array, a: float, b: float) -> Array:
    """The regularised incomplete beta function I_x(a, b) (scipy.stats.beta.cdf), by its continued fraction."""

    def fraction(z: float, p: float, q: float) -> float:
        tiny = 1e-300
        c, d = 1.0, 1.0 - (p + q) * z / (p + 1.0)
        d = 1.0 / (d if abs(d) > tiny else tiny)
        h = d
        for m in range(1, 500):
            for numerator in (m * (q - m) * z / ((p + 2 * m - 1) * (p + 2 * m)),
                              -(p + m) * (p + q + m) * z / ((p + 2 * m) * (p + 2 * m + 1))):  # fmt: skip
                d = 1.0 + numerator * d
                d = 1.0 / (d if abs(d) > tiny else tiny)
                c = 1.0 + numerator / c
                c = c if abs(c) > tiny else tiny
                h *= d * c
            if abs(d * c - 1.0) < 1e-16:
                break
        return h

    out = np.empty(len(x))
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    for i, z in enumerate(np.asarray(x, dtype=np.float64)):
        if z <= 0.0:
            out[i] = 0.0
        elif z >= 1.0:
            out[i] = 1.0
        else:
            front = math.exp(a * math.log(z) + b * math.log1p(-z) - log_beta)
            if z < (a + 1.0) / (a + b + 2.0):
                out[i] = front * fraction(z, a, b) / a
            else:
                out[i] = 1.0 - front * fraction(1.0 - z, b, a) / b
    return out


def _transition(n_bins: int, width: int, switch_prob: float) -> Array:
    """librosa.sequence.transition_local(n_bins, width, window="triangle", wrap=False) kron'd with
    transition_loop(2, 1 - switch_prob)."""
    half = np.arange(1, (width + 1) // 2 + 1)
    if width % 2 == 0:
        rising = (2 * half - 1.0) / width
        window = np.r_[rising, rising[::-1]]
    else:
        rising = 2 * half / (width + 1.0)
        window = np.r_[rising, rising[-2::-1]]
    left = (n_bins - width) // 2
    row = np.zeros(n_bins)
    row[left : left + width] = window
    local = np.zeros((n_bins, n_bins))
    for i in range(n_bins):
        trans = np.roll(row, n_bins // 2 + i + 1)
        trans[min(n_bins, i + width // 2 + 1) :] = 0
        trans[: max(0, i - width // 2)] = 0
        local[i] = trans
    local /= local.sum(axis=1, keepdims=True)
    loop = np.array([[1 - switch_prob, switch_prob], [switch_prob, 1 - switch_prob]])
    result: Array = np.kron(loop, local)
    return result


def _viterbi(prob: Array, log_trans: Array) -> Array:
    """librosa.sequence.viterbi with a uniform initial distribution: prob (n_states, n_frames)."""
    tiny = np.finfo(prob.dtype).tiny
    log_prob = np.log(prob.T + tiny)
    n_frames, n_states = log_prob.shape
    value = log_prob[0] + np.log(1.0 / n_states + tiny)
    pointers = np.zeros((n_frames, n_states), dtype=np.int64)
    for t in range(1, n_frames):
        scores = value[:, None] + log_trans  # (from, to)
        pointers[t] = np.argmax(scores, axis=0)
        value = log_prob[t] + scores[pointers[t], np.arange(n_states)]
    states = np.empty(n_frames, dtype=np.int64)
    states[-1] = int(np.argmax(value))
    for t in range(n_frames - 2, -1, -1):
        states[t] = pointers[t + 1, states[t + 1]]
    return states


def _device_viterbi(observations: Array, log_trans: GPUArray) -> Array:
    """_viterbi of every row of ``observations`` (rows, n_states, n_frames) in one launch (one block a row):
    the log observations go to the device, the decoded states (rows, n_frames) come back."""
    rows, n_states, n_frames = observations.shape
    log_prob = from_numpy(np.ascontiguousarray(np.log(np.swapaxes(observations, 1, 2) + np.finfo(np.float64).tiny)))
    value = empty((rows, 2, n_states), float64)
    pointers = empty((rows, n_frames, n_states), int32)
    states = empty((rows, n_frames), int32)
    log_init = float(np.log(1.0 / n_states + np.finfo(np.float64).tiny))
    launch_analysis("viterbi", float64, rows, log_prob.device_ptr, log_trans.device_ptr, value.device_ptr,
                    pointers.device_ptr, states.device_ptr, rows, n_frames, n_states, log_init,
                    grid=min(rows, 65535), block=256)  # fmt: skip
    result: Array = states.to_numpy().astype(np.int64)
    return result


def _observations(c: Array, shifts: Array, rate: float, thresholds: Array, boltzmann: float, beta_probs: Array,
                  no_trough_prob: float, min_period: int, low: float, n_bins: int,
                  per_semitone: int) -> tuple[Array, Array]:  # fmt: skip
    """librosa's __pyin_helper for one row: c (n_frames, n_lags) -> (observation (2 n_bins, n_frames), voiced)."""
    n_frames = c.shape[0]
    probs_all = np.zeros_like(c)
    troughs = _troughs(c)
    for i in range(n_frames):
        (index,) = np.nonzero(troughs[i])
        if len(index) == 0:
            continue
        heights = c[i, index]
        below = np.less.outer(heights, thresholds[1:])
        positions = np.cumsum(below, axis=0) - 1
        counts = np.count_nonzero(below, axis=0)
        lam = boltzmann
        with np.errstate(divide="ignore", invalid="ignore"):
            prior = (1 - math.exp(-lam)) * np.exp(-lam * positions) / (1 - np.exp(-lam * counts))
        prior = np.where((positions >= 0) & (positions < counts), prior, 0.0)
        prior[~below] = 0
        probs = prior.dot(beta_probs)
        lowest = int(np.argmin(heights))
        n_below_min = int(np.count_nonzero(~below[lowest, :]))
        probs[lowest] += no_trough_prob * np.sum(beta_probs[:n_below_min])
        probs_all[i, index] = probs
    frame_index, period = np.nonzero(probs_all)
    candidates = min_period + period + shifts[frame_index, period]
    bins = 12 * per_semitone * np.log2(rate / candidates / low)
    bins = np.clip(np.round(bins), 0, n_bins).astype(int)
    observation = np.zeros((2 * n_bins, n_frames))
    observation[bins, frame_index] = probs_all[frame_index, period]
    voiced = np.clip(np.sum(observation[:n_bins, :], axis=0), 0, 1)
    observation[n_bins:, :] = (1 - voiced) / n_bins
    return observation, voiced


def pyin(y: Any, *, fmin: float, fmax: float, sr: float = 22050, frame_length: int = 2048,
         hop_length: int | None = None, n_thresholds: int = 100, beta_parameters: tuple[float, float] = (2, 18),
         boltzmann_parameter: float = 2, resolution: float = 0.1, max_transition_rate: float = 35.92,
         switch_prob: float = 0.01, no_trough_prob: float = 0.01, fill_na: float | None = np.nan,
         center: bool = True, pad_mode: str = "constant") -> tuple[GPUArray, GPUArray, GPUArray]:  # fmt: skip
    """(f0, voiced_flag, voiced_prob), each (..., n_frames), by probabilistic YIN as librosa.pyin (0.11).
    voiced_flag is float (1.0 voiced, 0.0 unvoiced; pygpukit has no bool arrays of this kind); the
    difference frames and the Viterbi decoding run on the device, the observation probabilities on the host
    (see the module docstring)."""
    name = "pyin"
    low, high, rate, frame, hop = _params(name, fmin, fmax, sr, frame_length, hop_length)
    n_thresholds = positive_int(name, "n_thresholds", n_thresholds)
    res = number(name, "resolution", resolution, minimum=0.0, exclusive=True)
    if res >= 1:
        raise ArgumentError(f"{name}: resolution must lie in (0, 1), got {res}")
    switch = number(name, "switch_prob", switch_prob)
    no_trough = number(name, "no_trough_prob", no_trough_prob)
    if not (0 <= switch <= 1 and 0 <= no_trough <= 1):
        raise ArgumentError(f"{name}: switch_prob and no_trough_prob must lie in [0, 1], got {switch}, {no_trough}")
    alpha, beta = (number(name, "beta_parameters", v, minimum=0.0, exclusive=True) for v in beta_parameters)
    boltzmann = number(name, "boltzmann_parameter", boltzmann_parameter, minimum=0.0, exclusive=True)
    min_period, max_period = _periods(low, high, rate, frame)
    _, c, lead, n_frames = _cmndf(name, y, frame, hop, min_period, max_period, center, pad_mode, 0.1, rate, True)
    assert c is not None
    thresholds = np.linspace(0, 1, n_thresholds + 1)
    beta_probs = np.diff(_beta_cdf(thresholds, alpha, beta))
    per_semitone = int(np.ceil(1.0 / res))
    n_bins = int(np.floor(12 * per_semitone * np.log2(high / low))) + 1
    semitones = round(number(name, "max_transition_rate", max_transition_rate, minimum=0.0) * 12 * hop / rate)
    with np.errstate(divide="ignore"):
        log_trans = np.log(_transition(n_bins, semitones * per_semitone + 1, switch) + np.finfo(np.float64).tiny)
    freqs = low * 2 ** (np.arange(n_bins) / (12 * per_semitone))
    rows = c.shape[0]
    observations = []
    probs = np.empty((rows, n_frames))
    for r in range(rows):
        observation, probs[r] = _observations(c[r], _parabolic(c[r]), rate, thresholds, boltzmann, beta_probs,
                                              no_trough, min_period, low, n_bins, per_semitone)  # fmt: skip
        observations.append(observation)
    if is_cuda():
        key = ("pyin_log_trans", n_bins, semitones * per_semitone + 1, switch)
        states = _device_viterbi(np.stack(observations), device_table(key, lambda: log_trans, float64))
    else:
        states = np.stack([_viterbi(observation, log_trans) for observation in observations])
    f0 = freqs[states % n_bins]
    flags = (states < n_bins).astype(np.float64)
    if fill_na is not None:
        f0[states >= n_bins] = fill_na
    dtype = as_signal(name, "y", y).dtype.numpy
    shape = (*lead, n_frames)
    return tuple(from_numpy(np.ascontiguousarray(a.reshape(shape), dtype=dtype)) for a in (f0, flags, probs))  # type: ignore[return-value]
