"""Reading the ``PYGPUKIT_*`` environment variables, and checking them all for ``pygpukit info``.

Two policies, by how much a wrong value matters:

- a choice that decides what runs (``PYGPUKIT_BACKEND``, ``PYGPUKIT_CUDA_VARIANT``) raises
  :class:`PyGPUkitError` where it is read: guessing would run something the user did not ask for;
- an on/off flag (``PYGPUKIT_DEBUG_LIBRARY_LOAD``, ``PYGPUKIT_KERNEL_CACHE``, ``PYGPUKIT_ALLOW_TF32``,
  ``PYGPUKIT_NO_TF32``, ``PYGPUKIT_NO_CUBLASLT``) read with :func:`env_flag` accepts ``1/0``,
  ``true/false``, ``yes/no`` and ``on/off`` in any case; anything else is announced once per variable and value with an
  :class:`EnvironmentVariableWarning` and the default is used.

:func:`environment_report` checks every run-time variable that is set without raising or warning, so
``python -m pygpukit info`` can say which one is wrong and why.
"""

from __future__ import annotations

import difflib
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import PyGPUkitError

__all__ = [
    "FALSE_VALUES",
    "TRUE_VALUES",
    "EnvSetting",
    "EnvironmentVariableWarning",
    "env_choice",
    "env_flag",
    "environment_report",
    "parse_flag",
    "warn_once",
]

TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("0", "false", "no", "off")


class EnvironmentVariableWarning(RuntimeWarning):
    """A ``PYGPUKIT_*`` variable has a value outside its accepted set; its default is used instead.

    ``variable``, ``value`` and ``accepted`` say which, what and what would have been understood."""

    def __init__(self, message: str, *, variable: str = "", value: str = "", accepted: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.variable = variable
        self.value = value
        self.accepted = tuple(accepted)


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_once(variable: str, value: str, accepted: Sequence[str], message: str, *, stacklevel: int = 2) -> None:
    """Emit ``message`` as an :class:`EnvironmentVariableWarning`, once per variable and value."""
    with _warned_lock:
        if (variable, value) in _warned:
            return
        _warned.add((variable, value))
    warnings.warn(
        EnvironmentVariableWarning(message, variable=variable, value=value, accepted=accepted),
        stacklevel=stacklevel + 1,
    )


def parse_flag(value: str) -> bool | None:
    """``True``/``False`` for an accepted flag spelling (case-insensitive, blanks ignored), else ``None``."""
    text = value.strip().lower()
    if text in TRUE_VALUES:
        return True
    if text in FALSE_VALUES:
        return False
    return None


def env_flag(name: str, default: bool = False) -> bool:
    """The on/off environment variable ``name``: unset or empty gives ``default``; ``1/true/yes/on``
    and ``0/false/no/off`` (any case) give True and False; any other value warns once
    (:class:`EnvironmentVariableWarning`, naming the variable, the value and the accepted values) and
    gives ``default``."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    parsed = parse_flag(raw)
    if parsed is None:
        accepted = (*TRUE_VALUES, *FALSE_VALUES)
        warn_once(
            name,
            raw,
            accepted,
            f"{name}={raw!r} is not an on/off value (accepted, in any case: {', '.join(accepted)}); "
            f"using the default, {'on' if default else 'off'}",
            stacklevel=2,
        )
        return default
    return parsed


def env_choice(name: str, choices: Sequence[str], default: str) -> str:
    """The environment variable ``name`` lower-cased: unset or empty gives ``default``; a value outside
    ``choices`` raises :class:`PyGPUkitError` naming the variable, the value and the choices."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in choices:
        raise PyGPUkitError(f"{name} must be {_one_of(choices)} (or unset), got {value!r}")
    return value


def _one_of(choices: Sequence[str]) -> str:
    quoted = [repr(c) for c in choices]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


# -- the check behind `pygpukit info` -------------------------------------------------------------------


@dataclass(frozen=True)
class EnvSetting:
    """One ``PYGPUKIT_*`` variable that is set: its value and, when it is wrong, what is wrong."""

    variable: str
    value: str
    problem: str | None = None

    def __str__(self) -> str:
        text = f"{self.variable}={self.value!r}"
        return text if self.problem is None else f"{text}: {self.problem}"


_CHOICES: dict[str, tuple[str, ...]] = {
    "PYGPUKIT_BACKEND": ("auto", "cuda", "cpu"),
    "PYGPUKIT_CUDA_VARIANT": ("cu12", "cu13"),
    "PYGPUKIT_PREFILL_KERNEL": ("auto", "sm80"),  # read by pygpukit.ops' prefill attention
}
_FLAGS: dict[str, bool] = {  # name -> default
    "PYGPUKIT_DEBUG_LIBRARY_LOAD": False,
    "PYGPUKIT_KERNEL_CACHE": True,
    "PYGPUKIT_ALLOW_TF32": False,
    "PYGPUKIT_NO_TF32": False,  # the product description's name: 1 keeps float32 matmuls exact fp32
    "PYGPUKIT_NO_CUBLASLT": False,
}
_COUNTS = ("PYGPUKIT_STAGING_MIN_BYTES", "PYGPUKIT_STAGING_CHUNK_BYTES", "PYGPUKIT_COPY_THREADS")  # native
_PATHS = ("PYGPUKIT_LIBCUDA_PATH", "PYGPUKIT_NVRTC_PATH", "PYGPUKIT_CUBLASLT_PATH")  # checked by _libraries
_DIRECTORIES = ("PYGPUKIT_CACHE_DIR",)
# Read by pygpukit.ops (whether to route at all) and pygpukit.triton.routing: op=mode items.
_ROUTES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "PYGPUKIT_TRITON_ROUTE": (
        ("*", "rmsnorm", "layernorm", "softmax", "rotary", "swiglu", "matmul"),
        ("builtin", "triton", "auto"),
    ),
}
RUNTIME_VARIABLES: tuple[str, ...] = (*_CHOICES, *_FLAGS, *_COUNTS, *_PATHS, *_DIRECTORIES, *_ROUTES)
# Read by the build, the tests or CI, never by an installed pygpukit: not checked, not typos either.
_OTHER_VARIABLES = (
    "PYGPUKIT_CUDA_INCLUDE_DIR",
    "PYGPUKIT_CUDA12_INCLUDE_DIR",
    "PYGPUKIT_CUDA13_INCLUDE_DIR",
    "PYGPUKIT_CUDA_MAJOR",
    "PYGPUKIT_DIST_DIR",
    "PYGPUKIT_DEVICE_PYTHON",
    "PYGPUKIT_SMOLLM2_GGUF",
    "PYGPUKIT_REQUIRE_MODELS",
    "PYGPUKIT_NETWORK_TESTS",
    "PYGPUKIT_BENCH",
    "PYGPUKIT_TEST_PRECOMPILE",
)


