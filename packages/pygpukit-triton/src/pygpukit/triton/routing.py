"""Choosing, per op and per call site, between a built-in kernel and its Triton version.

The routed functions here (:func:`rmsnorm`, :func:`layernorm`, :func:`softmax`, :func:`rotary`,
:func:`swiglu`, :func:`matmul`) take the built-in op's arguments plus ``out=`` and a keyword-only
``backend=``, and run one of:

- ``"builtin"``: the op of :mod:`pygpukit.ops` (the default);
- ``"triton"``: the kernel of :mod:`pygpukit.triton.kernels`;
- ``"auto"``: the faster of the two for this op, dtype and shape on this GPU, measured once (both run
  a few times on the current stream, timed with events) and remembered in memory and on disk, in
  ``<cache root>/triton/routes.json`` (the cache root is ``PYGPUKIT_CACHE_DIR`` or
  ``$XDG_CACHE_HOME/pygpukit``, as for compiled kernels).

Where the mode comes from, first match wins: the call's ``backend=``; the innermost
``with route(mode, *ops):`` block naming the op (or every op); :func:`set_route`; the environment
variable ``PYGPUKIT_TRITON_ROUTE`` (``triton``, ``auto``, ``builtin``, or per op
``rmsnorm=triton,matmul=auto``, ``*`` for every other op); else ``"builtin"``.

Triton cannot run on the CPU backend or without Triton installed: there every mode runs the built-in
op (documented fallback; :mod:`pygpukit.triton.kernels` itself raises instead). A dtype the Triton
kernel does not take (fp8, int8, float64 outside softmax) runs the built-in op in every mode too. While a CUDA graph is
capturing, ``auto`` uses a remembered winner or the built-in op; it never measures inside a capture.
A shape the Triton kernel does not take (``matmul`` beyond 3 dimensions or with a quantized ``b``,
``softmax`` of a strided array along an inner axis) also runs the built-in op.

The built-in ops follow the same routes: once a route is configured (``set_route`` with a mode other
than ``builtin``, a ``route`` block, or ``PYGPUKIT_TRITON_ROUTE`` in the environment, which works even
in a program that never imports this module), ``pygpukit.ops.rmsnorm``, ``layernorm``, ``softmax``,
``apply_rope``, ``swiglu`` and ``matmul`` (and ``a @ b``) ask :func:`route_hook` first, through
``pygpukit.ops._route``. Until then they do not look at routes at all; after that, a built-in call costs
one route lookup (about a microsecond) more. Calls made by a routed function (the built-in side of
``backend="builtin"``, the measurements of ``auto``) are not routed again.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pygpukit.core.array import GPUArray
from pygpukit.core.dtypes import bfloat16, float16, float32, float64
from pygpukit.core.errors import ArgumentError
from pygpukit.ops import _route
from pygpukit.ops._nn_common import output

from . import kernels as _triton
from ._interop import triton_available, triton_version

__all__ = [
    "ENV_VAR",
    "MODES",
    "OPS",
    "auto_cache_path",
    "clear_auto_cache",
    "get_route",
    "layernorm",
    "matmul",
    "rmsnorm",
    "rotary",
    "route",
    "route_hook",
    "set_route",
    "softmax",
    "swiglu",
]

OPS = ("rmsnorm", "layernorm", "softmax", "rotary", "swiglu", "matmul")
MODES = ("builtin", "triton", "auto")
ENV_VAR = "PYGPUKIT_TRITON_ROUTE"

_FLOATS = (float32, float16, bfloat16)
_DTYPES = dict.fromkeys(OPS, _FLOATS) | {"softmax": (*_FLOATS, float64)}  # what the Triton kernels take
_settings: dict[str, str] = {}  # op or "*" -> mode (set_route)
_scopes: ContextVar[tuple[tuple[frozenset[str] | None, str], ...]] = ContextVar("pygpukit_triton_routes", default=())
_env_cache: list[Any] = [None, {}]  # [raw value, parsed]
_winners: dict[tuple[Any, ...], str] = {}  # auto: key -> "builtin" / "triton"
_on_disk: dict[str, str] = {}  # the same, by the key's JSON text, as read from and written to the file
_disk: dict[str, Any] = {"loaded": False, "path": None}
_lock = threading.Lock()
_inside = threading.local()  # .depth > 0 while this thread runs a routed call: its own op calls run built-in


def _check_mode(mode: Any, where: str) -> str:
    if mode not in MODES:
        raise ArgumentError(f"{where}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    return str(mode)


def _check_op(op: Any, where: str) -> str:
    if op != "*" and op not in OPS:
        raise ArgumentError(f"{where}: op must be one of {', '.join(OPS)} (or '*'), got {op!r}")
    return str(op)


def _parse_env(raw: str) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for item in (part.strip().lower() for part in raw.split(",")):
        if not item:
            continue
        op, sep, mode = item.partition("=")
        if not sep:
            op, mode = "*", op
        where = f"{ENV_VAR}={raw!r}"
        parsed[_check_op(op.strip(), where)] = _check_mode(mode.strip(), where)
    return parsed


def _env_routes() -> dict[str, str]:
    raw = os.environ.get(ENV_VAR, "")
    if raw != _env_cache[0]:
        parsed = _parse_env(raw)
        _env_cache[:] = [raw, parsed]
    routes: dict[str, str] = _env_cache[1]
    return routes


def set_route(op: str, mode: str | None = None) -> None:
    """``set_route("triton")``: every op; ``set_route("matmul", "auto")``: one op; mode None clears
    the op's setting (back to the environment variable or ``"builtin"``)."""
    if mode is None and op in MODES:
        op, mode = "*", str(op)
    op = _check_op(op, "set_route")
    if mode is None:
        _settings.pop(op, None)
        return
    _settings[op] = _check_mode(mode, "set_route")
    if _settings[op] != "builtin":
        _route.install(route_hook)


