"""The elementwise engine: operand normalisation, dtype promotion, launch plans and the three launch
paths of the unary and binary family kernels, and the converting copies (copy_into, float casts).

An op (:class:`Op`, declared in :mod:`pygpukit.ops.elementwise`) names its family (a functor family of
native/kernels/elementwise/functors.cuh), its run-time op code (an enum of common/codes.cuh), its
arity, the operand kinds it accepts and its result rule. For each promoted operand dtype it keeps a
:class:`Plan` (compute type, result dtype, the kernels compiled together) in its :class:`PlanCache`.

Launch paths: contiguous operands of one dtype use 16-byte vector accesses (``*_contig``); a
contiguous array with a scalar does too; anything else (strides, broadcasting, mixed dtypes) runs the
strided kernel, which reads each operand in place with its own dtype. A repeated call of contiguous
operands of one dtype and shape is one plan lookup and one launch (``binary``/``unary`` fast paths,
and GPUArray's operators: ``operator``/``unary_operator``). Over 600 lines: those fast paths sit next
to the general paths whose results they must equal.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pygpukit.core import backend as _backend
from pygpukit.core.array import GPUArray, allocate, empty
from pygpukit.core.codes import enum_values
from pygpukit.core.dtypes import (
    DType,
    all_dtypes,
    as_dtype,
    bool_,
    cast_values,
    float16,
    float32,
    float64,
    int64,
    uint64,
)
from pygpukit.core.errors import DeviceError, DTypeError, ShapeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache

from . import _cpu
from ._kernels import (
    BLOCK,
    NAMESPACE,
    TILE,
    TILE_BLOCKS_PER_SM,
    c_param,
    code_param,
    grid_for,
    group,
    launch,
    pointer,
    size_param,
    sm_count,
)
from ._layout import (
    LAYOUT,
    broadcast_shapes,
    broadcast_strides,
    check_devices,
    dtype_code,
    is_cuda,
    overlaps,
    pack_layout,
)
from .promotion import _promote, apply_weak, can_cast, scalar_kind

__all__ = [
    "FILES",
    "FLOAT_DTYPES",
    "Op",
    "Operand",
    "Scalar",
    "binary",
    "compute_ctype",
    "copy_ctype",
    "copy_expression",
    "copy_into",
    "describe",
    "detach",
    "finish",
    "fits",
    "float_cast",
    "float_cast_expression",
    "known_scalar",
    "operand",
    "operand_args",
    "operator",
    "promoted",
    "remember_scalar",
    "result_output",
    "scalar_value",
    "unary",
    "unary_operator",
]

FILES = {1: "elementwise/unary.cu", 2: "elementwise/binary.cu", 3: "elementwise/ternary.cu"}
FLOAT_DTYPES = tuple(d for d in all_dtypes() if d.is_floating)
# The float type a math function of an integer or bool gives (NumPy's choice: the smallest float that
# holds every value of the type).
_FLOAT_OF = {d: d for d in all_dtypes() if d.is_floating} | {
    d: float16 if d.itemsize == 1 else float32 if d.itemsize == 2 else float64
    for d in all_dtypes()
    if not d.is_floating
}
_MODES = enum_values("BinaryMode")  # common/codes.cuh: which operand of binary_contig is the scalar
_ARRAYS, _SCALAR_FIRST, _SCALAR_SECOND = (_MODES[k] for k in ("kBinaryArrays", "kBinaryScalarFirst",
                                                             "kBinaryScalarSecond"))  # fmt: skip
_COPY = enum_values("CopyOp")["kCopyIdentity"]
_LAYOUT_PARAM = LAYOUT.param("layout")
_BLOCKS_ANY_GPU = 128  # grid_for's limit below which no device lookup is needed
_OPERANDS = (GPUArray, int, float, np.generic, np.ndarray)  # what GPUArray's operators take (as array.py)


def compute_ctype(dtype: DType) -> str:
    """The C type arithmetic on ``dtype`` runs in (types.cuh): float for fp16/bf16/fp8/float32."""
    if dtype.is_floating:
        return "double" if dtype == float64 else "float"
    return dtype.ctype


def copy_ctype(dtype: DType) -> str:
    """The C type a converting copy into ``dtype`` goes through (one rounding)."""
    if dtype.is_floating and dtype not in (float32, float64):
        return "double"
    return compute_ctype(dtype)


class Op:
    """One elementwise op: its functor family and op code (``enumerator`` of enum ``<family>Op`` in
    common/codes.cuh), arity, accepted kinds of the promoted operand dtype (b, i, u, f) and result
    rule: "same", "bool" (comparisons), "float" (math), "divide" (true division), "truth" (logical).
    ``key`` names its NumPy implementation in _cpu (default: ``name``)."""

    __slots__ = ("arity", "code", "family", "key", "kinds", "name", "plans", "result")

    def __init__(self, name: str, family: str, enumerator: str, arity: int, kinds: str, result: str,
                 key: str = "") -> None:  # fmt: skip
        self.name = name
        self.key = key or name
        self.family = family
        self.code = enum_values(f"{family}Op")[enumerator]
        self.arity = arity
        self.kinds = kinds
        self.result = result
        self.plans: PlanCache[Plan] = PlanCache(f"ops.elementwise.{self.key}", maxsize=64)

    def plan(self, common: DType) -> Plan:
        # Keyed by the dtype's name (a str hashes in C; DType's __hash__ is a Python call per lookup).
        found = self.plans.get(common.name)
        if found is None:
            found = self.plans.put(common.name, Plan(self, common))
        return found


class Plan:
    """The kernels of one op family for one promoted operand dtype: compute type, result dtype and the
    name expressions, compiled together on first use.

    Math functions and true division of integers have no contiguous kernel: integer inputs to them are
    rare, and the strided kernel (which reads any dtype) serves them without more instantiations.
    """

    __slots__ = ("_contig", "_strided", "arity", "compute", "contig_expr", "group", "out", "strided_expr", "tile",
                 "width", "zero")  # fmt: skip

    def __init__(self, op: Op, common: DType) -> None:
        self.arity = op.arity
        target = common
        if op.result == "float":
            target = _FLOAT_OF[common]
        elif op.result == "divide" and not common.is_floating:
            target = float64
        self.compute = "bool" if op.result == "truth" else compute_ctype(target)
        self.out = bool_ if op.result in ("bool", "truth") else target
        self.zero: Any = False if self.compute == "bool" else 0  # the scalar argument when there is none
        family = f"{NAMESPACE}{op.family}<{self.compute}>"
        kind = "binary" if op.arity == 2 else "unary"
        self.contig_expr: str | None = None
        if target is common:
            self.contig_expr = f"{NAMESPACE}{kind}_contig<{family}, {common.ctype}, {self.out.ctype}>"
        self.strided_expr = f"{NAMESPACE}{kind}_strided<{family}, {self.out.ctype}>"
        expressions = [self.strided_expr] if self.contig_expr is None else [self.contig_expr, self.strided_expr]
        self.group = group(FILES[op.arity], expressions)
        self.width = max(1, 16 // max(common.itemsize, self.out.itemsize))
        self.tile = self.width * TILE  # elements a block of the contiguous kernel covers per step
        self._contig: JITKernel | None = None
        self._strided: JITKernel | None = None

    def contig(self) -> JITKernel | None:
        """The contiguous kernel: (a, b, s, out, n, mode, op) for binary ops, (x, out, n, op) for unary."""
        if self._contig is None and self.contig_expr is not None:
            if self.arity == 2:
                params = [pointer("a"), pointer("b"), c_param("s", self.compute), pointer("out"), size_param("n"),
                          code_param("mode"), code_param("op")]  # fmt: skip
            else:
                params = [pointer("x"), pointer("out"), size_param("n"), code_param("op")]
            self._contig = self.group.kernel(self.contig_expr, params, programmatic=True)
        return self._contig

    def strided(self) -> JITKernel:
        kernel = self._strided
        if kernel is None:
            if self.arity == 2:
                params = [pointer("out"), pointer("a"), code_param("a_code"), pointer("b"), code_param("b_code"),
                          c_param("s", self.compute), size_param("n"), _LAYOUT_PARAM, code_param("op")]  # fmt: skip
            else:
                params = [pointer("out"), pointer("x"), code_param("x_code"), size_param("n"), _LAYOUT_PARAM,
                          code_param("op")]  # fmt: skip
            kernel = self._strided = self.group.kernel(self.strided_expr, params, programmatic=True)
        return kernel


def _contig_grid(n: int, tile: int) -> int:
    """grid_for(ceil(n / width), TILE, TILE_BLOCKS_PER_SM) of a contiguous launch (``tile = width * TILE``)."""
    blocks = -(-n // tile)
    return blocks if blocks <= _BLOCKS_ANY_GPU else min(blocks, sm_count() * TILE_BLOCKS_PER_SM)


# -- operands ---------------------------------------------------------------------------------------
class Scalar:
    """A scalar operand: a Python number (weak: ``kind`` set) or a NumPy scalar (strong: ``dtype`` set)."""

    __slots__ = ("dtype", "kind", "value")

    def __init__(self, value: Any, kind: str | None, dtype: DType | None) -> None:
        self.value = value
        self.kind = kind
        self.dtype = dtype


Operand = GPUArray | Scalar


def operand(value: Any, op: str) -> Operand:
    if isinstance(value, GPUArray):
        return value
    kind = scalar_kind(value)
    if kind is not None:
        return Scalar(value, kind, None)
    if isinstance(value, np.generic):
        try:
            dtype = as_dtype(value.dtype)
        except DTypeError:
            raise DTypeError(f"{op}: unsupported scalar dtype {value.dtype}") from None
        return Scalar(value, None, dtype)
    if isinstance(value, np.ndarray):
        raise DeviceError(
            f"{op}: got a host NumPy array (shape {value.shape}, dtype {value.dtype}); ops take device arrays, so "
            "copy it explicitly with gp.asarray(...) first"
        )
    raise DTypeError(f"{op}: unsupported operand type {type(value).__name__}")


def describe(operands: Sequence[Operand]) -> str:
    parts = []
    for o in operands:
        if isinstance(o, GPUArray):
            parts.append(f"{o.dtype} array of shape {o.shape}")
        elif o.dtype is not None:
            parts.append(f"{o.dtype} scalar")
        else:
            parts.append(f"Python {type(o.value).__name__}")
    return ", ".join(parts)


def fits(value: int, dtype: DType) -> bool:
    info = np.iinfo(dtype.numpy)
    return int(info.min) <= value <= int(info.max)


def promoted(operands: Sequence[Operand]) -> DType:
    """NumPy 2 promotion of the operands: arrays and NumPy scalars are strong, Python numbers weak."""
    strong: DType | None = None
    weak = ""
    for o in operands:
        if isinstance(o, GPUArray):
            dt = o._dtype
        elif o.dtype is None:
            weak += o.kind or ""
            continue
        else:
            dt = o.dtype
        strong = dt if strong is None else _promote(strong, dt)
    return apply_weak(strong, weak)


def _common_dtype(op: Op, operands: Sequence[Operand]) -> DType:
    """The promoted operand dtype (for logical ops: the arrays' shared dtype, else bool)."""
    for o in operands:
        if isinstance(o, GPUArray) and o._dtype.packed:
            raise DTypeError(f"{op.name} does not support packed {o._dtype} operands; convert with astype first "
                             f"(got {describe(operands)})")  # fmt: skip
    if op.result == "truth":
        dtypes = {o._dtype for o in operands if isinstance(o, GPUArray)}
        return dtypes.pop() if len(dtypes) == 1 else bool_
    common = promoted(operands)
    if common.kind in "iu":
        for o in operands:
            if isinstance(o, Scalar) and o.kind == "i" and not fits(o.value, common):
                if op.result != "bool":
                    raise DTypeError(f"{op.name}: Python integer {o.value} is out of bounds for {common}")
                # NumPy compares out-of-range Python integers exactly; so do we, in a wider type.
                if fits(o.value, int64) and common != uint64:
                    common = int64
                elif o.value >= 0 and fits(o.value, uint64) and common.kind == "u":
                    common = uint64
                else:
                    common = float64
    if common.kind not in op.kinds:
        raise DTypeError(f"{op.name} does not support {common} operands (got {describe(operands)})")
    return common


def scalar_value(scalar: Scalar, common: DType, ctype: str) -> Any:
    """The scalar converted to the operands' dtype (NumPy's rule for weak scalars; float8_e4m3fn
    saturates to +-448 as the kernels' stores do), then to the compute type of the kernel argument."""
    if ctype == "bool":
        return bool(scalar.value)
    with np.errstate(all="ignore"):
        typed = cast_values(scalar.value, common)
        if ctype in ("float", "double"):
            return float(typed.astype(np.float64))
    return int(typed)


def result_output(name: str, out: Any, shape: tuple[int, ...], dtype: DType) -> tuple[GPUArray, GPUArray | None]:
    """(array the kernel writes, ``out`` when the result must be converted into it afterwards)."""
    if out is None:
        return empty(shape, dtype), None
    if not isinstance(out, GPUArray):
        raise DTypeError(f"{name}: out must be a GPUArray, got {type(out).__name__}")
    if out.shape != shape:
        raise ShapeError(f"{name}: out has shape {out.shape} but the result has shape {shape}")
    if not can_cast(dtype, out.dtype):
        raise DTypeError(f"{name}: cannot store the {dtype} result in out of dtype {out.dtype} (same-kind casting)")
    if out.dtype != dtype:
        return empty(shape, dtype), out
    return out, None


def detach(value: Any, target: GPUArray) -> Any:
    """``value``, or a copy of it when it shares memory with the output without being the same view
    (NumPy copies such inputs too)."""
    return value.clone() if isinstance(value, GPUArray) and overlaps(value, target) else value


def operand_args(value: Operand, shape: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
    """(pointer, dtype code, strides in ``shape``) of an operand of a strided launch."""
    if isinstance(value, GPUArray):
        return value.device_ptr, dtype_code(value._dtype), broadcast_strides(value, shape)
    return 0, -1, (0,) * len(shape)


def finish(target: GPUArray, final: GPUArray | None) -> GPUArray:
    if final is None:
        return target
    copy_into(final, target)
    return final


# -- binary -----------------------------------------------------------------------------------------
def _fast_out(out: GPUArray, x1: GPUArray, x2: GPUArray | None, dtype: DType) -> bool:
    """Whether ``out`` can take the contiguous fast path's result directly: the result's dtype and
    shape, contiguous, on the operands' device, and every operand either ``out`` itself (in place) or in
    another buffer (so none can partly overlap it; such calls take the general path, which copies the
    overlapping operand first)."""
    buffer = out._buffer
    return (
        out._dtype is dtype
        and out._shape == x1._shape
        and out._contiguous
        and buffer.device == x1._buffer.device
        and (x1 is out or x1._buffer is not buffer)
        and (x2 is None or x2 is out or x2._buffer is not buffer)
    )


# Array-scalar calls of Python numbers made before: (op, array dtype, scalar type, mode) -> the plan whose
# contiguous kernel ran; and (dtype, compute type, scalar type, value) -> the non-zero scalar as the
# kernel argument, stored only after the general path checked and converted it (so a value never seen,
# or NaN, which equals nothing, takes the general path). Zero converts in place: -0.0 and 0.0 are equal
# keys but must stay distinct.
_SCALAR_CALLS: PlanCache[Plan] = PlanCache("ops.elementwise.scalar_calls", maxsize=1024)
_SCALARS: PlanCache[Any] = PlanCache("ops.elementwise.scalars", maxsize=4096)


def known_scalar(dtype: DType, compute: str, value: int | float) -> Any:
    """``value`` (a Python int or float) as the kernel argument of compute type ``compute`` for operands
    of ``dtype``, when an earlier call converted it (None otherwise)."""
    if value:
        return _SCALARS.get((dtype.name, compute, type(value), value))
    if compute == "bool":
        return False
    return float(value) if compute in ("float", "double") else int(value)


def remember_scalar(dtype: DType, compute: str, value: Any, converted: Any) -> None:
    """Record a scalar the general path checked and converted, for :func:`known_scalar`."""
    if (type(value) is float or type(value) is int) and value:
        _SCALARS.put((dtype.name, compute, type(value), value), converted)


def _scalar_call(op: Op, array: GPUArray, scalar: int | float, mode: int) -> GPUArray | None:
    """The fast path of a contiguous array with a Python number (as an earlier call of this op, dtype,
    scalar type and side), or None."""
    plan = _SCALAR_CALLS.get((op, array._dtype.name, type(scalar), mode))
    if plan is None or not is_cuda():
        return None
    value = known_scalar(array._dtype, plan.compute, scalar)
    if value is None:
        return None
    result = allocate(array._shape, plan.out)
    n = math.prod(array._shape)
    if n:
        blocks = -(-n // plan.tile)
        if blocks > _BLOCKS_ANY_GPU:
            blocks = min(blocks, sm_count() * TILE_BLOCKS_PER_SM)
        launch(plan._contig, (array, array, value, result, n, mode, op.code), blocks)  # type: ignore[arg-type]
    return result


def binary(op: Op, x1: Any, x2: Any, out: Any = None) -> GPUArray:
    if type(x1) is GPUArray:
        if type(x2) is GPUArray:
            if out is None or type(out) is GPUArray:
                dtype = x1._dtype
                state = _backend._state
                if (
                    dtype is x2._dtype
                    and x1._contiguous
                    and x2._contiguous
                    and x1._shape == x2._shape
                    and x1._buffer.device == x2._buffer.device
                    and state is not None
                    and state.name == "cuda"
                ):
                    plan = op.plans._plans.get(dtype.name)
                    if (
                        plan is not None
                        and plan._contig is not None  # made by an earlier call, after the dtype checks
                        and (out is None or _fast_out(out, x1, x2, plan.out))
                    ):
                        result = allocate(x1._shape, plan.out) if out is None else out
                        n = math.prod(x1._shape)  # (result.size, without the property call)
                        if n:
                            blocks = -(-n // plan.tile)
                            if blocks > _BLOCKS_ANY_GPU:
                                blocks = min(blocks, sm_count() * TILE_BLOCKS_PER_SM)
                            launch(plan._contig, (x1, x2, plan.zero, result, n, _ARRAYS, op.code), blocks)
                        return result
        elif out is None and x1._contiguous and (type(x2) is float or type(x2) is int):
            done = _scalar_call(op, x1, x2, _SCALAR_SECOND)
            if done is not None:
                return done
    elif out is None and type(x2) is GPUArray and x2._contiguous and (type(x1) is float or type(x1) is int):
        done = _scalar_call(op, x2, x1, _SCALAR_FIRST)
        if done is not None:
            return done
    return _binary_general(op, x1, x2, out)


def operator(op: Op, reflected: bool = False) -> Callable[[GPUArray, Any], Any]:
    """GPUArray's ``x <op> y`` (``y <op> x`` when ``reflected``): the array-array fast path of
    :func:`binary` inline (one Python call per ``x + y``), anything else through :func:`binary`;
    NotImplemented for an operand no op takes (Python then tries the other side)."""
    plans = op.plans._plans
    code = op.code

    def forward(self: GPUArray, other: Any) -> Any:
        if type(other) is GPUArray:
            dtype = self._dtype
            state = _backend._state
            if (
                dtype is other._dtype
                and self._contiguous
                and other._contiguous
                and self._shape == other._shape
                and self._buffer.device == other._buffer.device
                and state is not None
                and state.name == "cuda"
            ):
                plan = plans.get(dtype.name)
                if plan is not None and plan._contig is not None:
                    result = allocate(self._shape, plan.out)
                    n = math.prod(self._shape)
                    if n:
                        blocks = -(-n // plan.tile)
                        if blocks > _BLOCKS_ANY_GPU:
                            blocks = min(blocks, sm_count() * TILE_BLOCKS_PER_SM)
                        first, second = (other, self) if reflected else (self, other)
                        launch(plan._contig, (first, second, plan.zero, result, n, _ARRAYS, code), blocks)
                    return result
        elif not (type(other) is float or type(other) is int or isinstance(other, _OPERANDS)):
            return NotImplemented
        return binary(op, other, self) if reflected else binary(op, self, other)

    named: Callable[[GPUArray, Any], Any] = _named(forward, f"{op.name}_{'reflected_' if reflected else ''}operator")
    return named


def _named(function: Any, name: str) -> Any:
    """``function`` (a plain function) renamed, with a code object of its own: the CPU backend's graph
    recording (core/_recording.py) finds the function of a frame by its code object, which closures
    share."""
    code = function.__code__.replace(co_name=name)
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=name)
    function.__code__ = code
    function.__name__ = function.__qualname__ = name
    return function


def unary_operator(op: Op) -> Callable[[GPUArray], GPUArray]:
    """GPUArray's ``-x`` / ``abs(x)``: :func:`unary`'s fast path inline, anything else through it."""
    plans = op.plans._plans
    code = op.code

    def forward(self: GPUArray) -> GPUArray:
        state = _backend._state
        if self._contiguous and state is not None and state.name == "cuda":
            plan = plans.get(self._dtype.name)
            if plan is not None and plan._contig is not None:
                result = allocate(self._shape, plan.out)
                n = math.prod(self._shape)
                if n:
                    blocks = -(-n // plan.tile)
                    if blocks > _BLOCKS_ANY_GPU:
                        blocks = min(blocks, sm_count() * TILE_BLOCKS_PER_SM)
                    launch(plan._contig, (self, result, n, code), blocks)
                return result
        return unary(op, self, None)

    named: Callable[[GPUArray], GPUArray] = _named(forward, f"{op.name}_operator")
    return named


def _binary_general(op: Op, x1: Any, x2: Any, out: Any) -> GPUArray:
    operands = [operand(x1, op.name), operand(x2, op.name)]
    arrays = [o for o in operands if isinstance(o, GPUArray)]
    if not arrays:
        raise DTypeError(f"{op.name} needs at least one GPUArray operand (got {describe(operands)})")
    check_devices(op.name, arrays if out is None or not isinstance(out, GPUArray) else [*arrays, out])
    common = _common_dtype(op, operands)
    shape = broadcast_shapes(*(a._shape for a in arrays))
    plan = op.plan(common)
    scalars = [scalar_value(o, common, plan.compute) if isinstance(o, Scalar) else None for o in operands]
    target, final = result_output(op.name, out, shape, plan.out)
    if out is not None:
        operands = [detach(o, target) for o in operands]
    n = target.size
    if n == 0:
        return finish(target, final)
    if not is_cuda():
        values = [
            _cpu.host(o).astype(_cpu.compute_numpy(plan.compute))
            if isinstance(o, GPUArray)
            else np.asarray(s, _cpu.compute_numpy(plan.compute))
            for o, s in zip(operands, scalars, strict=True)
        ]
        with np.errstate(all="ignore"):
            _cpu.store(target, _cpu.BINARY[op.key](values[0], values[1]))
        return finish(target, final)
    a, b = operands
    value = next((s for s in scalars if s is not None), plan.zero)
    contig = plan.contig()
    if (
        contig is not None
        and target._contiguous
        and all(o._dtype is common and o._shape == shape and o._contiguous for o in operands if isinstance(o, GPUArray))
    ):
        mode = _SCALAR_FIRST if isinstance(a, Scalar) else _SCALAR_SECOND if isinstance(b, Scalar) else _ARRAYS
        # The scalar's pointer slot gets the array too (never read), which keeps the launch fast path.
        array = a if mode != _SCALAR_FIRST else b
        contig(array if mode == _SCALAR_FIRST else a, array if mode == _SCALAR_SECOND else b, value, target, n, mode,
               op.code, grid=_contig_grid(n, plan.tile), block=BLOCK)  # fmt: skip
        scalar = b if mode == _SCALAR_SECOND else a if mode == _SCALAR_FIRST else None
        if isinstance(scalar, Scalar) and scalar.dtype is None and out is None:
            remember_scalar(common, plan.compute, scalar.value, value)
            _SCALAR_CALLS.put((op, common.name, type(scalar.value), mode), plan)
        return finish(target, final)
    pa, ca, sa = operand_args(a, shape)
    pb, cb, sb = operand_args(b, shape)
    layout = pack_layout(shape, [target._strides, sa, sb])
    plan.strided()(target.device_ptr, pa, ca, pb, cb, value, n, layout, op.code, grid=grid_for(n), block=BLOCK)
    return finish(target, final)


# -- unary ------------------------------------------------------------------------------------------
def unary(op: Op, x: Any, out: Any) -> GPUArray:
    state = _backend._state
    if (
        (out is None or type(out) is GPUArray)
        and type(x) is GPUArray
        and x._contiguous
        and state is not None
        and state.name == "cuda"
    ):
        plan = op.plans._plans.get(x._dtype.name)
        if plan is not None and plan._contig is not None and (out is None or _fast_out(out, x, None, plan.out)):
            result = allocate(x._shape, plan.out) if out is None else out
            n = math.prod(x._shape)
            if n:
                blocks = -(-n // plan.tile)
                if blocks > _BLOCKS_ANY_GPU:
                    blocks = min(blocks, sm_count() * TILE_BLOCKS_PER_SM)
                launch(plan._contig, (x, result, n, op.code), blocks)
            return result
    value = operand(x, op.name)
    if not isinstance(value, GPUArray):
        raise DTypeError(f"{op.name} needs a GPUArray operand (got {describe([value])})")
    check_devices(op.name, [value] if not isinstance(out, GPUArray) else [value, out])
    common = _common_dtype(op, [value])
    plan = op.plan(common)
    target, final = result_output(op.name, out, value._shape, plan.out)
    if out is not None and overlaps(value, target):
        value = value.clone()
    n = target.size
    if n == 0:
        return finish(target, final)
    if not is_cuda():
        with np.errstate(all="ignore"):
            _cpu.store(target, _cpu.UNARY[op.key](_cpu.host(value).astype(_cpu.compute_numpy(plan.compute))))
        return finish(target, final)
    contig = plan.contig()
    if contig is not None and value._contiguous and target._contiguous and value._dtype is common:
        contig(value, target, n, op.code, grid=_contig_grid(n, plan.tile), block=BLOCK)
    else:
        layout = pack_layout(value._shape, [target._strides, value._strides])
        plan.strided()(target.device_ptr, value.device_ptr, dtype_code(value._dtype), n, layout, op.code,
                       grid=grid_for(n), block=BLOCK)  # fmt: skip
    return finish(target, final)


# -- conversions ------------------------------------------------------------------------------------
_COPY_PARAMS = [pointer("out"), pointer("x"), code_param("x_code"), size_param("n"), _LAYOUT_PARAM, code_param("op")]
_CAST_PARAMS = [pointer("x"), pointer("out"), size_param("n"), code_param("op")]
_copy_kernels: PlanCache[JITKernel] = PlanCache("ops.elementwise.copy", maxsize=64)
_float_casts: PlanCache[JITKernel] = PlanCache("ops.elementwise.float_cast", maxsize=64)


def copy_expression(dtype: DType) -> str:
    return f"{NAMESPACE}unary_strided<{NAMESPACE}Copy<{copy_ctype(dtype)}>, {dtype.ctype}>"


def _copy_kernel(dtype: DType) -> JITKernel:
    kernel = _copy_kernels.get(dtype)
    if kernel is None:
        expression = copy_expression(dtype)
        kernel = _copy_kernels.put(dtype, group(FILES[1], [expression]).kernel(expression, _COPY_PARAMS))
    return kernel


def copy_into(dst: GPUArray, src: GPUArray) -> None:
    """Copy ``src`` into ``dst`` (same shape), converting the dtype on the way, any layout on both
    sides, on the device. Same-dtype copies are core's typed copy (a memcpy when both are contiguous)."""
    if src.dtype == dst.dtype:
        dst.copy_(src)
        return
    n = dst.size
    if n == 0:
        return
    if not is_cuda():
        _cpu.store(dst, _cpu.host(src))
        return
    layout = pack_layout(dst._shape, [dst._strides, broadcast_strides(src, dst._shape)])
    _copy_kernel(dst._dtype)(dst.device_ptr, src.device_ptr, dtype_code(src._dtype), n, layout, _COPY,
                             grid=grid_for(n), block=BLOCK)  # fmt: skip


def float_cast_expression(source: DType, target: DType) -> str:
    compute = "double" if float64 in (source, target) else "float"
    return f"{NAMESPACE}unary_contig<{NAMESPACE}Copy<{compute}>, {source.ctype}, {target.ctype}>"


def float_cast(x: GPUArray, target: DType) -> GPUArray:
    """A new contiguous array of the contiguous float array ``x`` converted to the float ``target``
    by the vectorized contiguous kernel (the casts models use); CUDA backend only."""
    source = x._dtype
    kernel = _float_casts.get((source, target))
    if kernel is None:
        expression = float_cast_expression(source, target)
        kernel = _float_casts.put((source, target), group(FILES[1], [expression]).kernel(expression, _CAST_PARAMS))
    out = empty(x._shape, target)
    n = out.size
    if n:
        kernel(x, out, n, _COPY, grid=_contig_grid(n, max(1, 16 // max(source.itemsize, target.itemsize)) * TILE),
               block=BLOCK)  # fmt: skip
    return out
