"""pygpukit.tts.kokoro_generator: Kokoro's iSTFTNet generator (harmonic source, source STFT, upsampling with
AdaIN residual blocks, conv_post, the export's inverse STFT).

Tiny random weights (the real layer structure, few channels) against a float64 NumPy implementation of the
ONNX graph written here (np.fft for the STFT, the export's inverse-basis overlap-add). The real model is in
test_tts_model.py.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import ShapeError
from pygpukit.tts.errors import KokoroModelError
from pygpukit.tts.kokoro_generator import KokoroGenerator, linear_resize, source_phase, stft_basis
from pygpukit.tts.onnx_reader import KokoroOnnx

Array = np.ndarray[Any, Any]
C0, C1, C2 = 6, 5, 4  # Kokoro: 512, 256, 128
G = "decoder.generator."


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _block(t: dict[str, Array], u: Any, name: str, c: int, k: int) -> None:
    for j in range(3):
        for p in ("adain1", "adain2"):
            t[f"{name}.{p}.{j}.fc.weight"], t[f"{name}.{p}.{j}.fc.bias"] = u(2 * c, 128, s=0.1), u(2 * c, s=0.2)
        for p in ("convs1", "convs2"):
            t[f"{name}.{p}.{j}.weight"], t[f"{name}.{p}.{j}.bias"] = u(c, c, k, s=0.3), u(c, s=0.1)
        t[f"{name}.alpha1.{j}"] = (0.5 + np.abs(u(1, c, 1))).astype(np.float32)
        t[f"{name}.alpha2.{j}"] = (0.5 + np.abs(u(1, c, 1))).astype(np.float32)


def _weights(rng: np.random.Generator) -> KokoroOnnx:
    def u(*shape: int, s: float = 1.0) -> Array:
        return (rng.uniform(-1, 1, shape) * s).astype(np.float32)

    t: dict[str, Array] = {}
    t["m_source.l_linear.weight"], t["m_source.l_linear.bias"] = u(1, 9, s=0.5), u(1, s=0.1)
    t["ups.0.weight"], t["ups.0.bias"] = u(C0, C1, 20, s=0.2), u(C1, s=0.1)
    t["ups.1.weight"], t["ups.1.bias"] = u(C1, C2, 12, s=0.2), u(C2, s=0.1)
    t["noise_convs.0.weight"], t["noise_convs.0.bias"] = u(C1, 22, 12, s=0.1), u(C1, s=0.1)
    t["noise_convs.1.weight"], t["noise_convs.1.bias"] = u(C2, 22, 1, s=0.2), u(C2, s=0.1)
    _block(t, u, "noise_res.0", C1, 7)
    _block(t, u, "noise_res.1", C2, 11)
    for b, k in enumerate((3, 7, 11) * 2):
        _block(t, u, f"resblocks.{b}", C1 if b < 3 else C2, k)
    t["conv_post.weight"], t["conv_post.bias"] = u(22, C2, 7, s=0.2), u(22, s=0.1)
    n = np.arange(20)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / 20)
    fourier = np.fft.fft(np.eye(20))[:11]
    basis = np.vstack([fourier.real, fourier.imag])  # the export's pinv basis, as pytorch-stft builds it
    t["stft.istft.stft.inverse_basis"] = (np.linalg.pinv(4 * basis).T * window)[:, None, :].astype(np.float32)
    t["stft.istft.stft.window_sum"] = (window**2).astype(np.float32)
    return KokoroOnnx(tensors={G + k: v for k, v in t.items()})


# -- the float64 reference ----------------------------------------------------------------------------
def _conv(x: Array, w: Array, b: Array | None, stride: int = 1, padding: int = 0, dilation: int = 1) -> Array:
    k = w.shape[2]
    pad = np.pad(x, ((0, 0), (padding, padding)))
    length = (pad.shape[1] - dilation * (k - 1) - 1) // stride + 1
    out = np.zeros((w.shape[0], length))
    for j in range(k):
        start = j * dilation
        out += np.einsum("oc,cl->ol", w[:, :, j], pad[:, start : start + stride * (length - 1) + 1 : stride])
    return out + (b[:, None] if b is not None else 0.0)


def _convt(x: Array, w: Array, b: Array | None, stride: int, padding: int) -> Array:
    _, c_out, k = w.shape
    full = np.zeros((c_out, (x.shape[1] - 1) * stride + k))
    for j in range(x.shape[1]):
        full[:, j * stride : j * stride + k] += np.einsum("i,iok->ok", x[:, j], w)
    out: Array = full[:, padding : full.shape[1] - padding]
    return out + (b[:, None] if b is not None else 0.0)


def reference(weights: KokoroOnnx, x: Array, f0: Array, style: Array, har: Array | None = None) -> Array:
    """The waveform; ``har`` replaces the source's [magnitude; phase] (whose near-zero bins have a phase
    decided by rounding, so a float32 and a float64 computation need not agree there)."""
    w = {k[len(G) :]: np.asarray(v, np.float64) for k, v in weights.tensors.items()}
    s = np.asarray(style, np.float64)[:128]
    # harmonic source: frame-rate phase, linear (half-pixel) resize x300, sines of voiced samples
    f = np.asarray(f0, np.float64)
    rad = f[:, None] * np.arange(1, 10) / 24000.0
    phase = np.cumsum(rad - np.floor(rad), axis=0) * 2 * np.pi * 300
    pos = np.clip((np.arange(f.size * 300) + 0.5) / 300 - 0.5, 0, f.size - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, f.size - 1)
    up = phase[lo] * (1 - (pos - lo))[:, None] + phase[hi] * (pos - lo)[:, None]
    voiced = np.repeat(f > 10, 300)[:, None]
    source = np.tanh((0.1 * np.sin(up) * voiced) @ w["m_source.l_linear.weight"].T + w["m_source.l_linear.bias"])[:, 0]
    padded = np.pad(source, 10, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(20) / 20)
    frames = np.stack([padded[i : i + 20] * window for i in range(0, padded.size - 19, 5)])
    spec = np.fft.rfft(frames, axis=1).T  # (11, T)
    if har is None:
        har = np.concatenate([np.abs(spec), np.arctan2(spec.imag, spec.real)])

    def adain(v: Array, name: str) -> Array:
        gamma, beta = np.split(w[name + ".fc.weight"] @ s + w[name + ".fc.bias"], 2)
        centred = v - v.mean(1, keepdims=True)
        return (1 + gamma[:, None]) * centred / np.sqrt((centred**2).mean(1, keepdims=True) + 1e-5) + beta[:, None]  # type: ignore[no-any-return]

    def block(v: Array, name: str, k: int) -> Array:
        for j, d in enumerate((1, 3, 5)):
            a1, a2 = w[f"{name}.alpha1.{j}"].reshape(-1, 1), w[f"{name}.alpha2.{j}"].reshape(-1, 1)
            h = adain(v, f"{name}.adain1.{j}")
            h = _conv(h + np.sin(a1 * h) ** 2 / a1, w[f"{name}.convs1.{j}.weight"], w[f"{name}.convs1.{j}.bias"],
                      padding=d * (k - 1) // 2, dilation=d)  # fmt: skip
            h = adain(h, f"{name}.adain2.{j}")
            h = _conv(h + np.sin(a2 * h) ** 2 / a2, w[f"{name}.convs2.{j}.weight"], w[f"{name}.convs2.{j}.bias"],
                      padding=(k - 1) // 2)  # fmt: skip
            v = v + h
        return v

    v = np.asarray(x, np.float64)
    for i, ((stride, pad), (ns, npad), nk) in enumerate(zip(((10, 5), (6, 3)), ((6, 3), (1, 0)), (7, 11), strict=True)):
        v = np.where(v >= 0, v, 0.1 * v)
        xs = block(_conv(har, w[f"noise_convs.{i}.weight"], w[f"noise_convs.{i}.bias"], ns, npad), f"noise_res.{i}", nk)
        v = _convt(v, w[f"ups.{i}.weight"], w[f"ups.{i}.bias"], stride, pad)
        if i == 1:
            v = np.concatenate([v[:, 1:2], v], axis=1)
        v = v + xs
        v = np.sum([block(v, f"resblocks.{3 * i + j}", k) for j, k in enumerate((3, 7, 11))], axis=0) / 3
    post = _conv(np.where(v >= 0, v, 0.01 * v), w["conv_post.weight"], w["conv_post.bias"], padding=3)
    magnitude, angle = np.exp(post[:11]), np.sin(post[11:])
    wav = _convt(np.concatenate([magnitude * np.cos(angle), magnitude * np.sin(angle)]),
                 w["stft.istft.stft.inverse_basis"], None, 5, 0)[0]  # fmt: skip
    ws = w["stft.istft.stft.window_sum"]
    wav[1:20] /= ws[1:20]  # the export divides only where its traced window sum reaches (> tiny)
    return wav[10:-10] * 4  # type: ignore[no-any-return]


def _snr(ours: Array, ref: Array) -> float:
    ref = np.asarray(ref, np.float64)
    return float(10 * np.log10((ref**2).sum() / max(((np.asarray(ours, np.float64) - ref) ** 2).sum(), 1e-300)))


# -- tests ------------------------------------------------------------------------------------------------
def test_stft_basis_is_onesided_dft_of_hann_frames(rng: np.random.Generator) -> None:
    frame = rng.standard_normal(20)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(20) / 20)
    want = np.fft.rfft(frame * window)
    got = stft_basis()[:, 0, :].astype(np.float64) @ frame
    np.testing.assert_allclose(got[:11], want.real, atol=1e-5)
    np.testing.assert_allclose(got[11:], want.imag, atol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 7])
def test_linear_resize_half_pixel(n: int, rng: np.random.Generator) -> None:
    values = rng.standard_normal(n)
    i0, i1, w0, w1 = linear_resize(n, 300)
    pos = np.clip((np.arange(n * 300) + 0.5) / 300 - 0.5, 0, n - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, n - 1)
    want = values[lo] * (1 - (pos - lo)) + values[hi] * (pos - lo)
    np.testing.assert_allclose(values[i0] * w0 + values[i1] * w1, want, rtol=1e-6, atol=1e-6)


def test_source_phase_float32_order(rng: np.random.Generator) -> None:
    f0 = rng.uniform(-50, 400, 40).astype(np.float32)
    rad = f0[:, None].astype(np.float64) * np.arange(1, 10) / 24000.0
    want = np.cumsum(rad - np.floor(rad), axis=0) * 2 * np.pi * 300
    np.testing.assert_allclose(source_phase(f0), want, rtol=2e-5, atol=2e-3)


def test_generator_matches_float64_reference(rng: np.random.Generator) -> None:
    weights = _weights(rng)
    frames = 3  # 2F = 6 F0 values -> 1800 samples
    x = rng.standard_normal((C0, 2 * frames)).astype(np.float32)
    f0 = np.array([0.0, 5.0, 120.0, 180.0, 240.0, 90.0], np.float32)  # unvoiced and voiced values
    style = rng.standard_normal(256).astype(np.float32) * 0.5
    gen = KokoroGenerator(weights)
    har = gen.harmonics(gen.source(f0))
    ours = gen.inverse(gen.spectrum(gp.from_numpy(x), har, style)).to_numpy()
    want = reference(weights, x, f0, style, har=har.to_numpy())
    assert ours.shape == (600 * frames,)
    assert ours.dtype == np.float32
    assert _snr(ours, want) > 60.0
    full = gen(gp.from_numpy(x), gp.from_numpy(f0), style).to_numpy()
    np.testing.assert_array_equal(full, ours)


def test_generator_pieces(rng: np.random.Generator) -> None:
    weights = _weights(rng)
    gen = KokoroGenerator(weights)
    f0 = np.array([150.0, 151.0, 0.0, 220.0], np.float32)
    source = gen.source(f0)
    assert source.shape == (1200,)
    har = gen.harmonics(source).to_numpy()
    padded = np.pad(source.to_numpy().astype(np.float64), 10, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(20) / 20)
    spec = np.fft.rfft(np.stack([padded[i : i + 20] * window for i in range(0, padded.size - 19, 5)]), axis=1).T
    np.testing.assert_allclose(har[:11], np.abs(spec), atol=1e-5)
    strong = np.abs(spec) > 1e-3  # the angle of a near-zero bin is rounding noise
    wrapped = np.angle(np.exp(1j * (har[11:] - np.angle(spec))))
    assert np.abs(wrapped[strong]).max() < 1e-3


def test_generator_errors(rng: np.random.Generator) -> None:
    weights = _weights(rng)
    gen = KokoroGenerator(weights)
    with pytest.raises(ShapeError, match="F0 curve of 2F"):
        gen(gp.from_numpy(np.zeros((C0, 4), np.float32)), np.zeros(5, np.float32), np.zeros(256, np.float32))
    with pytest.raises(ShapeError, match="style"):
        gen(gp.from_numpy(np.zeros((C0, 2), np.float32)), np.full(2, 100.0, np.float32), np.zeros(7, np.float32))
    del weights.tensors[G + "conv_post.weight"]
    with pytest.raises(KokoroModelError, match=r"conv_post\.weight"):
        KokoroGenerator(weights)


@pytest.mark.parametrize(("dtype", "floor"), [(gp.float16, 40.0), (gp.bfloat16, 20.0)])
def test_generator_half_precision(dtype: Any, floor: float, rng: np.random.Generator) -> None:
    """float16 / bfloat16 weights and activations (the source and the iSTFT stay float32); bfloat16 keeps 8
    bits, so a deep stack of convolutions ends near 25 to 45 dB (measured on the CPU backend)."""
    weights = _weights(rng)
    x = rng.standard_normal((C0, 6)).astype(np.float32)
    f0 = np.array([0.0, 5.0, 120.0, 180.0, 240.0, 90.0], np.float32)
    style = rng.standard_normal(256).astype(np.float32) * 0.5
    gen = KokoroGenerator(weights, dtype)
    har = gen.harmonics(gen.source(f0))
    ours = gen.inverse(gen.spectrum(gp.from_numpy(x).astype(dtype), har, style)).to_numpy()
    assert ours.dtype == np.float32
    assert _snr(ours, reference(weights, x, f0, style, har=har.to_numpy())) > floor