def get_route(op: str) -> str:
    """The mode ``op`` runs in here and now (without a call's ``backend=``)."""
    for ops, scoped in reversed(_scopes.get()):
        if ops is None or op in ops:
            return scoped
    setting = _settings.get(op) or _settings.get("*")
    if setting is not None:
        return setting
    env = _env_routes()
    return env.get(op) or env.get("*") or "builtin"


@contextmanager
def route(mode: str, *ops: str) -> Iterator[None]:
    """``with route("triton"):`` every routed op in the block (this thread or task) runs on Triton;
    ``with route("auto", "matmul", "softmax"):`` only those."""
    mode = _check_mode(mode, "route")
    names = frozenset(_check_op(op, "route") for op in ops) if ops else None
    if mode != "builtin":
        _route.install(route_hook)
    token = _scopes.set((*_scopes.get(), (names, mode)))
    try:
        yield
    finally:
        _scopes.reset(token)


# -- auto: measure once, remember -------------------------------------------------------------------


def auto_cache_path() -> Path:
    """Where ``auto`` keeps its winners."""
    explicit = os.environ.get("PYGPUKIT_CACHE_DIR")
    root = Path(explicit) if explicit else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pygpukit"
    return root.expanduser() / "triton" / "routes.json"


def clear_auto_cache(disk: bool = True) -> None:
    """Forget every ``auto`` winner (in memory, and on disk with ``disk``)."""
    with _lock:
        _winners.clear()
        _on_disk.clear()
        _disk["loaded"] = False
        if disk:
            path = auto_cache_path()
            if path.exists():
                path.unlink()


def _load() -> None:
    path = auto_cache_path()
    if _disk["loaded"] and _disk["path"] == path:
        return
    _disk["loaded"], _disk["path"] = True, path
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    for key, entry in data.get("winners", {}).items() if isinstance(data, dict) else ():
        if isinstance(entry, dict) and entry.get("winner") in ("builtin", "triton"):
            _on_disk.setdefault(key, entry["winner"])


def _save(key: str, winner: str, times: dict[str, float]) -> None:
    path = auto_cache_path()
    try:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        winners = data.get("winners") if isinstance(data, dict) else None
        winners = winners if isinstance(winners, dict) else {}
        winners[key] = {"winner": winner, "ms": times}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": 1, "winners": winners}, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs a new measurement in the next process


def _describe(value: Any) -> Any:
    if isinstance(value, GPUArray):
        return (value.shape, value.dtype.name, value.strides, value.device_ptr % 16)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__name__


_device_tags: dict[int, tuple[Any, ...]] = {}


