"""The FFT plans of the CUDA backend (pygpukit/audio/_fft_plan.py), checked without a GPU: each plan's launches
are replayed by a NumPy model of the fft_smem / fft_pack / fft_unpack kernels (native/kernels/audio/fft.cu;
the in-kernel transform of one row is numpy.fft.fft, which the gpu-marked tests of test_fft.py compare the
device's own against). This checks the plan's wiring: buffers, strides, rows, twiddles, conjugations,
scales and the launch shapes, for the single-launch, four-step and pack/core/unpack paths."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pygpukit.audio import _fft_plan, _kernels
from pygpukit.audio._common import host
from pygpukit.audio._launch import PAD_MODES
from pygpukit.audio.spectral import fft_window
from pygpukit.core.backend import current_backend
from pygpukit.core.dtypes import float32, float64

# The model reads the arrays' bytes on the host (host_view): the CPU backend's arrays. On the CUDA backend
# the kernels themselves run, in test_fft.py's gpu-marked tests.
pytestmark = pytest.mark.skipif(current_backend() != "cpu", reason="a NumPy model of the kernels: CPU backend only")

Array = np.ndarray[Any, Any]
LOAD = _fft_plan._LOAD
STORE = _fft_plan._STORE


@pytest.fixture
def model_plans(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Plans built with fake kernels (no compilation, no device query); each test sets a small shared-memory
    budget (4 KiB for float32, 8 KiB for float64) so that short lengths take the long-length paths."""

    def fake_kernel(name: str, dtype: Any, params: Any) -> Any:
        return SimpleNamespace(name=name, attributes={"max_threads_per_block": 1024},
                               set_max_dynamic_shared_memory=lambda size: None)  # fmt: skip

    monkeypatch.setattr(_fft_plan, "_kernel", fake_kernel)
    monkeypatch.setattr(_kernels, "grid_for", lambda work, *args, **kwargs: 1)
    _fft_plan._PLANS.clear()
    yield
    _fft_plan._PLANS.clear()


