"""Elementwise ops against float64 (or exact integer) NumPy references, on fresh random data.

Every op and dtype runs in CI on the CPU backend with small sizes; the tests marked ``gpu`` repeat the
same checks on the GPU with sizes 1, 3, 1023 and 2**20 + 7. Each size covers contiguous operands,
strided views, scalars on either side, broadcasting, and ``out=`` arrays filled with garbage first
(results of fresh allocations come from a pool block poisoned the same way).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from ops_testing import (
    DTYPES,
    SIZES,
    SMALL_SIZES,
    Array,
    assert_matches,
    poison,
    poison_pool,
    sample,
    strided,
    upload,
)

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import DTypeError

F64 = np.float64
_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    # Fresh data per test, reproducible from the test's name.
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


# -- the ops: (function, accepted kinds of the operand dtype, domain of a, domain of b, ulps) ---------
BINARY: dict[str, tuple[Callable[..., gp.GPUArray], str, tuple[float, float], tuple[float, float], float]] = {
    "add": (gp.add, "biuf", (-8, 8), (-8, 8), 1),
    "sub": (gp.sub, "iuf", (-8, 8), (-8, 8), 1),
    "mul": (gp.mul, "biuf", (-8, 8), (-8, 8), 1),
    "div": (gp.div, "biuf", (-8, 8), (1, 8), 1),
    "floor_divide": (gp.floor_divide, "iuf", (-20, 20), (1, 4), 1),
    "mod": (gp.mod, "iuf", (-20, 20), (1, 4), 1),
    "pow": (gp.pow, "iuf", (0.5, 2), (-3, 3), 8),
    "maximum": (gp.maximum, "biuf", (-50, 50), (-50, 50), 0),
    "minimum": (gp.minimum, "biuf", (-50, 50), (-50, 50), 0),
    "eq": (gp.eq, "biuf", (-3, 3), (-3, 3), 0),
    "ne": (gp.ne, "biuf", (-3, 3), (-3, 3), 0),
    "lt": (gp.lt, "biuf", (-3, 3), (-3, 3), 0),
    "le": (gp.le, "biuf", (-3, 3), (-3, 3), 0),
    "gt": (gp.gt, "biuf", (-3, 3), (-3, 3), 0),
    "ge": (gp.ge, "biuf", (-3, 3), (-3, 3), 0),
    "logical_and": (gp.logical_and, "biuf", (-2, 2), (-2, 2), 0),
    "logical_or": (gp.logical_or, "biuf", (-2, 2), (-2, 2), 0),
    "logical_xor": (gp.logical_xor, "biuf", (-2, 2), (-2, 2), 0),
}
_POW_INT_DOMAIN = ((-4, 4), (0, 5))
_INTEGRAL = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"}


def _gelu_tanh(x: Array) -> Array:
    result: Array = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return result


UNARY: dict[str, tuple[Callable[..., gp.GPUArray], str, tuple[float, float], Callable[[Array], Array]]] = {
    "neg": (gp.neg, "iuf", (-50, 50), lambda x: -x),
    "abs": (gp.abs, "biuf", (-50, 50), np.abs),
    "sign": (gp.sign, "iuf", (-50, 50), np.sign),
    "relu": (gp.relu, "iuf", (-50, 50), lambda x: np.where(x < 0, 0, x)),
    "logical_not": (gp.logical_not, "biuf", (-2, 2), lambda x: x == 0),
    "exp": (gp.exp, "biuf", (-4, 4), np.exp),
    "exp2": (gp.exp2, "biuf", (-4, 4), np.exp2),
    "log": (gp.log, "biuf", (0.1, 50), np.log),
    "log2": (gp.log2, "biuf", (0.1, 50), np.log2),
    "log1p": (gp.log1p, "biuf", (-0.9, 50), np.log1p),
    "sqrt": (gp.sqrt, "biuf", (0, 50), np.sqrt),
    "rsqrt": (gp.rsqrt, "biuf", (0.1, 50), lambda x: 1 / np.sqrt(x)),
    "sin": (gp.sin, "biuf", (-10, 10), np.sin),
    "cos": (gp.cos, "biuf", (-10, 10), np.cos),
    "tanh": (gp.tanh, "biuf", (-8, 8), np.tanh),
    "sigmoid": (gp.sigmoid, "biuf", (-8, 8), lambda x: 1 / (1 + np.exp(-x))),
    "silu": (gp.silu, "biuf", (-8, 8), lambda x: x / (1 + np.exp(-x))),
    "gelu": (gp.gelu, "biuf", (-8, 8), lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))),
    "gelu_tanh": (gp.gelu_tanh, "biuf", (-8, 8), _gelu_tanh),
}
_EXACT_UNARY = {"neg", "abs", "sign", "relu", "logical_not"}


def _math_dtype(dtype: DType) -> DType:
    """NumPy's float type for math on ``dtype``: the smallest float holding every integer value."""
    if dtype.is_floating:
        return dtype
    return {1: gp.float16, 2: gp.float32}.get(dtype.itemsize, gp.float64)


