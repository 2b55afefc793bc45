"""Reductions, cumsum and softmax against float64 / exact NumPy references, and their determinism.

Sums, products, cumulative sums and the extremes use integer-valued data, so the exact result is known
and the comparison is exact after one rounding to the result dtype; var, std, mean and softmax compare
with tolerances. Each size runs full reductions (contiguous and strided), long rows, short rows, column
reductions, transposed views and tuple axes. CI runs small sizes on the CPU backend; the ``gpu`` tests
use 1, 3, 1023 and 2**20 + 7 and check that ten runs give bitwise identical results.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from ops_testing import (
    DTYPES,
    FLOATS,
    SIZES,
    SMALL_SIZES,
    Array,
    assert_matches,
    poison_pool,
    sample,
    tolerance,
    upload,
)

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.ops import reduction
from pygpukit.testing import assert_bitwise_equal

F64 = np.float64


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def sum_dtype(dtype: DType) -> DType:
    if dtype.is_floating:
        return dtype
    return gp.uint64 if dtype.kind == "u" else gp.int64


def mean_dtype(dtype: DType) -> DType:
    return dtype if dtype.is_floating else gp.float64


def _wide(x: Array, dtype: DType) -> Array:
    """Exact values: float64 for floats, int64/uint64 for integers and bool."""
    if dtype.is_floating:
        return x.astype(F64)
    return x.astype(np.uint64 if dtype.kind == "u" else np.int64)


def _moments_reference(fn: Callable[..., Any]) -> Callable[..., Array]:
    """var/std in extended precision: NumPy sums along a non-contiguous axis one element after another,
    which in float64 is less accurate than the kernels' blocked trees."""

    def reference(x: Array, axis: Any, keepdims: bool) -> Array:
        result: Array = fn(x.astype(np.longdouble), axis=axis, keepdims=keepdims).astype(F64)
        return result

    return reference


# name: (function, result dtype, data(rng, shape, dtype), reference(exact values, axis, keepdims), ulps)
def _small_integers(rng: np.random.Generator, shape: Any, dtype: DType) -> Array:
    wide = dtype in (gp.float32, gp.float64) or (dtype.kind in "iu" and dtype.itemsize > 1)
    low, high = (-8, 8) if wide else (-1, 1)
    return sample(rng, shape, dtype, 0 if dtype.kind == "u" else low, high, integral=True)


def _signs(rng: np.random.Generator, shape: Any, dtype: DType) -> Array:
    if dtype.kind in "bu":
        return np.ones(shape, dtype.numpy)
    values = rng.choice(np.array([-1, 1]), size=shape).astype(dtype.numpy)
    flat = values.reshape(-1)
    flat[rng.integers(0, flat.size, 3)] = 2  # a product of a few 2s stays exact
    return values


def _spread(rng: np.random.Generator, shape: Any, dtype: DType) -> Array:
    return sample(rng, shape, dtype, 0 if dtype.kind == "u" else -50, 50)


def _ties(rng: np.random.Generator, shape: Any, dtype: DType) -> Array:
    return sample(rng, shape, dtype, 0 if dtype.kind == "u" else -3, 3, integral=True)


def _sparse(rng: np.random.Generator, shape: Any, dtype: DType) -> Array:
    return (rng.random(shape) < 0.02).astype(dtype.numpy)


def _dense(rng: np.random.Generator, shape: Any, dtype: DType) -> Array:
    return (rng.random(shape) < 0.999).astype(dtype.numpy)


def _argmax_reference(fn: Callable[..., Any]) -> Callable[[Array, Any, bool], Array]:
    def reference(x: Array, axis: Any, keepdims: bool) -> Array:
        if isinstance(axis, tuple):
            raise AssertionError("argmax takes one axis")
        return fn(x, axis=axis, keepdims=keepdims)  # type: ignore[no-any-return]

    return reference


