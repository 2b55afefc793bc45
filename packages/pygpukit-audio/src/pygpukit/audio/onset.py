"""Onset strength, onset detection, tempo and beat tracking with librosa 0.11's names, defaults and results.

``onset_strength`` runs on the device: melspectrogram and power_to_db (pygpukit.audio.features), then one
kernel (native/kernels/audio/analysis.cu) for the positive flux against the lag-shifted (optionally
maximum-filtered) spectrogram, its mean or median over bins and the centring pad, and, with detrend=True,
the [1, -1] / [1, -0.99] IIR as a second-order section. Its result stays on the device.

``onset_detect``, ``tempo`` and ``beat_track`` run on the HOST in float64 from the onset envelope, which is
copied once from the device (n_frames values: about 31 a second at sr=16000, hop_length=512): librosa's
greedy peak picking, the autocorrelation tempogram with its log-normal tempo prior and the beat dynamic
programme are sequential, small, and would not gain from the GPU. They return NumPy arrays, as librosa.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from pygpukit.core.array import GPUArray, empty
from pygpukit.core.errors import ArgumentError, ShapeError

from ._analysis_kernels import launch as launch_analysis
from ._common import Array, as_signal, host, is_cuda, number, positive_int
from ._launch import check_finite

__all__ = ["beat_track", "onset_detect", "onset_strength", "tempo", "tempogram"]


def _aggregate_code(name: str, aggregate: Any) -> int:
    if aggregate is None or aggregate is np.mean:
        return 0
    if aggregate is np.median:
        return 1
    raise ArgumentError(f"{name}: aggregate must be None, np.mean or np.median, got {aggregate!r}")


def _host_flux(s: Array, lag: int, max_size: int, pad: int, aggregate: int) -> Array:
    """s (rows, n_freq, n_frames) float64 -> (rows, n_frames)."""
    ref = s
    if max_size > 1:
        lo = max_size // 2
        padded = np.pad(s, ((0, 0), (lo, max_size - 1 - lo), (0, 0)), mode="symmetric")
        ref = np.lib.stride_tricks.sliding_window_view(padded, max_size, axis=1).max(axis=-1)
    env = np.maximum(0.0, s[..., lag:] - ref[..., :-lag])
    env = env.mean(axis=1) if aggregate == 0 else np.median(env, axis=1)
    out = np.zeros((s.shape[0], s.shape[-1]))
    width = min(s.shape[-1] - pad, env.shape[-1]) if pad < s.shape[-1] else 0
    out[:, pad : pad + width] = env[:, :width]
    return out


def onset_strength(y: Any = None, *, sr: float = 22050, S: Any = None, lag: int = 1, max_size: int = 1,  # noqa: N803
                   ref: Any = None, detrend: bool = False, center: bool = True, feature: Any = None,
                   aggregate: Any = None, **kwargs: Any) -> GPUArray:  # fmt: skip
    """Spectral-flux onset strength (..., n_frames), as librosa.onset.onset_strength (feature: the mel
    spectrogram in dB; aggregate: np.mean (None) or np.median; ``kwargs`` go to melspectrogram)."""
    from .features import melspectrogram
    from .spectral import power_to_db

    name = "onset_strength"
    lag = positive_int(name, "lag", lag)
    max_size = positive_int(name, "max_size", max_size)
    code = _aggregate_code(name, aggregate)
    if feature is not None and feature is not melspectrogram:
        raise ArgumentError(f"{name}: feature must be None (pygpukit.audio.melspectrogram), got {feature!r}")
    if ref is not None:
        raise ArgumentError(f"{name}: only ref=None (the spectrogram itself, maximum-filtered over max_size) is "
                            f"supported, got an explicit ref")  # fmt: skip
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    if S is None:
        if y is None:
            raise ArgumentError(f"{name}: give y (audio) or S (a log-power spectrogram)")
        kwargs.setdefault("fmax", 0.5 * rate)
        spec = power_to_db(melspectrogram(y, sr=rate, **kwargs))
    else:
        spec = as_signal(name, "S", S, min_ndim=2)
        check_finite(name, "S", spec)
    n_fft = positive_int(name, "n_fft", kwargs.get("n_fft", 2048))
    hop = positive_int(name, "hop_length", kwargs.get("hop_length", 512))
    pad = lag + (n_fft // (2 * hop) if center else 0)
    lead = spec.shape[:-2]
    n_freq, n_frames = spec.shape[-2:]
    rows = int(np.prod(lead)) if lead else 1
    dense = spec.contiguous().reshape(rows, n_freq, n_frames)
    out = empty((*lead, n_frames), spec.dtype)
    if out.size:
        if is_cuda():
            launch_analysis("onset_flux", spec.dtype, rows * n_frames, dense.device_ptr, out.device_ptr, rows, n_freq,
                            n_frames, lag, max_size, pad, code)  # fmt: skip
        else:
            flux = _host_flux(host(dense).astype(np.float64), lag, max_size, pad, code)
            host(out)[...] = flux.reshape(out.shape).astype(spec.dtype.numpy)
    if detrend:
        from .dynamics import apply_sos

        sos = np.array([[1.0, -1.0, 0.0, 1.0, -0.99, 0.0]])
        out = apply_sos(name, out, sos, ("onset_detrend",))
    return out


# -- host steps -----------------------------------------------------------------------------------------------------
def _envelope(name: str, y: Any, onset_envelope: Any, sr: float, hop_length: int, aggregate: Any = None) -> Array:
    """The onset envelope on the host (float64): given, or onset_strength(y) copied from the device once."""
    if onset_envelope is None:
        if y is None:
            raise ArgumentError(f"{name}: give y (audio) or onset_envelope")
        onset_envelope = onset_strength(y, sr=sr, hop_length=hop_length, aggregate=aggregate)
    values = onset_envelope.to_numpy() if isinstance(onset_envelope, GPUArray) else np.asarray(onset_envelope)
    if values.dtype.kind not in "fiu":
        raise ArgumentError(f"{name}: onset_envelope must be real numbers, got dtype {values.dtype}")
    values = values.astype(np.float64)
    if values.ndim == 0 or values.shape[-1] == 0:
        raise ShapeError(f"{name}: onset_envelope is empty (shape {values.shape})")
    if not np.all(np.isfinite(values)):
        raise ArgumentError(f"{name}: onset_envelope holds non-finite values")
    return values


def _peak_pick(x: Array, pre_max: int, post_max: int, pre_avg: int, post_avg: int, delta: float, wait: int) -> Array:
    """librosa.util.peak_pick on a 1-D array (greedy, sequential)."""
    n_x = x.shape[0]
    peaks = np.zeros(n_x, dtype=bool)
    peaks[0] = x[0] >= np.max(x[: min(post_max, n_x)]) and x[0] >= np.mean(x[: min(post_avg, n_x)]) + delta
    n = wait + 1 if peaks[0] else 1
    while n < n_x:
        if x[n] != np.max(x[max(0, n - pre_max) : min(n + post_max, n_x)]):
            n += 1
            continue
        if not x[n] >= np.mean(x[max(0, n - pre_avg) : min(n + post_avg, n_x)]) + delta:
            n += 1
            continue
        peaks[n] = True
        n += wait + 1
    return np.flatnonzero(peaks)


def _units(name: str, frames: Array, units: str, sr: float, hop: int) -> Array:
    if units == "frames":
        return frames
    if units == "samples":
        return frames * hop
    if units == "time":
        return cast(Array, frames * hop / sr)
    raise ArgumentError(f"{name}: units must be 'frames', 'samples' or 'time', got {units!r}")


def onset_detect(y: Any = None, *, sr: float = 22050, onset_envelope: Any = None, hop_length: int = 512,
                 backtrack: bool = False, energy: Any = None, units: str = "frames", normalize: bool = True,
                 **kwargs: Any) -> Array:  # fmt: skip
    """Onset events of a mono signal (NumPy), as librosa.onset.onset_detect (peak picking on the host)."""
    name = "onset_detect"
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    hop = positive_int(name, "hop_length", hop_length)
    env = _envelope(name, y, onset_envelope, rate, hop)
    if env.ndim != 1:
        raise ShapeError(f"{name}: needs a mono onset envelope (n_frames,), got shape {env.shape}")
    if normalize:
        env = env - env.min()
        env = env / (env.max() + np.finfo(np.float64).tiny)
    if not env.any():
        return np.array([], dtype=int)
    picks = {"pre_max": 0.03 * rate // hop, "post_max": 0.00 * rate // hop + 1, "pre_avg": 0.10 * rate // hop,
             "post_avg": 0.10 * rate // hop + 1, "wait": 0.03 * rate // hop, "delta": 0.07}  # fmt: skip
    unknown = set(kwargs) - set(picks)
    if unknown:
        raise ArgumentError(f"{name}: unknown peak-picking argument(s) {sorted(unknown)}")
    picks.update(kwargs)
    ints = {k: int(np.ceil(number(name, k, picks[k], minimum=0.0))) for k in ("pre_max", "post_max", "pre_avg",
                                                                             "post_avg", "wait")}  # fmt: skip
    if ints["post_max"] < 1 or ints["post_avg"] < 1:
        raise ArgumentError(f"{name}: post_max and post_avg must be >= 1, got {ints['post_max']}, {ints['post_avg']}")
    onsets = _peak_pick(env, ints["pre_max"], ints["post_max"], ints["pre_avg"], ints["post_avg"],
                        number(name, "delta", picks["delta"]), ints["wait"])  # fmt: skip
    if backtrack:
        level = env if energy is None else np.asarray(energy.to_numpy() if isinstance(energy, GPUArray) else energy)
        minima = np.flatnonzero((level[1:-1] <= level[:-2]) & (level[1:-1] < level[2:])) + 1
        minima = np.unique(np.concatenate([[0], minima]))
        onsets = minima[np.searchsorted(minima, onsets, side="right") - 1]
    return _units(name, onsets, units, rate, hop)


def _autocorrelate(x: Array) -> Array:
    n = x.shape[-1]
    spectrum = np.fft.rfft(x, n=2 * n - 1, axis=-1)
    result: Array = np.fft.irfft(np.abs(spectrum) ** 2, n=2 * n - 1, axis=-1)[..., :n]
    return result


def tempogram(y: Any = None, *, sr: float = 22050, onset_envelope: Any = None, hop_length: int = 512,
              win_length: int = 384, center: bool = True, norm: float | None = np.inf) -> Array:  # fmt: skip
    """Autocorrelation tempogram (..., win_length, n_frames) (NumPy, host), as librosa.feature.tempogram with
    its Hann window."""
    name = "tempogram"
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    hop = positive_int(name, "hop_length", hop_length)
    win = positive_int(name, "win_length", win_length)
    env = _envelope(name, y, onset_envelope, rate, hop)
    n = env.shape[-1]
    if center:
        widths = [(0, 0)] * (env.ndim - 1) + [(win // 2, win // 2)]
        env = np.pad(env, widths, mode="linear_ramp", end_values=0)
    if env.shape[-1] < win:
        raise ShapeError(f"{name}: the onset envelope of {env.shape[-1]} frames is shorter than win_length={win}")
    frames = np.lib.stride_tricks.sliding_window_view(env, win, axis=-1)  # (..., n_frames, win)
    if center:
        frames = frames[..., :n, :]
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(win) / win)  # periodic Hann
    ac = _autocorrelate(frames * window)
    if norm is not None:
        if norm != np.inf:
            raise ArgumentError(f"{name}: norm must be np.inf or None, got {norm!r}")
        length = np.max(np.abs(ac), axis=-1, keepdims=True)
        length[length < np.finfo(ac.dtype).tiny] = 1.0
        ac = ac / length
    return np.swapaxes(ac, -1, -2)


def tempo(y: Any = None, *, sr: float = 22050, onset_envelope: Any = None, hop_length: int = 512,
          start_bpm: float = 120, std_bpm: float = 1.0, ac_size: float = 8.0, max_tempo: float | None = 320.0,
          aggregate: Any = np.mean) -> Array:  # fmt: skip
    """Global tempo estimate in BPM (NumPy (..., 1), or (..., n_frames) with aggregate=None), as
    librosa.feature.tempo with its log-normal prior (host)."""
    name = "tempo"
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    start = number(name, "start_bpm", start_bpm, minimum=0.0, exclusive=True)
    spread = number(name, "std_bpm", std_bpm, minimum=0.0, exclusive=True)
    hop = positive_int(name, "hop_length", hop_length)
    win = int(number(name, "ac_size", ac_size, minimum=0.0, exclusive=True) * rate) // hop
    tg = tempogram(y, sr=rate, onset_envelope=onset_envelope, hop_length=hop, win_length=win)
    if aggregate is not None:
        tg = aggregate(tg, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        bpms = np.r_[np.inf, 60.0 * rate / (hop * np.arange(1.0, win))]
        logprior = -0.5 * ((np.log2(bpms) - np.log2(start)) / spread) ** 2
    if max_tempo is not None:
        logprior[: int(np.argmax(bpms < number(name, "max_tempo", max_tempo)))] = -np.inf
    best = np.argmax(np.log1p(1e6 * tg) + logprior[:, None], axis=-2)
    result: Array = np.take(bpms, best)
    return result


def _beat_tracker(env: Array, bpm: float, frame_rate: float, tightness: float, trim: bool) -> Array:
    fpb = float(np.round(frame_rate * 60.0 / bpm))
    onsets = env / (env.std(ddof=1) + np.finfo(env.dtype).tiny)
    n = len(onsets)
    window = np.exp(-0.5 * (np.arange(-fpb, fpb + 1) * 32.0 / fpb) ** 2)
    k_len = len(window)
    full = np.convolve(onsets, window)  # full[m] = sum_k window[k] onsets[m - k]
    local = full[k_len // 2 : k_len // 2 + n].copy()
    first = np.arange(n)
    skip = first + k_len // 2 < k_len  # librosa's loop leaves out k = i + K//2 (the onsets[0] term)
    local[skip] -= window[first[skip] + k_len // 2] * onsets[0]
    backlink = np.full(n, -1, dtype=np.int64)
    cumscore = np.zeros(n)
    thresh = 0.01 * local.max()
    first_beat = True
    tight = float(np.float32(tightness))
    for i in range(n):
        hi = i - int(np.round(fpb / 2))
        lo = max(i - int(2 * fpb), 0)
        best, loc_best = -np.inf, -1
        if hi >= lo:
            locs = np.arange(hi, lo - 1, -1)
            scores = cumscore[locs] - tight * (np.log(i - locs) - np.log(fpb)) ** 2
            j = int(np.argmax(scores))
            best, loc_best = scores[j], int(locs[j])
        cumscore[i] = local[i] + best if loc_best >= 0 else local[i]
        if first_beat and local[i] < thresh:
            backlink[i] = -1
        else:
            backlink[i] = loc_best
            first_beat = False
    peaks = np.zeros(n, dtype=bool)
    peaks[1:-1] = (cumscore[1:-1] > cumscore[:-2]) & (cumscore[1:-1] >= cumscore[2:])
    peaks[-1] = n > 1 and cumscore[-1] > cumscore[-2]
    threshold = 0.5 * float(np.median(cumscore[peaks])) if peaks.any() else 0.0
    tail = n - 1
    for m in range(n - 1, -1, -1):
        if peaks[m] and cumscore[m] >= threshold:
            tail = m
            break
    beats = np.zeros(n, dtype=bool)
    m = tail
    while m >= 0:
        beats[m] = True
        m = int(backlink[m])
    w = np.hanning(5)
    smooth = np.convolve(local[beats], w)[len(w) // 2 : n + len(w) // 2]
    level = 0.5 * float(np.sqrt((smooth**2).mean())) if trim else 0.0
    m = 0
    while m < n and local[m] <= level:
        beats[m] = False
        m += 1
    m = n - 1
    while m >= 0 and local[m] <= level:
        beats[m] = False
        m -= 1
    return np.flatnonzero(beats)


def beat_track(y: Any = None, *, sr: float = 22050, onset_envelope: Any = None, hop_length: int = 512,
               start_bpm: float = 120.0, tightness: float = 100, trim: bool = True, bpm: float | None = None,
               units: str = "frames") -> tuple[Any, Array]:  # fmt: skip
    """(tempo, beat events) of a mono signal, as librosa.beat.beat_track (onset strength with np.median
    aggregation on the device; tempo and the dynamic programme on the host)."""
    name = "beat_track"
    rate = number(name, "sr", sr, minimum=0.0, exclusive=True)
    hop = positive_int(name, "hop_length", hop_length)
    tight = number(name, "tightness", tightness, minimum=0.0, exclusive=True)
    env = _envelope(name, y, onset_envelope, rate, hop, aggregate=np.median)
    if env.ndim != 1:
        raise ShapeError(f"{name}: needs a mono onset envelope (n_frames,), got shape {env.shape}")
    if not env.any():
        return 0.0, np.array([], dtype=int)
    estimate = tempo(onset_envelope=env, sr=rate, hop_length=hop, start_bpm=start_bpm) if bpm is None else bpm
    value = float(np.atleast_1d(estimate)[0])
    if value <= 0:
        raise ArgumentError(f"{name}: bpm must be > 0, got {value}")
    beats = _beat_tracker(env, value, rate / hop, tight, bool(trim))
    return estimate, _units(name, beats, units, rate, hop)
