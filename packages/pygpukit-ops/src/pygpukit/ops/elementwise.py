"""Elementwise ops: arithmetic, comparisons, logical ops, math functions, activations, where, clamp and
astype; the op table (each op's functor family, op code, accepted kinds and result rule) and the public
functions. The engine they run on (operands, promotion, plans, launch paths) is
:mod:`pygpukit.ops._elementwise_engine`.

Every op broadcasts like NumPy, promotes types as documented in :mod:`pygpukit.ops.promotion` and
takes Python and NumPy scalars as kernel arguments (they never travel to the device as arrays). A
result lands in a new array, or in ``out=`` (any layout, in place included; a result dtype that
differs from ``out``'s is computed first and converted into it under NumPy's same-kind rule).

Kernels (native/kernels/elementwise/{binary,unary,ternary}.cu) take one of three paths: contiguous operands
of one dtype use 16-byte vector accesses; a contiguous array with a scalar does too; anything else
(strides, broadcasting, mixed dtypes) runs a strided kernel that reads each operand in place with its
own dtype, so non-contiguous inputs are never copied first. fp16, bf16 and fp8 compute in float32,
float64 in float64, integers in their own type (wrapping), so a narrow float result is rounded once.
"gelu" is the exact (erf) GELU and "gelu_tanh" its tanh approximation. (Over 600 lines: the op table
and one documented public function per op.)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from pygpukit.core import array as _array_module
from pygpukit.core.array import GPUArray, allocate, empty
from pygpukit.core.dtypes import DType, all_dtypes, as_dtype, bool_
from pygpukit.core.errors import ArgumentError, DTypeError
from pygpukit.core.jit import JITKernel
from pygpukit.core.plans import PlanCache

from . import _cpu
from ._elementwise_engine import (
    FILES,
    FLOAT_DTYPES,
    Op,
    Operand,
    Scalar,
    binary,
    copy_ctype,
    copy_expression,
    describe,
    detach,
    finish,
    fits,
    float_cast,
    float_cast_expression,
    known_scalar,
    operand,
    operand_args,
    operator,
    promoted,
    remember_scalar,
    result_output,
    scalar_value,
    unary,
    unary_operator,
)
from ._elementwise_engine import compute_ctype as compute_ctype  # re-exported: other op modules use these
from ._elementwise_engine import copy_into as copy_into
from ._kernels import (
    BLOCK,
    NAMESPACE,
    Groups,
    c_param,
    code_param,
    grid_for,
    group,
    launch,
    pointer,
    register_enumerator,
    size_param,
)
from ._layout import LAYOUT, broadcast_shapes, check_devices, is_cuda, pack_layout

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
    "gelu_tanh",
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

# -- the op table -----------------------------------------------------------------------------------
_ALL_KINDS = "biuf"
_NUMERIC = "iuf"

_ADD = Op("add", "Arith", "kArithAdd", 2, _ALL_KINDS, "same")
_SUB = Op("sub", "Arith", "kArithSub", 2, _NUMERIC, "same")
_MUL = Op("mul", "Arith", "kArithMul", 2, _ALL_KINDS, "same")
_DIV = Op("div", "Arith", "kArithDiv", 2, _ALL_KINDS, "divide")
_FLOOR_DIVIDE = Op("floor_divide", "Arith", "kArithFloorDivide", 2, _NUMERIC, "same")
_MOD = Op("mod", "Arith", "kArithMod", 2, _NUMERIC, "same")
_POW = Op("pow", "Arith", "kArithPow", 2, _NUMERIC, "same")
_MAXIMUM = Op("maximum", "Arith", "kArithMaximum", 2, _ALL_KINDS, "same")
_MINIMUM = Op("minimum", "Arith", "kArithMinimum", 2, _ALL_KINDS, "same")
_EQ = Op("eq", "Compare", "kCompareEq", 2, _ALL_KINDS, "bool")
_NE = Op("ne", "Compare", "kCompareNe", 2, _ALL_KINDS, "bool")
_LT = Op("lt", "Compare", "kCompareLt", 2, _ALL_KINDS, "bool")
_LE = Op("le", "Compare", "kCompareLe", 2, _ALL_KINDS, "bool")
_GT = Op("gt", "Compare", "kCompareGt", 2, _ALL_KINDS, "bool")
_GE = Op("ge", "Compare", "kCompareGe", 2, _ALL_KINDS, "bool")
_LOGICAL_AND = Op("logical_and", "Logical", "kLogicalAnd", 2, _ALL_KINDS, "truth")
_LOGICAL_OR = Op("logical_or", "Logical", "kLogicalOr", 2, _ALL_KINDS, "truth")
_LOGICAL_XOR = Op("logical_xor", "Logical", "kLogicalXor", 2, _ALL_KINDS, "truth")

_NEG = Op("neg", "Signs", "kSignsNeg", 1, _NUMERIC, "same")
_ABS = Op("abs", "Signs", "kSignsAbs", 1, _ALL_KINDS, "same")
_SIGN = Op("sign", "Signs", "kSignsSign", 1, _NUMERIC, "same")
_RELU = Op("relu", "Signs", "kSignsRelu", 1, _NUMERIC, "same")
_LOGICAL_NOT = Op("logical_not", "Logical", "kLogicalNot", 1, _ALL_KINDS, "truth")
_EXP = Op("exp", "Math", "kMathExp", 1, _ALL_KINDS, "float")
_EXP2 = Op("exp2", "Math", "kMathExp2", 1, _ALL_KINDS, "float")
_LOG = Op("log", "Math", "kMathLog", 1, _ALL_KINDS, "float")
_LOG2 = Op("log2", "Math", "kMathLog2", 1, _ALL_KINDS, "float")
_LOG1P = Op("log1p", "Math", "kMathLog1p", 1, _ALL_KINDS, "float")
_SQRT = Op("sqrt", "Math", "kMathSqrt", 1, _ALL_KINDS, "float")
_RSQRT = Op("rsqrt", "Math", "kMathRsqrt", 1, _ALL_KINDS, "float")
_SIN = Op("sin", "Math", "kMathSin", 1, _ALL_KINDS, "float")
_COS = Op("cos", "Math", "kMathCos", 1, _ALL_KINDS, "float")
_TANH = Op("tanh", "Math", "kMathTanh", 1, _ALL_KINDS, "float")
_SIGMOID = Op("sigmoid", "Math", "kMathSigmoid", 1, _ALL_KINDS, "float")
_SILU = Op("silu", "Math", "kMathSilu", 1, _ALL_KINDS, "float")
_GELU = Op("gelu", "Math", "kMathGelu", 1, _ALL_KINDS, "float")
_GELU_TANH = Op("gelu_tanh", "Math", "kMathGeluTanh", 1, _ALL_KINDS, "float")

BINARY_OPS = (_ADD, _SUB, _MUL, _DIV, _FLOOR_DIVIDE, _MOD, _POW, _MAXIMUM, _MINIMUM, _EQ, _NE, _LT, _LE, _GT, _GE,
              _LOGICAL_AND, _LOGICAL_OR, _LOGICAL_XOR)  # fmt: skip
UNARY_OPS = (_NEG, _ABS, _SIGN, _RELU, _LOGICAL_NOT, _EXP, _EXP2, _LOG, _LOG2, _LOG1P, _SQRT, _RSQRT, _SIN, _COS,
             _TANH, _SIGMOID, _SILU, _GELU, _GELU_TANH)  # fmt: skip
_GELU_FORMS = {"none": _GELU, "tanh": _GELU_TANH}  # gelu's approximate=


# -- binary ops -------------------------------------------------------------------------------------
def add(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 + x2`` elementwise (bool: logical or). Integers wrap."""
    return binary(_ADD, x1, x2, out)