REDUCTIONS: dict[str, tuple[Callable[..., gp.GPUArray], Callable[[DType], DType], Any, Any, float]] = {
    "sum": (gp.sum, sum_dtype, _small_integers, np.sum, 0),
    "prod": (gp.prod, sum_dtype, _signs, np.prod, 0),
    "max": (gp.max, lambda d: d, _spread, np.max, 0),
    "min": (gp.min, lambda d: d, _spread, np.min, 0),
    "argmax": (gp.argmax, lambda d: gp.int64, _ties, _argmax_reference(np.argmax), 0),
    "argmin": (gp.argmin, lambda d: gp.int64, _ties, _argmax_reference(np.argmin), 0),
    "any": (gp.any, lambda d: gp.bool_, _sparse, np.any, 0),
    "all": (gp.all, lambda d: gp.bool_, _dense, np.all, 0),
    "mean": (gp.mean, mean_dtype, _small_integers, np.mean, 2),
    "var": (gp.var, mean_dtype, _spread, _moments_reference(np.var), 2000),
    "std": (gp.std, mean_dtype, _spread, _moments_reference(np.std), 2000),
}


def _layouts(n: int) -> list[tuple[str, tuple[int, ...], Any, str]]:
    """(label, host shape, axis, how to view the device array)."""
    return [
        ("full", (n,), None, "plain"),
        ("full strided", (2 * n,), None, "every other"),
        ("long rows", (3, n), 1, "plain"),
        ("long rows keepdims", (3, n), -1, "keepdims"),
        ("columns", (n, 3), 0, "plain"),
        ("columns side by side", (5, n + (-n) % 16), 0, "plain"),  # whole 16-byte packs of columns
        ("short rows", (n, 3), 1, "plain"),
        ("transposed", (3, n), 0, "transpose"),
        ("tuple axis", (2, n, 3), (0, 2), "plain"),
    ]