def binary_result_dtype(name: str, dtype: DType) -> DType:
    if name in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"):
        return gp.bool_
    if name == "div" and not dtype.is_floating:
        return gp.float64
    return dtype


def binary_reference(name: str, a: Array, b: Array, dtype: DType) -> Array:
    """float64 results for float outputs, exact values (in NumPy's own integer arithmetic) otherwise."""
    with np.errstate(all="ignore"):
        if name.startswith("logical"):
            return getattr(np, name)(a.astype(F64) != 0, b.astype(F64) != 0)  # type: ignore[no-any-return]
        if name in ("eq", "ne", "lt", "le", "gt", "ge"):
            wide = F64 if dtype.is_floating or dtype.kind == "b" else (np.uint64 if dtype.kind == "u" else np.int64)
            op = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
                  "ge": np.greater_equal}[name]  # fmt: skip
            return op(a.astype(wide), b.astype(wide))  # type: ignore[no-any-return]
        if name == "div":
            return a.astype(F64) / b.astype(F64)  # type: ignore[no-any-return]
        if dtype.kind == "b":
            return {"add": a | b, "mul": a & b, "maximum": a | b, "minimum": a & b}[name]
        if dtype.is_floating and name in ("floor_divide", "mod"):
            compute = F64 if dtype == gp.float64 else np.float32  # the same float algorithm in the same type
            fn = np.floor_divide if name == "floor_divide" else np.remainder
            return fn(a.astype(compute), b.astype(compute)).astype(F64)  # type: ignore[no-any-return]
        x, y = (a.astype(F64), b.astype(F64)) if dtype.is_floating else (a, b)
        fns = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "floor_divide": np.floor_divide,
               "mod": np.remainder, "pow": np.power, "maximum": np.maximum, "minimum": np.minimum}  # fmt: skip
        return fns[name](x, y)  # type: ignore[no-any-return]


def _domains(name: str, dtype: DType) -> tuple[tuple[float, float], tuple[float, float]]:
    _, _, da, db, _ = BINARY[name]
    if name == "pow" and not dtype.is_floating:
        return _POW_INT_DOMAIN
    if dtype.kind == "u":
        da, db = (max(0, da[0]), max(1, da[1])), (max(0, db[0]), max(1, db[1]))
    return da, db


def _operands(rng: np.random.Generator, name: str, dtype: DType, shape: Any) -> tuple[Array, Array]:
    (la, ha), (lb, hb) = _domains(name, dtype)
    integral = name in _INTEGRAL
    a = sample(rng, shape, dtype, la, ha, integral=integral)
    b = sample(rng, shape, dtype, lb, hb, integral=integral)
    if name in ("div", "floor_divide", "mod") and dtype.kind in "if":
        sign = rng.choice(np.array([-1, 1], dtype=np.int8), size=shape)
        b = (b.astype(F64) * sign).astype(dtype.numpy)  # divisors of both signs, none near zero
    if name in ("maximum", "minimum", "eq", "ne", "lt", "gt") and dtype.is_floating and a.size > 5:
        a.reshape(-1)[::5] = np.nan
    return a, b


