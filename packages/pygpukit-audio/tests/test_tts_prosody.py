"""pygpukit.tts.kokoro_prosody: Kokoro's F0 / N predictor (shared LSTM, AdaIN residual blocks).

On random weights of Kokoro's real sizes it is compared with a float64 NumPy implementation written here;
on the real model (cached by ci/fetch_kokoro.py; needs the onnx package) the whole chain ids -> durations ->
frames -> F0 and N curves is compared with onnxruntime on the float twin of the ONNX file
(tests/data/kokoro_reference.json, written by ci/kokoro_reference.py).
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
from pygpukit.tts.kokoro_prosody import KokoroProsody, expand
from pygpukit.tts.onnx_reader import KokoroOnnx, LstmWeights

Array = np.ndarray[Any, Any]
DATA = Path(__file__).resolve().parent / "data" / "kokoro_reference.json"
P = "encoder.predictor."


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _weights(rng: np.random.Generator) -> KokoroOnnx:
    def u(*shape: int, scale: float = 1.0) -> Array:
        return (rng.uniform(-1, 1, shape) * scale).astype(np.float32)

    t: dict[str, Array] = {}
    for branch in ("F0", "N"):
        for i, (c_in, c_out) in enumerate(((512, 512), (512, 256), (256, 256))):
            b = f"{P}{branch}.{i}."
            t[b + "norm1.fc.weight"], t[b + "norm1.fc.bias"] = u(2 * c_in, 128, scale=0.1), u(2 * c_in, scale=0.2)
            t[b + "norm2.fc.weight"], t[b + "norm2.fc.bias"] = u(2 * c_out, 128, scale=0.1), u(2 * c_out, scale=0.2)
            t[b + "conv1.weight"], t[b + "conv1.bias"] = u(c_out, c_in, 3, scale=0.05), u(c_out, scale=0.1)
            t[b + "conv2.weight"], t[b + "conv2.bias"] = u(c_out, c_out, 3, scale=0.05), u(c_out, scale=0.1)
            if i == 1:
                t[b + "conv1x1.weight"] = u(c_out, c_in, 1, scale=0.05)
                t[b + "pool.weight"], t[b + "pool.bias"] = u(c_in, 1, 3, scale=0.5), u(c_in, scale=0.1)
        t[f"{P}{branch}_proj.weight"], t[f"{P}{branch}_proj.bias"] = u(1, 256, 1, scale=0.1), u(1, scale=0.1)
    shared = LstmWeights(u(2, 1024, 640, scale=0.06), u(2, 1024, 256, scale=0.06), u(2, 1024, scale=0.1))
    return KokoroOnnx(tensors=t, lstms={P + "shared": shared})


def _lstm(x: Array, w: LstmWeights) -> Array:
    hidden = w.w_hh.shape[2]
    out = np.zeros((x.shape[0], 2 * hidden))
    for d in range(2):
        w_ih, w_hh, b = (np.asarray(a, np.float64)[d] for a in (w.w_ih, w.w_hh, w.bias))
        h, c = np.zeros(hidden), np.zeros(hidden)
        for t in range(x.shape[0]) if d == 0 else range(x.shape[0] - 1, -1, -1):
            i, f, g, o = np.split(w_ih @ x[t] + w_hh @ h + b, 4)
            c = c / (1 + np.exp(-f)) + np.tanh(g) / (1 + np.exp(-i))
            h = np.tanh(c) / (1 + np.exp(-o))
            out[t, d * hidden : (d + 1) * hidden] = h
    return out


def _conv(x: Array, w: Array, b: Array | None) -> Array:
    k = w.shape[2]
    pad = np.pad(x, ((0, 0), (k // 2, k // 2)))
    out = sum(np.einsum("oc,cl->ol", w[:, :, j], pad[:, j : j + x.shape[1]]) for j in range(k))
    return out + (b[:, None] if b is not None else 0.0)  # type: ignore[no-any-return]


def reference(weights: KokoroOnnx, expanded: Array, style: Array) -> tuple[Array, Array]:
    w = {n[len(P) :]: np.asarray(v, np.float64) for n, v in weights.tensors.items()}
    s = np.asarray(style, np.float64)[128:]

    def adain(x: Array, name: str) -> Array:
        h = w[name + ".fc.weight"] @ s + w[name + ".fc.bias"]
        gamma, beta = np.split(h, 2)
        centred = x - x.mean(1, keepdims=True)
        norm = centred / np.sqrt((centred**2).mean(1, keepdims=True) + 1e-5)
        return (1 + gamma[:, None]) * norm + beta[:, None]  # type: ignore[no-any-return]

    def lrelu(x: Array) -> Array:
        return np.where(x >= 0, x, 0.2 * x)

    x = _lstm(expanded.T.astype(np.float64), weights.lstms[P + "shared"]).T
    curves = []
    for branch in ("F0", "N"):
        h = x
        for i in range(3):
            name = f"{branch}.{i}"
            r = lrelu(adain(h, name + ".norm1"))
            shortcut = h
            if i == 1:  # depthwise transposed conv k3 s2 p1 op1: out[2j - 1 + k] += r[j] * w[k]
                pool = np.zeros((r.shape[0], 2 * r.shape[1] + 2))
                for k in range(3):
                    pool[:, k : k + 2 * r.shape[1] : 2] += r * w[name + ".pool.weight"][:, 0, k : k + 1]
                r = pool[:, 1 : 1 + 2 * r.shape[1]] + w[name + ".pool.bias"][:, None]
                shortcut = _conv(np.repeat(h, 2, axis=1), w[name + ".conv1x1.weight"], None)
            r = _conv(r, w[name + ".conv1.weight"], w[name + ".conv1.bias"])
            r = _conv(lrelu(adain(r, name + ".norm2")), w[name + ".conv2.weight"], w[name + ".conv2.bias"])
            h = (r + shortcut) / np.sqrt(2.0)
        curves.append(_conv(h, w[f"{branch}_proj.weight"], w[f"{branch}_proj.bias"])[0])
    return curves[0], curves[1]


def test_prosody_random_weights_match_numpy(rng: np.random.Generator) -> None:
    weights = _weights(rng)
    model = KokoroProsody(weights)
    features = rng.uniform(-1, 1, (4, 640)).astype(np.float32)
    frames = [2, 1, 3, 1]
    expanded = expand(gp.from_numpy(features), frames)
    np.testing.assert_array_equal(expanded.to_numpy(), np.repeat(features, frames, axis=0).T)
    style = rng.uniform(-0.5, 0.5, 256).astype(np.float32)
    f0, n = model(expanded, style)
    ref_f0, ref_n = reference(weights, np.repeat(features, frames, axis=0).T, style)
    assert f0.shape == n.shape == (14,)
    np.testing.assert_allclose(f0.to_numpy(), ref_f0, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(n.to_numpy(), ref_n, rtol=1e-4, atol=1e-4)


def test_prosody_bad_inputs(rng: np.random.Generator) -> None:
    weights = _weights(rng)
    model = KokoroProsody(weights)
    with pytest.raises(ShapeError, match=r"\(640, F\)"):
        model(gp.zeros((512, 4)), np.zeros(256, np.float32))
    with pytest.raises(ShapeError, match="256 values"):
        model(gp.zeros((640, 4)), np.zeros(10, np.float32))
    with pytest.raises(ShapeError, match="one frame count"):
        expand(gp.zeros((3, 640)), [1, 2])
    del weights.lstms[P + "shared"]
    with pytest.raises(KokoroModelError, match="shared"):
        KokoroProsody(weights)


def _snr(reference_values: Array, values: Array) -> float:
    r = np.asarray(reference_values, np.float64)
    return float(10 * np.log10((r**2).sum() / max(((r - values) ** 2).sum(), 1e-300)))


def test_prosody_matches_onnxruntime_float_twin() -> None:
    pytest.importorskip("onnx")
    from pygpukit.tts.fetch import MODEL_FILE, model_dir
    from pygpukit.tts.kokoro_durations import KokoroDurations
    from pygpukit.tts.onnx_reader import read_onnx

    path = model_dir() / MODEL_FILE
    if not path.is_file():
        if os.environ.get("PYGPUKIT_REQUIRE_MODELS") == "1":
            pytest.fail(f"Kokoro model not cached at {path} (python ci/fetch_kokoro.py)")
        pytest.skip(f"Kokoro model not cached at {path} (python ci/fetch_kokoro.py)")
    voices = np.load(model_dir() / "voices_ja.npz")
    weights = read_onnx(path)
    durations, prosody = KokoroDurations(weights), KokoroProsody(weights)
    cases = [c for c in json.loads(DATA.read_text(encoding="utf-8"))["cases"] if "twin_f0" in c]
    assert len(cases) == 6
    for case in cases:
        ids = np.array(case["ids"])
        style = voices[case["voice"]][ids.size - 3].reshape(256)
        out = durations(ids, style)
        f0, n = prosody(expand(out.features, out.frames), style)
        assert f0.shape == (len(case["twin_f0"]),)
        assert _snr(case["twin_f0"], f0.to_numpy()) >= 60.0, case["voice"]
        assert _snr(case["twin_n"], n.to_numpy()) >= 60.0, case["voice"]
