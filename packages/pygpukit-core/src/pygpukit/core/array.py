"""GPUArray: an n-dimensional view of pool-backed device memory, with NumPy-like construction,
views (reshape, transpose, slicing) that never leave the device, and explicit host transfers.

On the CPU backend the same class runs over host memory standing in for the device. Arrays of the
packed ``int4`` dtype (two values per byte) support copies, reshapes and ``astype`` to and from int8
and the float types only (:mod:`pygpukit.core.int4`).

(Over 600 lines, on purpose: the class, its operators and views, and the constructors share the
private layout and copy helpers below, and the constructors' fast paths are tuned together.)
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import builtins
from . import int4 as _int4
from .backend import backend_state
from .dtypes import DType, as_dtype, cast_values, float32, float64, int64
from .errors import ArgumentError, DTypeError, InvalidPointerError, MissingDistributionError, ShapeError
from .jit import register_array_type
from .memory import DeviceBuffer, reset_error
from .plans import PlanCache
from .stream import Stream, current_stream

__all__ = [
    "GPUArray",
    "arange",
    "asarray",
    "empty",
    "empty_like",
    "from_numpy",
    "full",
    "full_like",
    "ones",
    "ones_like",
    "zeros",
    "zeros_like",
]

ShapeLike = int | Sequence[int]
_MAX_KERNEL_DIMS = 8  # StridedLayout in native/kernels/core/strided_copy.cu
_BLOCK = 256


def _dimension(value: Any, shape: Any) -> int:
    """``value`` as a dimension: an int (or NumPy integer); a float, str, ... raises :class:`ShapeError`
    instead of being truncated or parsed."""
    if isinstance(value, (bool, np.bool_)):
        raise ShapeError(f"shape {shape!r} has a bool dimension {value!r}; dimensions are ints")
    try:
        return operator.index(value)
    except TypeError:
        raise ShapeError(
            f"shape {shape!r} has a dimension {value!r} of type {type(value).__name__}; dimensions are ints"
        ) from None


def _normalize_shape(shape: ShapeLike | tuple[Any, ...]) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (int(shape),)
    try:
        items = tuple(shape)  # type: ignore[arg-type]
    except TypeError:
        raise ShapeError(
            f"shape must be an int or a sequence of ints, got {shape!r} of type {type(shape).__name__}"
        ) from None
    result = tuple(_dimension(s, shape) for s in items)
    if any(s < 0 for s in result):
        raise ShapeError(f"negative dimension in shape {result}")
    return result


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(shape) == 1:
        return (1,)
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


# (element count, contiguous strides) of the shapes arrays were made with: ops allocate the same few
# shapes over and over. Bounded: cleared when full.
_LAYOUTS: dict[tuple[int, ...], tuple[int, tuple[int, ...]]] = {}
_LAYOUTS_MAX = 4096
_new_array = object.__new__


def _layout(shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """(element count, contiguous strides) of a checked shape, remembered in :data:`_LAYOUTS`."""
    known = (math.prod(shape), _contiguous_strides(shape))
    if len(_LAYOUTS) >= _LAYOUTS_MAX:
        _LAYOUTS.clear()
    _LAYOUTS[shape] = known
    return known


def _is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    expected = 1
    for dim, stride in zip(reversed(shape), reversed(strides), strict=True):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _grid(n: int) -> int:
    return max(1, min(math.ceil(n / _BLOCK), 65535 * 32))


def _native() -> Any:
    state = backend_state()
    return state.native if state.name == "cuda" else None


class GPUArray:
    """An array in device memory. Create one with :func:`from_numpy`, :func:`empty`, :func:`zeros`, ...

    Views (``reshape`` of contiguous data, ``transpose``, ``T``, slicing) share memory with their base;
    nothing here copies through the host except :meth:`to_numpy` and :func:`from_numpy`, which say so.
    """

    __slots__ = ("__weakref__", "_buffer", "_contiguous", "_dtype", "_offset", "_shape", "_strides")

    def __init__(
        self,
        buffer: DeviceBuffer,
        shape: tuple[int, ...],
        dtype: DType,
        strides: tuple[int, ...] | None = None,
        offset: int = 0,
    ) -> None:
        self._buffer = buffer
        self._shape = shape
        self._dtype = dtype
        self._offset = offset  # in elements
        if strides is None:
            known = _LAYOUTS.get(shape)
            self._strides = (known or _layout(shape))[1]  # in elements
            self._contiguous = True
        else:
            self._strides = strides
            self._contiguous = _is_contiguous(shape, strides)

    # -- properties ---------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in bytes, as in NumPy (int4, whose itemsize is 1: in elements)."""
        return tuple(s * self._dtype.itemsize for s in self._strides)

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return math.prod(self._shape)

    @property
    def itemsize(self) -> int:
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of device memory the elements take (int4: ``ceil(size / 2)``, two per byte)."""
        return (self.size * self._dtype.bits + 7) >> 3

    @property
    def device_ptr(self) -> int:
        """Address of the first element; raises if the memory was freed."""
        if self._buffer.freed:
            raise self._freed_error()
        if self._dtype.packed:
            raise _int4.unsupported("device_ptr (the address of one element)")
        return self._buffer.ptr + self._offset * self._dtype.itemsize

    def data_ptr(self) -> int:
        """:attr:`device_ptr` as a method: the pointer protocol (``data_ptr()`` and ``dtype``) that
        Triton reads, so a GPUArray is a pointer argument of a ``@triton.jit`` kernel (pygpukit.triton)."""
        return self.device_ptr

    def _freed_error(self) -> InvalidPointerError:
        reset = reset_error(self._buffer, f"this array (shape {self._shape}, dtype {self._dtype.name})")
        if reset is not None:  # the buffer died with a device reset (pygpukit.reset_device)
            return reset
        return InvalidPointerError(
            f"the memory of this array (shape {self._shape}, dtype {self._dtype.name}) was freed "
            f"(buffer at {self._buffer.ptr:#x})"
        )

    @property
    def device(self) -> str:
        """``"cuda:<ordinal>"`` or ``"cpu"`` (the CPU simulation backend)."""
        return "cpu" if self._buffer.device < 0 else f"cuda:{self._buffer.device}"

    @property
    def on_gpu(self) -> bool:
        return self._buffer.device >= 0

    @property
    def buffer(self) -> DeviceBuffer:
        """The allocation this array views."""
        return self._buffer

    @property
    def is_contiguous(self) -> bool:
        """C-contiguous (dimensions of size 1 may have any stride)."""
        return self._contiguous

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d array")
        return self._shape[0]

    def __repr__(self) -> str:
        return f"GPUArray(shape={self._shape}, dtype={self._dtype.name}, device={self.device})"

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray[Any, Any]:
        raise TypeError("implicit conversion of a GPUArray to NumPy is not allowed; call .to_numpy() explicitly")

    # -- operators: thin forwards to the op library (pygpukit-ops) ---------------------------------
    __array_ufunc__ = None  # NumPy operands defer to the reflected operators below

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(f"the truth value of an array of shape {self._shape} is ambiguous; use gp.any or gp.all")
        return bool(self.to_numpy().reshape(()))

    def __add__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("add") or _fn("add"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __radd__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("add") or _fn("add"))(other, self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __iadd__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("add") or _fn("add"))(self, other, out=self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __sub__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("sub") or _fn("sub"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __rsub__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("sub") or _fn("sub"))(other, self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __isub__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("sub") or _fn("sub"))(self, other, out=self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __mul__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("mul") or _fn("mul"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __rmul__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("mul") or _fn("mul"))(other, self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __imul__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("mul") or _fn("mul"))(self, other, out=self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __truediv__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("div") or _fn("div"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __rtruediv__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("div") or _fn("div"))(other, self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __itruediv__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("div") or _fn("div"))(self, other, out=self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __floordiv__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("floor_divide") or _fn("floor_divide"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __rfloordiv__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("floor_divide") or _fn("floor_divide"))(other, self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __ifloordiv__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("floor_divide") or _fn("floor_divide"))(self, other, out=self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __mod__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("mod") or _fn("mod"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __rmod__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("mod") or _fn("mod"))(other, self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __imod__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("mod") or _fn("mod"))(self, other, out=self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __pow__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("pow") or _fn("pow"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __rpow__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("pow") or _fn("pow"))(other, self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __ipow__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("pow") or _fn("pow"))(self, other, out=self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __matmul__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("matmul") or _fn("matmul"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __rmatmul__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("matmul") or _fn("matmul"))(other, self)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __neg__(self) -> GPUArray:
        return (_functions.get("neg") or _fn("neg"))(self)

    def __pos__(self) -> GPUArray:
        return self.clone()

    def __abs__(self) -> GPUArray:
        return (_functions.get("abs") or _fn("abs"))(self)

    def __eq__(self, other: Any) -> GPUArray:  # type: ignore[override]
        return (
            (_functions.get("eq") or _fn("eq"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __ne__(self, other: Any) -> GPUArray:  # type: ignore[override]
        return (
            (_functions.get("ne") or _fn("ne"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __lt__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("lt") or _fn("lt"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __le__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("le") or _fn("le"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __gt__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("gt") or _fn("gt"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    def __ge__(self, other: Any) -> GPUArray:
        return (
            (_functions.get("ge") or _fn("ge"))(self, other)
            if type(other) is GPUArray or _operand(other)
            else NotImplemented
        )

    __hash__ = None  # type: ignore[assignment]  # arrays compare elementwise, as in NumPy

    # -- host transfers -----------------------------------------------------------------------------
    def _host_view(self) -> np.ndarray[Any, Any]:
        """CPU backend: a NumPy view with this array's layout. Every CPU path reads and writes array
        memory through here (as the CUDA paths go through ``device_ptr``), so a freed array is refused
        here once for all of them."""
        if self._buffer.freed:
            raise self._freed_error()
        if self._dtype.packed:
            raise _int4.unsupported("this operation")
        raw = self._buffer.host_view()
        if self.size == 0:
            return np.empty(self._shape, dtype=self._dtype.numpy)
        view: np.ndarray[Any, Any] = np.ndarray(
            self._shape, dtype=self._dtype.numpy, buffer=raw, offset=self._offset * self.itemsize, strides=self.strides
        )
        return view

    def to_numpy(self, stream: Stream | None = None) -> np.ndarray[Any, Any]:
        """Copy to a new NumPy array (device to host), waiting for the copy to finish."""
        native = _native()
        if self._dtype.packed:
            self._check_int4()
            return _int4.to_numpy(self, native, stream)
        self.device_ptr  # noqa: B018 - raises if freed
        if native is None:
            return np.array(self._host_view(), copy=True)
        source = self if self.is_contiguous else self.contiguous(stream=stream)
        out = np.empty(self._shape, dtype=self._dtype.numpy)
        # Ordered after the stream's work; large copies are staged through pinned buffers
        # (native/runtime/staging.cpp), small ones use the driver's pageable copy.
        native.memcpy_pageable_dtoh(
            out.ctypes.data, source.device_ptr, self.nbytes, (stream or current_stream()).handle
        )
        return out

    def _check_int4(self) -> None:
        """int4 arrays: live, contiguous and starting at element 0 (else a typed error)."""
        if self._buffer.freed:
            raise self._freed_error()
        _int4.check_int4_view(self._shape, self._strides, self._offset, self._contiguous)

    # -- views --------------------------------------------------------------------------------------
    def _view(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> GPUArray:
        return GPUArray(self._buffer, shape, self._dtype, strides, offset)

    def reshape(self, *shape: Any) -> GPUArray:
        """Same data, new shape (one dimension may be -1). A view when contiguous, else a device copy."""
        if len(shape) == 1 and shape[0] == self._shape and self._contiguous:  # the same shape: hot in op code
            return self._view(self._shape, self._strides, self._offset)
        new_shape = _resolve_reshape(self.size, shape)
        source = self if self.is_contiguous else self.contiguous()
        return source._view(new_shape, _contiguous_strides(new_shape), source._offset)

    def view(self, *shape: Any) -> GPUArray:
        """Like :meth:`reshape` but never copies: raises :class:`ShapeError` for non-contiguous data."""
        if not self.is_contiguous:
            raise ShapeError(f"view() needs contiguous data; this array has strides {self.strides}")
        return self.reshape(*shape)

    def transpose(self, *axes: Any) -> GPUArray:
        """Permute axes (reverse them when none are given); always a view."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        order = tuple(range(self.ndim))[::-1] if not axes else tuple(int(a) % max(self.ndim, 1) for a in axes)
        if sorted(order) != list(range(self.ndim)):
            raise ShapeError(f"axes {axes} are not a permutation of {self.ndim} dimensions")
        view = self._view(tuple(self._shape[a] for a in order), tuple(self._strides[a] for a in order), self._offset)
        if self._dtype.packed:
            view._check_int4()
        return view

    permute = transpose

    @property
    def T(self) -> GPUArray:  # noqa: N802 - NumPy's name
        return self.transpose()

    def __getitem__(self, key: Any) -> GPUArray:
        """Basic indexing (ints, slices with any step, ``...``, ``None``) as a view on the device."""
        if not isinstance(key, tuple):
            key = (key,)
        if any(not isinstance(k, (int, np.integer, slice, type(None), type(Ellipsis))) for k in key):
            raise TypeError("only integers, slices, ... and None are supported as indices")
        if sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have a single ellipsis")
        consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
        if consumed > self.ndim:
            raise IndexError(f"too many indices: {consumed} for {self.ndim} dimensions")
        if Ellipsis in key:
            at = key.index(Ellipsis)
            key = key[:at] + (slice(None),) * (self.ndim - consumed) + key[at + 1 :]
        shape, strides, offset, dim = [], [], self._offset, 0
        for k in key:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            size, stride = self._shape[dim], self._strides[dim]
            if isinstance(k, slice):
                start, stop, step = k.indices(size)
                length = len(range(start, stop, step))
                offset += start * stride if length else 0
                shape.append(length)
                strides.append(stride * step)
            else:
                index = int(k)
                if not -size <= index < size:
                    raise IndexError(f"index {index} is out of bounds for axis {dim} with size {size}")
                offset += (index % size) * stride
            dim += 1
        shape.extend(self._shape[dim:])
        strides.extend(self._strides[dim:])
        view = self._view(tuple(shape), tuple(strides), offset)
        if self._dtype.packed:
            view._check_int4()
        return view

    # -- device copies ------------------------------------------------------------------------------
    def contiguous(self, stream: Stream | None = None) -> GPUArray:
        """This array if C-contiguous, else a contiguous device copy."""
        return self if self.is_contiguous else self.clone(stream=stream)

    def clone(self, stream: Stream | None = None) -> GPUArray:
        """A contiguous copy on the device."""
        out = empty(self._shape, self._dtype, stream=stream)
        out.copy_(self, stream=stream)
        return out

    def copy_(self, source: GPUArray | np.ndarray[Any, Any], stream: Stream | None = None) -> GPUArray:
        """Copy ``source`` (same shape and dtype; a GPUArray or a NumPy array) into this array."""
        if isinstance(source, np.ndarray):
            if tuple(source.shape) != self._shape:
                raise ShapeError(f"copy_: source shape {tuple(source.shape)} does not match {self._shape}")
            source = from_numpy(cast_values(source, self._dtype), stream=stream)
        if not isinstance(source, GPUArray):
            raise DTypeError(f"copy_ needs a GPUArray or a NumPy array, got {type(source).__name__}")
        if source.shape != self._shape:
            raise ShapeError(f"copy_: source shape {source.shape} does not match {self._shape}")
        if source.dtype != self._dtype:
            raise DTypeError(f"copy_: source dtype {source.dtype} does not match {self._dtype}; use astype first")
        _copy_strided(self, source, stream)
        return self

    def astype(self, dtype: Any, stream: Stream | None = None) -> GPUArray:
        """A contiguous copy converted to ``dtype`` on the device (NumPy's conversion rules)."""
        target = as_dtype(dtype)
        if target == self._dtype:
            return self.clone(stream=stream)
        source = self.contiguous(stream=stream)
        out = empty(self._shape, target, stream=stream)
        if target.packed or self._dtype.packed:
            if self._dtype.packed:
                self._check_int4()
            _int4.astype_int4(source, out, _native(), stream)
            return out
        if out.size == 0:
            return out
        native = _native()
        if native is None:
            out._host_view()[...] = cast_values(source._host_view(), target)  # e4m3 saturates as on the GPU
            return out
        n = out.size
        per_thread = 16 // max(self._dtype.itemsize, target.itemsize)  # cast.cu's chunk
        builtins.cast_kernel(self._dtype, target)(
            source.device_ptr, out.device_ptr, n, grid=_grid(-(-n // per_thread)), block=_BLOCK, stream=stream
        )
        return out

    # -- interop ------------------------------------------------------------------------------------
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        """DLPack export (zero-copy). ``stream`` is the consumer's stream; it is made to wait for ours."""
        from .dlpack import to_dlpack

        if copy:
            return self.clone().__dlpack__(stream=stream)
        return to_dlpack(self, stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        from .dlpack import dlpack_device

        return dlpack_device(self)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3 (CUDA backend only)."""
        if not self.on_gpu:
            raise AttributeError("__cuda_array_interface__ exists only for arrays on a CUDA device")
        handle = current_stream()._id  # not .handle: exporting is not a launch (no token from a paced stream)
        return {
            "shape": self._shape,
            "typestr": self._dtype.numpy.str,
            "data": (self.device_ptr if self.size else 0, False),
            "strides": None if self.is_contiguous else self.strides,
            "version": 3,
            "stream": handle if handle else 1,
        }


register_array_type(GPUArray)

_op_library: Any = None


def _operand(value: Any) -> bool:
    """Whether an operator takes ``value`` (else NotImplemented lets Python try the other side)."""
    return isinstance(value, (GPUArray, int, float, np.generic, np.ndarray))


# op name -> the function of pygpukit.ops the operators call (their hot path); pygpukit.ops fills in its
# binary elementwise ops when imported, the rest are looked up on first use.
_functions: dict[str, Any] = {}


def _fn(name: str) -> Callable[..., GPUArray]:
    """Op ``name`` of pygpukit.ops, looked up once."""
    function = _functions.get(name)
    if function is None:
        function = _functions[name] = getattr(_library(), name)
    return function  # type: ignore[no-any-return]


# The operators pygpukit.ops may replace with its own fast paths (bind_operator): the forward and
# reflected arithmetic and comparison operators, negation and abs. The methods above stay the
# behaviour to match (and serve until pygpukit.ops is imported).
_BINDABLE = frozenset({
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__eq__", "__ne__", "__lt__",
    "__le__", "__gt__", "__ge__", "__neg__", "__abs__",
})  # fmt: skip


def bind_operator(dunder: str, function: Callable[..., Any]) -> None:
    """Make ``function`` GPUArray's ``dunder`` (one of the operators above): pygpukit.ops binds each to
    its elementwise fast path, so ``x + y`` is one Python call. ``function`` must behave as the method
    it replaces (NotImplemented for an operand the op does not take)."""
    if dunder not in _BINDABLE:
        raise ArgumentError(f"bind_operator: {dunder!r} is not a bindable operator (one of {sorted(_BINDABLE)})")
    if not callable(function):
        raise DTypeError(f"bind_operator: the function for {dunder} must be callable, got {type(function).__name__}")
    setattr(GPUArray, dunder, function)


def _library() -> Any:
    """pygpukit.ops, imported on the first operator use (a separate distribution)."""
    global _op_library
    if _op_library is None:
        try:
            import pygpukit.ops as op_library
        except ImportError as exc:
            raise MissingDistributionError(
                "GPUArray arithmetic and comparison operators come from the pygpukit-ops distribution, which is "
                "not installed: pip install pygpukit-ops"
            ) from exc
        _op_library = op_library
    return _op_library


def _resolve_reshape(size: int, shape: tuple[Any, ...]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    dims = [_dimension(s, shape) for s in shape]
    if dims.count(-1) > 1:
        raise ShapeError("only one dimension can be -1")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise ShapeError(f"cannot reshape {size} elements into {tuple(shape)}")
        dims[dims.index(-1)] = size // known
    if math.prod(dims) != size or any(d < 0 for d in dims):
        raise ShapeError(f"cannot reshape {size} elements into {tuple(dims)}")
    return tuple(dims)


def _collapse(shape: tuple[int, ...], *stride_sets: tuple[int, ...]) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dimensions that are contiguous in every stride set (fewer kernel dimensions)."""
    dims: list[int] = []
    strides: list[list[int]] = [[] for _ in stride_sets]
    for axis, size in enumerate(shape):
        if size == 1:
            continue
        if dims and all(s[-1] == st[axis] * size for s, st in zip(strides, stride_sets, strict=True)):
            dims[-1] *= size
            for s, st in zip(strides, stride_sets, strict=True):
                s[-1] = st[axis]
            continue
        dims.append(size)
        for s, st in zip(strides, stride_sets, strict=True):
            s.append(st[axis])
    return dims, strides


def _copy_strided(dst: GPUArray, src: GPUArray, stream: Stream | None) -> None:
    if dst._dtype.packed:
        dst._check_int4()
        src._check_int4()
        _int4.copy(dst, src, _native(), stream)
        return
    n = dst.size
    if n == 0:
        return
    native = _native()
    if native is None:
        dst._host_view()[...] = src._host_view()
        return
    handle = (stream or current_stream()).handle
    if dst.is_contiguous and src.is_contiguous:
        native.memcpy_dtod(dst.device_ptr, src.device_ptr, dst.nbytes, handle, True)
        return
    key = (dst._dtype, dst._shape, src._strides, dst._strides)
    plan = _STRIDED_COPIES.get(key)
    if plan is None:
        dims, (src_strides, dst_strides) = _collapse(dst.shape, src._strides, dst._strides)
        if len(dims) > _MAX_KERNEL_DIMS:
            raise ShapeError(
                f"strided copies support up to {_MAX_KERNEL_DIMS} non-mergeable dimensions, got {len(dims)}"
            )
        layout = builtins.STRIDED_LAYOUT.pack(len(dims), dims, src_strides, dst_strides)
        plan = _STRIDED_COPIES.put(key, (builtins.builtin_kernel("strided_copy", dst.dtype), layout, _grid(n)))
    kernel, layout, grid = plan
    kernel(dst.device_ptr, src.device_ptr, n, layout, grid=grid, block=_BLOCK, stream=stream)


# Strided copies by (dtype, shape, source strides, destination strides): kernel, packed layout, grid.
_STRIDED_COPIES: PlanCache[tuple[Any, bytes, int]] = PlanCache("core.strided_copy")


# -- construction ----------------------------------------------------------------------------------
def empty(shape: ShapeLike, dtype: Any = float32, *, stream: Stream | None = None) -> GPUArray:
    """An uninitialised array."""
    t = type(shape)
    if t is tuple:
        for d in shape:  # type: ignore[union-attr]
            if type(d) is not int or d < 0:
                dims = _normalize_shape(shape)
                break
        else:
            dims = shape  # type: ignore[assignment]  # the ops pass an array's own (checked) shape
    elif t is int and shape >= 0:  # type: ignore[operator]
        dims = (shape,)  # type: ignore[assignment]
    else:
        dims = _normalize_shape(shape)
    return allocate(dims, dtype if type(dtype) is DType else as_dtype(dtype), stream)


def allocate(shape: tuple[int, ...], dtype: DType, stream: Stream | None = None) -> GPUArray:
    """:func:`empty` for callers that pass a checked shape (a tuple of non-negative ints, such as an
    array's own shape) and a :class:`DType`: the ops' hot path, without the argument checks."""
    known = _LAYOUTS.get(shape)
    if known is None:
        known = _layout(shape)
    array = _new_array(GPUArray)
    array._buffer = DeviceBuffer((known[0] * dtype.bits + 7) >> 3, stream=stream)  # int4: 2 per byte
    array._shape = shape
    array._dtype = dtype
    array._offset = 0
    array._strides = known[1]
    array._contiguous = True
    return array


def _bits(value: Any, dtype: DType) -> int:
    if dtype.kind in "iu" and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        info = np.iinfo(dtype.numpy)
        if not int(info.min) <= int(value) <= int(info.max):
            raise DTypeError(f"fill value {value!r} cannot be represented as {dtype.name} ({info.min}..{info.max})")
    try:
        with np.errstate(over="raise", invalid="raise"):
            raw = cast_values(value, dtype).tobytes()  # float8_e4m3fn saturates, as the kernels convert
    except (FloatingPointError, OverflowError, ValueError, TypeError) as exc:
        raise DTypeError(f"fill value {value!r} cannot be represented as {dtype.name}: {exc}") from None
    return int.from_bytes(raw, "little")


def full(shape: ShapeLike, fill_value: Any, dtype: Any = None, *, stream: Stream | None = None) -> GPUArray:
    """An array filled with ``fill_value`` (dtype: float32 for floats, int64 for ints, bool for bools)."""
    if dtype is None:
        dtype = "bool" if isinstance(fill_value, bool) else int64 if isinstance(fill_value, int) else float32
    out = empty(shape, dtype, stream=stream)
    n = out.size
    if out.dtype.packed:
        _int4.fill(out, fill_value, _native(), stream)
        return out
    if n == 0:
        return out
    native = _native()
    bits = _bits(fill_value, out.dtype)
    if native is None:
        out._host_view().reshape(-1).view(np.uint8).reshape(-1, out.itemsize)[...] = np.frombuffer(
            bits.to_bytes(8, "little")[: out.itemsize], np.uint8
        )  # fmt: skip
    elif bits == 0:
        native.memset_d8(out.device_ptr, 0, out.nbytes, (stream or current_stream()).handle)
    else:
        builtins.builtin_kernel("fill", out.dtype)(out.device_ptr, bits, n, grid=_grid(n), block=_BLOCK, stream=stream)
    return out


def zeros(shape: ShapeLike, dtype: Any = float32, *, stream: Stream | None = None) -> GPUArray:
    """An array of zeros (a device memset)."""
    return full(shape, 0, dtype, stream=stream)


def ones(shape: ShapeLike, dtype: Any = float32, *, stream: Stream | None = None) -> GPUArray:
    """An array of ones."""
    return full(shape, 1, dtype, stream=stream)


def arange(
    start: float, stop: float | None = None, step: float = 1, dtype: Any = None, *, stream: Stream | None = None
) -> GPUArray:
    """Evenly spaced values in [start, stop), computed on the device (``start + i * step``). As in
    NumPy, a bool range has at most 2 values (``bool(start)``, ``bool(start + step)``); a longer one
    raises :class:`DTypeError`. Bounds must be finite real numbers (else :class:`ArgumentError`)."""
    if stop is None:
        start, stop = 0, start
    bounds: tuple[tuple[str, Any], ...] = (("start", start), ("stop", stop), ("step", step))  # any type, checked
    for name, value in bounds:
        if not isinstance(value, numbers.Real):
            raise ArgumentError(f"arange: {name} must be a real number, got {value!r} of type {type(value).__name__}")
        if not math.isfinite(value):
            raise ArgumentError(f"arange: {name} must be finite, got {value!r}")
    if step == 0:
        raise ArgumentError("arange: step must not be zero")
    if dtype is None:
        dtype = int64 if all(isinstance(v, (int, np.integer)) for v in (start, stop, step)) else float64
    dt = as_dtype(dtype)
    if dt.packed:
        raise _int4.unsupported("arange")
    n = max(0, math.ceil((stop - start) / step))
    if dt.kind == "b":  # NumPy's rule, the same on every backend: computed here, uploaded
        if n > 2:
            raise DTypeError(
                f"arange of bool gives at most 2 values, as in NumPy; start {start}, stop {stop} and step {step} "
                f"give {n} (compare an integer arange instead: gp.arange(n) > k)"
            )
        return from_numpy(np.array([start + i * step for i in range(n)], dtype=np.bool_), stream=stream)
    out = empty(n, dt, stream=stream)
    if n == 0:
        return out
    native = _native()
    if native is None:
        index: np.ndarray[Any, Any] = np.arange(n, dtype=np.float64 if dt.is_floating else np.int64)
        out._host_view()[...] = cast_values(index * step + start, dt)
        return out
    first, delta = (float(start), float(step)) if dt.is_floating else (int(start), int(step))
    builtins.builtin_kernel("arange", dt)(out.device_ptr, first, delta, n, grid=_grid(n), block=_BLOCK, stream=stream)
    return out


def from_numpy(array: Any, *, stream: Stream | None = None) -> GPUArray:
    """Copy a NumPy array (any layout, any supported dtype) to a new contiguous device array."""
    host = np.asarray(array)
    host = np.ascontiguousarray(host).reshape(host.shape)  # ascontiguousarray alone makes a 0-d array 1-d
    dt = as_dtype(host.dtype)
    out = empty(host.shape, dt, stream=stream)
    if dt.packed:
        _int4.upload(out, host, _native(), stream)
        return out
    if out.nbytes == 0:
        return out
    native = _native()
    if native is None:
        out._host_view()[...] = host
        return out
    # Ordered after the allocation's stream; staged through pinned buffers when large.
    native.memcpy_pageable_htod(out.device_ptr, host.ctypes.data, out.nbytes, (stream or current_stream()).handle)
    return out


def asarray(value: Any, dtype: Any = None, *, stream: Stream | None = None) -> GPUArray:
    """A GPUArray from a GPUArray (returned as is, or converted), device memory of another library
    (DLPack or the CUDA Array Interface: viewed without a copy), a NumPy array or nested sequences."""
    if isinstance(value, GPUArray):
        return value if dtype is None or as_dtype(dtype) == value.dtype else value.astype(dtype, stream=stream)
    if not isinstance(value, np.ndarray) and backend_state().name == "cuda":
        from .dlpack import from_cuda_array_interface, from_dlpack

        imported = None
        if hasattr(value, "__dlpack__") and value.__dlpack_device__()[0] == 2:
            imported = from_dlpack(value)
        elif hasattr(value, "__cuda_array_interface__"):
            imported = from_cuda_array_interface(value)
        if imported is not None:
            return asarray(imported, dtype, stream=stream)
    target = None if dtype is None else as_dtype(dtype)
    if target is not None and target.packed:  # the int4 rule, on every platform (not NumPy's conversion)
        return from_numpy(cast_values(np.asarray(value), target), stream=stream)
    try:
        host = np.asarray(value, dtype=None if target is None else target.numpy)
    except ValueError as exc:  # ragged nesting, or a value the dtype cannot hold ("abc" as float32)
        raise (ShapeError if "inhomogeneous" in str(exc) else DTypeError)(f"asarray: {exc}") from None
    return from_numpy(host, stream=stream)


def empty_like(other: GPUArray, dtype: Any = None) -> GPUArray:
    return empty(other.shape, dtype or other.dtype)


def zeros_like(other: GPUArray, dtype: Any = None) -> GPUArray:
    return zeros(other.shape, dtype or other.dtype)


def ones_like(other: GPUArray, dtype: Any = None) -> GPUArray:
    return ones(other.shape, dtype or other.dtype)


def full_like(other: GPUArray, fill_value: Any, dtype: Any = None) -> GPUArray:
    return full(other.shape, fill_value, dtype or other.dtype)