def _python_scalar(value: Any, dtype: DType) -> Any:
    if dtype.kind == "b":
        return bool(value)
    if dtype.kind in "iu":
        return int(value)
    return float(value)


def check_binary(name: str, dtype: DType, sizes: list[int], rng: np.random.Generator) -> None:
    fn, kinds, _, _, ulps = BINARY[name]
    if dtype.kind not in kinds:
        with pytest.raises(DTypeError, match=dtype.name):
            fn(gp.zeros(3, dtype), gp.zeros(3, dtype))
        return
    result_dtype = binary_result_dtype(name, dtype)
    for n in sizes:
        a, b = _operands(rng, name, dtype, n)
        expected = binary_reference(name, a, b, dtype)
        ga, gb = upload(a), upload(b)
        poison_pool(n, result_dtype)
        assert_matches(fn(ga, gb).to_numpy(), expected, result_dtype, ulps, f"{name} {dtype} n={n} contiguous")
        va, _ = strided(a)
        vb, _ = strided(b)
        assert_matches(fn(va, vb).to_numpy(), expected, result_dtype, ulps, f"{name} {dtype} n={n} strided")
        out = poison(n, result_dtype)
        assert fn(ga, vb, out=out) is out
        assert_matches(out.to_numpy(), expected, result_dtype, ulps, f"{name} {dtype} n={n} out=")
        # Python scalars (weak: they take the array's dtype) on either side.
        s = _python_scalar(b[0], dtype)
        full_b = np.full(n, b[0], dtype=dtype.numpy)
        assert_matches(fn(ga, s).to_numpy(), binary_reference(name, a, full_b, dtype), result_dtype, ulps,
                       f"{name} {dtype} n={n} array op scalar")  # fmt: skip
        s = _python_scalar(a[0], dtype)
        full_a = np.full(n, a[0], dtype=dtype.numpy)
        assert_matches(fn(s, gb).to_numpy(), binary_reference(name, full_a, b, dtype), result_dtype, ulps,
                       f"{name} {dtype} n={n} scalar op array")  # fmt: skip
        # Broadcasting: a (2, n) matrix with a row, and a column with a row.
        a2, b2 = _operands(rng, name, dtype, (2, n))
        row = b2[0]
        expected2 = binary_reference(name, a2, np.broadcast_to(row, a2.shape), dtype)
        assert_matches(fn(upload(a2), upload(row)).to_numpy(), expected2, result_dtype, ulps,
                       f"{name} {dtype} n={n} broadcast row")  # fmt: skip
        column = a2[:, :1]
        expected3 = binary_reference(name, np.broadcast_to(column, a2.shape), np.broadcast_to(row, a2.shape), dtype)
        assert_matches(fn(upload(np.ascontiguousarray(column)), upload(row)).to_numpy(), expected3, result_dtype, ulps,
                       f"{name} {dtype} n={n} outer broadcast")  # fmt: skip


