"""pygpukit.ops.lstm against a float64 NumPy reference written here (all samples stepped together with
a length mask, independent of the op's own CPU path): uni- and bidirectional, per-sample lengths, initial
states, odd sizes, float32/float16/bfloat16. ``gpu`` tests use Kokoro's sizes (bidirectional, H 256)."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
from ops_testing import Array, upload

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

DTYPES = [gp.float32, gp.float16, gp.bfloat16]
ATOL = {gp.float32: 2e-5, gp.float16: 4e-3, gp.bfloat16: 3e-2}


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def data(rng: np.random.Generator, shape: Any, dtype: DType, scale: float = 1.0) -> Array:
    return (rng.uniform(-scale, scale, size=shape)).astype(np.float32).astype(dtype.numpy)


def f64(values: Any) -> Array:
    return np.asarray(values).astype(np.float64)


def lstm_ref(x: Array, w_ih: Array, w_hh: Array, b: Array | None, lengths: list[int], h0: Array | None,
             c0: Array | None) -> tuple[Array, Array, Array]:  # fmt: skip
    """Every sample at once; frame s of the backward direction of sample n is lengths[n] - 1 - s."""
    n, steps, _ = x.shape
    d_count, four_h, _ = w_ih.shape
    hid = four_h // 4
    lens = np.asarray(lengths)
    out = np.zeros((n, steps, d_count * hid))
    h_all = np.zeros((d_count, n, hid)) if h0 is None else h0.copy()
    c_all = np.zeros((d_count, n, hid)) if c0 is None else c0.copy()
    rows = np.arange(n)
    for d in range(d_count):
        h, c = h_all[d].copy(), c_all[d].copy()
        for s in range(steps):
            active = s < lens
            frame = np.clip(s if d == 0 else lens - 1 - s, 0, steps - 1) * np.ones(n, int)
            xt = x[rows, frame]  # (N, I)
            z = xt @ w_ih[d].T + h @ w_hh[d].T + (0.0 if b is None else b[d])
            i, f = 1 / (1 + np.exp(-z[:, :hid])), 1 / (1 + np.exp(-z[:, hid : 2 * hid]))
            g, o = np.tanh(z[:, 2 * hid : 3 * hid]), 1 / (1 + np.exp(-z[:, 3 * hid :]))
            c_new = f * c + i * g
            h_new = o * np.tanh(c_new)
            c = np.where(active[:, None], c_new, c)
            h = np.where(active[:, None], h_new, h)
            out[rows[active], frame[active], d * hid : (d + 1) * hid] = h[active]
        h_all[d], c_all[d] = h, c
    return out, h_all, c_all


def check_lstm(rng: np.random.Generator, n: int, steps: int, feat: int, hid: int, d: int, dtype: DType,
               lengths: list[int] | None = None, bias: bool = True, state: bool = False) -> None:  # fmt: skip
    scale = 1.0 / np.sqrt(hid)
    hx = data(rng, (n, steps, feat), dtype)
    w_ih, w_hh = data(rng, (d, 4 * hid, feat), dtype, scale * 2), data(rng, (d, 4 * hid, hid), dtype, scale * 2)
    hb = data(rng, (d, 4 * hid), dtype, 0.5) if bias else None
    h0 = data(rng, (d, n, hid), dtype, 0.5) if state else None
    c0 = data(rng, (d, n, hid), dtype, 0.5) if state else None
    lens = lengths if lengths is not None else [steps] * n
    out, h_n, c_n = gp.lstm(upload(hx), upload(w_ih), upload(w_hh), None if hb is None else upload(hb),
                            lengths=lengths, h0=None if h0 is None else upload(h0),
                            c0=None if c0 is None else upload(c0))  # fmt: skip
    e_out, e_h, e_c = lstm_ref(f64(hx), f64(w_ih), f64(w_hh), None if hb is None else f64(hb), lens,
                               None if h0 is None else f64(h0), None if c0 is None else f64(c0))  # fmt: skip
    assert out.shape == (n, steps, d * hid)
    assert out.dtype == dtype
    assert h_n.shape == c_n.shape == (d, n, hid)
    tol = ATOL[dtype] * (1 + np.sqrt(steps) / 4)
    for what, got, want in (("out", out, e_out), ("h_n", h_n, e_h), ("c_n", c_n, e_c)):
        err = np.abs(f64(got.to_numpy()) - want)
        assert err.max() <= tol * (1 + np.abs(want)).max(), f"lstm {dtype} {what}: max error {err.max():.3g}"
    for row, length in enumerate(lens):  # padded frames are exactly zero
        assert not np.any(f64(out.to_numpy())[row, length:])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lstm(rng: np.random.Generator, dtype: DType) -> None:
    check_lstm(rng, 1, 7, 5, 3, 1, dtype)
    check_lstm(rng, 2, 9, 6, 5, 2, dtype)
    check_lstm(rng, 3, 11, 4, 33, 2, dtype, lengths=[11, 4, 7])
    check_lstm(rng, 2, 6, 3, 8, 2, dtype, lengths=[0, 6], bias=False, state=True)
    check_lstm(rng, 1, 1, 17, 2, 2, dtype)


def test_lstm_errors(rng: np.random.Generator) -> None:
    x = upload(data(rng, (2, 5, 4), gp.float32))
    w_ih, w_hh = upload(data(rng, (2, 12, 4), gp.float32)), upload(data(rng, (2, 12, 3), gp.float32))
    with pytest.raises(ShapeError, match=r"w_ih must be \(D, 4H, 4\)"):
        gp.lstm(x, upload(data(rng, (2, 12, 5), gp.float32)), w_hh)
    with pytest.raises(ShapeError, match=r"w_hh must have shape \(2, 12, 3\)"):
        gp.lstm(x, w_ih, upload(data(rng, (2, 12, 4), gp.float32)))
    with pytest.raises(ArgumentError, match=r"\[0, 5\], got 6"):
        gp.lstm(x, w_ih, w_hh, lengths=[6, 1])
    with pytest.raises(ShapeError, match="2 ints"):
        gp.lstm(x, w_ih, w_hh, lengths=[5])
    with pytest.raises(DTypeError, match="float16"):
        gp.lstm(x, upload(data(rng, (2, 12, 4), gp.float16)), w_hh)
    with pytest.raises(ShapeError, match=r"\(N, T, I\)"):
        gp.lstm(upload(data(rng, (5, 4), gp.float32)), w_ih, w_hh)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lstm_gpu_kokoro_sizes(rng: np.random.Generator, dtype: DType) -> None:
    check_lstm(rng, 1, 120, 512, 256, 2, dtype)  # Kokoro's text encoder LSTM
    check_lstm(rng, 3, 57, 640, 256, 2, dtype, lengths=[57, 20, 1])  # prosody LSTMs, by length
    check_lstm(rng, 2, 40, 96, 100, 1, dtype, state=True)  # H not a multiple of the warp
