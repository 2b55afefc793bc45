"""CudaGraph on the CPU simulation backend: the pygpukit calls made inside ``capture()`` are recorded
(and run, as everything runs eagerly there), and ``replay()`` makes them again.

There are no kernels to capture on the CPU backend, so the recording is of calls: while a capture is
open, a profile hook (``sys.setprofile``, this thread only) watches for calls from outside pygpukit
into a public pygpukit function or method (``gp.add``, ``x.astype``, ``cache.append``, ``x += 1``,
...). Each such outermost call is one step: the function, its arguments (the objects themselves, as
a CUDA graph keeps addresses) and its result. Calls that pygpukit makes internally are part of their
step and not recorded again. Replay makes each step's call again, in order, and copies each array it
returns into the array the captured call returned, so later steps (which hold those arrays) and the
caller see the new values, as in a CUDA graph, whose replay rewrites the same memory. Replays are
therefore equal to eager runs on the arrays' current contents.

What cannot be recorded fails the capture with a :class:`PyGPUkitError` rather than replaying
differently: a pygpukit function that the profile hook sees but cannot call again (a closure), or
work done inside a pygpukit generator. Launching a custom JIT kernel inside a capture raises, as any
launch does on this backend (:class:`DeviceError`). Private functions (``_name``) and finalizers are
never recorded; objects constructed inside a capture are built once.
"""

from __future__ import annotations

import re
import sys
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from .errors import PyGPUkitError

__all__ = ["CpuRecorder", "Step", "active_recorder", "replay_steps"]

_GENERATOR_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, ASYNC_GEN
_VARARGS, _VARKEYWORDS = 0x04, 0x08
# Special methods that do work a capture must replay (operators, calls, indexing).
_RECORDED_DUNDER = re.compile(
    r"__(?:[ir]?(?:add|sub|mul|truediv|floordiv|mod|pow|matmul|and|or|xor|lshift|rshift)|neg|pos|abs|invert|"
    r"eq|ne|lt|le|gt|ge|call|getitem|setitem)__"
)

_local = threading.local()


def active_recorder() -> CpuRecorder | None:
    """The CPU capture open on this thread, if any."""
    recorder: CpuRecorder | None = getattr(_local, "recorder", None)
    return recorder


def _module_of(frame: FrameType) -> str:
    name = frame.f_globals.get("__name__", "")
    return name if isinstance(name, str) else ""


