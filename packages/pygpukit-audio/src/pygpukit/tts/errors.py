"""Errors of pygpukit.tts."""

from __future__ import annotations

from pygpukit.core.errors import ModelDownloadError, PyGPUkitError

__all__ = ["KokoroDownloadError", "KokoroModelError"]


class KokoroDownloadError(ModelDownloadError):
    """Fetching the Kokoro model failed: a package download failed, or a file's SHA-256 did not match."""


class KokoroModelError(PyGPUkitError, ValueError):
    """A Kokoro model file (ONNX graph, voices) is missing, truncated, corrupt or not the expected model."""