def _problem(name: str, raw: str) -> str | None:
    value = raw.strip()
    if name in _CHOICES:
        if value and value.lower() not in _CHOICES[name]:
            return f"must be {_one_of(_CHOICES[name])}; pygpukit raises PyGPUkitError until it is fixed or unset"
    elif name in _FLAGS:
        if value and parse_flag(value) is None:
            default = "on" if _FLAGS[name] else "off"
            return f"not an on/off value ({'/'.join(TRUE_VALUES)} or {'/'.join(FALSE_VALUES)}); {default} is used"
    elif name in _COUNTS:
        digits = raw.lstrip()  # what the native reader (strtoull, nothing after the number) accepts
        if value and not (digits.isascii() and digits.isdigit()):
            return "must be a non-negative integer; the CUDA backend raises on its first copy until it is fixed"
    elif name in _DIRECTORIES and value and os.path.exists(value) and not os.path.isdir(value):
        return "exists but is not a directory; nothing can be cached there"
    elif name in _ROUTES:
        return _route_problem(value, *_ROUTES[name])
    return None


def _route_problem(value: str, ops: tuple[str, ...], modes: tuple[str, ...]) -> str | None:
    """What is wrong with a ``mode`` / ``op=mode,...`` list (as pygpukit.triton.routing parses it)."""
    for item in (part.strip().lower() for part in value.split(",")):
        if not item:
            continue
        op, sep, mode = item.partition("=")
        op, mode = (op.strip(), mode.strip()) if sep else ("*", op.strip())
        if op not in ops:
            return f"{op!r} is not a routed op (one of {', '.join(ops)}); the first routed call raises ArgumentError"
        if mode not in modes:
            return f"{mode!r} is not a mode ({_one_of(modes)}); the first routed call raises ArgumentError"
    return None


def environment_report(environ: dict[str, str] | None = None) -> list[EnvSetting]:
    """Every ``PYGPUKIT_*`` run-time variable that is set, with what is wrong with its value (never
    raises or warns). A name that is not a pygpukit variable but is close to one is reported as a
    likely misspelling. Library paths are checked by :func:`pygpukit.core._libraries.explicit_problem`."""
    env = os.environ if environ is None else environ
    report = []
    for name in sorted(env):
        if not name.startswith("PYGPUKIT_") or name in _OTHER_VARIABLES:
            continue
        if name in RUNTIME_VARIABLES:
            report.append(EnvSetting(name, env[name], _problem(name, env[name])))
            continue
        close = difflib.get_close_matches(name, RUNTIME_VARIABLES, n=1, cutoff=0.8)
        if close:
            report.append(EnvSetting(name, env[name], f"not a pygpukit variable; did you mean {close[0]}?"))
    return report
