"""Issue 21, item 4: property tests of the op library against NumPy (float64 references) on random shapes
(0-size and 0-d included), layouts (offsets, negative steps, every-other-element and transposed views),
broadcasting and dtypes (every dtype, mixed pairs, Python scalars), with tolerances by dtype from
ops_testing.py.

Hypothesis draws the shapes, dtypes, layouts and a seed; the values come from NumPy's generator with that
seed, in each op's domain. The tests run on whichever backend is active (the CPU simulation here, the GPU
where there is one). The default example count keeps the file well under a minute on two CPU cores;
``HYPOTHESIS_PROFILE=long`` runs 2000 examples per test (``=ci`` keeps the default).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from ops_testing import Array, assert_matches, compute_eps, poison, sample, tolerance

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import DTypeError, ShapeError

_EXAMPLES = {"long": 2000}.get(os.environ.get("HYPOTHESIS_PROFILE", ""), 150)
PROPERTY = settings(
    max_examples=_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ALL = [d for d in gp.dtypes.all_dtypes() if not d.packed]
FLOATS = [d for d in ALL if d.is_floating]
F64 = np.float64
LAYOUTS = ("contiguous", "offset", "reversed", "strided", "transposed")

dtypes = st.sampled_from(ALL)
seeds = st.integers(0, 2**32 - 1)
layouts = st.sampled_from(LAYOUTS)
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)


def place(values: Array, layout: str) -> gp.GPUArray:
    """A device array holding ``values`` with the given layout (each a view of a larger upload, except
    ``contiguous``); 0-d and 1-D arrays take the layouts that exist for them."""
    if layout == "offset" and values.ndim >= 1:
        padded = np.concatenate([values[:1] if values.shape[0] else np.zeros((1, *values.shape[1:]), values.dtype),
                                 values])  # fmt: skip
        return gp.from_numpy(padded)[1:]
    if layout == "reversed" and values.ndim >= 1:
        return gp.from_numpy(np.ascontiguousarray(values[::-1]))[::-1]
    if layout == "strided" and values.ndim >= 1:
        wide = np.zeros((*values.shape[:-1], values.shape[-1] * 2 + 1), values.dtype)
        wide[..., 1::2] = values
        return gp.from_numpy(wide)[..., 1::2]
    if layout == "transposed" and values.ndim >= 2:
        return gp.from_numpy(np.ascontiguousarray(values.T)).T
    return gp.from_numpy(values)


def host(values: Any) -> Array:
    return np.asarray(values.to_numpy() if isinstance(values, gp.GPUArray) else values)


_NOT_NUMPY = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def numpy_promotion(*operands: Any) -> Any:
    """NumPy's result dtype where every operand is one of NumPy's own types (not bfloat16 or fp8), else None."""
    if any(isinstance(o, np.ndarray) and o.dtype.name in _NOT_NUMPY for o in operands):
        return None
    return np.result_type(*operands)


# -- elementwise binary ---------------------------------------------------------------------------------
# name: (function, accepted kinds of the promoted dtype, domain of x2, float64 reference)
BINARY: dict[str, tuple[Callable[..., gp.GPUArray], str, tuple[float, float], Callable[[Array, Array], Array]]] = {
    "add": (gp.add, "biuf", (-8, 8), np.add),
    "sub": (gp.sub, "iuf", (-8, 8), np.subtract),
    "mul": (gp.mul, "biuf", (-8, 8), np.multiply),
    "div": (gp.div, "biuf", (1, 8), np.divide),
    "maximum": (gp.maximum, "biuf", (-8, 8), np.maximum),
    "minimum": (gp.minimum, "biuf", (-8, 8), np.minimum),
    "lt": (gp.lt, "biuf", (-3, 3), np.less),
    "eq": (gp.eq, "biuf", (-3, 3), np.equal),
    "logical_and": (gp.logical_and, "biuf", (-2, 2), lambda a, b: np.logical_and(a != 0, b != 0)),
}
_BOOL_RESULT = {"lt", "eq", "logical_and"}


def _exact_binary(name: str, a: Array, b: Array, result: DType) -> Array:
    """The reference for integer and bool results, in NumPy's own arithmetic of the result dtype."""
    with np.errstate(all="ignore"):
        x, y = a.astype(result.numpy), b.astype(result.numpy)
        if result.kind == "b" and name == "add":
            return np.asarray(np.logical_or(x, y))
        if result.kind == "b" and name == "mul":
            return np.asarray(np.logical_and(x, y))
        return BINARY[name][3](x, y)