def check_unary(name: str, dtype: DType, sizes: list[int], rng: np.random.Generator) -> None:
    fn, kinds, (low, high), reference = UNARY[name]
    if dtype.kind not in kinds:
        with pytest.raises(DTypeError, match=dtype.name):
            fn(gp.zeros(3, dtype))
        return
    exact = name in _EXACT_UNARY
    result_dtype = gp.bool_ if name == "logical_not" else dtype if exact else _math_dtype(dtype)
    if dtype.kind == "u":
        low = max(low, 0)
    for n in sizes:
        x = sample(rng, n, dtype, low, high)
        with np.errstate(all="ignore"):
            expected = reference(x) if exact and not dtype.is_floating else reference(x.astype(F64))
        ulps = 0 if exact else 8
        poison_pool(n, result_dtype)
        assert_matches(fn(upload(x)).to_numpy(), expected, result_dtype, ulps, f"{name} {dtype} n={n} contiguous")
        view, _ = strided(x)
        assert_matches(fn(view).to_numpy(), expected, result_dtype, ulps, f"{name} {dtype} n={n} strided")
        out = poison(n, result_dtype)
        assert fn(upload(x), out=out) is out
        assert_matches(out.to_numpy(), expected, result_dtype, ulps, f"{name} {dtype} n={n} out=")
        matrix = sample(rng, (3, n), dtype, low, high)
        with np.errstate(all="ignore"):
            expected_t = reference(matrix.T) if exact and not dtype.is_floating else reference(matrix.T.astype(F64))
        assert_matches(fn(upload(matrix).T).to_numpy(), expected_t, result_dtype, ulps, f"{name} {dtype} n={n} .T")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name: str, dtype: DType, rng: np.random.Generator) -> None:
    check_binary(name, dtype, SMALL_SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_gpu(name: str, dtype: DType, rng: np.random.Generator) -> None:
    check_binary(name, dtype, SIZES, rng)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name: str, dtype: DType, rng: np.random.Generator) -> None:
    check_unary(name, dtype, SMALL_SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_gpu(name: str, dtype: DType, rng: np.random.Generator) -> None:
    check_unary(name, dtype, SIZES, rng)


# -- where and clamp --------------------------------------------------------------------------------
def check_where(dtype: DType, sizes: list[int], rng: np.random.Generator) -> None:
    for n in sizes:
        cond = rng.integers(0, 2, n).astype(bool)
        x, y = sample(rng, n, dtype, -50, 50), sample(rng, n, dtype, -50, 50)
        expected = np.where(cond, x, y)
        poison_pool(n, dtype)
        assert_matches(gp.where(upload(cond), upload(x), upload(y)).to_numpy(), expected, dtype, 0, f"where {dtype}")
        vx, _ = strided(x)
        int_cond = cond.astype(np.int32) * 7  # any dtype: non-zero is true
        out = poison(n, dtype)
        gp.where(upload(int_cond), vx, upload(y), out=out)
        assert_matches(out.to_numpy(), expected, dtype, 0, f"where {dtype} strided, int condition, out=")
        scalar = _python_scalar(y[0], dtype)
        expected_scalar = np.where(cond, x, np.asarray(scalar).astype(dtype.numpy))
        assert_matches(gp.where(upload(cond), upload(x), scalar).to_numpy(), expected_scalar, dtype, 0,
                       f"where {dtype} scalar")  # fmt: skip
        matrix = rng.integers(0, 2, (2, n)).astype(bool)
        expected_b = np.where(matrix, x, y)
        assert_matches(gp.where(upload(matrix), upload(x), upload(y)).to_numpy(), expected_b, dtype, 0,
                       f"where {dtype} broadcast")  # fmt: skip


def check_clamp(dtype: DType, sizes: list[int], rng: np.random.Generator) -> None:
    if dtype.kind == "b":
        with pytest.raises(DTypeError, match="bool"):
            gp.clamp(gp.zeros(3, dtype), False, True)
        return
    low, high = (0, 60) if dtype.kind == "u" else (-50, 50)
    lo, hi = (5, 30) if dtype.kind == "u" else (-10, 20)
    for n in sizes:
        x = sample(rng, n, dtype, low, high)
        if dtype.is_floating and n > 3:
            x[::3] = np.nan
        expected = np.minimum(np.maximum(x.astype(F64), lo), hi)
        poison_pool(n, dtype)
        assert_matches(gp.clamp(upload(x), lo, hi).to_numpy(), expected, dtype, 0, f"clamp {dtype}")
        assert_matches(gp.clamp(upload(x), max=hi).to_numpy(), np.minimum(x.astype(F64), hi), dtype, 0,
                       f"clamp {dtype} max only")  # fmt: skip
        bounds = sample(rng, n, dtype, low, high)
        view, _ = strided(x)
        out = poison(n, dtype)
        gp.clamp(view, upload(bounds), hi, out=out)
        expected_arr = np.minimum(np.maximum(x.astype(F64), bounds.astype(F64)), hi)
        assert_matches(out.to_numpy(), expected_arr, dtype, 0, f"clamp {dtype} array bound, strided, out=")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_where(dtype: DType, rng: np.random.Generator) -> None:
    check_where(dtype, SMALL_SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_where_gpu(dtype: DType, rng: np.random.Generator) -> None:
    check_where(dtype, SIZES, rng)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_clamp(dtype: DType, rng: np.random.Generator) -> None:
    check_clamp(dtype, SMALL_SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_clamp_gpu(dtype: DType, rng: np.random.Generator) -> None:
    check_clamp(dtype, SIZES, rng)


# -- mixed dtypes, conversions, special values -------------------------------------------------------
MIXED = [
    (gp.float32, gp.float16), (gp.bfloat16, gp.float16), (gp.int8, gp.bfloat16), (gp.int16, gp.float16),
    (gp.uint8, gp.int8), (gp.int64, gp.uint64), (gp.float8_e4m3fn, gp.float8_e5m2), (gp.bool_, gp.int32),
    (gp.float8_e4m3fn, gp.int8), (gp.int32, gp.float32),
]  # fmt: skip


def check_mixed(sizes: list[int], rng: np.random.Generator) -> None:
    for first, second in MIXED:
        common = gp.promote_types(first, second)
        for n in sizes:
            a, b = sample(rng, n, first, -8, 8), sample(rng, n, second, 1, 8)
            for name in ("add", "mul", "maximum", "lt", "div"):
                result = getattr(gp, name)(upload(a), strided(b)[0]).to_numpy()
                expected = binary_reference(name, a.astype(common.numpy), b.astype(common.numpy), common)
                assert_matches(result, expected, binary_result_dtype(name, common), 1, f"{name} {first} {second}")


def test_mixed_dtypes(rng: np.random.Generator) -> None:
    check_mixed(SMALL_SIZES, rng)


@pytest.mark.gpu
def test_mixed_dtypes_gpu(rng: np.random.Generator) -> None:
    check_mixed(SIZES, rng)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_astype_of_views(dtype: DType, rng: np.random.Generator) -> None:
    # Negative floats to unsigned integers are undefined in C++ and NumPy alike: leave them out.
    matrix = sample(rng, (5, 7), gp.float32, 0 if dtype.kind == "u" else -50, 50)
    view = upload(matrix)[:, ::2].T
    result = gp.astype(view, dtype)
    assert result.is_contiguous
    assert result.dtype == dtype
    with np.errstate(all="ignore"):
        expected = matrix[:, ::2].T.astype(dtype.numpy)
    assert_matches(result.to_numpy(), expected, dtype, 0, f"astype {dtype}")


def test_integer_division_by_zero_and_negative_powers() -> None:
    a = upload(np.array([7, -7, 0, 5], np.int32))
    zero = upload(np.zeros(4, np.int32))
    assert gp.floor_divide(a, zero).to_numpy().tolist() == [0, 0, 0, 0]
    assert gp.mod(a, zero).to_numpy().tolist() == [0, 0, 0, 0]
    assert gp.floor_divide(a, 2).to_numpy().tolist() == [3, -4, 0, 2]
    assert gp.mod(a, -3).to_numpy().tolist() == [-2, -1, 0, -1]
    base = upload(np.array([1, -1, -1, 2, 0], np.int8))
    assert gp.pow(base, upload(np.array([-3, -3, -2, -1, 5], np.int8))).to_numpy().tolist() == [1, -1, 1, 0, 0]


def test_float_special_values() -> None:
    x = upload(np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -1.0], np.float32))
    assert np.isnan(gp.maximum(x, 0.0).to_numpy()[0])
    assert gp.sign(x).to_numpy()[1:3].tolist() == [-1.0, 1.0]
    assert np.isnan(gp.relu(x).to_numpy()[0])
    assert gp.floor_divide(upload(np.array([1.0, -1.0], np.float32)), 0.0).to_numpy().tolist() == [np.inf, -np.inf]
    assert gp.mod(upload(np.array([5.0, -5.0], np.float32)), 3.0).to_numpy().tolist() == [2.0, 1.0]
    assert gp.logical_not(x).to_numpy().tolist() == [False, False, False, True, True, False]


@pytest.mark.parametrize("dtype", [gp.bfloat16, gp.float16, gp.float8_e4m3fn, gp.float8_e5m2], ids=str)
def test_gelu_every_narrow_value(dtype: DType) -> None:
    """On the GPU, narrow results take a cheaper GELU form (functors.cuh, GeluErfNarrow). Every value of
    the dtype, contiguous and strided, is within one ulp of the float64 GELU rounded once, and at most
    1 % of them differ from it at all."""
    bits = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint16 if dtype.itemsize == 2 else np.uint8)
    x = bits.view(dtype.numpy)
    with np.errstate(all="ignore"):
        wide = x.astype(F64)
        expected = wide * 0.5 * _erfc(-wide / np.sqrt(2.0))
    contiguous = gp.gelu(upload(x)).to_numpy()
    assert_matches(contiguous, expected, dtype, 8, f"gelu over every {dtype} value")
    view, _ = strided(x)
    assert_matches(gp.gelu(view).to_numpy(), expected, dtype, 8, f"gelu over every {dtype} value, strided")
    finite = np.isfinite(wide) & np.isfinite(expected)
    with np.errstate(all="ignore"):
        rounded = expected[finite].astype(dtype.numpy).astype(F64)
    assert np.count_nonzero(contiguous[finite].astype(F64) != rounded) <= finite.sum() // 100