def check_reduction(name: str, dtype: DType, sizes: list[int], rng: np.random.Generator) -> None:
    fn, result, data, reference, ulps = REDUCTIONS[name]
    result_dtype = result(dtype)
    for n in sizes:
        for label, shape, axis, view in _layouts(n):
            if name in ("argmax", "argmin") and isinstance(axis, tuple):
                continue
            host = data(rng, shape, dtype)
            device = upload(host)
            keepdims = view == "keepdims"
            if view == "every other":
                host, device = host[::2], device[::2]
            elif view == "transpose":
                host, device = host.T, device.T
            with np.errstate(all="ignore"):
                expected = np.asarray(reference(_wide(host, dtype), axis=axis, keepdims=keepdims))
            poison_pool(expected.shape, result_dtype)
            got = fn(device, axis=axis, keepdims=keepdims)
            what = f"{name} {dtype} n={n} {label}"
            assert got.shape == expected.shape, what
            assert_matches(got.to_numpy(), expected, result_dtype, ulps, what)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduction(name: str, dtype: DType, rng: np.random.Generator) -> None:
    check_reduction(name, dtype, SMALL_SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduction_gpu(name: str, dtype: DType, rng: np.random.Generator) -> None:
    check_reduction(name, dtype, SIZES, rng)


def check_nan_and_float_sums(dtype: DType, sizes: list[int], rng: np.random.Generator) -> None:
    for n in sizes:
        x = sample(rng, n, dtype, -50, 50)
        x[n // 2] = np.nan
        device = upload(x)
        assert np.isnan(gp.max(device).to_numpy())
        assert np.isnan(gp.min(device).to_numpy())
        assert gp.argmax(device).to_numpy() == n // 2 == gp.argmin(device).to_numpy()
        # Random (not integer) data: the blocked pairwise float sum against float64 (the mean for
        # narrow types, whose range a sum of a million values exceeds).
        y = sample(rng, (2, n), dtype, 0, 1)
        narrow = dtype not in (gp.float32, gp.float64)
        exact = y.astype(F64).mean(axis=1) if narrow else y.astype(F64).sum(axis=1)
        got = (gp.mean if narrow else gp.sum)(upload(y), axis=1).to_numpy().astype(F64)
        rtol, _ = tolerance(dtype, 256)  # 256 compute ulps: runs of <= 128 elements and trees above them
        bound = rtol * np.abs(exact)
        assert np.all(np.abs(got - exact) <= bound + 1e-300), (dtype, n, got, exact)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_and_float_sums(dtype: DType, rng: np.random.Generator) -> None:
    check_nan_and_float_sums(dtype, SMALL_SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_and_float_sums_gpu(dtype: DType, rng: np.random.Generator) -> None:
    check_nan_and_float_sums(dtype, SIZES, rng)


# -- cumsum -----------------------------------------------------------------------------------------
def check_cumsum(dtype: DType, sizes: list[int], rng: np.random.Generator) -> None:
    result_dtype = sum_dtype(dtype)
    for n in sizes:
        for label, shape, axis in (("flat", (n,), None), ("long rows", (3, n), 1), ("columns", (n, 3), 0),
                                   ("short rows", (n, 3), 1)):  # fmt: skip
            low = 0 if dtype.kind == "u" else -2
            host = sample(rng, shape, dtype, low, 2, integral=True)
            expected = np.cumsum(_wide(host, dtype), axis=axis)
            poison_pool(expected.shape, result_dtype)
            got = gp.cumsum(upload(host), axis=axis)
            assert_matches(got.to_numpy(), expected, result_dtype, 0, f"cumsum {dtype} n={n} {label}")
        strided_host = sample(rng, (4, n), dtype, low, 2, integral=True)
        got = gp.cumsum(upload(strided_host)[::2], axis=1)
        assert_matches(got.to_numpy(), np.cumsum(_wide(strided_host[::2], dtype), axis=1), result_dtype, 0,
                       f"cumsum {dtype} n={n} strided rows")  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cumsum(dtype: DType, rng: np.random.Generator) -> None:
    check_cumsum(dtype, SMALL_SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cumsum_gpu(dtype: DType, rng: np.random.Generator) -> None:
    check_cumsum(dtype, SIZES, rng)


# -- softmax ----------------------------------------------------------------------------------------
def softmax_reference(x: Array, axis: int, log: bool) -> Array:
    shifted = x - x.max(axis=axis, keepdims=True)
    total = np.exp(shifted).sum(axis=axis, keepdims=True)
    result: Array = shifted - np.log(total) if log else np.exp(shifted) / total
    return result


def _softmax_layouts(n: int) -> list[tuple[str, tuple[int, ...], int, str]]:
    return [("row", (n,), -1, "plain"), ("rows", (3, n), -1, "plain"), ("columns", (n, 3), 0, "plain"),
            ("strided rows", (3, 2 * n), 1, "every other"), ("transposed", (3, n), 0, "transpose")]  # fmt: skip


def check_softmax(dtype: DType, sizes: list[int], rng: np.random.Generator) -> None:
    for n in sizes:
        for label, shape, axis, view in _softmax_layouts(n):
            host = sample(rng, shape, dtype, -8, 8)
            device = upload(host)
            if view == "every other":
                host, device = host[:, ::2], device[:, ::2]
            elif view == "transpose":
                host, device = host.T, device.T
            for log, fn in ((False, gp.softmax), (True, gp.log_softmax)):
                poison_pool(host.shape, dtype)
                expected = softmax_reference(host.astype(np.longdouble), axis, log).astype(F64)
                assert_matches(fn(device, axis=axis).to_numpy(), expected, dtype, 64,
                               f"{fn.__name__} {dtype} n={n} {label}")  # fmt: skip


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_softmax(dtype: DType, rng: np.random.Generator) -> None:
    check_softmax(dtype, SMALL_SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_softmax_gpu(dtype: DType, rng: np.random.Generator) -> None:
    check_softmax(dtype, SIZES, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gp.float32, gp.bfloat16, gp.float16, gp.float64, gp.float8_e4m3fn], ids=str)
def test_softmax_rows_held_in_registers_gpu(dtype: DType, rng: np.random.Generator) -> None:
    # Row lengths that pick each register plan of softmax_rows_held (1 to 8 packs per thread, groups of
    # 4 to 1024 threads) and the longest rows that still fit, plus ragged tails.
    for rows, count in [(7, 5), (300, 33), (64, 1000), (260, 4097), (256, 8192), (300, 8193), (256, 20000)]:
        host = sample(rng, (rows, count), dtype, -8, 8)
        device = upload(host)
        for log, fn in ((False, gp.softmax), (True, gp.log_softmax)):
            poison_pool(host.shape, dtype)
            expected = softmax_reference(host.astype(np.longdouble), -1, log).astype(F64)
            assert_matches(fn(device, axis=-1).to_numpy(), expected, dtype, 64,
                           f"{fn.__name__} {dtype} {rows}x{count}")  # fmt: skip


# Row lengths around the kernels' limits: softmax_rows_held (8192 elements of 2 and 4 bytes),
# softmax_rows_shared (rows of up to 128 KiB: 32768 float32, 65536 bf16/fp16) and the two-pass
# softmax_rows beyond; odd lengths make every row after the first misaligned (element loads).
SHARED_ROW_WIDTHS = [8191, 8193, 16383, 16384, 16385, 32767, 32768, 65536, 65537]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gp.float32, gp.float16, gp.bfloat16, gp.float64], ids=str)
def test_softmax_rows_in_shared_memory_gpu(dtype: DType, rng: np.random.Generator) -> None:
    # 256 rows past 16384 elements (fewer rows of that length go through the statistics and an
    # elementwise pass: the last case), 5 rows below.
    for rows, count in [*((256 if n > 16384 else 5, n) for n in SHARED_ROW_WIDTHS), (5, 32768)]:
        host = sample(rng, (rows, count), dtype, -8, 8)
        device = upload(host)
        for log, fn in ((False, gp.softmax), (True, gp.log_softmax)):
            poison_pool(host.shape, dtype)
            expected = softmax_reference(host.astype(np.longdouble), -1, log).astype(F64)
            assert_matches(fn(device, axis=-1).to_numpy(), expected, dtype, 64,
                           f"{fn.__name__} {dtype} {rows}x{count}")  # fmt: skip
    # A row offset by one element (a misaligned start) and a row with its own NaN and -inf.
    host = sample(rng, (256, 32769), dtype, -8, 8)
    host[7, 3] = np.nan
    host[9, :] = -np.inf
    host[11, 5] = -np.inf
    view = upload(host)[:, 1:]
    for log, fn in ((False, gp.softmax), (True, gp.log_softmax)):
        with np.errstate(invalid="ignore"):
            expected = softmax_reference(host[:, 1:].astype(np.longdouble), -1, log).astype(F64)
        assert_matches(fn(view, axis=-1).to_numpy(), expected, dtype, 64, f"{fn.__name__} {dtype} offset view")


@pytest.mark.gpu
def test_softmax_plans_pick_the_shared_memory_kernel_gpu() -> None:
    """The rows that motivated softmax_rows_shared (issue 14: bf16 rows of 32768 read twice) take it;
    rows past its limit take the two-pass kernel."""
    for dtype, count, shared in [(gp.bfloat16, 32768, True), (gp.float32, 32768, True), (gp.bfloat16, 65536, True),
                                 (gp.bfloat16, 65537, False), (gp.float32, 8192, False)]:  # fmt: skip
        x = gp.zeros((256, count), dtype)
        plan = reduction._plan_softmax(x, x._strides, 1, False)
        assert (plan.shared_mem > 0) == shared, (dtype, count, plan.kernel)
        assert plan.stats is None, (dtype, count)
    # Row lengths sharing the kernel, alternately (each plan keeps the shared memory its launch needs):
    # uniform rows give 1 / count (the float32 reciprocal, rounded to bf16).
    for count in (65536, 32768, 65536, 20000, 32768):
        result = gp.softmax(gp.zeros((256, count), gp.bfloat16), axis=-1).to_numpy()
        expected = np.full((256, count), np.float32(1) / np.float32(count), np.float32).astype(gp.bfloat16.numpy)
        np.testing.assert_array_equal(result, expected, err_msg=str(count))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gp.bfloat16, gp.float32], ids=str)