def _device_tag() -> tuple[Any, ...]:
    """(name, compute capability, Triton version) of the calling thread's device, looked up once."""
    from pygpukit.core.stream import thread_device

    device = thread_device()
    tag = _device_tags.get(device)
    if tag is None:
        from pygpukit.core.device import get_device_info

        info = get_device_info(device)
        tag = _device_tags[device] = (info.name, tuple(info.compute_capability), triton_version())
    return tag


def _key(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What a winner is remembered under (hashable); its JSON text is the key on disk."""
    kw = tuple((k, _describe(v)) for k, v in sorted(kwargs.items()) if k not in ("out", "stream"))
    return (op, _device_tag(), tuple(_describe(a) for a in args), kw)


def _text(key: tuple[Any, ...]) -> str:
    return json.dumps(key, separators=(",", ":"))


def _time(fn: Callable[[], Any], reps: int = 10) -> float:
    from pygpukit.core.stream import Event, current_stream

    stream = current_stream()
    fn()  # compiles and warms up
    best = float("inf")
    for _ in range(3):
        start, end = Event(), Event()
        start.record(stream)
        for _ in range(reps):
            fn()
        end.record(stream)
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def _measure(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, dict[str, float]]:
    builtin, triton_fn = _IMPLS[op]
    if op == "rotary":  # in place: time on copies
        copy = (args[0].clone(), None if args[1] is None else args[1].clone(), *args[2:])
        calls: dict[str, Callable[[], Any]] = {
            "builtin": lambda: builtin(*copy, **kwargs),
            "triton": lambda: triton_fn(*copy, **kwargs),
        }
    else:
        calls = {"builtin": lambda: builtin(*args, **kwargs), "triton": lambda: triton_fn(*args, **kwargs)}
    times = {"builtin": _time(calls["builtin"])}  # raises the typed error of a bad argument
    try:
        times["triton"] = _time(calls["triton"])
    except Exception:
        return "builtin", times
    return ("triton" if times["triton"] < times["builtin"] else "builtin"), times


def _auto(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    key = _key(op, args, kwargs)
    winner = _winners.get(key)
    if winner is not None:
        return winner
    with _lock:
        _load()
        winner = _winners.get(key) or _on_disk.get(_text(key))
        if winner is not None:
            _winners[key] = winner
    if winner is not None:
        return winner
    from pygpukit.core.graph import is_capturing
    from pygpukit.core.stream import current_stream

    if is_capturing(current_stream()):
        return "builtin"  # no measuring inside a capture; not remembered
    winner, times = _measure(op, args, kwargs)
    with _lock:
        _winners[key] = _on_disk[_text(key)] = winner
        _save(_text(key), winner, times)
    return winner


def _takes(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the Triton kernel takes these operands (dtype and shape); else the built-in op runs."""
    first = args[0]
    if not (isinstance(first, GPUArray) and first.dtype in _DTYPES[op]):
        return False
    if op == "matmul":
        b = args[1]
        if type(b) is not GPUArray or not (1 <= first.ndim <= 3 and 1 <= b.ndim <= 3):
            return False
        batches = (first.shape[0] if first.ndim == 3 else 1, b.shape[0] if b.ndim == 3 else 1)
        return max(batches) <= 65535 and (batches[0] == batches[1] or 1 in batches)
    if op == "softmax":
        axis, out = kwargs.get("axis", -1), kwargs.get("out")
        inner = isinstance(axis, int) and first.ndim > 0 and axis % first.ndim != first.ndim - 1
        if inner and not (first.is_contiguous and (out is None or (isinstance(out, GPUArray) and out.is_contiguous))):
            return False
    return True


def _run(op: str, mode: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    builtin, triton_fn = _IMPLS[op]
    depth = getattr(_inside, "depth", 0)
    _inside.depth = depth + 1
    try:
        if mode == "builtin" or not triton_available() or not _takes(op, args, kwargs):
            return builtin(*args, **kwargs)
        if mode == "auto":
            mode = _auto(op, args, kwargs)
        return (triton_fn if mode == "triton" else builtin)(*args, **kwargs)
    finally:
        _inside.depth = depth


def _dispatch(op: str, backend: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    mode = get_route(op) if backend is None else _check_mode(backend, op)
    return _run(op, mode, args, kwargs)


def route_hook(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What a built-in op asks first once routing is on (``pygpukit.ops._route``): the result of the
    routed call, or ``_route.BUILTIN`` to let the built-in kernel run (mode ``builtin``, a call made
    from inside a routed one, Triton missing, or operands the Triton kernel does not take)."""
    if getattr(_inside, "depth", 0) or op not in _DTYPES:
        return _route.BUILTIN
    mode = get_route(op)
    if mode == "builtin" or not triton_available() or not _takes(op, args, kwargs):
        return _route.BUILTIN
    return _run(op, mode, args, kwargs)


# -- the built-in side, with the Triton signatures ---------------------------------------------------


def _builtin(op: str) -> Callable[..., Any]:
    from pygpukit import ops

    if op == "softmax":

        def softmax_out(x: GPUArray, axis: int = -1, out: GPUArray | None = None) -> GPUArray:
            result: GPUArray = ops.softmax(x, axis)
            if out is None:
                return result
            output("softmax", "out", out, result.shape, result.dtype)
            return out.copy_(result)

        return softmax_out
    fn: Callable[..., Any] = getattr(ops, "apply_rope" if op == "rotary" else op)
    return fn


class _Impls(dict[str, tuple[Callable[..., Any], Callable[..., Any]]]):
    def __missing__(self, op: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        pair = (_builtin(op), getattr(_triton, op))
        self[op] = pair
        return pair


_IMPLS = _Impls()


def rmsnorm(
    x: GPUArray, weight: GPUArray | None, eps: float = 1e-6, out: GPUArray | None = None, *, backend: str | None = None
) -> GPUArray:
    """Routed ``rmsnorm`` (see the module's docstring for ``backend``)."""
    result: GPUArray = _dispatch("rmsnorm", backend, (x, weight), {"eps": eps, "out": out})
    return result


def layernorm(
    x: GPUArray,
    weight: GPUArray | None,
    bias: GPUArray | None = None,
    eps: float = 1e-5,
    out: GPUArray | None = None,
    *,
    backend: str | None = None,
) -> GPUArray:
    """Routed ``layernorm``."""
    result: GPUArray = _dispatch("layernorm", backend, (x, weight, bias), {"eps": eps, "out": out})
    return result


def softmax(x: GPUArray, axis: int = -1, out: GPUArray | None = None, *, backend: str | None = None) -> GPUArray:
    """Routed ``softmax`` (``out=`` works with the built-in op too, by a copy)."""
    result: GPUArray = _dispatch("softmax", backend, (x,), {"axis": axis, "out": out})
    return result


def rotary(
    q: GPUArray,
    k: GPUArray | None,
    cos: GPUArray,
    sin: GPUArray,
    positions: GPUArray,
    style: str = "neox",
    rotary_dim: int | None = None,
    position_offset: int = 0,
    *,
    backend: str | None = None,
) -> None:
    """Routed ``apply_rope`` (in place)."""
    kwargs = {"style": style, "rotary_dim": rotary_dim, "position_offset": position_offset}
    _dispatch("rotary", backend, (q, k, cos, sin, positions), kwargs)


def swiglu(
    gate: GPUArray, up: GPUArray | None = None, out: GPUArray | None = None, *, backend: str | None = None
) -> GPUArray:
    """Routed ``swiglu``."""
    result: GPUArray = _dispatch("swiglu", backend, (gate, up), {"out": out})
    return result


def matmul(
    a: GPUArray,
    b: GPUArray,
    *,
    out: GPUArray | None = None,
    use_tf32: bool | None = None,
    stream: Any = None,
    backend: str | None = None,
) -> GPUArray:
    """Routed ``matmul``."""
    result: GPUArray = _dispatch("matmul", backend, (a, b), {"out": out, "use_tf32": use_tf32, "stream": stream})
    return result


def _install_from_environment() -> None:
    """PYGPUKIT_TRITON_ROUTE names a route other than builtin: the built-in ops follow it too. A bad
    value is not raised here (importing must work): the first routed call raises ArgumentError."""
    try:
        routes = _env_routes()
    except ArgumentError:
        routes = {"*": "invalid"}
    if any(mode != "builtin" for mode in routes.values()):
        _route.install(route_hook)


_install_from_environment()