@PROPERTY
@given(
    name=st.sampled_from(sorted(BINARY)),
    shapes2=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=0, max_side=4),
    dtype1=dtypes,
    dtype2=dtypes,
    layout1=layouts,
    layout2=layouts,
    scalar=st.sampled_from([None, None, "int", "float", "bool"]),
    use_out=st.booleans(),
    seed=seeds,
)
def test_binary_matches_numpy(
    name: str, shapes2: Any, dtype1: DType, dtype2: DType, layout1: str, layout2: str, scalar: Any,
    use_out: bool, seed: int,
) -> None:  # fmt: skip
    function, kinds, domain2, reference = BINARY[name]
    rng = np.random.default_rng(seed)
    (shape1, shape2), shape = shapes2.input_shapes, shapes2.result_shape
    low = 0 if dtype1.kind == "u" else -8
    a = sample(rng, shape1, dtype1, low, 8)
    x1 = place(a, layout1)
    if scalar is None:
        b = sample(rng, shape2, dtype2, max(domain2[0], 0) if dtype2.kind == "u" else domain2[0], domain2[1])
        x2: Any = place(b, layout2)
        operand2: Any = b
    else:  # a weak Python scalar, within every dtype's range
        x2 = {"int": int(rng.integers(1, 8)), "float": float(rng.integers(2, 16)) / 2, "bool": True}[scalar]
        b, operand2 = np.asarray(x2, F64), x2
        shape = tuple(shape1)
    result = gp.result_type(x1, x2)
    native = numpy_promotion(a, operand2)
    if native is not None:
        assert result.numpy == native, (a.dtype, operand2, result, native)
    if result.kind not in kinds:
        with pytest.raises(DTypeError):
            function(x1, x2)
        return
    expected_dtype = gp.bool_ if name in _BOOL_RESULT else result
    if name == "div" and not result.is_floating:
        expected_dtype = gp.float64
    out = poison(shape, expected_dtype) if use_out else None
    got = function(x1, x2, out=out)
    assert got.shape == shape
    assert got.dtype == expected_dtype
    if out is not None:
        assert got is out
    if expected_dtype.is_floating:
        with np.errstate(all="ignore"):
            want = reference(a.astype(F64), b.astype(F64))
        assert_matches(host(got), np.broadcast_to(want, shape), expected_dtype, compute_ulps=1, what=name)
    else:
        want = _exact_binary(name, a, b if scalar is None else np.asarray(x2), result)
        assert_matches(host(got), np.broadcast_to(want, shape), expected_dtype, what=name)
    assert np.array_equal(host(x1), a), "an input changed"


# -- elementwise unary ----------------------------------------------------------------------------------
UNARY: dict[str, tuple[Callable[..., gp.GPUArray], str, tuple[float, float], Callable[[Array], Array], float]] = {
    "neg": (gp.neg, "iuf", (-50, 50), np.negative, 0),
    "abs": (gp.abs, "biuf", (-50, 50), np.abs, 0),
    "relu": (gp.relu, "iuf", (-50, 50), lambda x: np.where(x < 0, 0, x), 0),
    "exp": (gp.exp, "biuf", (-4, 4), np.exp, 16),
    "log": (gp.log, "biuf", (0.1, 50), np.log, 16),
    "sqrt": (gp.sqrt, "biuf", (0, 50), np.sqrt, 16),
    "sin": (gp.sin, "biuf", (-4, 4), np.sin, 16),
    "tanh": (gp.tanh, "biuf", (-6, 6), np.tanh, 16),
    "sigmoid": (gp.sigmoid, "biuf", (-8, 8), lambda x: 1 / (1 + np.exp(-x)), 16),
}


