"""Helpers for testing code built on pygpukit: random data per dtype and bitwise comparison."""

from __future__ import annotations

from typing import Any

import numpy as np

from .core.dtypes import DType, as_dtype

__all__ = ["assert_bitwise_equal", "random_array"]


def random_array(
    rng: np.random.Generator, shape: Any, dtype: Any, *, nonnegative: bool = False
) -> np.ndarray[Any, Any]:
    """Fresh random data (never all zeros) exactly representable in ``dtype``.

    Integers lie in [-100, 100] (or [0, 100]), floats in [-50, 50) rounded to the type, so every value
    converts between all supported types without overflow.
    """
    dt: DType = as_dtype(dtype)
    values: np.ndarray[Any, Any]
    if dt.kind == "b":
        values = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif dt.kind in "iu":
        info = np.iinfo(dt.numpy)
        low = 0 if nonnegative else max(int(info.min), -100)
        values = rng.integers(low, min(int(info.max), 100) + 1, size=shape).astype(dt.numpy)
    else:
        low_f = 0.0 if nonnegative else -50.0
        values = rng.uniform(low_f, 50.0, size=shape).astype(np.float32).astype(dt.numpy)
    return values


def assert_bitwise_equal(actual: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> None:
    """Same dtype, same shape, same bytes (NaNs and signed zeros included)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a = np.ascontiguousarray(actual).view(np.uint8)
    e = np.ascontiguousarray(expected).view(np.uint8)
    if not np.array_equal(a, e):
        mismatch = int(np.count_nonzero(np.ascontiguousarray(actual) != np.ascontiguousarray(expected)))
        raise AssertionError(f"{mismatch} of {actual.size} elements differ")
