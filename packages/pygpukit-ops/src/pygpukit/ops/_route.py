"""The seam through which another package may take over a built-in op's call (pygpukit-triton's routing).

``hook`` is None unless a router is installed; the routed ops (``rmsnorm``, ``layernorm``, ``softmax``,
``apply_rope``, ``swiglu``, ``matmul``) read it first, one module attribute, and call it only when set:
``hook(op, args, kwargs)`` returns :data:`BUILTIN` to let the built-in kernel run, or the op's result.
The arguments are in the layout of :mod:`pygpukit.triton.routing`'s functions (``softmax`` with an
``out`` of None, ``apply_rope`` under the name ``"rotary"``).

Without an explicit install, a ``PYGPUKIT_TRITON_ROUTE`` naming a route other than ``builtin`` in the
environment at import installs a hook that imports ``pygpukit.triton.routing`` on the first routed call
(so the variable works in a program that never imports pygpukit.triton). Where that package is not
installed, that first call warns once and the built-in ops run.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["BUILTIN", "ENV_VAR", "ROUTED_OPS", "hook", "install", "uninstall"]

ENV_VAR = "PYGPUKIT_TRITON_ROUTE"
ROUTED_OPS = ("rmsnorm", "layernorm", "softmax", "rotary", "swiglu", "matmul")


class _Builtin:
    __slots__ = ()

    def __repr__(self) -> str:
        return "BUILTIN"


BUILTIN: Any = _Builtin()
"""What a hook returns to let the built-in kernel run."""

Hook = Callable[[str, tuple[Any, ...], dict[str, Any]], Any]
hook: Hook | None = None


def install(new: Hook | None) -> Hook | None:
    """Make ``new`` the hook (None: no routing); returns the previous one."""
    global hook
    previous, hook = hook, new
    return previous


def uninstall() -> None:
    install(None)


def _from_environment(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The hook ``PYGPUKIT_TRITON_ROUTE`` installs: loads the router, which replaces this hook."""
    try:
        from pygpukit.triton import routing
    except ImportError as error:
        install(None)
        warnings.warn(
            f"{ENV_VAR} is set but pygpukit.triton cannot be imported ({error}); the built-in ops run",
            RuntimeWarning,
            stacklevel=3,
        )
        return BUILTIN
    if hook is _from_environment:  # importing it normally installs its router; make sure
        install(routing.route_hook)
    return routing.route_hook(op, args, kwargs)


def _names_a_route(raw: str) -> bool:
    """Whether the variable's value asks for anything but ``builtin`` (a bad value counts: the router
    then raises ArgumentError naming the variable on the first routed call)."""
    for item in raw.lower().split(","):
        op, sep, mode = item.partition("=")
        if (mode if sep else op).strip() not in ("", "builtin"):
            return True
    return False


if _names_a_route(os.environ.get(ENV_VAR, "")):
    hook = _from_environment