def test_float8_overflow_rules() -> None:
    """float8_e5m2 overflows to infinity (as NumPy/ml_dtypes and PyTorch do); float8_e4m3fn, which has
    no infinity, saturates to +-448. The same through astype, strided copies and op results."""
    host = np.array([1e6, -1e6, np.inf, -np.inf, 57344, 61439, 61440, 60000, np.nan, 1.5], np.float32)
    x = upload(host)
    e5m2 = host.astype(gp.float8_e5m2.numpy)
    assert np.isinf(e5m2.astype(F64)[[0, 1, 2, 3, 6]]).all()
    for got in (x.astype(gp.float8_e5m2), gp.astype(x, gp.float8_e5m2), strided(host)[0].astype(gp.float8_e5m2)):
        np.testing.assert_array_equal(got.to_numpy().astype(F64), e5m2.astype(F64))  # NaN payloads may differ
    doubled = gp.mul(upload(np.array([40960, -40960, 2], np.float32).astype(gp.float8_e5m2.numpy)), 2.0)
    assert doubled.to_numpy().astype(F64).tolist() == [np.inf, -np.inf, 4.0]
    e4m3 = gp.mul(upload(np.array([448, -448, 2], np.float32).astype(gp.float8_e4m3fn.numpy)), 2.0)
    assert e4m3.to_numpy().astype(F64).tolist() == [448.0, -448.0, 4.0]


