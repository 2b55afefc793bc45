"""pygpukit.tts.kokoro_text: Kokoro's text encoder (embedding, conv + channel layer norm + LeakyReLU, LSTM).

Random weights of Kokoro's sizes against a float64 NumPy implementation written here; the real model
(cached by ci/fetch_kokoro.py; needs the onnx package) against onnxruntime on the float twin, through the
fixed projection of tests/data/kokoro_reference.json (ci/kokoro_reference.py).
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.tts.errors import KokoroModelError
from pygpukit.tts.kokoro_text import KokoroTextEncoder
from pygpukit.tts.onnx_reader import KokoroOnnx, LstmWeights

Array = np.ndarray[Any, Any]
DATA = Path(__file__).resolve().parent / "data" / "kokoro_reference.json"
P = "encoder.text_encoder."


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _weights(rng: np.random.Generator, vocab: int = 30) -> KokoroOnnx:
    def u(*shape: int, scale: float = 1.0) -> Array:
        return (rng.uniform(-1, 1, shape) * scale).astype(np.float32)

    t = {P + "embedding.weight": u(vocab, 512)}
    for i in range(3):
        t[f"{P}cnn.{i}.0.weight"], t[f"{P}cnn.{i}.0.bias"] = u(512, 512, 5, scale=0.03), u(512, scale=0.1)
        t[f"{P}cnn.{i}.1.gamma"], t[f"{P}cnn.{i}.1.beta"] = 1 + u(512, scale=0.2), u(512, scale=0.2)
    lstm = LstmWeights(u(2, 1024, 512, scale=0.06), u(2, 1024, 256, scale=0.06), u(2, 1024, scale=0.1))
    return KokoroOnnx(tensors=t, lstms={P + "lstm": lstm})


def reference(weights: KokoroOnnx, ids: Array) -> Array:
    w = {n[len(P) :]: np.asarray(v, np.float64) for n, v in weights.tensors.items()}
    x = w["embedding.weight"][ids]  # (T, 512)
    steps = x.shape[0]
    for i in range(3):
        kernel = w[f"cnn.{i}.0.weight"]
        padded = np.pad(x, ((2, 2), (0, 0)))
        h = sum(padded[j : j + steps] @ kernel[:, :, j].T for j in range(5)) + w[f"cnn.{i}.0.bias"]
        centred = h - h.mean(1, keepdims=True)
        h = centred / np.sqrt((centred**2).mean(1, keepdims=True) + 1e-5) * w[f"cnn.{i}.1.gamma"] + w[f"cnn.{i}.1.beta"]
        x = np.where(h >= 0, h, 0.2 * h)
    lstm = weights.lstms[P + "lstm"]
    out = np.zeros((steps, 512))
    for d in range(2):
        w_ih, w_hh, b = (np.asarray(a, np.float64)[d] for a in (lstm.w_ih, lstm.w_hh, lstm.bias))
        hs, c = np.zeros(256), np.zeros(256)
        for t in range(steps) if d == 0 else range(steps - 1, -1, -1):
            gi, gf, gg, go = np.split(w_ih @ x[t] + w_hh @ hs + b, 4)
            c = c / (1 + np.exp(-gf)) + np.tanh(gg) / (1 + np.exp(-gi))
            hs = np.tanh(c) / (1 + np.exp(-go))
            out[t, d * 256 : (d + 1) * 256] = hs
    return out.T


def test_text_encoder_random_weights_match_numpy(rng: np.random.Generator) -> None:
    weights = _weights(rng)
    ids = np.concatenate([[0], rng.integers(1, 30, 9), [0]])
    out = KokoroTextEncoder(weights)(ids)
    assert out.shape == (512, 11)
    np.testing.assert_allclose(out.to_numpy(), reference(weights, ids), atol=2e-5)


def test_text_encoder_errors(rng: np.random.Generator) -> None:
    weights = _weights(rng)
    model = KokoroTextEncoder(weights)
    with pytest.raises(ArgumentError, match=r"\[0, 30\)"):
        model(np.array([0, 31, 0]))
    with pytest.raises(ShapeError, match="1-D integer"):
        model(np.array([0.5, 1.0]))
    del weights.tensors[P + "cnn.2.1.gamma"]
    with pytest.raises(KokoroModelError, match="gamma"):
        KokoroTextEncoder(weights)


def test_text_encoder_matches_onnxruntime_float_twin() -> None:
    pytest.importorskip("onnx")
    from pygpukit.tts.fetch import MODEL_FILE, model_dir
    from pygpukit.tts.onnx_reader import read_onnx

    path = model_dir() / MODEL_FILE
    if not path.is_file():
        if os.environ.get("PYGPUKIT_REQUIRE_MODELS") == "1":
            pytest.fail(f"Kokoro model not cached at {path} (python ci/fetch_kokoro.py)")
        pytest.skip(f"Kokoro model not cached at {path} (python ci/fetch_kokoro.py)")
    model = KokoroTextEncoder(read_onnx(path))
    projection = np.random.default_rng(0).standard_normal((8, 512)) / np.sqrt(512.0)  # as ci/kokoro_reference.py
    cases = [c for c in json.loads(DATA.read_text(encoding="utf-8"))["cases"] if "twin_text_proj" in c]
    assert len(cases) == 6
    for case in cases:
        got = projection @ model(np.array(case["ids"])).to_numpy().astype(np.float64)
        want = np.array(case["twin_text_proj"])
        snr = 10 * np.log10((want**2).sum() / ((want - got) ** 2).sum())
        assert snr >= 60.0, (case["voice"], snr)