def sub(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 - x2`` elementwise. Not defined for bool (use logical_xor)."""
    return binary(_SUB, x1, x2, out)


def mul(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 * x2`` elementwise (bool: logical and)."""
    return binary(_MUL, x1, x2, out)


def div(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 / x2`` (true division): integers and bool divide as float64; floats keep their dtype."""
    return binary(_DIV, x1, x2, out)


def floor_divide(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 // x2``: rounded toward minus infinity; integer division by zero gives 0."""
    return binary(_FLOOR_DIVIDE, x1, x2, out)


def mod(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 % x2`` with the sign of the divisor (Python's and NumPy's rule); integer ``x % 0`` is 0."""
    return binary(_MOD, x1, x2, out)


def pow(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 ** x2``. Integer powers wrap; a negative integer exponent gives ``1 // x1**-x2`` truncated
    toward zero (1 for base 1, +-1 for base -1, else 0) where NumPy raises."""
    return binary(_POW, x1, x2, out)


def maximum(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Elementwise maximum; NaN propagates."""
    return binary(_MAXIMUM, x1, x2, out)


def minimum(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Elementwise minimum; NaN propagates."""
    return binary(_MINIMUM, x1, x2, out)


def eq(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 == x2`` as bool, compared in the promoted dtype."""
    return binary(_EQ, x1, x2, out)


def ne(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 != x2`` as bool."""
    return binary(_NE, x1, x2, out)


def lt(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 < x2`` as bool."""
    return binary(_LT, x1, x2, out)


def le(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 <= x2`` as bool."""
    return binary(_LE, x1, x2, out)


def gt(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 > x2`` as bool."""
    return binary(_GT, x1, x2, out)


def ge(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x1 >= x2`` as bool."""
    return binary(_GE, x1, x2, out)


def logical_and(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Truth values (non-zero is true) combined with and; any dtypes, bool result."""
    return binary(_LOGICAL_AND, x1, x2, out)


def logical_or(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Truth values combined with or; bool result."""
    return binary(_LOGICAL_OR, x1, x2, out)


def logical_xor(x1: Any, x2: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Truth values combined with exclusive or; bool result."""
    return binary(_LOGICAL_XOR, x1, x2, out)


# -- unary ops --------------------------------------------------------------------------------------
def neg(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``-x`` (unsigned integers wrap). Not defined for bool."""
    return unary(_NEG, x, out)


def abs(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``|x|``; the most negative integer stays negative (wraps), as in NumPy."""
    return unary(_ABS, x, out)


def sign(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """-1, 0 or 1 by the sign of ``x`` (NaN stays NaN). Not defined for bool."""
    return unary(_SIGN, x, out)


def relu(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``max(x, 0)``, keeping NaN. Not defined for bool."""
    return unary(_RELU, x, out)


def logical_not(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x == 0`` as bool."""
    return unary(_LOGICAL_NOT, x, out)


def exp(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``e**x``. Integers and bool give a float (int8/uint8/bool: float16, 16-bit: float32, wider: float64)."""
    return unary(_EXP, x, out)


def exp2(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``2**x``."""
    return unary(_EXP2, x, out)


def log(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Natural logarithm."""
    return unary(_LOG, x, out)


def log2(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Base-2 logarithm."""
    return unary(_LOG2, x, out)


def log1p(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``log(1 + x)``, accurate for small ``x``."""
    return unary(_LOG1P, x, out)


def sqrt(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Square root (NaN for negative values)."""
    return unary(_SQRT, x, out)


def rsqrt(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``1 / sqrt(x)`` (CUDA's rsqrt: within 2 ulp in float32)."""
    return unary(_RSQRT, x, out)


def sin(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Sine (radians)."""
    return unary(_SIN, x, out)


def cos(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Cosine (radians)."""
    return unary(_COS, x, out)


def tanh(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """Hyperbolic tangent."""
    return unary(_TANH, x, out)


def sigmoid(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``1 / (1 + exp(-x))``."""
    return unary(_SIGMOID, x, out)


def silu(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x * sigmoid(x)`` (also called swish)."""
    return unary(_SILU, x, out)


def gelu(x: Any, /, *, approximate: str = "none", out: GPUArray | None = None) -> GPUArray:
    """The exact GELU ``0.5 * x * (1 + erf(x / sqrt(2)))``; ``approximate="tanh"`` gives
    :func:`gelu_tanh` instead (torch.nn.functional.gelu's parameter)."""
    op = _GELU_FORMS.get(approximate) if isinstance(approximate, str) else None
    if op is None:
        raise ArgumentError(f"gelu: approximate must be 'none' (erf) or 'tanh', got {approximate!r}")
    return unary(op, x, out)


def gelu_tanh(x: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """The tanh approximation of GELU, ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``
    (GPT-2's ``gelu_new``, torch's ``approximate="tanh"``)."""
    return unary(_GELU_TANH, x, out)


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


# -- astype -----------------------------------------------------------------------------------------
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
        return float_cast(x, target)
    if x._contiguous and is_cuda():
        return x.astype(target)
    out = empty(x._shape, target)
    copy_into(out, x)  # on the CPU backend: _cpu.store, which saturates float8_e4m3fn like the kernels
    return out


# -- where and clamp (elementwise/ternary.cu) -------------------------------------------------------
_CLAMP_KINDS = "iuf"
_ABSENT = -2  # kCodeAbsent of types.cuh: a clamp bound that was not given
_WHERE_CONTIG_PARAMS = [pointer("cond"), pointer("x"), pointer("y"), pointer("out"), size_param("n")]
# Repeated calls: where's contiguous kernel by dtype; clamp's contiguous kernel and compute type by
# (dtype, type of min, type of max) for Python-number bounds (values through known_scalar).
_WHERE_CALLS: PlanCache[JITKernel] = PlanCache("ops.elementwise.where_calls", maxsize=64)
_CLAMP_CALLS: PlanCache[tuple[JITKernel, str]] = PlanCache("ops.elementwise.clamp_calls", maxsize=256)


def _where_expressions(dtype: DType) -> tuple[str, str]:
    return (f"{NAMESPACE}where_contig<{dtype.ctype}>",
            f"{NAMESPACE}where_strided<{copy_ctype(dtype)}, {dtype.ctype}>")  # fmt: skip


def _clamp_expressions(dtype: DType) -> tuple[str, str]:
    ctype = compute_ctype(dtype)
    return (f"{NAMESPACE}clamp_scalar<{ctype}, {dtype.ctype}>",
            f"{NAMESPACE}clamp_strided<{ctype}, {dtype.ctype}>")  # fmt: skip


def _ternary_common(name: str, operands: Sequence[Operand]) -> DType:
    common = promoted(operands)
    for o in operands:
        if isinstance(o, Scalar) and o.kind == "i" and common.kind in "iu" and not fits(o.value, common):
            raise DTypeError(f"{name}: Python integer {o.value} is out of bounds for {common}")
    return common


def where(condition: Any, x: Any, y: Any, /, *, out: GPUArray | None = None) -> GPUArray:
    """``x`` where ``condition`` is true (non-zero), else ``y``; the three broadcast together.

    ``condition`` may have any dtype; the result has the promoted dtype of ``x`` and ``y`` (either may
    be a scalar: ``where(mask, x, 0.0)``).
    """
    if out is None and type(condition) is GPUArray and type(x) is GPUArray and type(y) is GPUArray:
        kernel = _WHERE_CALLS.get(x._dtype)  # the contiguous kernel an earlier call of this dtype used
        if (
            kernel is not None
            and y._dtype is x._dtype
            and condition._dtype is bool_
            and x._shape == y._shape == condition._shape
            and x._contiguous
            and y._contiguous
            and condition._contiguous
            and x._buffer.device == y._buffer.device == condition._buffer.device
            and is_cuda()
        ):
            result = allocate(x._shape, x._dtype)
            n = result.size
            if n:
                launch(kernel, (condition, x, y, result, n), grid_for(n))
            return result
    cond = operand(condition, "where")
    if not isinstance(cond, GPUArray):
        raise DTypeError(f"where: condition must be a GPUArray, got {type(condition).__name__}")
    values = [operand(x, "where"), operand(y, "where")]
    arrays = [cond, *(v for v in values if isinstance(v, GPUArray))]
    check_devices("where", arrays if not isinstance(out, GPUArray) else [*arrays, out])
    common = _ternary_common("where", values)
    shape = broadcast_shapes(*(a._shape for a in arrays))
    ctype = copy_ctype(common)
    scalars = [scalar_value(v, common, ctype) if isinstance(v, Scalar) else 0 for v in values]
    target, final = result_output("where", out, shape, common)
    if out is not None:
        cond = detach(cond, target)
        values = [detach(v, target) for v in values]
    n = target.size
    if n == 0:
        return finish(target, final)
    assert isinstance(cond, GPUArray)
    if not is_cuda():
        # In the promoted dtype first: NumPy cannot promote bfloat16 and fp8 with its own types.
        host = [_cpu.host(v).astype(common.numpy, copy=False) if isinstance(v, GPUArray)
                else np.asarray(s, common.numpy) for v, s in zip(values, scalars, strict=True)]  # fmt: skip
        _cpu.store(target, np.where(_cpu.host(cond).astype(bool), host[0], host[1]))
        return finish(target, final)
    contig, strided = _where_expressions(common)
    kernels = group(FILES[3], [contig, strided])
    vx, vy = values
    if (
        cond._dtype == bool_
        and isinstance(vx, GPUArray)
        and isinstance(vy, GPUArray)
        and vx._dtype == common
        and vy._dtype == common
        and all(a._shape == shape and a._contiguous for a in (cond, vx, vy, target))
    ):
        kernel = kernels.kernel(contig, _WHERE_CONTIG_PARAMS)
        kernel(cond, vx, vy, target, n, grid=grid_for(n), block=BLOCK)
        _WHERE_CALLS.put(common, kernel)
        return finish(target, final)
    pc, cc, sc = operand_args(cond, shape)
    px, cx, sx = operand_args(vx, shape)
    py, cy, sy = operand_args(vy, shape)
    params = [pointer("out"), pointer("cond"), code_param("cond_code"), pointer("x"), code_param("x_code"),
              pointer("y"), code_param("y_code"), c_param("xs", ctype), c_param("ys", ctype), size_param("n"),
              LAYOUT.param("layout")]  # fmt: skip
    layout = pack_layout(shape, [target._strides, sc, sx, sy])
    kernels.kernel(strided, params)(target.device_ptr, pc, cc, px, cx, py, cy, scalars[0], scalars[1], n, layout,
                                    grid=grid_for(n), block=BLOCK)  # fmt: skip
    return finish(target, final)


def clamp(x: GPUArray, min: Any = None, max: Any = None, *, out: GPUArray | None = None) -> GPUArray:
    """``minimum(maximum(x, min), max)`` elementwise (NumPy's ``clip``): bounds are scalars or arrays
    that broadcast with ``x``, either may be None; NaN propagates. Not defined for bool."""
    if out is None and type(x) is GPUArray and x._contiguous:
        t_lo, t_hi = type(min), type(max)
        call = _CLAMP_CALLS.get((x._dtype, t_lo, t_hi))  # an earlier call's kernel and compute type
        if call is not None and is_cuda():
            kernel, compute = call
            lo = 0 if min is None else known_scalar(x._dtype, compute, min)
            hi = 0 if max is None else known_scalar(x._dtype, compute, max)
            if lo is not None and hi is not None:
                fast = allocate(x._shape, x._dtype)
                n = fast.size
                if n:
                    bounded = (x, lo, hi, int(min is not None), int(max is not None), fast, n)
                    launch(kernel, bounded, grid_for(-(-n // (16 // x._dtype.itemsize))))
                return fast
    if min is None and max is None:
        raise ArgumentError("clamp needs at least one of min and max")
    value = operand(x, "clamp")
    if not isinstance(value, GPUArray):
        raise DTypeError(f"clamp: x must be a GPUArray, got {type(x).__name__}")
    bounds = [None if b is None else operand(b, "clamp") for b in (min, max)]
    given = [b for b in bounds if b is not None]
    arrays = [value, *(b for b in given if isinstance(b, GPUArray))]
    check_devices("clamp", arrays if not isinstance(out, GPUArray) else [*arrays, out])
    common = _ternary_common("clamp", [value, *given])
    if common.kind not in _CLAMP_KINDS:
        raise DTypeError(f"clamp does not support {common} operands (got {describe([value, *given])})")
    shape = broadcast_shapes(*(a._shape for a in arrays))
    ctype = compute_ctype(common)
    scalars = [scalar_value(b, common, ctype) if isinstance(b, Scalar) else 0 for b in bounds]
    target, final = result_output("clamp", out, shape, common)
    if out is not None:
        value = detach(value, target)
        bounds = [detach(b, target) for b in bounds]
    n = target.size
    if n == 0:
        return finish(target, final)
    if not is_cuda():
        cnp = _cpu.compute_numpy(ctype)
        result = _cpu.host(value).astype(cnp)
        with np.errstate(all="ignore"):
            for bound, scalar, fn in zip(bounds, scalars, (np.maximum, np.minimum), strict=True):
                if bound is not None:
                    limit = _cpu.host(bound).astype(cnp) if isinstance(bound, GPUArray) else cnp.type(scalar)
                    result = fn(result, limit)
        _cpu.store(target, np.broadcast_to(result, shape))
        return finish(target, final)
    contig, strided = _clamp_expressions(common)
    kernels = group(FILES[3], [contig, strided])
    if (
        value._dtype == common
        and value._shape == shape
        and value._contiguous
        and target._contiguous
        and all(b is None or isinstance(b, Scalar) for b in bounds)
    ):
        params = [pointer("x"), c_param("lo", ctype), c_param("hi", ctype), code_param("has_lo"),
                  code_param("has_hi"), pointer("out"), size_param("n")]  # fmt: skip
        width = 16 // common.itemsize
        kernel = kernels.kernel(contig, params)
        kernel(value, scalars[0], scalars[1], int(bounds[0] is not None), int(bounds[1] is not None), target, n,
               grid=grid_for(-(-n // width)), block=BLOCK)  # fmt: skip
        if out is None and all(b is None or (b.dtype is None and type(b.value) in (int, float)) for b in bounds):
            for bound, converted in zip(bounds, scalars, strict=True):
                if bound is not None:
                    remember_scalar(common, ctype, bound.value, converted)  # type: ignore[union-attr]
            _CLAMP_CALLS.put((common, type(min), type(max)), (kernel, ctype))
        return finish(target, final)
    px, cx, sx = operand_args(value, shape)
    args = []
    stride_sets = [target._strides, sx]
    for bound in bounds:
        if bound is None:
            args += [0, _ABSENT]
            stride_sets.append((0,) * len(shape))
        else:
            pointer_, code, strides = operand_args(bound, shape)
            args += [pointer_, code]
            stride_sets.append(strides)
    params = [pointer("out"), pointer("x"), code_param("x_code"), pointer("lo"), code_param("lo_code"),
              pointer("hi"), code_param("hi_code"), c_param("los", ctype), c_param("his", ctype), size_param("n"),
              LAYOUT.param("layout")]  # fmt: skip
    layout = pack_layout(shape, stride_sets)
    kernels.kernel(strided, params)(target.device_ptr, px, cx, *args, scalars[0], scalars[1], n, layout,
                                    grid=grid_for(n), block=BLOCK)  # fmt: skip
    return finish(target, final)


clip = clamp


# GPUArray's arithmetic and comparison operators call the engine directly (one Python call less per
# ``x + y`` than through the public functions, which only forward to it).
_array_module._functions.update({op.name: functools.partial(binary, op) for op in (
    _ADD, _SUB, _MUL, _DIV, _FLOOR_DIVIDE, _MOD, _POW, _EQ, _NE, _LT, _LE, _GT, _GE)})  # fmt: skip
# And its forward and reflected operators are the engine's fast path itself (``x + y`` is one call).
for _op, _dunder, _reflected in (
    (_ADD, "add", True), (_SUB, "sub", True), (_MUL, "mul", True), (_DIV, "truediv", True),
    (_FLOOR_DIVIDE, "floordiv", True), (_MOD, "mod", True), (_POW, "pow", True), (_EQ, "eq", False),
    (_NE, "ne", False), (_LT, "lt", False), (_LE, "le", False), (_GT, "gt", False), (_GE, "ge", False),
):  # fmt: skip
    _array_module.bind_operator(f"__{_dunder}__", operator(_op))
    if _reflected:
        _array_module.bind_operator(f"__r{_dunder}__", operator(_op, reflected=True))
_array_module.bind_operator("__neg__", unary_operator(_NEG))
_array_module.bind_operator("__abs__", unary_operator(_ABS))


# -- compile-check enumeration ----------------------------------------------------------------------
def _enumerate() -> Groups:
    files: Groups = {path: [] for path in FILES.values()}
    for op in (*BINARY_OPS, *UNARY_OPS):
        for dtype in all_dtypes():
            if op.result == "truth" or dtype.kind in op.kinds:
                files[FILES[op.arity]].append(op.plan(dtype).group.expressions)
    for source in FLOAT_DTYPES:
        for target in FLOAT_DTYPES:
            if source != target:
                files[FILES[1]].append((float_cast_expression(source, target),))
    for dtype in all_dtypes():
        files[FILES[1]].append((copy_expression(dtype),))
        files[FILES[3]].append(_where_expressions(dtype))
        if dtype.kind in _CLAMP_KINDS:
            files[FILES[3]].append(_clamp_expressions(dtype))
    return files


register_enumerator(_enumerate)