_E4M3 = gp.float8_e4m3fn


def _e4m3(values: list[float]) -> gp.GPUArray:
    return upload(np.array(values, np.float32).astype(_E4M3.numpy))


def _floats(x: gp.GPUArray) -> list[float]:
    return [float(v) for v in x.to_numpy().astype(F64)]


def _same(got: list[float], expected: list[float]) -> bool:
    if len(got) != len(expected):
        return False
    return all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(got, expected, strict=True))


def test_float8_e4m3fn_python_scalars_saturate() -> None:
    """A Python scalar beyond +-448 meets a float8_e4m3fn array as +-448 (it takes the array's dtype,
    NumPy's rule for weak scalars, and e4m3fn saturates), not as NaN; infinities too; NaN stays NaN."""
    x = _e4m3([1.0, -1.0, 0.5, math.nan])
    assert _same(_floats(x * 1000.0), [448.0, -448.0, 224.0, math.nan])
    assert _same(_floats(gp.mul(x, -1000.0)), [-448.0, 448.0, -224.0, math.nan])
    assert _same(_floats(x * math.inf), [448.0, -448.0, 224.0, math.nan])
    assert _same(_floats(x * 1000), [448.0, -448.0, 224.0, math.nan])  # a Python int as well
    assert _same(_floats(x + 1000.0), [448.0, 448.0, 448.0, math.nan])
    assert _same(_floats(1000.0 - x), [448.0, 448.0, 448.0, math.nan])
    assert _same(_floats(gp.maximum(x, 1000.0)), [448.0, 448.0, 448.0, math.nan])
    assert _same(_floats(x * math.nan), [math.nan] * 4)
    assert _same(_floats(gp.where(x > 0, 1000.0, x)), [448.0, -1.0, 448.0, math.nan])
    view, _ = strided(np.array([1.0, -2.0, 3.0], np.float32).astype(_E4M3.numpy))
    assert _floats(view * 1000.0) == [448.0, -448.0, 448.0]  # the strided kernel's scalar too