def test_shared_softmax_and_swept_sum_are_deterministic_and_replay_gpu(dtype: DType, rng: np.random.Generator) -> None:
    """The same input gives the same bits on every call, and a CUDA-graph replay gives the eager bits:
    softmax rows held in shared memory, and split sums whose blocks sweep the row together (including
    a misaligned start, whose packs are element loads)."""
    x = upload(sample(rng, (300, 32768), dtype, -4, 4))
    whole = upload(sample(rng, 2**22 + 3, dtype, -1, 1))
    cases = [lambda: gp.softmax(x, axis=-1), lambda: gp.log_softmax(x, axis=-1), lambda: gp.sum(whole),
             lambda: gp.sum(whole[1:]), lambda: gp.mean(whole), lambda: gp.argmax(whole)]  # fmt: skip
    expected = [fn().to_numpy() for fn in cases]
    for _ in range(3):
        for fn, want in zip(cases, expected, strict=True):
            poison_pool(want.shape, want.dtype)
            assert_bitwise_equal(fn().to_numpy(), want)
    host = whole.to_numpy().astype(F64)
    exact = host.sum()
    assert abs(float(expected[2]) - exact) <= 1e-5 * np.abs(host).sum(), (float(expected[2]), exact)
    assert int(expected[5]) == int(np.argmax(host))
    assert_replay_gives(cases, expected)


