"""Exceptions raised by the native scheduler module ``_pygpukit_rust._native``.

They derive from :class:`pygpukit.PyGPUkitError` (when pygpukit-core is importable) and from the
builtin exception a caller would expect (``ValueError`` for bad values, ``KeyError`` for unknown
ids, ...), and carry the details of the Rust error as attributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pygpukit.core.errors import PyGPUkitError as _Base
    from pygpukit.core.errors import QuotaExceededError as _QuotaBase
else:
    try:
        from pygpukit.core.errors import PyGPUkitError as _Base
        from pygpukit.core.errors import QuotaExceededError as _QuotaBase
    except ImportError:  # the bindings also work without pygpukit-core (host backend only)
        _Base = Exception
        _QuotaBase = MemoryError

__all__ = [
    "AdmissionError",
    "AdmissionRejectedError",
    "BudgetExceededError",
    "ContextError",
    "DependencyCycleError",
    "DeviceOperationError",
    "DuplicateIdError",
    "InvalidArgumentError",
    "InvalidTransitionError",
    "QuotaExceededError",
    "SchedulerError",
    "UnknownIdError",
]


class SchedulerError(_Base):
    """Base of every error of the scheduler's native module."""


class InvalidArgumentError(SchedulerError, ValueError):
    """A value out of range (negative, NaN, larger than the resource). ``name`` and ``value`` say
    which, when known."""

    name: str
    value: str


class UnknownIdError(SchedulerError, KeyError):
    """An id that does not exist (never created, or already removed); ``kind`` and ``id``."""

    kind: str
    id: str

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DuplicateIdError(SchedulerError, ValueError):
    """An id that is already in use; ``kind`` and ``id``."""

    kind: str
    id: str


class DependencyCycleError(SchedulerError, ValueError):
    """A dependency that would close a cycle; ``cycle`` lists the ids along it."""

    cycle: list[str]


class InvalidTransitionError(SchedulerError, RuntimeError):
    """An operation the object's state does not allow (completing twice, restoring a resident
    block, ...); ``kind``, ``id``, ``state`` and ``operation``."""

    kind: str
    id: str
    state: str
    operation: str


class AdmissionRejectedError(SchedulerError):
    """Admission control refused a submission; ``reason`` is the :class:`RejectReason`."""

    reason: Any


class QuotaExceededError(SchedulerError, _QuotaBase):
    """A memory pool's quota would be exceeded; ``requested``, ``in_use`` and ``quota`` bytes."""

    requested: int
    in_use: int
    quota: int


class DeviceOperationError(SchedulerError, RuntimeError):
    """A device call failed; ``code`` (the C API's PYGPUKIT_E_* value) and ``call``."""

    code: int
    call: str


class ContextError(SchedulerError):
    """An unknown, destroyed or duplicate execution context, or the scheduler used before
    ``initialize`` (``pygpukit.scheduler.ContextError``)."""


class AdmissionError(ContextError):
    """A context was refused at creation; ``reason`` says why: the Rust evaluator's reject kind
    (``"insufficient_memory"``, ``"partition_limit"``, ...), ``"capacity"`` (a budget above the
    device) or ``"duplicate"`` (``pygpukit.scheduler.AdmissionError``)."""

    def __init__(self, message: str, *, reason: str = "refused") -> None:
        super().__init__(message)
        self.reason = reason


class BudgetExceededError(QuotaExceededError):
    """A real allocation refused by an execution context's budget or a partition's limit
    (``pygpukit.scheduler.QuotaExceededError``, a ``pygpukit.QuotaExceededError``). ``context``
    names the context (None for a partition scope), ``partition`` the partition (None when the
    context's own budget refused); ``requested``, ``in_use`` and ``limit`` are bytes (``quota`` is
    ``limit``)."""

    context: str | None
    partition: str | None
    limit: int