def _math_dtype(dtype: DType) -> DType:
    """NumPy's float for math on ``dtype``: 8-bit and bool float16, 16-bit float32, wider float64."""
    if dtype.is_floating:
        return dtype
    return {1: gp.float16, 2: gp.float32}.get(dtype.itemsize, gp.float64)


@PROPERTY
@given(name=st.sampled_from(sorted(UNARY)), shape=shapes, dtype=dtypes, layout=layouts, use_out=st.booleans(),
       seed=seeds)  # fmt: skip
def test_unary_matches_numpy(name: str, shape: Any, dtype: DType, layout: str, use_out: bool, seed: int) -> None:
    function, kinds, (low, high), reference, ulps = UNARY[name]
    rng = np.random.default_rng(seed)
    values = sample(rng, shape, dtype, max(low, 0) if dtype.kind == "u" else low, high)
    x = place(values, layout)
    if dtype.kind not in kinds:
        with pytest.raises(DTypeError):
            function(x)
        return
    exact = ulps == 0
    result = dtype if exact else _math_dtype(dtype)
    out = poison(shape, result) if use_out else None
    got = function(x, out=out)
    assert got.shape == tuple(shape)
    assert got.dtype == result
    if exact and not dtype.is_floating:
        with np.errstate(all="ignore"):
            want = reference(values)
        assert_matches(host(got), want, result, what=name)
    else:
        with np.errstate(all="ignore"):
            want = reference(values.astype(F64))
        assert_matches(host(got), want, result, compute_ulps=max(ulps, 1), what=name)


# -- reductions -----------------------------------------------------------------------------------------
REDUCTIONS = ("sum", "mean", "max", "min", "argmax", "argmin", "any", "all", "var", "std", "cumsum")


def _reduction_dtype(name: str, dtype: DType) -> DType:
    if name in ("argmax", "argmin"):
        return gp.int64
    if name in ("any", "all"):
        return gp.bool_
    if name in ("max", "min"):
        return dtype
    if dtype.is_floating:
        return dtype
    if name in ("mean", "var", "std"):
        return gp.float64
    return gp.uint64 if dtype.kind == "u" else gp.int64


@st.composite
def _axis(draw: st.DrawFn, ndim: int, single: bool) -> Any:
    if ndim == 0:
        return None
    choice = draw(st.sampled_from(["none", "int", "tuple"] if not single else ["none", "int"]))
    if choice == "none":
        return None
    if choice == "int":
        return draw(st.integers(-ndim, ndim - 1))
    axes = draw(st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim))
    return tuple(a - ndim if draw(st.booleans()) else a for a in axes)


@PROPERTY
@given(name=st.sampled_from(REDUCTIONS), shape=shapes, dtype=dtypes, layout=layouts, keepdims=st.booleans(),
       data=st.data(), seed=seeds)  # fmt: skip
