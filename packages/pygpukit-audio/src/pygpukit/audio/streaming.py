"""Streaming audio: a ring buffer of samples, a chunker with a window, and a streaming STFT whose frames are
the offline :func:`~pygpukit.audio.stft`'s.

Samples arrive from a microphone or a socket in host memory, in chunks of any size; the buffers here keep
them in host memory (NumPy) and hand out fixed-size chunks as GPUArrays, so the device work (windowing,
FFTs) runs on whole chunks or frames. Signals are mono (n,) or multichannel (channels, n); a buffer's
channel count is fixed when it is made.

- :class:`AudioRingBuffer`: a fixed-capacity FIFO: ``write`` (refused with :class:`BufferFullError` past
  capacity unless ``overwrite=True`` drops the oldest samples), ``read`` / ``peek`` / ``skip``.
- :class:`AudioStream`: ``push`` samples; while ``has_chunk()``, ``pop_chunk()`` gives the next
  ``chunk_size`` samples (times ``window`` when given) and advances by ``hop_size``.
- :class:`StreamingSTFT`: ``push`` samples and get the STFT frames (..., 1 + n_fft // 2, k, 2) that became
  complete (None when none did); ``flush`` at the end gives the rest. Concatenated along the frame axis they
  equal ``stft(y)`` of the whole signal with the same parameters (center=True pads with zeros as librosa's
  default ``pad_mode="constant"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, from_numpy
from pygpukit.core.dtypes import DType, float32, float64
from pygpukit.core.errors import ArgumentError, PyGPUkitError, ShapeError

from . import filters
from ._common import Array, positive_int
from .spectral import stft

__all__ = ["AudioRingBuffer", "AudioStream", "BufferFullError", "StreamingSTFT"]


class BufferFullError(PyGPUkitError):
    """A write would pass an :class:`AudioRingBuffer`'s capacity (and overwrite=False)."""


def _dtype(name: str, dtype: Any) -> DType:
    text = str(np.dtype(dtype.numpy if isinstance(dtype, DType) else dtype))
    if text == "float32":
        return float32
    if text == "float64":
        return float64
    raise ArgumentError(f"{name}: dtype must be float32 or float64, got {dtype!r}")