def _smem(buffers: dict[Any, Array], args: tuple[Any, ...], launch: Any) -> None:
    (src, dst, tw, edge, rows, inner, in_outer, in_inner, in_elem, out_outer, out_inner, out_elem, n, in_len,
     out_count, _npass, _radices, _tw_pass, tw_post, load, store, conj_in, conj_out, rows_fast, scale, window,
     x_len, pad_left, pad_mode, power) = args  # fmt: skip
    assert load in (LOAD["kLoadComplex"], LOAD["kLoadFramePairs"]), "the model reads complex values or frames"
    assert store in (STORE["kStoreComplex"], STORE["kStoreR2cEven"], STORE["kStoreR2cPower"]), store
    tx, ry, _ = launch.block
    assert launch.grid * ry >= rows
    assert tx * ry <= 1024
    complex_bytes = 16 if buffers["dtype"] == float64 else 8
    pad = 0 if not rows_fast else (1 if ry >= 32 else 32 // ry)
    assert launch.shared == ry * (2 * n + pad) * complex_bytes <= _fft_plan._smem_limit()
    row = np.arange(rows)
    outer, i = np.divmod(row, inner)
    e = np.arange(n)
    if load == LOAD["kLoadFramePairs"]:
        signal = buffers[src].real.reshape(-1, x_len)  # float rows of x_len samples (in_outer == x_len)
        assert in_outer == x_len
        mode = next(name for name, code in PAD_MODES.items() if code == pad_mode)
        padded = np.pad(signal, ((0, 0), (pad_left, 2 * n + in_inner * inner)), mode=mode)  # type: ignore[call-overload]
        j = np.arange(2 * n)
        frames = padded[outer[:, None], (i * in_inner)[:, None] + j[None, :]] * buffers[window][None, :]
        x = frames[:, 0::2] + 1j * frames[:, 1::2]
    else:
        x = buffers[src][(outer * in_outer + i * in_inner)[:, None] + e[None, :] * in_elem]
        x = np.where(e[None, :] < in_len, x, 0)
    if conj_in:
        x = np.conj(x)
    k = np.arange(out_count)
    if store in (STORE["kStoreR2cEven"], STORE["kStoreR2cPower"]):
        full = np.fft.fft(x, axis=1)
        zk, zc = full[:, k % n], np.conj(full[:, (n - k) % n])
        z = ((zk + zc) + buffers[edge][k] * -1j * (zk - zc)) * 0.5
        if store == STORE["kStoreR2cPower"]:
            z = np.abs(z * scale) ** power / scale  # the kernel scales before the power; scale is 1 here
    else:
        z = np.fft.fft(x, axis=1)[:, :out_count]
    if conj_out:
        z = np.conj(z)
    if tw_post:
        z = z * buffers[tw][k[None, :] * (i * tw_post)[:, None]]
    buffers[dst][(outer * out_outer + i * out_inner)[:, None] + k[None, :] * out_elem] = z * scale


def _run_model(plan: Any, x: Array, out_size: int, dtype: Any) -> Array:
    """Replay ``plan`` on the complex rows ``x`` (flattened) into an output of ``out_size`` complex values."""
    buffers: dict[Any, Any] = {"in": x.ravel().astype(np.complex128), "out": np.zeros(out_size, np.complex128),
                               "dtype": dtype}  # fmt: skip
    for i, size in enumerate(plan.scratch):
        buffers[f"s{i}"] = np.full(size, np.nan + 0j)  # stale scratch: every value read must be written first
    for table in plan.tables:
        values = host(table).astype(np.float64)
        buffers[table.device_ptr] = values[..., 0] + 1j * values[..., 1] if values.ndim == 2 else values
    for launch in plan.launches:
        args = launch.args
        if launch.kernel.name == "fft_smem":
            _smem(buffers, args, launch)
        elif launch.kernel.name == "fft_pack":
            src, dst, _edge, chirp, rows, in_row, in_elem, n, m, in_len, load, conj = args
            assert load == LOAD["kLoadComplex"]
            assert chirp == 0
            e = np.arange(m)
            values = buffers[src][(np.arange(rows) * in_row)[:, None] + np.minimum(e, in_len - 1)[None, :] * in_elem]
            values = np.where(e[None, :] < min(n, in_len), values, 0)
            buffers[dst][: rows * m] = (np.conj(values) if conj else values).ravel()
        elif launch.kernel.name == "fft_unpack":
            src, dst, _edge, chirp, rows, out_row, out_elem, n, m, count, store, conj, scale = args
            assert store == STORE["kStoreComplex"]
            assert chirp == 0
            z = buffers[src][: rows * m].reshape(rows, m)[:, :count]
            z = np.conj(z) if conj else z
            k = np.arange(count)
            buffers[dst][(np.arange(rows) * out_row)[:, None] + k[None, :] * out_elem] = z * scale
        else:
            raise AssertionError(f"no model of {launch.kernel.name}")
    result: Array = buffers["out"]
    return result


@pytest.mark.usefixtures("model_plans")
@pytest.mark.parametrize("dtype", [float32, float64])
@pytest.mark.parametrize(
    ("kind", "n", "in_row", "rows"),
    [
        ("fft", 4096, 4096, 3),  # four-step 64 x 64, two launches
        ("ifft", 4096, 4096, 2),
        ("fft", 3 * 4096, 3 * 4096, 2),  # an odd smooth length: 96 x 128
        ("ifft", 5 * 7 * 64, 5 * 7 * 64 + 5, 2),  # cropped input rows
        ("fft", 4096, 1000, 2),  # zero padding: pack, a four-step core, unpack
        ("fft", 200, 200, 4),  # one launch
    ],
)
def test_plans_compute_the_dft(dtype: Any, kind: str, n: int, in_row: int, rows: int,
                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(_fft_plan, "smem_limit_override", 4096 if dtype == float32 else 8192)
    rng = np.random.default_rng()
    x = rng.standard_normal((rows, in_row)) + 1j * rng.standard_normal((rows, in_row))
    for norm in ("backward", "ortho", "forward"):
        plan = _fft_plan.get_plan(kind, n, in_row, rows, dtype, norm)
        names = [launch.kernel.name for launch in plan.launches]
        if n == in_row and n > 256:
            assert names == ["fft_smem", "fft_smem"], names
            assert plan.scratch == (rows * n,)
        got = _run_model(plan, x, rows * n, dtype).reshape(rows, n)
        want = getattr(np.fft, kind)(x, n=n, axis=-1, norm=norm)
        tol = 2e-6 if dtype == float32 else 1e-12  # the twiddle tables are rounded to the dtype
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())


@pytest.mark.usefixtures("model_plans")
@pytest.mark.parametrize("dtype", [float32, float64])
@pytest.mark.parametrize(("n_fft", "hop"), [(400, 160), (64, 16), (96, 40)])
@pytest.mark.parametrize("pad_mode", ["constant", "reflect", "edge", "symmetric", "wrap"])
def test_stft_plan_reads_the_frames_itself(dtype: Any, n_fft: int, hop: int, pad_mode: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The fused STFT plan (kLoadFramePairs into an r2c store) against numpy's padded, windowed frames."""
    monkeypatch.setattr(_fft_plan, "smem_limit_override", 4096 if dtype == float32 else 8192)
    rng = np.random.default_rng()
    rows, length, pad = 3, 1000, n_fft // 2
    signal = rng.standard_normal((rows, length))
    n_frames = 1 + (length + 2 * pad - n_fft) // hop
    window = fft_window("stft", "hann", n_fft, n_fft, dtype)
    plan = _fft_plan.stft_plan(n_fft, rows, n_frames, length, hop, pad, PAD_MODES[pad_mode], window, dtype)
    assert plan is not None
    assert [launch.kernel.name for launch in plan.launches] == ["fft_smem"]
    n_freq = n_fft // 2 + 1
    got = _run_model(plan, signal.astype(np.complex128), rows * n_frames * n_freq, dtype).reshape(
        rows, n_frames, n_freq
    )
    padded = np.pad(signal, ((0, 0), (pad, pad)), mode=pad_mode)  # type: ignore[call-overload]
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft, axis=-1)[:, ::hop][:, :n_frames]
    want = np.fft.rfft(frames * host(window).astype(np.float64), axis=-1)
    tol = 2e-6 if dtype == float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * np.abs(want).max())
    for power in (2.0, 1.0, 1.5):  # |X| ** power written by the FFT kernel (kStoreR2cPower), real values
        fused = _fft_plan.stft_plan(n_fft, rows, n_frames, length, hop, pad, PAD_MODES[pad_mode], window, dtype, power)
        assert fused is not None
        assert fused is not plan
        got_power = _run_model(fused, signal.astype(np.complex128), rows * n_frames * n_freq, dtype)
        want_power = np.abs(want) ** power
        np.testing.assert_allclose(got_power.real.reshape(want.shape), want_power, rtol=0,
                                   atol=power * tol * want_power.max())  # fmt: skip
    assert _fft_plan.stft_plan(n_fft + 1, rows, n_frames, length, hop, pad, 0, window, dtype) is None  # odd n_fft
    assert _fft_plan.stft_plan(2 * 17 * 2, rows, n_frames, length, hop, pad, 0, window, dtype) is None  # 17: Bluestein