def test_float8_e4m3fn_clamp_with_wide_bounds() -> None:
    x = _e4m3([-448.0, 448.0, 3.0, -0.5, math.nan])
    assert _same(_floats(gp.clamp(x, -1000, 1000)), [-448.0, 448.0, 3.0, -0.5, math.nan])
    assert _same(_floats(gp.clamp(x, -1000.0, 1000.0)), [-448.0, 448.0, 3.0, -0.5, math.nan])
    assert _same(_floats(gp.clamp(x, min=-math.inf, max=math.inf)), [-448.0, 448.0, 3.0, -0.5, math.nan])
    assert _same(_floats(gp.clamp(x, min=0, max=1000)), [0.0, 448.0, 3.0, 0.0, math.nan])
    assert _same(_floats(gp.clip(x, -1000.0, 2.0)), [-448.0, 2.0, 2.0, -0.5, math.nan])


def test_float8_e4m3fn_conversions_saturate() -> None:
    """astype into float8_e4m3fn from float32, bfloat16 and float8_e5m2 (contiguous and strided), and op
    results beyond its range: +-448 with infinities, NaN stays NaN, values up to 448 round as usual."""
    host = np.array([1000.0, -1e9, math.inf, -math.inf, math.nan, 460.0, 470.0, 447.0, 1.5, -0.0], np.float32)
    expected = [448.0, -448.0, 448.0, -448.0, math.nan, 448.0, 448.0, 448.0, 1.5, -0.0]
    x = upload(host)
    assert _same(_floats(gp.astype(x, _E4M3)), expected)
    assert _same(_floats(x.astype(_E4M3)), expected)
    assert _same(_floats(gp.astype(strided(host)[0], _E4M3)), expected)
    for source in (gp.bfloat16, gp.float8_e5m2):
        wide = host.astype(source.numpy)
        assert _same(_floats(gp.astype(upload(wide), _E4M3)), expected), source
        assert _same(_floats(gp.astype(strided(wide)[0], _E4M3)), expected), source
    assert _floats(gp.astype(upload(np.array([1000, -70000, 3], np.int32)), _E4M3)) == [448.0, -448.0, 3.0]
    big = _e4m3([400.0, -400.0, 448.0, 2.0])
    assert _floats(big + big) == [448.0, -448.0, 448.0, 4.0]
    assert _floats(gp.add(big, _e4m3([100.0, -100.0, 448.0, 1.0]))) == [448.0, -448.0, 448.0, 3.0]
    assert _floats(gp.exp(_e4m3([10.0, 0.0]))) == [448.0, 1.0]  # exp(10) = 22026
    assert _floats(gp.sum(_e4m3([400.0, 400.0, -0.5]))[None]) == [448.0]


