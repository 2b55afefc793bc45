"""pygpukit.tts.kokoro_decoder: the front of Kokoro's decoder (F0/N convs, encode, decode.0-3).

Small random weights against a float64 NumPy implementation written here; the real model (cached by
ci/fetch_kokoro.py; needs the onnx package) end to end from phoneme ids (text encoder, durations, F0 / N)
against onnxruntime on the float twin, through the fixed projection of tests/data/kokoro_reference.json.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.errors import ShapeError
from pygpukit.tts.errors import KokoroModelError
from pygpukit.tts.kokoro_decoder import KokoroDecoderFront
from pygpukit.tts.onnx_reader import KokoroOnnx

Array = np.ndarray[Any, Any]
DATA = Path(__file__).resolve().parent / "data" / "kokoro_reference.json"
C, HID, RES = 8, 16, 4  # asr channels, block width, asr_res channels (Kokoro: 512, 1024, 64)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _weights(rng: np.random.Generator) -> KokoroOnnx:
    def u(*shape: int, scale: float = 1.0) -> Array:
        return (rng.uniform(-1, 1, shape) * scale).astype(np.float32)

    t: dict[str, Array] = {}
    for name in ("F0_conv", "N_conv"):
        t[f"decoder.{name}.weight"], t[f"decoder.{name}.bias"] = u(1, 1, 3, scale=0.5), u(1, scale=0.1)
    t["decoder.asr_res.0.weight"], t["decoder.asr_res.0.bias"] = u(RES, C, 1, scale=0.3), u(RES, scale=0.1)
    blocks = {"encode": (C + 2, HID), "decode.0": (HID + RES + 2, HID), "decode.1": (HID + RES + 2, HID),
              "decode.2": (HID + RES + 2, HID), "decode.3": (HID + RES + 2, C)}  # fmt: skip
    for block, (c_in, c_out) in blocks.items():
        b = f"decoder.{block}."
        t[b + "norm1.fc.weight"], t[b + "norm1.fc.bias"] = u(2 * c_in, 128, scale=0.1), u(2 * c_in, scale=0.2)
        t[b + "norm2.fc.weight"], t[b + "norm2.fc.bias"] = u(2 * c_out, 128, scale=0.1), u(2 * c_out, scale=0.2)
        t[b + "conv1.weight"], t[b + "conv1.bias"] = u(c_out, c_in, 3, scale=0.3), u(c_out, scale=0.1)
        t[b + "conv2.weight"], t[b + "conv2.bias"] = u(c_out, c_out, 3, scale=0.3), u(c_out, scale=0.1)
        t[b + "conv1x1.weight"] = u(c_out, c_in, 1, scale=0.3)
    t["decoder.decode.3.pool.weight"], t["decoder.decode.3.pool.bias"] = u(HID + RES + 2, 1, 3), u(HID + RES + 2)
    return KokoroOnnx(tensors=t)


def _conv(x: Array, w: Array, b: Array | None, stride: int = 1) -> Array:
    k = w.shape[2]
    pad = np.pad(x, ((0, 0), (k // 2, k // 2)))
    length = (x.shape[1] + 2 * (k // 2) - k) // stride + 1
    out = sum(np.einsum("oc,cl->ol", w[:, :, j], pad[:, j : j + stride * (length - 1) + 1 : stride]) for j in range(k))
    return out + (b[:, None] if b is not None else 0.0)  # type: ignore[no-any-return]


def reference(weights: KokoroOnnx, asr: Array, f0: Array, n: Array, style: Array) -> Array:
    w = {k[len("decoder.") :]: np.asarray(v, np.float64) for k, v in weights.tensors.items()}
    s = np.asarray(style, np.float64)[:128]

    def adain(x: Array, name: str) -> Array:
        gamma, beta = np.split(w[name + ".fc.weight"] @ s + w[name + ".fc.bias"], 2)
        centred = x - x.mean(1, keepdims=True)
        return (1 + gamma[:, None]) * centred / np.sqrt((centred**2).mean(1, keepdims=True) + 1e-5) + beta[:, None]  # type: ignore[no-any-return]

    def block(x: Array, name: str, upsample: bool) -> Array:
        r = adain(x, name + ".norm1")
        r = np.where(r >= 0, r, 0.2 * r)
        short = x
        if upsample:
            pool = np.zeros((r.shape[0], 2 * r.shape[1] + 2))
            for k in range(3):
                pool[:, k : k + 2 * r.shape[1] : 2] += r * w[name + ".pool.weight"][:, 0, k : k + 1]
            r = pool[:, 1 : 1 + 2 * r.shape[1]] + w[name + ".pool.bias"][:, None]
            short = np.repeat(x, 2, axis=1)
        r = adain(_conv(r, w[name + ".conv1.weight"], w[name + ".conv1.bias"]), name + ".norm2")
        r = _conv(np.where(r >= 0, r, 0.2 * r), w[name + ".conv2.weight"], w[name + ".conv2.bias"])
        return (r + _conv(short, w[name + ".conv1x1.weight"], None)) / np.sqrt(2.0)

    f0_f = _conv(f0[None], w["F0_conv.weight"], w["F0_conv.bias"], stride=2)
    n_f = _conv(n[None], w["N_conv.weight"], w["N_conv.bias"], stride=2)
    x = block(np.concatenate([asr, f0_f, n_f]), "encode", False)
    res = _conv(asr, w["asr_res.0.weight"], w["asr_res.0.bias"])
    for i in range(4):
        x = block(np.concatenate([x, res, f0_f, n_f]), f"decode.{i}", i == 3)
    return x


def test_decoder_front_random_weights_match_numpy(rng: np.random.Generator) -> None:
    weights = _weights(rng)
    frames = 9
    asr = rng.uniform(-1, 1, (C, frames)).astype(np.float32)
    f0 = rng.uniform(0, 3, 2 * frames).astype(np.float32)
    n = rng.uniform(-1, 1, 2 * frames).astype(np.float32)
    style = rng.uniform(-0.5, 0.5, 256).astype(np.float32)
    out = KokoroDecoderFront(weights)(gp.from_numpy(asr), gp.from_numpy(f0), gp.from_numpy(n), style)
    expected = reference(weights, asr.astype(np.float64), f0.astype(np.float64), n.astype(np.float64), style)
    assert out.shape == (C, 2 * frames)
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-4, atol=1e-4)


def test_decoder_front_errors(rng: np.random.Generator) -> None:
    weights = _weights(rng)
    model = KokoroDecoderFront(weights)
    with pytest.raises(ShapeError, match="2F values"):
        model(gp.zeros((C, 5)), gp.zeros(9), gp.zeros(10), np.zeros(256))
    with pytest.raises(ShapeError, match="256 values"):
        model(gp.zeros((C, 5)), gp.zeros(10), gp.zeros(10), np.zeros(128))
    del weights.tensors["decoder.decode.3.pool.bias"]
    with pytest.raises(KokoroModelError, match=r"pool\.bias"):
        KokoroDecoderFront(weights)


def test_decoder_front_matches_onnxruntime_float_twin() -> None:
    pytest.importorskip("onnx")
    from pygpukit.tts import KokoroDurations, KokoroProsody, KokoroTextEncoder, expand, model_dir, read_onnx
    from pygpukit.tts.fetch import MODEL_FILE

    path = model_dir() / MODEL_FILE
    if not path.is_file():
        if os.environ.get("PYGPUKIT_REQUIRE_MODELS") == "1":
            pytest.fail(f"Kokoro model not cached at {path} (python ci/fetch_kokoro.py)")
        pytest.skip(f"Kokoro model not cached at {path} (python ci/fetch_kokoro.py)")
    voices = np.load(model_dir() / "voices_ja.npz")
    weights = read_onnx(path)
    text, durations = KokoroTextEncoder(weights), KokoroDurations(weights)
    prosody, decoder = KokoroProsody(weights), KokoroDecoderFront(weights)
    projection = np.random.default_rng(0).standard_normal((8, 512)) / np.sqrt(512.0)  # as ci/kokoro_reference.py
    cases = [c for c in json.loads(DATA.read_text(encoding="utf-8"))["cases"] if "twin_decoder_proj" in c]
    assert len(cases) == 6
    for case in cases[::2]:  # one voice per phoneme string keeps the CPU backend's run short
        ids = np.array(case["ids"])
        style = voices[case["voice"]][ids.size - 3].reshape(256)
        d = durations(ids, style)
        f0, n = prosody(expand(d.features, d.frames), style)
        asr = expand(text(ids).transpose((1, 0)).contiguous(), d.frames)
        got = projection @ decoder(asr, f0, n, style).to_numpy().astype(np.float64)
        want = np.array(case["twin_decoder_proj"])
        assert got.shape == want.shape
        snr = 10 * np.log10((want**2).sum() / ((want - got) ** 2).sum())
        assert snr >= 60.0, (case["voice"], snr)