def _qualname(code: types.CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+


# A pygpukit module that captures graphs itself (pygpukit.llm.decode) sets this global to True: the
# calls it makes into pygpukit inside a capture are then recorded like a user's.
_OPT_IN = "__pygpukit_record_calls__"


def _in_pygpukit(name: str) -> bool:
    return name == "pygpukit" or name.startswith("pygpukit.")


@dataclass
class Step:
    """One recorded call: ``fn(*args, **kwargs)`` returned ``result`` at capture time."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any
    label: str


_SKIP: Any = object()  # the registry's mark of code that is never recorded (property accessors)


class _Registry:
    """Code object -> the function object that owns it, over every loaded pygpukit module."""

    def __init__(self) -> None:
        self._functions: dict[types.CodeType, Any] = {}
        self._modules_seen = 0

    def lookup(self, code: types.CodeType) -> Any:
        found = self._functions.get(code)
        if found is None and len(sys.modules) != self._modules_seen:
            self._rebuild()
            found = self._functions.get(code)
        return found

    def _rebuild(self) -> None:
        self._modules_seen = len(sys.modules)
        functions: dict[types.CodeType, Any] = {}
        for name, module in list(sys.modules.items()):
            if not _in_pygpukit(name) or module is None:
                continue
            for value in list(vars(module).values()):
                self._add(functions, value)
                if isinstance(value, type) and _in_pygpukit(getattr(value, "__module__", "") or ""):
                    for member in list(vars(value).values()):
                        if isinstance(member, property):
                            for accessor in (member.fget, member.fset, member.fdel):
                                for function in _unwrap(accessor):
                                    functions.setdefault(function.__code__, _SKIP)
                            continue
                        if isinstance(member, (staticmethod, classmethod)):
                            member = member.__func__
                        self._add(functions, member)
        self._functions = functions

    @staticmethod
    def _add(functions: dict[types.CodeType, Any], value: Any) -> None:
        for function in _unwrap(value):
            functions.setdefault(function.__code__, function)


def _unwrap(value: Any) -> Iterator[types.FunctionType]:
    """``value`` and what it wraps (functools.wraps, functools.cache), as plain functions."""
    seen = 0
    while value is not None and seen < 8:
        if isinstance(value, types.FunctionType):
            yield value
        value = getattr(value, "__wrapped__", None) if not isinstance(value, type) else None
        seen += 1


_registry = _Registry()


def _arguments(code: types.CodeType, local_values: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments, rebuilt from the frame's locals at its start (parameters only)."""
    names = code.co_varnames
    count, keyword_only = code.co_argcount, code.co_kwonlyargcount
    args = [local_values[name] for name in names[:count]]
    kwargs = {name: local_values[name] for name in names[count : count + keyword_only]}
    at = count + keyword_only
    if code.co_flags & _VARARGS:
        args.extend(local_values[names[at]])
        at += 1
    if code.co_flags & _VARKEYWORDS:
        kwargs.update(local_values[names[at]])
    return tuple(args), kwargs


class CpuRecorder:
    """The recording of one CPU-backend capture on this thread (see the module documentation)."""

    def __init__(self, exclude: tuple[types.CodeType, ...] = ()) -> None:
        self.steps: list[Step] = []
        self.problems: list[str] = []
        self._exclude = frozenset(exclude)
        self._active: FrameType | None = None
        self._pending: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str] | None = None
        self._previous: Any = None

    def start(self) -> None:
        if active_recorder() is not None:
            raise PyGPUkitError("a CudaGraph capture is already open on this thread (CPU backend: one at a time)")
        self._previous = sys.getprofile()
        _local.recorder = self
        sys.setprofile(self._profile)

    def stop(self) -> None:
        sys.setprofile(self._previous)
        _local.recorder = None

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        active = self._active
        if active is not None:  # inside a recorded (or ignored) call: its nested calls are part of it
            if event == "return" and frame is active:
                if self._pending is not None:
                    fn, args, kwargs, label = self._pending
                    self.steps.append(Step(fn, args, kwargs, arg, label))
                self._active = None
                self._pending = None
            return
        if event != "call":
            return
        try:
            self._consider(frame)
        except Exception as exc:  # never let the hook break the user's code: report at the end
            self._problem(f"recording failed: {exc!r}")

    def _consider(self, frame: FrameType) -> None:
        """A call made while no recorded call is running: record it when it enters pygpukit's public
        API from outside; ignore what runs inside it (or inside an ignored call) until it returns."""
        module = _module_of(frame)
        if not _in_pygpukit(module) or frame.f_globals.get(_OPT_IN):
            return  # user code (or an opted-in module's, which is treated as such)
        caller = frame.f_back
        if caller is not None and _in_pygpukit(_module_of(caller)) and not caller.f_globals.get(_OPT_IN):
            return  # the capture's own machinery (a module setting _OPT_IN is recorded as user code)
        code = frame.f_code
        if code in self._exclude:
            return
        self._active = frame  # from here on, until this frame returns, nothing else is considered
        name = code.co_name
        if code.co_flags & _GENERATOR_FLAGS:
            self._problem(f"{module}.{_qualname(code)} is a generator, whose work cannot be replayed")
            return
        if name == "<module>" or (name.startswith("_") and not _RECORDED_DUNDER.fullmatch(name)):
            return  # an import; private helpers, finalizers, __init__, __repr__, __getattr__, ...
        fn = _registry.lookup(code)
        if fn is _SKIP:
            return
        if fn is None:
            self._problem(f"{module}.{_qualname(code)} cannot be called again (not a module or class function)")
            return
        args, kwargs = _arguments(code, dict(frame.f_locals))
        self._pending = (fn, args, kwargs, f"{module}.{_qualname(code)}")

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def check(self) -> None:
        """Raise when something inside the capture could not be recorded."""
        if self.problems:
            raise PyGPUkitError(
                "this CudaGraph capture cannot be replayed on the CPU simulation backend: "
                + "; ".join(self.problems)
                + " (only calls into pygpukit's public functions and methods are recorded there)"
            )


def _refresh(old: Any, new: Any, label: str) -> None:
    """Make ``old`` (what the captured call returned) hold ``new`` (what the replayed call returned)."""
    from .array import GPUArray

    if old is new or old is None:
        return
    if isinstance(old, GPUArray):
        if not isinstance(new, GPUArray) or new.shape != old.shape or new.dtype != old.dtype:
            got = f"{new.shape} {new.dtype}" if isinstance(new, GPUArray) else type(new).__name__
            raise PyGPUkitError(f"replay of {label} returned {got} where the capture returned {old.shape} {old.dtype}")
        if new.buffer is old.buffer and new._offset == old._offset and new._strides == old._strides:
            return  # the same view
        old.copy_(new)
    elif isinstance(old, (tuple, list)) and isinstance(new, (tuple, list)) and len(old) == len(new):
        for before, after in zip(old, new, strict=True):
            _refresh(before, after, label)
    elif isinstance(old, dict) and isinstance(new, dict) and old.keys() == new.keys():
        for key in old:
            _refresh(old[key], new[key], label)


def replay_steps(steps: list[Step]) -> None:
    """Make every recorded call again, in order, refreshing the arrays the captured calls returned."""
    for step in steps:
        _refresh(step.result, step.fn(*step.args, **step.kwargs), step.label)
