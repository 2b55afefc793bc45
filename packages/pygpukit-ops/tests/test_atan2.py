"""pygpukit.ops.atan2 against NumPy's float64 arctan2 on random data (every quadrant, the axes, signed
zeros), float32 / float16 / bfloat16; errors. The ``gpu`` test runs Kokoro's size on the device."""

from __future__ import annotations

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import DTypeError, ShapeError

TOL = {gp.float32: 2e-6, gp.float16: 2e-3, gp.bfloat16: 1.6e-2}


def _check(dtype: DType, shape: tuple[int, ...], seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.standard_normal(shape).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    flat_y, flat_x = y.reshape(-1), x.reshape(-1)
    flat_y[:6] = [0.0, -0.0, 0.0, -0.0, 1.0, -1.0]
    flat_x[:6] = [-1.0, -1.0, 1.0, 1.0, 0.0, 0.0]
    yd, xd = y.astype(dtype.numpy), x.astype(dtype.numpy)
    got = gp.atan2(gp.from_numpy(yd), gp.from_numpy(xd)).to_numpy().astype(np.float64)
    want = np.arctan2(yd.astype(np.float64), xd.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_array_equal(np.signbit(got.reshape(-1)[:4]), np.signbit(want.reshape(-1)[:4]))


@pytest.mark.parametrize("dtype", [gp.float32, gp.float16, gp.bfloat16])
def test_atan2_matches_numpy(dtype: DType) -> None:
    _check(dtype, (7, 33), 0)


def test_atan2_out_and_errors() -> None:
    y = gp.from_numpy(np.array([1.0, -2.0], np.float32))
    x = gp.from_numpy(np.array([-1.0, 3.0], np.float32))
    gp.atan2(y, x, out=y)
    np.testing.assert_allclose(y.to_numpy(), np.arctan2([1.0, -2.0], [-1.0, 3.0]), rtol=2e-6)
    with pytest.raises(ShapeError, match="same shape"):
        gp.atan2(y, gp.from_numpy(np.zeros(3, np.float32)))
    with pytest.raises(DTypeError, match="float32, float16 or bfloat16"):
        gp.atan2(gp.from_numpy(np.zeros(2, np.int32)), x)
    with pytest.raises(DTypeError, match="dtype"):
        gp.atan2(y, x.astype(gp.float16))
    assert gp.atan2(gp.from_numpy(np.zeros(0, np.float32)), gp.from_numpy(np.zeros(0, np.float32))).shape == (0,)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gp.float32, gp.float16, gp.bfloat16])
def test_atan2_gpu_kokoro_size(dtype: DType) -> None:
    _check(dtype, (11, 10441), 1)  # the harmonic source's STFT of a 2 s utterance
