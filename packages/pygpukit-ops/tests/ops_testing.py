"""Helpers shared by the op tests: data per dtype and domain, poisoned outputs, float64 references
compared with tolerances of the result dtype."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

import pygpukit as gp
from pygpukit.core.dtypes import DType, as_dtype

Array = np.ndarray[Any, Any]

DTYPES = list(gp.dtypes.all_dtypes())
FLOATS = [d for d in DTYPES if d.is_floating]
SIZES = [1, 3, 1023, 2**20 + 7]
SMALL_SIZES = [1, 3, 37]

# Spacing of the result dtype near 1 (one unit in the last place) and a floor for values near zero.
_ULP = {"float64": 2.3e-16, "float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.9e-3, "float8_e4m3fn": 0.125,
        "float8_e5m2": 0.25}  # fmt: skip
_TINY = {"float64": 1e-300, "float32": 1e-37, "float16": 1e-7, "bfloat16": 1e-37, "float8_e4m3fn": 2.0**-9,
         "float8_e5m2": 2.0**-16}  # fmt: skip


def compute_eps(dtype: DType) -> float:
    """Unit roundoff of the type the kernels compute ``dtype`` in (float32 below float64)."""
    return 2.3e-16 if dtype == gp.float64 else 1.2e-7


def sample(
    rng: np.random.Generator, shape: Any, dtype: Any, low: float, high: float, *, integral: bool = False
) -> Array:
    """Fresh random values in [low, high] exactly representable in ``dtype`` (integers clipped to its
    range; ``integral`` floats take integer values only)."""
    dt = as_dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dt.kind in "iu" or integral:
        if dt.kind in "iu":
            info = np.iinfo(dt.numpy)
            low, high = max(low, int(info.min)), min(high, int(info.max))
        values = rng.integers(int(np.ceil(low)), int(np.floor(high)) + 1, size=shape)
        return values.astype(dt.numpy)
    return rng.uniform(low, high, size=shape).astype(np.float32).astype(dt.numpy)


def tolerance(dtype: DType, compute_ulps: float = 4.0) -> tuple[float, float]:
    """(rtol, atol) for one rounding to ``dtype`` plus ``compute_ulps`` of compute-type error."""
    eps = compute_eps(dtype)
    if dtype.is_floating:
        return max(_ULP[dtype.name], compute_ulps * eps), max(_TINY[dtype.name], compute_ulps * eps)
    return 0.0, 0.0


def as_float64(values: Array) -> Array:
    return np.asarray(values).astype(np.float64)


def assert_matches(actual: Array, expected: Array, dtype: DType, compute_ulps: float = 4.0, what: str = "") -> None:
    """``actual`` (dtype ``dtype``) equals ``expected`` (float64 or exact) rounded to ``dtype``, within
    the dtype's tolerance; NaN matches NaN. Integers and bool must be exact."""
    assert actual.dtype == dtype.numpy, (what, actual.dtype, dtype)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    if not dtype.is_floating:
        mismatch = np.flatnonzero(actual != expected.astype(dtype.numpy))
        assert mismatch.size == 0, f"{what}: {mismatch.size} of {actual.size} differ, first at {mismatch[:5]}"
        return
    rtol, atol = tolerance(dtype, compute_ulps)
    wide = expected.astype(np.float64)
    if dtype == gp.float8_e4m3fn:  # no infinity: conversions saturate to +-448 (CUDA's satfinite)
        wide = np.clip(wide, -448.0, 448.0)
    with np.errstate(all="ignore"):
        rounded = wide.astype(dtype.numpy).astype(np.float64)
    np.testing.assert_allclose(as_float64(actual), rounded, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def poison(shape: Any, dtype: Any) -> gp.GPUArray:
    """A device array of ``shape`` filled with garbage (NaN for floats), so that a kernel that leaves
    elements unwritten fails; freeing one first also poisons the pool block the next result takes."""
    dt = as_dtype(dtype)
    value: Any = np.nan if dt.is_floating else (True if dt.kind == "b" else 77)
    return gp.full(shape, value, dt)


def poison_pool(shape: Any, dtype: Any) -> None:
    """Leave a garbage-filled block of this size in the pool's cache for the next allocation."""
    block = poison(shape, dtype)
    del block


def upload(values: Array) -> gp.GPUArray:
    return gp.from_numpy(values)


def strided(values: Array) -> tuple[gp.GPUArray, Array]:
    """A non-contiguous device view holding ``values`` (every other element of a larger array)."""
    wide = np.zeros((values.size * 2,) if values.ndim <= 1 else (*values.shape[:-1], values.shape[-1] * 2),
                    dtype=values.dtype)  # fmt: skip
    wide[..., ::2] = values
    device = gp.from_numpy(wide)
    view = device[::2] if values.ndim <= 1 else device[..., ::2]
    return view, values


def bf16(values: Any) -> Array:
    return np.asarray(values, dtype=ml_dtypes.bfloat16)
