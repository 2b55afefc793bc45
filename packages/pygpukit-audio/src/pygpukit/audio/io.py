"""Audio files in and out through soundfile (libsndfile: WAV, FLAC, OGG/Vorbis and more), straight into GPUArrays.

``load(path)`` decodes on the host (libsndfile), copies the samples to the device once and returns
``(samples, sample_rate)`` with librosa's layout: (T,) for mono, (channels, T) otherwise; ``mono=True``
(the default, as librosa) averages the channels on the device. ``offset`` and ``duration`` (seconds)
select a part. ``sr`` resamples on the device after the channels are mixed, as librosa does
(pygpukit.audio.resample, ``res_type`` as there); the default ``sr=None`` keeps the file's own rate (librosa's
default is 22050). ``save`` writes a
(T,) or (channels, T) array. :class:`AudioBuffer` carries samples with their rate (``to_mono``,
``normalize``). Unreadable, truncated or corrupt files and unknown formats raise :class:`AudioFileError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import as_dtype, float32, float64
from pygpukit.core.errors import ArgumentError, DTypeError, PyGPUkitError, ShapeError

from ._common import as_signal, number

__all__ = ["AudioBuffer", "AudioFileError", "load", "save"]


class AudioFileError(PyGPUkitError, OSError):
    """An audio file cannot be read or written: missing, unreadable, truncated, corrupt or of an unknown format.
    ``path`` names the file."""

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


def _soundfile() -> Any:
    try:
        import soundfile  # type: ignore[import-untyped]
    except (ImportError, OSError) as exc:  # OSError: the libsndfile library itself is missing
        raise AudioFileError(f"audio file I/O needs the soundfile package and libsndfile: {exc}") from exc
    return soundfile


def load(path: str | os.PathLike[str], *, sr: int | None = None, mono: bool = True, offset: float = 0.0,
         duration: float | None = None, dtype: Any = float32,
         res_type: str = "soxr_hq") -> tuple[GPUArray, int]:  # fmt: skip
    """Decode ``path`` into a GPUArray of ``dtype`` (float32 or float64, samples in [-1, 1]) and its sample rate;
    with ``sr`` (Hz, an integer) the samples are resampled on the device to that rate."""
    name = "load"
    target_sr = None if sr is None else _target_rate(name, sr)
    target = as_dtype(dtype)
    if target not in (float32, float64):
        raise DTypeError(f"{name}: dtype must be float32 or float64, got {target.name}")
    start_s = number(name, "offset", offset, minimum=0.0)
    length_s = None if duration is None else number(name, "duration", duration, minimum=0.0)
    sf = _soundfile()
    text = os.fspath(path)
    if not os.path.isfile(text):
        raise AudioFileError(f"{name}: no such audio file: {text!r}", path=text)
    try:
        with sf.SoundFile(text) as handle:
            rate = int(handle.samplerate)
            start = round(start_s * rate)
            frames = -1 if length_s is None else round(length_s * rate)
            if start > handle.frames:
                raise ArgumentError(f"{name}: offset {start_s} s is past the end of {text!r} "
                                    f"({handle.frames / rate:.3f} s)")  # fmt: skip
            handle.seek(start)
            data = handle.read(frames=frames, dtype=target.numpy.name, always_2d=True)
            if frames >= 0 and data.shape[0] < frames and handle.frames - start >= frames:
                raise AudioFileError(f"{name}: {text!r} ended early (truncated?)", path=text)
    except (RuntimeError, getattr(sf, "SoundFileError", RuntimeError)) as exc:
        raise AudioFileError(f"{name}: cannot decode {text!r}: {exc}", path=text) from exc
    samples = from_numpy(np.ascontiguousarray(data.T))  # (channels, T), librosa's layout
    if samples.shape[0] == 1:
        samples = samples.reshape(samples.shape[1])
    elif mono:
        samples = _mean_channels(samples)
    if target_sr is not None and target_sr != rate and samples.shape[-1] > 0:
        from .resampling import resample

        samples = resample(samples, orig_sr=rate, target_sr=target_sr, res_type=res_type)
    return samples, (rate if target_sr is None else target_sr)


def _target_rate(name: str, sr: Any) -> int:
    value = number(name, "sr", sr, minimum=0.0, exclusive=True)
    if value != int(value):
        raise ArgumentError(f"{name}: sr must be a whole number of Hz, got {sr!r}")
    return int(value)


def _mean_channels(samples: GPUArray) -> GPUArray:
    from pygpukit.ops import mean

    return mean(samples, axis=0)


def save(path: str | os.PathLike[str], y: Any, sr: int, *, format: str | None = None,
         subtype: str | None = None) -> None:  # fmt: skip
    """Write ``y`` ((T,) or (channels, T)) at ``sr`` Hz; the format follows the file name unless ``format`` (and
    ``subtype``, e.g. "PCM_16", "FLOAT", "VORBIS") says otherwise."""
    name = "save"
    samples = as_signal(name, "y", y)
    if samples.ndim > 2:
        raise ShapeError(f"{name}: y must be (T,) or (channels, T), got shape {samples.shape}")
    rate = int(number(name, "sr", sr, minimum=1.0))
    sf = _soundfile()
    data = samples.to_numpy()
    text = os.fspath(path)
    try:
        sf.write(text, data.T if data.ndim == 2 else data, rate, format=format, subtype=subtype)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise AudioFileError(f"{name}: cannot write {text!r}: {exc}", path=text) from exc


@dataclass
class AudioBuffer:
    """Samples on the device ((T,) or (channels, T)) and their sample rate."""

    samples: GPUArray
    sample_rate: int

    def __post_init__(self) -> None:
        self.samples = as_signal("AudioBuffer", "samples", self.samples)
        if self.samples.ndim > 2:
            raise ShapeError(f"AudioBuffer: samples must be (T,) or (channels, T), got shape {self.samples.shape}")
        self.sample_rate = int(number("AudioBuffer", "sample_rate", self.sample_rate, minimum=1.0))

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, mono: bool = False, **kwargs: Any) -> AudioBuffer:
        """The file ``path`` (every channel unless ``mono``; keywords as :func:`load`)."""
        samples, rate = load(path, mono=mono, **kwargs)
        return cls(samples, rate)

    @property
    def channels(self) -> int:
        return 1 if self.samples.ndim == 1 else self.samples.shape[0]

    @property
    def frames(self) -> int:
        return self.samples.shape[-1]

    @property
    def duration(self) -> float:
        """Seconds."""
        return self.frames / self.sample_rate

    def to_mono(self) -> AudioBuffer:
        """The channels averaged (on the device); a mono buffer is returned as is."""
        if self.samples.ndim == 1:
            return self
        return AudioBuffer(_mean_channels(self.samples), self.sample_rate)

    def require_mono(self, what: str) -> GPUArray:
        """The samples of a mono buffer, else :class:`ShapeError` naming ``what`` needs mono audio."""
        if self.channels != 1:
            raise ShapeError(f"{what} needs mono audio, got {self.channels} channels (use to_mono() first)")
        return self.samples if self.samples.ndim == 1 else self.samples.reshape(self.frames)

    def normalize(self, peak: float = 1.0) -> AudioBuffer:
        """Scaled so that the largest absolute sample is ``peak`` (a silent buffer is returned unchanged)."""
        from pygpukit.ops import abs as device_abs
        from pygpukit.ops import div, max, maximum, mul

        target = number("normalize", "peak", peak, minimum=0.0, exclusive=True)
        largest = maximum(max(device_abs(self.samples)), float(np.finfo(self.samples.dtype.numpy).tiny))
        return AudioBuffer(mul(div(self.samples, largest), target), self.sample_rate)

    def save(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        save(path, self.samples, self.sample_rate, **kwargs)

    def to_numpy(self) -> np.ndarray[Any, Any]:
        return self.samples.to_numpy()