def test_float8_e4m3fn_full_saturates() -> None:
    for value, expected in ((1000.0, 448.0), (-1000.0, -448.0), (math.inf, 448.0), (-math.inf, -448.0), (1000, 448.0)):
        assert _floats(gp.full(3, value, _E4M3)) == [expected] * 3, value
    assert all(math.isnan(v) for v in _floats(gp.full(2, math.nan, _E4M3)))
    assert _floats(gp.full_like(_e4m3([1.0]), 1e6)) == [448.0]


def test_in_place_forms_and_overlap() -> None:
    host = np.arange(10, dtype=np.float32)
    x = upload(host)
    assert gp.add(x, 1, out=x) is x
    np.testing.assert_array_equal(x.to_numpy(), host + 1)
    # The output overlaps the input shifted by one: the input is read before anything is written.
    y = upload(host)
    gp.mul(y[:-1], 2, out=y[1:])
    np.testing.assert_array_equal(y.to_numpy(), np.concatenate([[0], host[:-1] * 2]))


def test_out_takes_same_kind_casts() -> None:
    out = gp.zeros(3, gp.float16)
    gp.add(upload(np.array([1, 2, 3], np.int32)), 1, out=out)  # int32 result into float16
    assert out.to_numpy().tolist() == [2.0, 3.0, 4.0]
    with pytest.raises(DTypeError, match="same-kind"):
        gp.add(upload(np.ones(3, np.float32)), 1.5, out=gp.zeros(3, gp.int32))


def test_gelu_names_exact_and_tanh_forms(rng: np.random.Generator) -> None:
    """The name "gelu" is the exact erf GELU; "gelu_tanh" (or approximate="tanh") the tanh form."""
    host = sample(rng, 257, gp.float32, -6, 6)
    x = upload(host)
    wide = host.astype(F64)
    exact, approximate = gp.gelu(x).to_numpy(), gp.gelu_tanh(x).to_numpy()
    assert_matches(exact, 0.5 * wide * (1 + _erf(wide / np.sqrt(2))), gp.float32, 4, "gelu")
    assert_matches(approximate, _gelu_tanh(wide), gp.float32, 4, "gelu_tanh")
    assert np.array_equal(gp.gelu(x, approximate="none").to_numpy(), exact)
    assert np.array_equal(gp.gelu(x, approximate="tanh").to_numpy(), approximate)
    assert np.abs(exact - approximate).max() > 1e-5  # the forms differ (by up to about 5e-4 here)
    with pytest.raises(ValueError, match="approximate"):
        gp.gelu(x, approximate="gelu_tanh")


def test_elementwise_plans_live_in_registered_plan_caches() -> None:
    from pygpukit.core.plans import clear_plan_caches, plan_cache_stats

    x = upload(np.arange(6, dtype=np.float32))
    gp.add(x, x)
    gp.gelu_tanh(x)
    stats = plan_cache_stats()
    assert stats["ops.elementwise.add"][0] >= 1
    assert stats["ops.elementwise.gelu_tanh"][0] >= 1
    clear_plan_caches()
    assert plan_cache_stats()["ops.elementwise.add"][0] == 0
    np.testing.assert_array_equal(gp.add(x, x).to_numpy(), 2 * np.arange(6, dtype=np.float32))
    assert plan_cache_stats()["ops.elementwise.add"][0] == 1
