"""Elementwise ops: arithmetic, comparisons, logical ops, math functions, activations, where and clamp.

Every op broadcasts like NumPy, promotes types as documented in :mod:`pygpukit.ops.promotion` and
takes Python and NumPy scalars as kernel arguments (they never travel to the device as arrays). A
result lands in a new array, or in ``out=`` (any layout, in place included; a result dtype that
differs from ``out``'s is computed first and converted into it under NumPy's same-kind rule).

Kernels (native/kernels/elementwise/{binary,unary,ternary}.cu) take one of three paths: contiguous operands
of one dtype use 16-byte vector accesses; a contiguous array with a scalar does too; anything else
(strides, broadcasting, mixed dtypes) runs a strided kernel that reads each operand in place with its
own dtype, so non-contiguous inputs are never copied first. fp16, bf16 and fp8 compute in float32,
float64 in float64, integers in their own type (wrapping), so a narrow float result is rounded once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray, empty
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

from . import _cpu
from ._kernels import (
    BLOCK,
    NAMESPACE,
    TILE,
    TILE_BLOCKS_PER_SM,
    Groups,
    c_param,
    code_param,
    grid_for,
    group,
    layout_param,
    pointer,
    register_enumerator,
    size_param,
)
from ._layout import broadcast_shapes, broadcast_strides, check_devices, dtype_code, is_cuda, overlaps, pack_layout
from .promotion import _promote, apply_weak, can_cast, scalar_kind

__all__ = [
    "abs",
    "add",
    "astype",
    "clamp",
    "clip",
    "cos",
    "div",
    "divide",
    "eq",
    "equal",
    "exp",
    "exp2",
    "floor_divide",
    "ge",
    "gelu",
    "greater",
    "greater_equal",
    "gt",
    "le",
    "less",
    "less_equal",
    "log",
    "log1p",
    "log2",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "lt",
    "maximum",
    "minimum",
    "mod",
    "mul",
    "multiply",
    "ne",
    "neg",
    "negative",
    "not_equal",
    "pow",
    "relu",
    "remainder",
    "rsqrt",
    "sigmoid",
    "sign",
    "silu",
    "sin",
    "sqrt",
    "sub",
    "subtract",
    "tanh",
    "true_divide",
    "where",
]

_FILES = {1: "elementwise/unary.cu", 2: "elementwise/binary.cu", 3: "elementwise/ternary.cu"}
# The float type a math function of an integer or bool gives (NumPy's choice: the smallest float that
# holds every value of the type).
_FLOAT_OF = {d: d for d in all_dtypes() if d.is_floating} | {
    d: float16 if d.itemsize == 1 else float32 if d.itemsize == 2 else float64
    for d in all_dtypes()
    if not d.is_floating
}


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


class _Op:
    """One elementwise op: its family (functors.cuh) and code in it, arity, accepted kinds, result rule."""

    __slots__ = ("arity", "code", "family", "key", "kinds", "name", "plans", "result")

    def __init__(self, name: str, family: str, code: int, arity: int, kinds: str, result: str, key: str = "") -> None:
        self.name = name
        self.key = key or name  # its NumPy implementation in _cpu
        self.family = family
        self.code = code
        self.arity = arity
        self.kinds = kinds  # kinds of the promoted operand dtype the op accepts: b, i, u, f
        self.result = result  # "same", "bool" (comparisons), "float" (math), "divide", "truth" (logical)
        self.plans: dict[DType, _Plan] = {}

    def plan(self, common: DType) -> _Plan:
        found = self.plans.get(common)
        if found is None:
            key = (self.family, self.arity, self.result, common)
            found = _plans.get(key)
            if found is None:
                found = _plans[key] = _Plan(self, common)
            self.plans[common] = found
        return found


class _Plan:
    """The kernels of one op family for one promoted operand dtype: compute type, result dtype and the
    name expressions, compiled together on first use.

    Math functions and true division of integers have no contiguous kernel: integer inputs to them are
    rare, and the strided kernel (which reads any dtype) serves them without more instantiations.
    """

    __slots__ = ("_contig", "_strided", "arity", "compute", "contig_expr", "group", "out", "strided_expr", "width",
                 "zero")  # fmt: skip

    def __init__(self, op: _Op, common: DType) -> None:
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
        self.group = group(_FILES[op.arity], expressions)
        self.width = max(1, 16 // max(common.itemsize, self.out.itemsize))
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
            self._contig = self.group.kernel(self.contig_expr, params)
        return self._contig

    def strided(self) -> JITKernel:
        kernel = self._strided
        if kernel is None:
            if self.arity == 2:
                params = [pointer("out"), pointer("a"), code_param("a_code"), pointer("b"), code_param("b_code"),
                          c_param("s", self.compute), size_param("n"), layout_param(), code_param("op")]  # fmt: skip
            else:
                params = [pointer("out"), pointer("x"), code_param("x_code"), size_param("n"), layout_param(),
                          code_param("op")]  # fmt: skip
            kernel = self._strided = self.group.kernel(self.strided_expr, params)
        return kernel


_plans: dict[tuple[str, int, str, DType], _Plan] = {}


class _Scalar:
    """A scalar operand: a Python number (weak: ``kind`` set) or a NumPy scalar (strong: ``dtype`` set)."""

    __slots__ = ("dtype", "kind", "value")

    def __init__(self, value: Any, kind: str | None, dtype: DType | None) -> None:
        self.value = value
        self.kind = kind
        self.dtype = dtype


Operand = GPUArray | _Scalar


def _operand(value: Any, op: str) -> Operand:
    if isinstance(value, GPUArray):
        return value
    kind = scalar_kind(value)
    if kind is not None:
        return _Scalar(value, kind, None)
    if isinstance(value, np.generic):
        try:
            dtype = as_dtype(value.dtype)
        except DTypeError:
            raise DTypeError(f"{op}: unsupported scalar dtype {value.dtype}") from None
        return _Scalar(value, None, dtype)
    if isinstance(value, np.ndarray):
        raise DeviceError(
            f"{op}: got a host NumPy array (shape {value.shape}, dtype {value.dtype}); ops take device arrays, so "
            "copy it explicitly with gp.asarray(...) first"
        )
    raise DTypeError(f"{op}: unsupported operand type {type(value).__name__}")


def _describe(operands: Sequence[Operand]) -> str:
    parts = []
    for o in operands:
        if isinstance(o, GPUArray):
            parts.append(f"{o.dtype} array of shape {o.shape}")
        elif o.dtype is not None:
            parts.append(f"{o.dtype} scalar")
        else:
            parts.append(f"Python {type(o.value).__name__}")
    return ", ".join(parts)


def _fits(value: int, dtype: DType) -> bool:
    info = np.iinfo(dtype.numpy)
    return int(info.min) <= value <= int(info.max)


def _common_dtype(op: _Op, operands: Sequence[Operand]) -> DType:
    """The promoted operand dtype (for logical ops: the arrays' shared dtype, else bool)."""
    if op.result == "truth":
        dtypes = {o._dtype for o in operands if isinstance(o, GPUArray)}
        return dtypes.pop() if len(dtypes) == 1 else bool_
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
    common = apply_weak(strong, weak)
    if common.kind in "iu":
        for o in operands:
            if isinstance(o, _Scalar) and o.kind == "i" and not _fits(o.value, common):
                if op.result != "bool":
                    raise DTypeError(f"{op.name}: Python integer {o.value} is out of bounds for {common}")
                # NumPy compares out-of-range Python integers exactly; so do we, in a wider type.
                if _fits(o.value, int64) and common != uint64:
                    common = int64
                elif o.value >= 0 and _fits(o.value, uint64) and common.kind == "u":
                    common = uint64
                else:
                    common = float64
    if common.kind not in op.kinds:
        raise DTypeError(f"{op.name} does not support {common} operands (got {_describe(operands)})")
    return common


def _scalar_value(scalar: _Scalar, common: DType, ctype: str) -> Any:
    """The scalar converted to the operands' dtype (NumPy's rule for weak scalars; float8_e4m3fn
    saturates to +-448 as the kernels' stores do), then to the compute type of the kernel argument."""
    if ctype == "bool":
        return bool(scalar.value)
    with np.errstate(all="ignore"):
        typed = cast_values(scalar.value, common)
        if ctype in ("float", "double"):
            return float(typed.astype(np.float64))
    return int(typed)


def _output(name: str, out: Any, shape: tuple[int, ...], dtype: DType) -> tuple[GPUArray, GPUArray | None]:
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


def _detach(operand: Any, target: GPUArray) -> Any:
    """``operand``, or a copy of it when it shares memory with the output without being the same view
    (NumPy copies such inputs too)."""
    return operand.clone() if isinstance(operand, GPUArray) and overlaps(operand, target) else operand


def _operand_args(operand: Operand, shape: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
    """(pointer, dtype code, strides in ``shape``) of an operand of a strided launch."""
    if isinstance(operand, GPUArray):
        return operand.device_ptr, dtype_code(operand._dtype), broadcast_strides(operand, shape)
    return 0, -1, (0,) * len(shape)


def _finish(target: GPUArray, final: GPUArray | None) -> GPUArray:
    if final is None:
        return target
    copy_into(final, target)
    return final


# -- binary -----------------------------------------------------------------------------------------
def _binary(op: _Op, x1: Any, x2: Any, out: Any) -> GPUArray:
    if out is None and type(x1) is GPUArray and type(x2) is GPUArray:
        dtype = x1._dtype
        if (
            dtype is x2._dtype
            and x1._shape == x2._shape
            and x1._contiguous
            and x2._contiguous
            and x1._buffer.device == x2._buffer.device
            and is_cuda()
        ):
            plan = op.plans.get(dtype)
            if plan is not None and plan._contig is not None:  # made by an earlier call, after the dtype checks
                result = empty(x1._shape, plan.out)
                n = result.size
                if n:
                    grid = grid_for(-(-n // plan.width), TILE, TILE_BLOCKS_PER_SM)
                    plan._contig(x1, x2, plan.zero, result, n, 0, op.code, grid=grid, block=BLOCK)
                return result
    return _binary_general(op, x1, x2, out)


def _binary_general(op: _Op, x1: Any, x2: Any, out: Any) -> GPUArray:
    operands = [_operand(x1, op.name), _operand(x2, op.name)]
    arrays = [o for o in operands if isinstance(o, GPUArray)]
    if not arrays:
        raise DTypeError(f"{op.name} needs at least one GPUArray operand (got {_describe(operands)})")
    check_devices(op.name, arrays if out is None or not isinstance(out, GPUArray) else [*arrays, out])
    common = _common_dtype(op, operands)
    shape = broadcast_shapes(*(a._shape for a in arrays))
    plan = op.plan(common)
    scalars = [_scalar_value(o, common, plan.compute) if isinstance(o, _Scalar) else None for o in operands]
    target, final = _output(op.name, out, shape, plan.out)
    if out is not None:
        operands = [_detach(o, target) for o in operands]
    n = target.size
    if n == 0:
        return _finish(target, final)
    if not is_cuda():
        values = [
            _cpu.host(o).astype(_cpu.compute_numpy(plan.compute))
            if isinstance(o, GPUArray)
            else np.asarray(s, _cpu.compute_numpy(plan.compute))
            for o, s in zip(operands, scalars, strict=True)
        ]
        with np.errstate(all="ignore"):
            _cpu.store(target, _cpu.BINARY[op.key](values[0], values[1]))
        return _finish(target, final)
    a, b = operands
    value = next((s for s in scalars if s is not None), plan.zero)
    contig = plan.contig()
    if (
        contig is not None
        and target._contiguous
        and all(o._dtype is common and o._shape == shape and o._contiguous for o in operands if isinstance(o, GPUArray))
    ):
        mode = 1 if isinstance(a, _Scalar) else 2 if isinstance(b, _Scalar) else 0
        # The scalar's pointer slot gets the array too (never read), which keeps the launch fast path.
        array = a if mode != 1 else b
        contig(array if mode == 1 else a, array if mode == 2 else b, value, target, n, mode, op.code,
               grid=grid_for(-(-n // plan.width), TILE, TILE_BLOCKS_PER_SM), block=BLOCK)  # fmt: skip
        return _finish(target, final)
    pa, ca, sa = _operand_args(a, shape)
    pb, cb, sb = _operand_args(b, shape)
    layout = pack_layout(shape, [target._strides, sa, sb])
    plan.strided()(target.device_ptr, pa, ca, pb, cb, value, n, layout, op.code, grid=grid_for(n), block=BLOCK)
    return _finish(target, final)


# -- unary ------------------------------------------------------------------------------------------
def _unary(op: _Op, x: Any, out: Any) -> GPUArray:
    if out is None and type(x) is GPUArray and x._contiguous and is_cuda():
        plan = op.plans.get(x._dtype)
        kernel = plan._contig if plan is not None else None
        if kernel is not None:
            result = empty(x._shape, plan.out)  # type: ignore[union-attr]
            n = result.size
            if n:
                kernel(x, result, n, op.code, grid=grid_for(-(-n // plan.width), TILE, TILE_BLOCKS_PER_SM), block=BLOCK)  # type: ignore[union-attr]
            return result
    operand = _operand(x, op.name)
    if not isinstance(operand, GPUArray):
        raise DTypeError(f"{op.name} needs a GPUArray operand (got {_describe([operand])})")
    check_devices(op.name, [operand] if not isinstance(out, GPUArray) else [operand, out])
    common = _common_dtype(op, [operand])
    plan = op.plan(common)
    target, final = _output(op.name, out, operand._shape, plan.out)
    if out is not None and overlaps(operand, target):
        operand = operand.clone()
    n = target.size
    if n == 0:
        return _finish(target, final)
    if not is_cuda():
        with np.errstate(all="ignore"):
            _cpu.store(target, _cpu.UNARY[op.key](_cpu.host(operand).astype(_cpu.compute_numpy(plan.compute))))
        return _finish(target, final)
    contig = plan.contig()
    if contig is not None and operand._contiguous and target._contiguous and operand._dtype is common:
        contig(operand, target, n, op.code, grid=grid_for(-(-n // plan.width), TILE, TILE_BLOCKS_PER_SM), block=BLOCK)
    else:
        layout = pack_layout(operand._shape, [target._strides, operand._strides])
        plan.strided()(target.device_ptr, operand.device_ptr, dtype_code(operand._dtype), n, layout, op.code,
                       grid=grid_for(n), block=BLOCK)  # fmt: skip
    return _finish(target, final)


# -- conversions ------------------------------------------------------------------------------------
_copy_kernels: dict[DType, JITKernel] = {}


def _copy_expression(dtype: DType) -> str:
    return f"{NAMESPACE}unary_strided<{NAMESPACE}Copy<{copy_ctype(dtype)}>, {dtype.ctype}>"


def _copy_kernel(dtype: DType) -> JITKernel:
    kernel = _copy_kernels.get(dtype)
    if kernel is None:
        expression = _copy_expression(dtype)
        params = [pointer("out"), pointer("x"), code_param("x_code"), size_param("n"), layout_param(), code_param("op")]
        kernel = _copy_kernels[dtype] = group(_FILES[1], [expression]).kernel(expression, params)
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
    _copy_kernel(dst._dtype)(dst.device_ptr, src.device_ptr, dtype_code(src._dtype), n, layout, 0, grid=grid_for(n),
                             block=BLOCK)  # fmt: skip


def _float_cast_expression(source: DType, target: DType) -> str:
    compute = "double" if float64 in (source, target) else "float"
    return f"{NAMESPACE}unary_contig<{NAMESPACE}Copy<{compute}>, {source.ctype}, {target.ctype}>"


_FLOAT_DTYPES = tuple(d for d in all_dtypes() if d.is_floating)
_float_casts: dict[tuple[DType, DType], JITKernel] = {}


def _float_cast(source: DType, target: DType) -> JITKernel:
    """The vectorized contiguous conversion between two float dtypes (the casts models use)."""
    kernel = _float_casts.get((source, target))
    if kernel is None:
        expression = _float_cast_expression(source, target)
        params = [pointer("x"), pointer("out"), size_param("n"), code_param("op")]
        kernel = _float_casts[source, target] = group(_FILES[1], [expression]).kernel(expression, params)
    return kernel


def astype(x: GPUArray, dtype: Any) -> GPUArray:
    """A new contiguous array of ``x`` converted to ``dtype`` (NumPy's conversion rules, one rounding).

    Contiguous float-to-float conversions use a vectorized kernel; a non-contiguous ``x`` is read in
    place by a strided kernel, not compacted first. Every dtype converts to every dtype.
    """
    if not isinstance(x, GPUArray):
        raise DTypeError(f"astype needs a GPUArray, got {type(x).__name__}")
    target = as_dtype(dtype)
    check_devices("astype", [x])
    source = x._dtype
    if target == source:
        return x.clone()
    if x._contiguous and source.is_floating and target.is_floating and is_cuda():
        out = empty(x._shape, target)
        n = out.size
        if n:
            width = 16 // max(source.itemsize, target.itemsize)
            _float_cast(source, target)(
                x, out, n, 0, grid=grid_for(-(-n // width), TILE, TILE_BLOCKS_PER_SM), block=BLOCK
            )
        return out
    if x._contiguous and is_cuda():
        return x.astype(target)
    out = empty(x._shape, target)
    copy_into(out, x)  # on the CPU backend: _cpu.store, which saturates float8_e4m3fn like the kernels
    return out


# -- where and clamp --------------------------------------------------------------------------------
_clamp_kinds = "iuf"


def _where_expressions(dtype: DType) -> tuple[str, str]:
    return (f"{NAMESPACE}where_contig<{dtype.ctype}>",
            f"{NAMESPACE}where_strided<{copy_ctype(dtype)}, {dtype.ctype}>")  # fmt: skip


def _clamp_expressions(dtype: DType) -> tuple[str, str]:
    ctype = compute_ctype(dtype)
    return (f"{NAMESPACE}clamp_scalar<{ctype}, {dtype.ctype}>",
            f"{NAMESPACE}clamp_strided<{ctype}, {dtype.ctype}>")  # fmt: skip


def _ternary_common(name: str, operands: Sequence[Operand]) -> DType:
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
    common = apply_weak(strong, weak)
    for o in operands:
        if isinstance(o, _Scalar) and o.kind == "i" and common.kind in "iu" and not _fits(o.value, common):
            raise DTypeError(f"{name}: Python integer {o.value} is out of bounds for {common}")
    return common


def where(condition: Any, x: Any, y: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x`` where ``condition`` is true (non-zero), else ``y``; the three broadcast together.

    ``condition`` may have any dtype; the result has the promoted dtype of ``x`` and ``y`` (either may
    be a scalar: ``where(mask, x, 0.0)``).
    """
    cond = _operand(condition, "where")
    if not isinstance(cond, GPUArray):
        raise DTypeError(f"where: condition must be a GPUArray, got {type(condition).__name__}")
    values = [_operand(x, "where"), _operand(y, "where")]
    arrays = [cond, *(v for v in values if isinstance(v, GPUArray))]
    check_devices("where", arrays if not isinstance(out, GPUArray) else [*arrays, out])
    common = _ternary_common("where", values)
    shape = broadcast_shapes(*(a._shape for a in arrays))
    ctype = copy_ctype(common)
    scalars = [_scalar_value(v, common, ctype) if isinstance(v, _Scalar) else 0 for v in values]
    target, final = _output("where", out, shape, common)
    if out is not None:
        cond = _detach(cond, target)
        values = [_detach(v, target) for v in values]
    n = target.size
    if n == 0:
        return _finish(target, final)
    assert isinstance(cond, GPUArray)
    if not is_cuda():
        host = [_cpu.host(v) if isinstance(v, GPUArray) else np.asarray(s, common.numpy)
                for v, s in zip(values, scalars, strict=True)]  # fmt: skip
        _cpu.store(target, np.where(_cpu.host(cond).astype(bool), host[0], host[1]))
        return _finish(target, final)
    contig, strided = _where_expressions(common)
    kernels = group(_FILES[3], [contig, strided])
    vx, vy = values
    if (
        cond._dtype == bool_
        and isinstance(vx, GPUArray)
        and isinstance(vy, GPUArray)
        and vx._dtype == common
        and vy._dtype == common
        and all(a._shape == shape and a._contiguous for a in (cond, vx, vy, target))
    ):
        params = [pointer("cond"), pointer("x"), pointer("y"), pointer("out"), size_param("n")]
        kernels.kernel(contig, params)(cond, vx, vy, target, n, grid=grid_for(n), block=BLOCK)
        return _finish(target, final)
    pc, cc, sc = _operand_args(cond, shape)
    px, cx, sx = _operand_args(vx, shape)
    py, cy, sy = _operand_args(vy, shape)
    params = [pointer("out"), pointer("cond"), code_param("cond_code"), pointer("x"), code_param("x_code"),
              pointer("y"), code_param("y_code"), c_param("xs", ctype), c_param("ys", ctype), size_param("n"),
              layout_param()]  # fmt: skip
    layout = pack_layout(shape, [target._strides, sc, sx, sy])
    kernels.kernel(strided, params)(target.device_ptr, pc, cc, px, cx, py, cy, scalars[0], scalars[1], n, layout,
                                    grid=grid_for(n), block=BLOCK)  # fmt: skip
    return _finish(target, final)


def clamp(x: GPUArray, min: Any = None, max: Any = None, *, out: GPUArray | None = None) -> GPUArray:
    """``minimum(maximum(x, min), max)`` elementwise (NumPy's ``clip``): bounds are scalars or arrays
    that broadcast with ``x``, either may be None; NaN propagates. Not defined for bool."""
    if min is None and max is None:
        raise ValueError("clamp needs at least one of min and max")
    operand = _operand(x, "clamp")
    if not isinstance(operand, GPUArray):
        raise DTypeError(f"clamp: x must be a GPUArray, got {type(x).__name__}")
    bounds = [None if b is None else _operand(b, "clamp") for b in (min, max)]
    given = [b for b in bounds if b is not None]
    arrays = [operand, *(b for b in given if isinstance(b, GPUArray))]
    check_devices("clamp", arrays if not isinstance(out, GPUArray) else [*arrays, out])
    common = _ternary_common("clamp", [operand, *given])
    if common.kind not in _clamp_kinds:
        raise DTypeError(f"clamp does not support {common} operands (got {_describe([operand, *given])})")
    shape = broadcast_shapes(*(a._shape for a in arrays))
    ctype = compute_ctype(common)
    scalars = [_scalar_value(b, common, ctype) if isinstance(b, _Scalar) else 0 for b in bounds]
    target, final = _output("clamp", out, shape, common)
    if out is not None:
        operand = _detach(operand, target)
        bounds = [_detach(b, target) for b in bounds]
    n = target.size
    if n == 0:
        return _finish(target, final)
    if not is_cuda():
        cnp = _cpu.compute_numpy(ctype)
        value = _cpu.host(operand).astype(cnp)
        with np.errstate(all="ignore"):
            for bound, scalar, fn in zip(bounds, scalars, (np.maximum, np.minimum), strict=True):
                if bound is not None:
                    value = fn(value, _cpu.host(bound).astype(cnp) if isinstance(bound, GPUArray) else cnp.type(scalar))
        _cpu.store(target, np.broadcast_to(value, shape))
        return _finish(target, final)
    contig, strided = _clamp_expressions(common)
    kernels = group(_FILES[3], [contig, strided])
    if (
        operand._dtype == common
        and operand._shape == shape
        and operand._contiguous
        and target._contiguous
        and all(b is None or isinstance(b, _Scalar) for b in bounds)
    ):
        params = [pointer("x"), c_param("lo", ctype), c_param("hi", ctype), code_param("has_lo"),
                  code_param("has_hi"), pointer("out"), size_param("n")]  # fmt: skip
        width = 16 // common.itemsize
        kernels.kernel(contig, params)(operand, scalars[0], scalars[1], int(bounds[0] is not None),
                                       int(bounds[1] is not None), target, n, grid=grid_for(-(-n // width)),
                                       block=BLOCK)  # fmt: skip
        return _finish(target, final)
    px, cx, sx = _operand_args(operand, shape)
    args = []
    stride_sets = [target._strides, sx]
    for bound in bounds:
        if bound is None:
            args += [0, -2]
            stride_sets.append((0,) * len(shape))
        else:
            pointer_, code, strides = _operand_args(bound, shape)
            args += [pointer_, code]
            stride_sets.append(strides)
    params = [pointer("out"), pointer("x"), code_param("x_code"), pointer("lo"), code_param("lo_code"),
              pointer("hi"), code_param("hi_code"), c_param("los", ctype), c_param("his", ctype), size_param("n"),
              layout_param()]  # fmt: skip
    layout = pack_layout(shape, stride_sets)
    kernels.kernel(strided, params)(target.device_ptr, px, cx, *args, scalars[0], scalars[1], n, layout,
                                    grid=grid_for(n), block=BLOCK)  # fmt: skip
    return _finish(target, final)


clip = clamp


# -- the op table and the public functions --------------------------------------------------------
_ALL_KINDS = "biuf"
_NUMERIC = "iuf"

_ADD = _Op("add", "Arith", 0, 2, _ALL_KINDS, "same")
_SUB = _Op("sub", "Arith", 1, 2, _NUMERIC, "same")
_MUL = _Op("mul", "Arith", 2, 2, _ALL_KINDS, "same")
_DIV = _Op("div", "Arith", 3, 2, _ALL_KINDS, "divide")
_FLOOR_DIVIDE = _Op("floor_divide", "Arith", 4, 2, _NUMERIC, "same")
_MOD = _Op("mod", "Arith", 5, 2, _NUMERIC, "same")
_POW = _Op("pow", "Arith", 6, 2, _NUMERIC, "same")
_MAXIMUM = _Op("maximum", "Arith", 7, 2, _ALL_KINDS, "same")
_MINIMUM = _Op("minimum", "Arith", 8, 2, _ALL_KINDS, "same")
_EQ = _Op("eq", "Compare", 0, 2, _ALL_KINDS, "bool")
_NE = _Op("ne", "Compare", 1, 2, _ALL_KINDS, "bool")
_LT = _Op("lt", "Compare", 2, 2, _ALL_KINDS, "bool")
_LE = _Op("le", "Compare", 3, 2, _ALL_KINDS, "bool")
_GT = _Op("gt", "Compare", 4, 2, _ALL_KINDS, "bool")
_GE = _Op("ge", "Compare", 5, 2, _ALL_KINDS, "bool")
_LOGICAL_AND = _Op("logical_and", "Logical", 0, 2, _ALL_KINDS, "truth")
_LOGICAL_OR = _Op("logical_or", "Logical", 1, 2, _ALL_KINDS, "truth")
_LOGICAL_XOR = _Op("logical_xor", "Logical", 2, 2, _ALL_KINDS, "truth")

_NEG = _Op("neg", "Signs", 0, 1, _NUMERIC, "same")
_ABS = _Op("abs", "Signs", 1, 1, _ALL_KINDS, "same")
_SIGN = _Op("sign", "Signs", 2, 1, _NUMERIC, "same")
_RELU = _Op("relu", "Signs", 3, 1, _NUMERIC, "same")
_LOGICAL_NOT = _Op("logical_not", "Logical", 0, 1, _ALL_KINDS, "truth")
_EXP = _Op("exp", "Math", 0, 1, _ALL_KINDS, "float")
_EXP2 = _Op("exp2", "Math", 1, 1, _ALL_KINDS, "float")
_LOG = _Op("log", "Math", 2, 1, _ALL_KINDS, "float")
_LOG2 = _Op("log2", "Math", 3, 1, _ALL_KINDS, "float")
_LOG1P = _Op("log1p", "Math", 4, 1, _ALL_KINDS, "float")
_SQRT = _Op("sqrt", "Math", 5, 1, _ALL_KINDS, "float")
_RSQRT = _Op("rsqrt", "Math", 6, 1, _ALL_KINDS, "float")
_SIN = _Op("sin", "Math", 7, 1, _ALL_KINDS, "float")
_COS = _Op("cos", "Math", 8, 1, _ALL_KINDS, "float")
_TANH = _Op("tanh", "Math", 9, 1, _ALL_KINDS, "float")
_SIGMOID = _Op("sigmoid", "Math", 10, 1, _ALL_KINDS, "float")
_SILU = _Op("silu", "Math", 11, 1, _ALL_KINDS, "float")
_GELU_ERF = _Op("gelu", "Math", 12, 1, _ALL_KINDS, "float", "gelu_erf")
_GELU_TANH = _Op("gelu", "Math", 13, 1, _ALL_KINDS, "float", "gelu_tanh")

BINARY_OPS = (_ADD, _SUB, _MUL, _DIV, _FLOOR_DIVIDE, _MOD, _POW, _MAXIMUM, _MINIMUM, _EQ, _NE, _LT, _LE, _GT, _GE,
              _LOGICAL_AND, _LOGICAL_OR, _LOGICAL_XOR)  # fmt: skip
UNARY_OPS = (_NEG, _ABS, _SIGN, _RELU, _LOGICAL_NOT, _EXP, _EXP2, _LOG, _LOG2, _LOG1P, _SQRT, _RSQRT, _SIN, _COS,
             _TANH, _SIGMOID, _SILU, _GELU_ERF, _GELU_TANH)  # fmt: skip


def add(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 + x2`` elementwise (bool: logical or). Integers wrap."""
    return _binary(_ADD, x1, x2, out)


def sub(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 - x2`` elementwise. Not defined for bool (use logical_xor)."""
    return _binary(_SUB, x1, x2, out)


def mul(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 * x2`` elementwise (bool: logical and)."""
    return _binary(_MUL, x1, x2, out)


def div(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 / x2`` (true division): integers and bool divide as float64; floats keep their dtype."""
    return _binary(_DIV, x1, x2, out)


def floor_divide(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 // x2``: rounded toward minus infinity; integer division by zero gives 0."""
    return _binary(_FLOOR_DIVIDE, x1, x2, out)


def mod(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 % x2`` with the sign of the divisor (Python's and NumPy's rule); integer ``x % 0`` is 0."""
    return _binary(_MOD, x1, x2, out)


def pow(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 ** x2``. Integer powers wrap; a negative integer exponent gives ``1 // x1**-x2`` truncated
    toward zero (1 for base 1, +-1 for base -1, else 0) where NumPy raises."""
    return _binary(_POW, x1, x2, out)


def maximum(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Elementwise maximum; NaN propagates."""
    return _binary(_MAXIMUM, x1, x2, out)


def minimum(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Elementwise minimum; NaN propagates."""
    return _binary(_MINIMUM, x1, x2, out)


def eq(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 == x2`` as bool, compared in the promoted dtype."""
    return _binary(_EQ, x1, x2, out)


def ne(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 != x2`` as bool."""
    return _binary(_NE, x1, x2, out)


def lt(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 < x2`` as bool."""
    return _binary(_LT, x1, x2, out)


def le(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 <= x2`` as bool."""
    return _binary(_LE, x1, x2, out)


def gt(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 > x2`` as bool."""
    return _binary(_GT, x1, x2, out)


def ge(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 >= x2`` as bool."""
    return _binary(_GE, x1, x2, out)


def logical_and(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Truth values (non-zero is true) combined with and; any dtypes, bool result."""
    return _binary(_LOGICAL_AND, x1, x2, out)


def logical_or(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Truth values combined with or; bool result."""
    return _binary(_LOGICAL_OR, x1, x2, out)


def logical_xor(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Truth values combined with exclusive or; bool result."""
    return _binary(_LOGICAL_XOR, x1, x2, out)


def neg(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``-x`` (unsigned integers wrap). Not defined for bool."""
    return _unary(_NEG, x, out)


def abs(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``|x|``; the most negative integer stays negative (wraps), as in NumPy."""
    return _unary(_ABS, x, out)


def sign(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """-1, 0 or 1 by the sign of ``x`` (NaN stays NaN). Not defined for bool."""
    return _unary(_SIGN, x, out)


def relu(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``max(x, 0)``, keeping NaN. Not defined for bool."""
    return _unary(_RELU, x, out)


def logical_not(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x == 0`` as bool."""
    return _unary(_LOGICAL_NOT, x, out)


def exp(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``e**x``. Integers and bool give a float (int8/uint8/bool: float16, 16-bit: float32, wider: float64)."""
    return _unary(_EXP, x, out)


def exp2(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``2**x``."""
    return _unary(_EXP2, x, out)


def log(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Natural logarithm."""
    return _unary(_LOG, x, out)


def log2(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Base-2 logarithm."""
    return _unary(_LOG2, x, out)


def log1p(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``log(1 + x)``, accurate for small ``x``."""
    return _unary(_LOG1P, x, out)


def sqrt(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Square root (NaN for negative values)."""
    return _unary(_SQRT, x, out)


def rsqrt(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``1 / sqrt(x)`` (CUDA's rsqrt: within 2 ulp in float32)."""
    return _unary(_RSQRT, x, out)


def sin(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Sine (radians)."""
    return _unary(_SIN, x, out)


def cos(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Cosine (radians)."""
    return _unary(_COS, x, out)


def tanh(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Hyperbolic tangent."""
    return _unary(_TANH, x, out)


def sigmoid(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``1 / (1 + exp(-x))``."""
    return _unary(_SIGMOID, x, out)


def silu(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x * sigmoid(x)`` (also called swish)."""
    return _unary(_SILU, x, out)


def gelu(x: Any, /, *, approximate: str = "none", out: GPUArray | None = None) -> GPUArray:
    """GELU: ``0.5 * x * (1 + erf(x / sqrt(2)))``, or with ``approximate="tanh"`` the tanh form
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``."""
    if approximate == "none":
        return _unary(_GELU_ERF, x, out)
    if approximate == "tanh":
        return _unary(_GELU_TANH, x, out)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


# NumPy spellings of the same ops.
subtract = sub
multiply = mul
divide = true_divide = div
remainder = mod
negative = neg
equal = eq
not_equal = ne
less = lt
less_equal = le
greater = gt
greater_equal = ge


# -- compile-check enumeration ----------------------------------------------------------------------
def _enumerate() -> Groups:
    files: Groups = {path: [] for path in _FILES.values()}
    for op in (*BINARY_OPS, *UNARY_OPS):
        for dtype in all_dtypes():
            if op.result == "truth" or dtype.kind in op.kinds:
                files[_FILES[op.arity]].append(op.plan(dtype).group.expressions)
    for source in _FLOAT_DTYPES:
        for target in _FLOAT_DTYPES:
            if source != target:
                files[_FILES[1]].append((_float_cast_expression(source, target),))
    for dtype in all_dtypes():
        files[_FILES[1]].append((_copy_expression(dtype),))
        files[_FILES[3]].append(_where_expressions(dtype))
        if dtype.kind in _clamp_kinds:
            files[_FILES[3]].append(_clamp_expressions(dtype))
    return files


register_enumerator(_enumerate)