def test_reductions_match_numpy(
    name: str, shape: Any, dtype: DType, layout: str, keepdims: bool, data: st.DataObject, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    values = sample(rng, shape, dtype, 0 if dtype.kind == "u" else -4, 4)
    x = place(values, layout)
    axis = data.draw(_axis(len(shape), single=name in ("argmax", "argmin", "cumsum")), label="axis")
    function = getattr(gp, name)
    kwargs: dict[str, Any] = {} if name == "cumsum" else {"keepdims": keepdims}
    wide = values.astype(F64)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's "mean of empty slice"
            want = getattr(np, name)(wide, axis=axis, **kwargs)
    except ValueError:  # an empty selection without identity: max, min, argmax, argmin
        with pytest.raises(ShapeError):
            function(x, axis=axis, **kwargs)
        return
    got = function(x, axis=axis, **kwargs)
    result = _reduction_dtype(name, dtype)
    want = np.asarray(want)
    assert got.dtype == result, (name, got.dtype)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    actual = host(got)
    if name in ("sum", "cumsum") and not dtype.is_floating:
        want = getattr(np, name)(values.astype(result.numpy), axis=axis, **kwargs)
    if not result.is_floating or name in ("max", "min"):
        assert_matches(actual, want, result, what=name)
        return
    # Accumulated error: a few units of the compute type per element folded, on the magnitudes summed.
    count = max(values.size // max(want.size, 1), 1) if name != "cumsum" else max(values.size, 1)
    eps = compute_eps(result)
    rtol, atol = tolerance(result, compute_ulps=2)
    magnitude = np.abs(wide).max(initial=0.0) ** (2 if name == "var" else 1)
    bound = rtol * np.abs(want) + atol + 4 * count * eps * magnitude * (1 if name in ("mean", "var", "std") else count)
    if name == "std":
        bound = rtol * np.abs(want) + atol + np.sqrt(4 * count * eps) * magnitude
    with np.errstate(all="ignore"):
        error = np.abs(actual.astype(F64) - want)
    both_nan = np.isnan(actual.astype(F64)) & np.isnan(want)
    assert np.all((error <= bound) | both_nan), (name, axis, actual, want)


@PROPERTY
@given(shape=shapes.filter(lambda s: len(s) >= 1), dtype=st.sampled_from(FLOATS), layout=layouts, log=st.booleans(),
       data=st.data(), seed=seeds)  # fmt: skip
def test_softmax_matches_numpy(
    shape: Any, dtype: DType, layout: str, log: bool, data: st.DataObject, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    values = sample(rng, shape, dtype, -6, 6)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    got = (gp.log_softmax if log else gp.softmax)(place(values, layout), axis=axis)
    wide = values.astype(F64)
    shifted = wide - wide.max(axis=axis, keepdims=True, initial=-np.inf) if values.size else wide
    with np.errstate(all="ignore"):  # an empty axis
        total = np.exp(shifted).sum(axis=axis, keepdims=True)
        want = shifted - np.log(total) if log else np.exp(shifted) / total
    assert got.dtype == dtype
    assert got.shape == tuple(shape)
    rtol, _ = tolerance(dtype, compute_ulps=16)
    atol = 32 * compute_eps(dtype) * (1 + np.abs(wide).max(initial=0.0))
    if dtype in (gp.float8_e4m3fn, gp.float8_e5m2):
        atol = max(atol, 2.0**-9 if dtype == gp.float8_e4m3fn else 2.0**-16)
    with np.errstate(all="ignore"):
        rounded = want.astype(dtype.numpy).astype(F64)
    np.testing.assert_allclose(host(got).astype(F64), rounded, rtol=rtol, atol=atol)


# -- where and clamp -------------------------------------------------------------------------------------
@PROPERTY
@given(
    shapes3=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, min_side=0, max_side=4),
    cond_dtype=dtypes,
    dtype1=dtypes,
    dtype2=dtypes,
    layouts3=st.tuples(layouts, layouts, layouts),
    seed=seeds,
)
def test_where_matches_numpy(
    shapes3: Any, cond_dtype: DType, dtype1: DType, dtype2: DType, layouts3: tuple[str, str, str], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    (sc, s1, s2), shape = shapes3.input_shapes, shapes3.result_shape
    cond = sample(rng, sc, cond_dtype, 0, 2)
    x, y = sample(rng, s1, dtype1, 0, 6), sample(rng, s2, dtype2, 0, 6)
    got = gp.where(place(cond, layouts3[0]), place(x, layouts3[1]), place(y, layouts3[2]))
    result = gp.promote_types(dtype1, dtype2)
    assert got.dtype == result
    assert got.shape == shape
    want = np.where(cond.astype(F64) != 0, x.astype(F64), y.astype(F64))
    assert_matches(host(got), want, result, what="where")


def test_where_promotes_bfloat16_and_fp8_with_numpy_types() -> None:
    # Found by test_where_matches_numpy: the CPU backend handed NumPy float16 with bfloat16, which it
    # cannot promote (DTypePromotionError) instead of converting both to the promoted dtype first.
    cond = gp.from_numpy(np.array([True, False, True]))
    for a, b in ((gp.float16, gp.bfloat16), (gp.int8, gp.float8_e4m3fn), (gp.float8_e5m2, gp.float32)):
        got = gp.where(cond, gp.full(3, 2, a), gp.full(3, 3, b))
        assert got.dtype == gp.promote_types(a, b)
        assert got.to_numpy().astype(F64).tolist() == [2.0, 3.0, 2.0]


@PROPERTY
@given(
    shapes3=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, min_side=0, max_side=4),
    dtype=dtypes,
    bounds=st.sampled_from(["array", "int", "float"]),
    which=st.sampled_from(["both", "min", "max", "neither"]),
    layout=layouts,
    seed=seeds,
)
def test_clamp_matches_numpy(shapes3: Any, dtype: DType, bounds: str, which: str, layout: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    (s0, s1, s2) = shapes3.input_shapes
    values = sample(rng, s0, dtype, 0 if dtype.kind == "u" else -8, 8)
    x = place(values, layout)
    if bounds == "array":
        lo_host = sample(rng, s1, dtype, 0 if dtype.kind == "u" else -4, 2)
        hi_host = sample(rng, s2, dtype, 2, 6)
        lo: Any = place(lo_host, "contiguous")
        hi: Any = place(hi_host, "strided")
    else:
        lo, hi = (1, 5) if bounds == "int" else (1.5, 5.5)
        lo_host, hi_host = np.asarray(lo), np.asarray(hi)
    lo = None if which in ("max", "neither") else lo
    hi = None if which in ("min", "neither") else hi
    if lo is None and hi is None:
        with pytest.raises(gp.ArgumentError):
            gp.clamp(x, lo, hi)
        return
    result = gp.result_type(*(o for o in (x, lo, hi) if o is not None))
    if result.kind == "b":
        with pytest.raises(DTypeError):
            gp.clamp(x, lo, hi)
        return
    got = gp.clamp(x, lo, hi)
    wide = values.astype(F64)
    if lo is not None:
        wide = np.maximum(wide, lo_host.astype(F64))
    if hi is not None:
        wide = np.minimum(wide, hi_host.astype(F64))
    assert got.dtype == result
    assert got.shape == wide.shape
    assert_matches(host(got), wide, result, what="clamp")


# -- shape ops ------------------------------------------------------------------------------------------
@PROPERTY
@given(shape=shapes, parts=st.lists(st.tuples(dtypes, layouts, st.integers(0, 3)), min_size=1, max_size=3),
       stack=st.booleans(), data=st.data(), seed=seeds)  # fmt: skip
def test_concatenate_and_stack_match_numpy(
    shape: Any, parts: list[tuple[DType, str, int]], stack: bool, data: st.DataObject, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    ndim = len(shape)
    if not stack and ndim == 0:
        shape, ndim = (2,), 1
    axis = data.draw(st.integers(-(ndim + 1), ndim) if stack else st.integers(-ndim, ndim - 1), label="axis")
    arrays = []
    for dtype, _, extent in parts:
        part_shape = list(shape)
        if not stack:
            part_shape[axis] = extent
        arrays.append(sample(rng, tuple(part_shape), dtype, 0, 8))
    devices = [place(a, layout) for a, (_, layout, _) in zip(arrays, parts, strict=True)]
    got = (gp.stack if stack else gp.concatenate)(devices, axis=axis)
    result = gp.result_type(*devices)
    want = (np.stack if stack else np.concatenate)([a.astype(F64) for a in arrays], axis=axis)
    assert got.dtype == result
    assert got.shape == want.shape
    assert_matches(host(got), want, result, what="stack" if stack else "concatenate")


@PROPERTY
@given(shape=shapes, dtype=dtypes, layout=layouts, data=st.data(), seed=seeds)
def test_transpose_matches_numpy(shape: Any, dtype: DType, layout: str, data: st.DataObject, seed: int) -> None:
    values = sample(np.random.default_rng(seed), shape, dtype, 0, 100)
    axes = data.draw(st.none() | st.permutations(range(len(shape))).map(tuple), label="axes")
    got = gp.transpose(place(values, layout), axes)
    want = np.transpose(values, axes)
    assert got.is_contiguous
    assert got.dtype == dtype
    assert got.shape == want.shape
    assert host(got).tobytes() == np.ascontiguousarray(want).tobytes()


# -- matmul ---------------------------------------------------------------------------------------------
_MATMUL_TOL = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1e-2, "int8": 0.0}


@PROPERTY
@given(
    dtype=st.sampled_from([gp.float32, gp.float64, gp.float16, gp.bfloat16, gp.int8]),
    batches=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, min_side=1, max_side=3),
    mnk=st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 6)),
    vectors=st.sampled_from(["", "a", "b", "ab"]),
    transposed=st.tuples(st.booleans(), st.booleans()),
    seed=seeds,
)
def test_matmul_matches_numpy(
    dtype: DType, batches: Any, mnk: tuple[int, int, int], vectors: str, transposed: tuple[bool, bool], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    m, n, k = mnk
    (ba, bb) = batches.input_shapes
    shape_a = (k,) if "a" in vectors else (*ba, m, k)
    shape_b = (k,) if "b" in vectors else (*bb, k, n)
    a, b = sample(rng, shape_a, dtype, -4, 4), sample(rng, shape_b, dtype, -4, 4)

    def operand(values: Array, flip: bool) -> gp.GPUArray:
        if not flip or values.ndim < 2:
            return place(values, "contiguous")
        axes = (*range(values.ndim - 2), values.ndim - 1, values.ndim - 2)
        return gp.from_numpy(np.ascontiguousarray(np.transpose(values, axes))).transpose(axes)

    got = gp.matmul(operand(a, transposed[0]), operand(b, transposed[1]), use_tf32=False)
    want = np.matmul(a.astype(F64), b.astype(F64))
    scale = np.matmul(np.abs(a.astype(F64)), np.abs(b.astype(F64)))
    assert got.shape == want.shape
    assert got.dtype == (gp.int32 if dtype == gp.int8 else dtype)
    error = np.abs(host(got).astype(F64) - want)
    bound = _MATMUL_TOL[dtype.name] * scale + (0 if dtype == gp.int8 else 1e-30)
    assert np.all(error <= bound), (error.max(initial=0), bound)


# -- astype ---------------------------------------------------------------------------------------------
@PROPERTY
@given(shape=shapes, source=dtypes, target=dtypes, layout=layouts, seed=seeds)
def test_astype_matches_numpy(shape: Any, source: DType, target: DType, layout: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Within every target's range; negative or NaN floats into unsigned integers are undefined (as in C).
    low = 0 if target.kind == "u" or source.kind == "u" else -8
    values = sample(rng, shape, source, low, 8)
    x = place(values, layout)
    got = gp.astype(x, target)
    assert got.dtype == target
    assert got.shape == tuple(shape)
    if target.is_floating:
        assert_matches(host(got), values.astype(F64), target, compute_ulps=0, what="astype")
    elif target.kind == "b":
        assert np.array_equal(host(got), values.astype(F64) != 0)
    else:
        assert np.array_equal(host(got), np.trunc(values.astype(F64)).astype(target.numpy))
    assert host(x).tobytes() == values.tobytes(), "the source changed"