def test_shared_softmax_plan_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """softmax_rows_shared's launch: a power of two of threads aiming at 8 packs each, one pack of
    shared memory per 16 bytes of row (rounded up), nothing past 128 KiB or the device's opt-in limit."""
    monkeypatch.setattr(reduction, "_shared_limit", lambda device: 227 * 1024 - 256)  # an H100's
    for count, width, want in [(32768, 8, (512, 65536)), (32767, 8, (512, 65536)), (16385, 8, (512, 32784)),
                               (32768, 4, (512, 131072)), (65536, 8, (512, 131072)), (8193, 4, (512, 32784)),
                               (1000, 8, (128, 2000)), (65537, 8, None), (32769, 4, None),
                               (16385, 2, None)]:  # fmt: skip
        assert reduction._shared_plan(count, width) == want, (count, width)
    monkeypatch.setattr(reduction, "_shared_limit", lambda device: 99 * 1024 - 256)  # sm_86 / sm_89
    assert reduction._shared_plan(32768, 8) == (512, 65536)
    assert reduction._shared_plan(65536, 8) is None


# -- determinism ------------------------------------------------------------------------------------
DETERMINISM_CASES: list[tuple[str, Callable[[gp.GPUArray], gp.GPUArray]]] = [
    ("sum", lambda x: gp.sum(x)),
    ("sum rows", lambda x: gp.sum(x, axis=-1)),
    ("sum columns", lambda x: gp.sum(x, axis=0)),
    ("mean", lambda x: gp.mean(x)),
    ("var", lambda x: gp.var(x, axis=-1)),
    ("std", lambda x: gp.std(x)),
    ("argmax", lambda x: gp.argmax(x, axis=-1)),
    ("softmax", lambda x: gp.softmax(x, axis=-1)),
    ("log_softmax columns", lambda x: gp.log_softmax(x, axis=0)),
    ("cumsum", lambda x: gp.cumsum(x, axis=-1)),
]


def check_determinism(dtype: DType, shapes: list[tuple[int, ...]], rng: np.random.Generator) -> None:
    for shape in shapes:
        device = upload(sample(rng, shape, dtype, -1, 1))
        for label, fn in DETERMINISM_CASES:
            first = fn(device).to_numpy()
            for _ in range(9):
                poison_pool(first.shape, first.dtype)
                assert_bitwise_equal(fn(device).to_numpy(), first)
            assert first.size, label


@pytest.mark.parametrize("dtype", [gp.float32, gp.float16], ids=str)
def test_determinism(dtype: DType, rng: np.random.Generator) -> None:
    check_determinism(dtype, [(5, 301)], rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_determinism_gpu(dtype: DType, rng: np.random.Generator) -> None:
    check_determinism(dtype, [(2**20 + 7,), (37, 2**16 + 3), (2**14 + 1, 61), (1029, 4096)], rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gp.float32, gp.bfloat16], ids=str)