def _samples(name: str, samples: Any, channels: int | None) -> Array:
    """``samples`` as a float64 host array (channels, n) (mono: (1, n))."""
    values = samples.to_numpy() if isinstance(samples, GPUArray) else np.asarray(samples)
    if values.dtype.kind not in "fiu" or values.dtype == np.bool_:
        raise ArgumentError(f"{name}: samples must be real numbers, got an array of {values.dtype}")
    if values.ndim == 1:
        values = values[None, :]
    expected = 1 if channels is None else channels
    if values.ndim != 2 or values.shape[0] != expected:
        want = "(n,)" if channels is None else f"({channels}, n)"
        raise ShapeError(f"{name}: samples must have shape {want}, got {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ArgumentError(f"{name}: samples hold non-finite value(s) (NaN or infinity); audio must be finite")
    return values.astype(np.float64, copy=False)


class AudioRingBuffer:
    """A FIFO of at most ``capacity`` samples (per channel) in host memory. ``channels=None`` holds mono
    samples (n,); an int holds (channels, n)."""

    def __init__(self, capacity: int, *, channels: int | None = None, dtype: Any = "float32",
                 overwrite: bool = False) -> None:  # fmt: skip
        name = "AudioRingBuffer"
        self.capacity = positive_int(name, "capacity", capacity)
        self.channels = None if channels is None else positive_int(name, "channels", channels)
        self.dtype = _dtype(name, dtype)
        self.overwrite = bool(overwrite)
        self._data = np.zeros((self.channels or 1, self.capacity), dtype=self.dtype.numpy)
        self._start = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def available(self) -> int:
        """Samples (per channel) that can be read."""
        return self._size

    @property
    def space(self) -> int:
        """Samples (per channel) that can be written without overwriting."""
        return self.capacity - self._size

    def clear(self) -> None:
        self._start = 0
        self._size = 0

    def write(self, samples: Any) -> int:
        """Append ``samples`` ((n,) or (channels, n)); returns how many of the oldest samples were dropped."""
        values = _samples("AudioRingBuffer.write", samples, self.channels)
        n = values.shape[-1]
        dropped = 0
        if n > self.space:
            if not self.overwrite:
                raise BufferFullError(f"AudioRingBuffer.write: {n} samples do not fit in the {self.space} free "
                                      f"of capacity {self.capacity}; read first or make the buffer with "
                                      f"overwrite=True")  # fmt: skip
            dropped = n - self.space
            if n >= self.capacity:
                values = values[:, n - self.capacity :]
                dropped = self._size + n - self.capacity
                self._start, self._size, n = 0, 0, self.capacity
            else:
                self.skip(dropped)
        end = (self._start + self._size) % self.capacity
        first = min(n, self.capacity - end)
        self._data[:, end : end + first] = values[:, :first]
        self._data[:, : n - first] = values[:, first:]
        self._size += n
        return dropped

    def _take(self, n: int, what: str) -> Array:
        n = positive_int(f"AudioRingBuffer.{what}", "n", n, minimum=0)
        if n > self._size:
            raise ArgumentError(f"AudioRingBuffer.{what}: asked for {n} samples, {self._size} available")
        index = (self._start + np.arange(n)) % self.capacity
        values: Array = self._data[:, index]
        return values if self.channels is not None else values[0]

    def peek(self, n: int) -> Array:
        """The oldest ``n`` samples as a NumPy array, left in the buffer."""
        return self._take(n, "peek")

    def read(self, n: int) -> Array:
        """The oldest ``n`` samples as a NumPy array, removed from the buffer."""
        values = self._take(n, "read")
        self.skip(n)
        return values

    def skip(self, n: int) -> None:
        """Drop the oldest ``n`` samples."""
        n = positive_int("AudioRingBuffer.skip", "n", n, minimum=0)
        if n > self._size:
            raise ArgumentError(f"AudioRingBuffer.skip: asked to drop {n} samples, {self._size} available")
        self._start = (self._start + n) % self.capacity
        self._size -= n


class AudioStream:
    """Fixed-size, optionally windowed chunks of a stream of samples: ``push`` samples, and while
    ``has_chunk()``, ``pop_chunk()`` gives the next ``chunk_size`` samples as a GPUArray and moves on by
    ``hop_size`` (default ``chunk_size``: no overlap). ``window`` (a window name or array, as stft's)
    multiplies each chunk. ``capacity`` (default 64 chunks) bounds the samples kept."""

    def __init__(self, chunk_size: int, *, hop_size: int | None = None, window: Any = None,
                 channels: int | None = None, dtype: Any = "float32", capacity: int | None = None) -> None:  # fmt: skip
        name = "AudioStream"
        self.chunk_size = positive_int(name, "chunk_size", chunk_size)
        self.hop_size = self.chunk_size if hop_size is None else positive_int(name, "hop_size", hop_size)
        if self.hop_size > self.chunk_size:
            raise ArgumentError(f"{name}: hop_size ({self.hop_size}) must be <= chunk_size ({self.chunk_size})")
        size = 64 * self.chunk_size if capacity is None else positive_int(name, "capacity", capacity)
        if size < self.chunk_size:
            raise ArgumentError(f"{name}: capacity ({size}) must be >= chunk_size ({self.chunk_size})")
        self.buffer = AudioRingBuffer(size, channels=channels, dtype=dtype)
        self.window: Array | None = None if window is None else filters.get_window(window, self.chunk_size)

    def push(self, samples: Any) -> None:
        """Append ``samples``; :class:`BufferFullError` past ``capacity`` samples not yet popped."""
        self.buffer.write(samples)

    def has_chunk(self) -> bool:
        return self.buffer.available >= self.chunk_size

    def pop_chunk(self) -> GPUArray:
        """The next chunk ((chunk_size,) or (channels, chunk_size)) on the device, windowed when asked."""
        if not self.has_chunk():
            raise ArgumentError(f"AudioStream.pop_chunk: {self.buffer.available} samples buffered, a chunk needs "
                                f"{self.chunk_size}; check has_chunk() first")  # fmt: skip
        values = self.buffer.peek(self.chunk_size).astype(np.float64)
        self.buffer.skip(self.hop_size)
        if self.window is not None:
            values = values * self.window
        return from_numpy(np.ascontiguousarray(values.astype(self.buffer.dtype.numpy)))


class StreamingSTFT:
    """The STFT of a stream, frame by frame, equal to ``stft(y, n_fft=..., hop_length=..., win_length=...,
    window=..., center=...)`` of the whole signal: ``push`` returns the frames completed by the samples
    pushed (complex (..., 1 + n_fft // 2, k, 2), or None), ``flush`` those left at the end (center=True:
    the zero padding of the end). ``channels`` as for :class:`AudioRingBuffer`."""

    def __init__(self, *, n_fft: int = 2048, hop_length: int | None = None, win_length: int | None = None,
                 window: Any = "hann", center: bool = True, channels: int | None = None,
                 dtype: Any = "float32") -> None:  # fmt: skip
        name = "StreamingSTFT"
        self.n_fft = positive_int(name, "n_fft", n_fft)
        self.win_length = self.n_fft if win_length is None else positive_int(name, "win_length", win_length)
        if hop_length is None and self.win_length // 4 < 1:
            raise ArgumentError(f"{name}: hop_length defaults to win_length // 4, which is 0 here")
        self.hop_length = self.win_length // 4 if hop_length is None else positive_int(name, "hop_length", hop_length)
        self.window = window
        self.center = bool(center)
        self.channels = None if channels is None else positive_int(name, "channels", channels)
        self.dtype = _dtype(name, dtype)
        self._pad = self.n_fft // 2 if self.center else 0
        self._pending = np.zeros((self.channels or 1, self._pad))  # padded samples not yet behind every frame
        self._seen = 0
        self._frames = 0
        self._done = False

    def _emit(self, count: int) -> GPUArray | None:
        if count <= 0:
            return None
        used = (count - 1) * self.hop_length + self.n_fft
        segment = self._pending[:, :used]
        if self.channels is None:
            segment = segment[0]
        signal = from_numpy(np.ascontiguousarray(segment.astype(self.dtype.numpy)))
        spec = stft(signal, n_fft=self.n_fft, hop_length=self.hop_length, win_length=self.win_length,
                    window=self.window, center=False)  # fmt: skip
        self._pending = self._pending[:, count * self.hop_length :]
        self._frames += count
        return spec

    def push(self, samples: Any) -> GPUArray | None:
        """Append ``samples``; the frames they complete, or None."""
        if self._done:
            raise ArgumentError("StreamingSTFT.push: the stream was flushed; make a new StreamingSTFT")
        values = _samples("StreamingSTFT.push", samples, self.channels)
        self._seen += values.shape[-1]
        self._pending = np.concatenate([self._pending, values], axis=-1)
        have = self._pending.shape[-1]
        count = 0 if have < self.n_fft else 1 + (have - self.n_fft) // self.hop_length
        return self._emit(count)

    def flush(self) -> GPUArray | None:
        """The frames left at the end of the stream (the end padding with center=True), or None."""
        if self._done:
            return None
        self._done = True
        if self._seen + 2 * self._pad < self.n_fft:
            raise ShapeError(f"StreamingSTFT.flush: n_fft={self.n_fft} is too large for a stream of {self._seen} "
                             f"samples")  # fmt: skip
        total = 1 + (self._seen + 2 * self._pad - self.n_fft) // self.hop_length
        self._pending = np.concatenate([self._pending, np.zeros((self._pending.shape[0], self._pad))], axis=-1)
        return self._emit(total - self._frames)

    @property
    def frames_out(self) -> int:
        """Frames handed out so far."""
        return self._frames
