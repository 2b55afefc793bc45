"""resample against a float64 sinc reference and librosa.resample (soxr_hq): on band-limited sums of sinusoids
(the exact answer is known), on band-limited real recordings (the exact answer is the DFT series evaluated at the
new times), and against a brute-force evaluation of the same windowed-sinc filter over the whole signal."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit.audio as audio
from pygpukit.audio import resampling as rs
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError


def _lib(name: str) -> Any:
    """A reference library (librosa, soundfile), imported by the test that needs it: the GPU tests of this
    file compare with float64 loops and run where the references are not installed."""
    return pytest.importorskip(name)


Array = np.ndarray[Any, Any]
RATES = [(44100, 16000), (16000, 44100), (16000, 8000), (8000, 16000), (22050, 16000), (48000, 44100)]


def _tones(rng: np.random.Generator, fmax: float, count: int = 8) -> tuple[Array, Array, Array]:
    return rng.uniform(20.0, fmax, count), rng.uniform(0.05, 0.12, count), rng.uniform(0.0, 2 * np.pi, count)


def _eval(tones: tuple[Array, Array, Array], t: Array) -> Array:
    freqs, amps, phases = tones
    values: Array = (amps[:, None] * np.sin(2 * np.pi * freqs[:, None] * t[None] + phases[:, None])).sum(0)
    return values


def _brute(x: Array, orig: float, target: float, res_type: str) -> Array:
    """Every output sample as sum_j x[j] h(t_n - j) of the continuous windowed sinc, in float64."""
    zeros, rolloff, beta = rs.RES_TYPES[res_type]
    cutoff = rolloff * min(1.0, target / orig)
    half = zeros / cutoff
    out_len = math.ceil(len(x) * target / orig)
    tau = (np.arange(out_len) * orig / target)[:, None] - np.arange(len(x))[None, :]
    inside = np.abs(tau) < half
    u = np.where(inside, tau / half, 0.0)
    h = cutoff * np.sinc(cutoff * tau) * np.where(inside, np.i0(beta * np.sqrt(1.0 - u * u)) / np.i0(beta), 0.0)
    result: Array = h @ x
    return result


@pytest.mark.parametrize(("orig", "target"), RATES)
def test_band_limited_tones_beat_librosa_soxr_hq(orig: int, target: int) -> None:
    rng = np.random.default_rng(orig + target)
    tones = _tones(rng, 0.8 * min(orig, target) / 2)
    x = _eval(tones, np.arange(orig // 2) / orig)
    batch = np.stack([x, 0.5 * x[::-1].copy()])
    got = audio.resample(batch, orig_sr=orig, target_sr=target).to_numpy()
    want_len = math.ceil(x.shape[-1] * target / orig)
    lib = _lib("librosa").resample(x, orig_sr=orig, target_sr=target, res_type="soxr_hq")
    assert got.shape == (2, want_len) == (2, lib.shape[-1])
    exact = _eval(tones, np.arange(want_len) / target)
    inner = slice(want_len // 10, want_len - want_len // 10)  # away from the zero-padded edges
    ours = np.abs(got[0] - exact)[inner].max()
    theirs = np.abs(lib - exact)[inner].max()
    assert ours <= max(theirs, 2e-7), (ours, theirs)
    assert ours <= 5e-7
    # the batch's rows are independent: row 1 is row 0's computation on its own signal
    single = audio.resample(batch[1], orig_sr=orig, target_sr=target).to_numpy()
    np.testing.assert_allclose(got[1], single, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("orig", "target", "res_type"), [(16000, 8000, "soxr_hq"), (8000, 11025, "soxr_hq"),
                                                          (44100, 16000, "soxr_vhq")])  # fmt: skip
def test_matches_brute_force_sinc_everywhere(orig: int, target: int, res_type: str) -> None:
    x = np.random.default_rng(7).standard_normal(1500)
    got = audio.resample(x, orig_sr=orig, target_sr=target, res_type=res_type).to_numpy()
    want = _brute(x, orig, target, res_type)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


def test_scale_float32_and_equal_rates() -> None:
    x = np.random.default_rng(3).standard_normal((3, 2, 800))
    plain = audio.resample(x, orig_sr=16000, target_sr=12000).to_numpy()
    assert plain.shape == (3, 2, 600)
    scaled = audio.resample(x, orig_sr=16000, target_sr=12000, scale=True).to_numpy()
    np.testing.assert_allclose(scaled, plain / np.sqrt(0.75), rtol=1e-12)
    lib_scaled = _lib("librosa").resample(x, orig_sr=16000, target_sr=12000, scale=True)
    assert lib_scaled.shape == scaled.shape
    single = audio.resample(x.astype(np.float32), orig_sr=16000, target_sr=12000)
    assert single.dtype.name == "float32"
    np.testing.assert_allclose(single.to_numpy(), plain, rtol=0, atol=2e-5 * np.abs(plain).max())
    np.testing.assert_array_equal(audio.resample(x, orig_sr=8000, target_sr=8000).to_numpy(), x)


def test_bad_input_is_refused() -> None:
    x = np.zeros(100)
    with pytest.raises(ArgumentError, match="orig_sr"):
        audio.resample(x, orig_sr=0, target_sr=8000)
    with pytest.raises(ArgumentError, match="target_sr"):
        audio.resample(x, orig_sr=8000, target_sr=float("inf"))
    with pytest.raises(ArgumentError, match="res_type"):
        audio.resample(x, orig_sr=8000, target_sr=16000, res_type="kaiser_best")
    with pytest.raises(ArgumentError, match="non-finite"):
        audio.resample(np.array([0.0, np.nan, 1.0]), orig_sr=8000, target_sr=16000)
    with pytest.raises(ShapeError, match="empty"):
        audio.resample(np.zeros(0), orig_sr=8000, target_sr=16000)
    with pytest.raises(DTypeError, match="int64"):
        audio.resample(np.zeros(10, dtype=np.int64), orig_sr=8000, target_sr=16000)


@pytest.mark.parametrize(("orig", "target"), [(16000 / 2 ** (-3 / 12), 16000), (8000, 11025.5), (384000, 383999)])
def test_any_ratio_matches_brute_force_sinc(orig: float, target: float) -> None:
    x = np.random.default_rng(5).standard_normal((2, 900))
    got = audio.resample(x, orig_sr=orig, target_sr=target).to_numpy()
    want = np.stack([_brute(row, orig, target, "soxr_hq") for row in x])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


def test_table_and_direct_evaluation_agree() -> None:
    x = np.random.default_rng(9).standard_normal((2, 700))
    out_len = math.ceil(700 * 11025 / 16000)
    table = rs._host_resample(x, 441, 640, out_len, "soxr_hq")
    direct = rs._host_direct(x, 16000.0, 11025.0, out_len, "soxr_hq")
    np.testing.assert_allclose(table, direct, rtol=0, atol=1e-12)


def _band_limited_excerpt(path: Path, count: int, fraction: float) -> tuple[Array, Array, int]:
    data, rate = _lib("soundfile").read(str(path), dtype="float64")
    x = data[:count]
    spectrum = np.fft.rfft(x)
    freqs = np.fft.rfftfreq(count, 1.0 / rate)
    spectrum[freqs > fraction * rate / 2] = 0.0
    return np.fft.irfft(spectrum, n=count), spectrum, rate


@pytest.mark.audio_data
def test_real_recordings_against_the_sinc_series(speech_16k: list[Path], speech_8k: list[Path]) -> None:
    for files, target in ((speech_16k, 8000), (speech_16k, 22050), (speech_8k, 16000)):
        rate = _lib("soundfile").info(str(files[0])).samplerate
        down = rate // math.gcd(rate, target)
        count = (rate // 2) // down * down  # a whole number of output samples
        x, spectrum, rate = _band_limited_excerpt(files[0], count, 0.8 * min(rate, target) / rate)
        n_out = count * target // rate
        exact = np.fft.irfft(spectrum, n=n_out) * (n_out / count)  # the periodic band-limited signal at the new times
        got = audio.resample(x, orig_sr=rate, target_sr=target).to_numpy()
        lib = _lib("librosa").resample(x, orig_sr=rate, target_sr=target, res_type="soxr_hq")
        inner = slice(n_out // 5, n_out - n_out // 5)
        peak = np.abs(exact).max()
        ours = np.abs(got - exact)[inner].max() / peak
        theirs = np.abs(lib[:n_out] - exact)[inner].max() / peak
        assert ours <= max(theirs, 1e-6), (files[0], target, ours, theirs)


@pytest.mark.nvrtc
def test_the_kernel_file_compiles() -> None:
    from pygpukit.audio import _kernels
    from pygpukit.core.compiler import compile_source

    names = [f"{n}_{s}" for n in rs._PARAMS for s in ("f32", "f64")]
    program = compile_source(_kernels.SOURCES.source(rs._FILE), arch=80, name=rs._FILE, name_expressions=names,
                             include_dirs=_kernels.SOURCES.include_dirs(rs._FILE))  # fmt: skip
    assert set(program.lowered_names) >= set(names)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("orig", "target"), [(44100, 16000), (16000, 44100), (8000, 11025), (16000.5, 12000)])
def test_gpu_kernel_matches_the_float64_sums(dtype: Any, orig: float, target: float) -> None:
    x = np.random.default_rng(11).standard_normal((3, 4001)).astype(dtype)
    got = audio.resample(x, orig_sr=orig, target_sr=target)
    assert got.dtype.name == np.dtype(dtype).name
    out_len = math.ceil(4001 * target / orig)
    want = rs._host_direct(x.astype(np.float64), orig, target, out_len, "soxr_hq")
    tol = 2e-5 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got.to_numpy(), want, rtol=0, atol=tol * np.abs(want).max())


TILE_RATES = [(44100, 16000), (48000, 16000), (16000, 24000), (22050, 16000), (16000, 8000), (8000, 11025)]


@pytest.mark.parametrize(("orig", "target"), TILE_RATES)
@pytest.mark.parametrize("itemsize", [4, 8])
def test_tile_geometry_and_thread_order(orig: int, target: int, itemsize: int) -> None:
    """The common rate pairs take resample_tile: a window within the shared-memory limit, whole periods of up
    outputs, and a thread order that is a permutation of the tile's outputs."""
    g = math.gcd(orig, target)
    up, down = target // g, orig // g
    taps = rs.filter_geometry(up, down, "soxr_hq")[0]
    tile = rs.tile_geometry(up, down, taps, itemsize)
    assert tile is not None
    span_up, threads, shared = tile
    assert span_up % up == 0
    assert span_up >= rs.TILE_MIN_PHASES
    assert shared == (rs.TILE_OUTPUTS[itemsize] * (span_up // up) * down + taps) * itemsize <= rs.TILE_SHARED
    assert threads % 32 == 0
    assert threads <= 256
    assert span_up / (threads * -(-span_up // threads)) > 0.8
    outputs = rs.TILE_OUTPUTS[itemsize]
    order = rs.tile_order(up, down, span_up, outputs)
    assert order.dtype == np.int32
    np.testing.assert_array_equal(np.sort(order), np.arange(span_up))
    assert rs._order_cost(order, up, down, outputs) <= rs._order_cost(np.arange(span_up), up, down, outputs)


def test_huge_windows_leave_the_tile_kernel() -> None:
    # 44101 -> 16000: a tile of 8 periods of 44101 input samples cannot sit in 48 KiB of shared memory
    assert rs.tile_geometry(16000, 44101, 376, 4) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("orig", "target"), [*TILE_RATES, (44101, 16000)])
@pytest.mark.parametrize("shape", [(1, 1), (5, 7919), (2, 3, 20011)])
def test_gpu_tile_kernel_matches_the_float64_sums(dtype: Any, orig: int, target: int, shape: tuple[int, ...]) -> None:
    """resample_tile (and resample_poly past its shared-memory limit) on odd lengths and batches, against the
    float64 sums: tiles that end past the signal, rows shorter than the filter, several tiles per row."""
    x = np.random.default_rng(orig + shape[-1]).standard_normal(shape).astype(dtype)
    got = audio.resample(x, orig_sr=orig, target_sr=target).to_numpy()
    out_len = math.ceil(shape[-1] * target / orig)
    assert got.shape == (*shape[:-1], out_len)
    rows = x.reshape(-1, shape[-1]).astype(np.float64)
    g = math.gcd(orig, target)
    want = rs._host_resample(rows, target // g, orig // g, out_len, "soxr_hq").reshape(got.shape)
    tol = 2e-5 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * max(np.abs(want).max(), 1e-300))
