"""pygpukit.audio.fft/ifft/rfft/irfft against numpy.fft (float64 references) on fresh random data: shapes,
axes, n (crop and zero-pad), the three norms, float32 and float64, bad arguments. The gpu-marked tests cover
every length 1..4096 (primes included: Bluestein) and 2^20 on the device, and every code path of the planner
(one shared-memory launch, four-step, global passes, pack/unpack) by shrinking its shared-memory budget."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio
from pygpukit.audio import _fft_plan
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

Array = np.ndarray[Any, Any]
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _rng() -> np.random.Generator:
    return np.random.default_rng()


def _complex(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> Array:
    values: Array = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(
        np.complex64 if dtype == np.float32 else np.complex128
    )
    return values


def _error(got: Array, want: Array) -> float:
    scale = max(float(np.abs(want).max()) if want.size else 0.0, 1e-30)
    return float(np.abs(got.astype(np.complex128) - want).max() / scale) if want.size else 0.0


def _check(kind: str, x: Array, dtype: type, **kwargs: Any) -> float:
    """Relative max error of pygpukit.audio.<kind> against numpy.fft.<kind> in float64."""
    reference = getattr(np.fft, kind)(x.astype(np.complex128 if np.iscomplexobj(x) else np.float64), **kwargs)
    arg = x.astype(dtype) if kind == "rfft" else audio.complex_from_numpy(x, dtype)
    result = getattr(audio, kind)(arg, **kwargs)
    got = result.to_numpy() if kind == "irfft" else audio.complex_to_numpy(result)
    assert got.shape == reference.shape, (got.shape, reference.shape)
    assert result.dtype.numpy == np.dtype(dtype)
    return _error(got, reference)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 12, 16, 17, 30, 64, 97, 100, 128, 210, 256, 1000, 1024, 2048])
def test_all_four_transforms_match_numpy(dtype: type, n: int) -> None:
    rng = _rng()
    x = _complex(rng, (3, n), dtype)
    r = rng.standard_normal((3, n)).astype(dtype)
    for kind, data in (("fft", x), ("ifft", x), ("rfft", r)):
        assert _check(kind, data, dtype) <= TOL[dtype], (kind, n)
    spectrum = _complex(rng, (3, n // 2 + 1), dtype)
    assert _check("irfft", spectrum, dtype, n=n) <= TOL[dtype], ("irfft", n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm", [None, "backward", "ortho", "forward"])
def test_norms_axes_and_lengths(dtype: type, norm: str | None) -> None:
    rng = _rng()
    x = _complex(rng, (4, 6, 10), dtype)
    r = rng.standard_normal((5, 7, 9)).astype(dtype)
    for axis in (0, 1, -1, -2):
        for n in (None, 4, 13):
            assert _check("fft", x, dtype, n=n, axis=axis, norm=norm) <= TOL[dtype]
            assert _check("ifft", x, dtype, n=n, axis=axis, norm=norm) <= TOL[dtype]
            assert _check("rfft", r, dtype, n=n, axis=axis, norm=norm) <= TOL[dtype]
            assert _check("irfft", x, dtype, n=n, axis=axis, norm=norm) <= TOL[dtype]


def test_irfft_ignores_the_imaginary_parts_of_dc_and_nyquist() -> None:
    x = _complex(_rng(), (2, 9), np.float64)
    for n in (16, 17, 8):
        got = audio.irfft(audio.complex_from_numpy(x), n=n).to_numpy()
        np.testing.assert_allclose(got, np.fft.irfft(x, n=n), rtol=0, atol=1e-12)


def test_round_trips_and_views() -> None:
    rng = _rng()
    r = rng.standard_normal((2, 3, 50))
    back = audio.irfft(audio.rfft(r), n=50).to_numpy()
    np.testing.assert_allclose(back, r, rtol=0, atol=1e-12)
    x = audio.complex_from_numpy(_complex(rng, (8, 12), np.float64))
    strided = x[::2]  # a non-contiguous complex view
    np.testing.assert_allclose(audio.complex_to_numpy(audio.fft(strided)),
                               np.fft.fft(audio.complex_to_numpy(x)[::2]), rtol=0, atol=1e-12)  # fmt: skip
    real = audio.to_complex(r.astype(np.float32))
    assert real.shape == (2, 3, 50, 2)
    np.testing.assert_allclose(audio.complex_to_numpy(audio.fft(real)), np.fft.fft(r), rtol=0, atol=1e-4)


def test_empty_batches_give_empty_results() -> None:
    x = np.zeros((0, 16))
    assert audio.rfft(x).shape == (0, 9, 2)
    assert audio.fft(audio.complex_from_numpy(x)).shape == (0, 16, 2)


def test_bad_arguments_raise_typed_errors() -> None:
    x = audio.complex_from_numpy(np.ones((2, 8), np.complex64))
    with pytest.raises(ArgumentError, match="norm"):
        audio.fft(x, norm="sideways")
    with pytest.raises(ArgumentError, match="n must be >= 1"):
        audio.fft(x, n=0)
    with pytest.raises(ArgumentError, match="axis 2 is out of bounds"):
        audio.fft(x, axis=2)
    with pytest.raises(ShapeError, match="trailing dimension of 2"):
        audio.fft(np.ones((2, 8), np.float32))
    with pytest.raises(DTypeError, match="complex NumPy array"):
        audio.rfft(np.ones(8, np.complex64))
    with pytest.raises(DTypeError, match="float32 or float64"):
        audio.rfft(np.ones(8, np.int16))
    with pytest.raises(DTypeError, match="GPUArray or a NumPy array"):
        audio.rfft([1.0, 2.0])
    with pytest.raises(ShapeError, match="invalid number of data points"):
        audio.rfft(np.ones((3, 0)))
    with pytest.raises(ShapeError, match="invalid number of data points"):
        audio.irfft(audio.complex_from_numpy(np.ones((3, 0), np.complex64)))


def test_radices_cover_smooth_lengths_only() -> None:
    for length in range(1, 3000):
        rads = _fft_plan.radices(length)
        smooth = all(p <= 13 for p in _prime_factors(length))
        assert (rads is not None) == smooth, length
        if rads is not None:
            assert int(np.prod(rads, dtype=np.int64)) == length
            assert all(r in (2, 3, 4, 5, 7, 8, 11, 13) for r in rads)


def _prime_factors(n: int) -> list[int]:
    found, p = [], 2
    while p * p <= n:
        while n % p == 0:
            found.append(p)
            n //= p
        p += 1
    return [*found, n] if n > 1 else found


# -- on the device ------------------------------------------------------------------------------------------------
@pytest.fixture
def smem_limit(request: pytest.FixtureRequest) -> Iterator[None]:
    """Plans made with a shared-memory budget of ``request.param`` bytes (None: the device's)."""
    _fft_plan.smem_limit_override = request.param
    _fft_plan._PLANS.clear()
    try:
        yield
    finally:
        _fft_plan.smem_limit_override = None
        _fft_plan._PLANS.clear()


def _sweep(lengths: range | list[int], dtype: type, batch: int = 2) -> list[tuple[str, int, float]]:
    rng = _rng()
    failures = []
    for n in lengths:
        x = _complex(rng, (batch, n), dtype)
        r = rng.standard_normal((batch, n)).astype(dtype)
        spectrum = _complex(rng, (batch, n // 2 + 1), dtype)
        for kind, data, kwargs in (("fft", x, {}), ("ifft", x, {}), ("rfft", r, {}), ("irfft", spectrum, {"n": n})):
            error = _check(kind, data, dtype, **kwargs)
            if not error <= TOL[dtype]:
                failures.append((kind, n, error))
    return failures


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_length_up_to_4096_on_the_device(dtype: type) -> None:
    failures = _sweep(range(1, 4097), dtype)
    assert not failures, failures[:20]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_two_to_the_twentieth_on_the_device(dtype: type) -> None:
    failures = _sweep([1 << 20, (1 << 20) + 2, 3 * 5 * 7 * 11 * 13 * 8], dtype, batch=1)
    assert not failures, failures


@pytest.mark.gpu
@pytest.mark.parametrize("smem_limit", [1024, 0], indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.usefixtures("smem_limit")
def test_four_step_global_pass_and_pack_paths_on_the_device(dtype: type) -> None:
    """1 KiB of shared memory: lengths above 32 (float32) run four-step or global passes with pack/unpack;
    0: no shared-memory launch at all, every length through global passes."""
    lengths = [*range(1, 70), 96, 97, 128, 240, 256, 343, 1000, 1024, 1331, 2048, 2197, 4096, 4099]
    failures = _sweep(lengths, dtype, batch=3)
    assert not failures, failures[:20]


@pytest.fixture
def reg_elements(request: pytest.FixtureRequest) -> Iterator[None]:
    """Plans whose fft_reg launches hold ``request.param`` elements per thread (0: fft_smem only; "8:single":
    8, with one shared-memory buffer a block where the planner would take fft_reg's _2buf kernels)."""
    saved = (_fft_plan.reg_enabled, _fft_plan.reg_elements, _fft_plan.reg_double)
    elements, _, single = str(request.param).partition(":")
    _fft_plan.reg_enabled = int(elements) > 0
    _fft_plan.reg_elements = {"float32": int(elements) or 8, "float64": int(elements) or 8}
    _fft_plan.reg_double = single != "single"
    _fft_plan._PLANS.clear()
    try:
        yield
    finally:
        _fft_plan.reg_enabled, _fft_plan.reg_elements, _fft_plan.reg_double = saved
        _fft_plan._PLANS.clear()


@pytest.mark.gpu
@pytest.mark.parametrize("reg_elements", [8, "8:single", 16, 0], indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.usefixtures("reg_elements")
def test_register_kernels_on_the_device(dtype: type) -> None:
    """fft_reg.cu with 8 and 16 elements per thread, one or two shared-memory buffers (and without it): its
    lengths alone (64 to 4096, as the transform or the half of a real one), batches that leave a block's last
    rows empty, four-step halves (2^16, 2^20: strided columns, the post twiddles), and the STFT's fused
    framing and r2c store."""
    rng = _rng()
    failures = _sweep([64, 65, 128, 129, 256, 512, 1024, 2048, 4096, 8192], dtype, batch=5)
    for n in (1 << 16, 1 << 20):
        x = _complex(rng, (2, n), dtype)
        for kind in ("fft", "ifft"):
            error = _check(kind, x, dtype, norm="ortho")
            if not error <= TOL[dtype]:
                failures.append((kind, n, error))
    for n_fft, hop in ((128, 32), (512, 160), (2048, 512), (4096, 1000)):
        y = rng.standard_normal((3, 7001))
        window = np.hanning(n_fft + 1)[:-1]
        padded = np.pad(y, ((0, 0), (n_fft // 2, n_fft // 2)), mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft, axis=-1)[:, ::hop]
        want = np.swapaxes(np.fft.rfft(frames * window, axis=-1), -1, -2)
        got = audio.complex_to_numpy(audio.stft(y.astype(dtype), n_fft=n_fft, hop_length=hop, pad_mode="reflect"))
        error = _error(got, want)
        if not error <= 5 * TOL[dtype]:
            failures.append(("stft", n_fft, error))
    assert not failures, failures


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_rfft_of_views_on_the_device(dtype: type) -> None:
    """A long rfft reads its real pairs in place when the rows and the address hold whole pairs, else packs
    them first: rows of an odd length, and a view one element into its buffer, against numpy."""
    import pygpukit as gp

    rng = _rng()
    n = 1 << 18
    base = rng.standard_normal(2 * n + 3)
    cases = {"aligned": base[: 2 * n].reshape(2, n), "odd rows": base[: 2 * (n + 1)].reshape(2, n + 1)}
    failures = []
    for name, x in cases.items():
        for offset in (0, 1):
            flat = gp.from_numpy(np.concatenate([base[:offset], x.ravel()]).astype(dtype))
            view = flat[offset:].reshape(x.shape)
            got = audio.complex_to_numpy(audio.rfft(view, n=n))
            error = _error(got, np.fft.rfft(x, n=n, axis=-1))
            if not error <= TOL[dtype]:
                failures.append((name, offset, error))
    assert not failures, failures


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_four_step_lengths_on_the_device(dtype: type) -> None:
    """The two-launch four-step path of complex transforms (2^16 to 2^22, an odd smooth 3 * 2^18, a batch, a
    cropped input), and the real transforms of those lengths (pack, four-step core, unpack)."""
    rng = _rng()
    failures = []
    for n, batch in ((1 << 16, 3), (1 << 18, 2), (1 << 20, 2), (3 << 18, 2), (1 << 21, 1), (1 << 22, 1)):
        x = _complex(rng, (batch, n), dtype)
        for kind in ("fft", "ifft"):
            for norm in (None, "ortho"):
                error = _check(kind, x, dtype, norm=norm)
                if not error <= TOL[dtype]:
                    failures.append((kind, n, batch, norm, error))
        error = _check("fft", x, dtype, n=n - 8)  # cropped rows: the input's row stride is not the length
        if not error <= TOL[dtype]:
            failures.append(("fft crop", n, batch, None, error))
        r = rng.standard_normal((batch, n)).astype(dtype)
        for kind, data, kwargs in (("rfft", r, {}), ("irfft", _complex(rng, (batch, n // 2 + 1), dtype), {"n": n})):
            error = _check(kind, data, dtype, **kwargs)
            if not error <= TOL[dtype]:
                failures.append((kind, n, batch, None, error))
    assert not failures, failures