def test_split_rows_give_the_same_bits_every_way_gpu(
    dtype: DType, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long rows are split across blocks (which sweep the row together). The last block of a row
    finishes it (the stream's completion counters); without counters (a capture on a stream that has
    none yet) a second pass does. Both give the same bits, and so does a CUDA-graph replay."""
    x = upload(sample(rng, (3, 2**19 + 5), dtype, -1, 1))
    whole = upload(sample(rng, 2**22 + 3, dtype, -1, 1))
    cases = [lambda: gp.sum(x), lambda: gp.sum(x, axis=-1), lambda: gp.var(x, axis=-1), lambda: gp.argmax(x, axis=-1),
             lambda: gp.max(whole), lambda: gp.sum(whole), lambda: gp.mean(whole)]  # fmt: skip
    expected = [fn().to_numpy() for fn in cases]
    monkeypatch.setattr(reduction, "completion_counters", lambda *args, **kwargs: None)  # the two-pass path
    for fn, want in zip(cases, expected, strict=True):
        assert_bitwise_equal(fn().to_numpy(), want)
    monkeypatch.undo()
    assert_replay_gives(cases, expected)


def assert_replay_gives(cases: list[Callable[[], gp.GPUArray]], expected: list[Array]) -> None:
    """On a new stream, the calls give ``expected`` eagerly, then captured in one CUDA graph, whose
    replays (into outputs overwritten in between) give them again, bitwise."""
    stream = gp.Stream()
    with stream:  # eager first: kernels, counters and pool blocks for this stream exist before the capture
        results = [fn() for fn in cases]  # all alive at once, as in the capture
        for result, want in zip(results, expected, strict=True):
            assert_bitwise_equal(result.to_numpy(), want)
        del results, result  # back to the stream's pool cache
    graph = gp.CudaGraph()
    with graph.capture(stream=stream):
        outs = [fn() for fn in cases]
    for out in outs:
        out.copy_(gp.full(out.shape, np.nan if out.dtype.is_floating else 7, out.dtype))
    for _ in range(2):
        graph.replay()
        graph.synchronize()
        for out, want in zip(outs, expected, strict=True):
            assert_bitwise_equal(out.to_numpy(), want)


@pytest.mark.gpu
def test_repeated_call_shapes_reuse_their_plan_gpu(rng: np.random.Generator) -> None:
    """A call shape is planned once (reduction's PlanCache); fresh data through the cached plan (new
    addresses) gives the reference again: one-pass and split rows, columns, cumsum with chunk carries,
    softmax along rows and, through the statistics and an elementwise pass, along a strided axis."""
    from pygpukit.core.plans import clear_plan_caches

    cases: list[tuple[tuple[int, ...], Callable[[gp.GPUArray], gp.GPUArray], Callable[[Array], Array]]] = [
        ((37, 1000), lambda x: gp.sum(x, axis=-1), lambda h: h.sum(axis=-1)),
        ((3, 2**19 + 5), lambda x: gp.sum(x, axis=-1), lambda h: h.sum(axis=-1)),
        ((1000, 37), lambda x: gp.max(x, axis=0), lambda h: h.max(axis=0)),
        ((5, 20000), lambda x: gp.cumsum(x, axis=1), lambda h: np.cumsum(h, axis=1)),
        ((64, 300), lambda x: gp.softmax(x, axis=-1), lambda h: softmax_reference(h, -1, False)),
        ((300, 64), lambda x: gp.log_softmax(x, axis=0), lambda h: softmax_reference(h, 0, True)),
    ]
    clear_plan_caches()
    for shape, fn, reference in cases:
        for round_ in range(3):
            host = sample(rng, shape, gp.float32, -8, 8, integral=True)
            result = fn(upload(host)).to_numpy()
            if round_ == 0:
                planned = len(reduction._PLANS)
                assert planned >= 1
            assert len(reduction._PLANS) == planned, (shape, "a repeated call shape was planned again")
            np.testing.assert_allclose(result, reference(host.astype(F64)), rtol=1e-5, atol=1e-5)


# -- dtypes, shapes and bad input ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_result_dtypes_follow_numpy(dtype: DType) -> None:
    x = gp.zeros((2, 3), dtype)
    host = np.zeros((2, 3), dtype.numpy if dtype.numpy.kind != "V" else np.float32)
    if dtype in (gp.bfloat16, gp.float8_e4m3fn, gp.float8_e5m2):
        assert gp.sum(x).dtype == dtype
        assert gp.mean(x).dtype == dtype
    else:
        assert gp.sum(x).dtype.numpy == np.sum(host).dtype
        assert gp.prod(x).dtype.numpy == np.prod(host).dtype
        assert gp.mean(x).dtype.numpy == np.mean(host).dtype
        assert gp.var(x).dtype.numpy == np.var(host).dtype
        assert gp.cumsum(x).dtype.numpy == np.cumsum(host).dtype
    assert gp.max(x).dtype == dtype
    assert gp.min(x).dtype == dtype
    assert gp.argmax(x).dtype == gp.int64
    assert gp.any(x).dtype == gp.bool_
    assert gp.sum(x, axis=1, keepdims=True).shape == (2, 1)
    assert gp.sum(x, axis=(0, 1)).shape == ()
    assert gp.sum_axis(x, 0).shape == (3,)


def test_empty_reductions_follow_numpy() -> None:
    empty = gp.zeros((0, 4))
    assert gp.sum(empty).to_numpy() == 0
    assert gp.prod(empty).to_numpy() == 1
    assert gp.sum(empty, axis=0).to_numpy().tolist() == [0, 0, 0, 0]
    assert np.isnan(gp.mean(empty).to_numpy())
    assert not gp.any(empty).to_numpy()
    assert gp.all(empty).to_numpy()
    assert gp.max(empty, axis=1).shape == (0,)
    for fn in (gp.max, gp.min, gp.argmax, gp.argmin):
        with pytest.raises(ShapeError, match="empty"):
            fn(empty)


def test_reduction_errors() -> None:
    x = gp.zeros((2, 3))
    with pytest.raises(ShapeError, match="out of bounds"):
        gp.sum(x, axis=2)
    with pytest.raises(ShapeError, match="repeated"):
        gp.sum(x, axis=(0, 0))
    with pytest.raises(ArgumentError, match="argmax: axis must be an int or None"):
        gp.argmax(x, axis=(0, 1))
    with pytest.raises(ValueError, match="ddof"):
        gp.var(x, ddof=-1)
    with pytest.raises(DTypeError, match="int32"):
        gp.softmax(gp.zeros(3, gp.int32))
    with pytest.raises(DTypeError, match="GPUArray"):
        gp.sum(np.zeros(3))  # type: ignore[arg-type]


_REDUCTIONS = [gp.sum, gp.prod, gp.mean, gp.max, gp.min, gp.any, gp.all, gp.var, gp.std, gp.argmax, gp.argmin]
_BAD_AXES = [1.5, 1.0, True, False, np.True_, "0", (0, 1.5), (True,), [0, None], np.float64(1)]


@pytest.mark.parametrize("fn", _REDUCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("axis", _BAD_AXES, ids=repr)
def test_axis_of_a_wrong_type_is_an_argument_error(fn: Callable[..., gp.GPUArray], axis: Any) -> None:
    """A float, bool, str or a tuple holding one is an ArgumentError naming the op and the axis, not a
    Python-internal TypeError (and never silently truncated)."""
    with pytest.raises(ArgumentError, match=rf"{fn.__name__}: axis must be .*got {re.escape(repr(axis))}"):
        fn(gp.zeros((2, 3)), axis=axis)


@pytest.mark.parametrize("fn", _REDUCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("axis", [2, -3, 100])
def test_axis_out_of_range_is_a_shape_error(fn: Callable[..., gp.GPUArray], axis: int) -> None:
    with pytest.raises(ShapeError, match=f"{fn.__name__}: axis {axis} is out of bounds for an array of 2 dimensions"):
        fn(gp.zeros((2, 3)), axis=axis)


def test_axis_checks_of_cumsum_softmax_and_sum_axis() -> None:
    x = gp.zeros((2, 3))
    for fn in (gp.cumsum, gp.softmax, gp.log_softmax):
        for bad in (1.5, True, (0,), "1"):
            with pytest.raises(ArgumentError, match=f"{fn.__name__}: axis must be an int"):
                fn(x, axis=bad)
        with pytest.raises(ShapeError, match="out of bounds"):
            fn(x, axis=2)
        assert fn(x, axis=np.int64(-1)).shape == (2, 3)
    with pytest.raises(ArgumentError, match="sum: axis must be"):
        gp.sum_axis(x, 0.5)  # type: ignore[arg-type]
    # Accepted forms: NumPy integers, tuples and lists of ints, None.
    assert gp.sum(x, axis=np.int32(1)).shape == (2,)
    assert gp.sum(x, axis=[0, 1]).shape == ()
    assert gp.sum(x, axis=(np.int64(0),)).shape == (3,)
    assert gp.argmax(x, axis=np.int64(0)).shape == (3,)
    assert gp.cumsum(gp.from_numpy(np.array(2.0, np.float32)), axis=0).to_numpy() == 2.0
