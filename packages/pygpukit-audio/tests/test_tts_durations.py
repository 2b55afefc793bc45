"""pygpukit.tts.kokoro_durations: Kokoro's duration path (ALBERT, duration encoder, LSTM, duration_proj).

On random weights of Kokoro's real sizes it is compared with a float64 NumPy implementation written here;
on the real model (cached by ci/fetch_kokoro.py; needs the onnx package) its frame counts must equal
onnxruntime's on the float twin of the ONNX file for three phoneme strings and all five voices
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

from pygpukit.core.errors import ArgumentError, ShapeError
from pygpukit.tts.errors import KokoroModelError
from pygpukit.tts.kokoro_durations import KokoroDurations
from pygpukit.tts.onnx_reader import KokoroOnnx, LstmWeights

Array = np.ndarray[Any, Any]
DATA = Path(__file__).resolve().parent / "data" / "kokoro_reference.json"
LAYER = "encoder.bert.encoder.albert_layer_groups.0.albert_layers.0."
QKV = ("query", "key", "value")


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _random_weights(rng: np.random.Generator, vocab: int = 40) -> KokoroOnnx:
    def u(*shape: int, scale: float = 1.0) -> Array:
        return (rng.uniform(-1, 1, shape) * scale).astype(np.float32)

    t: dict[str, Array] = {
        "encoder.bert.embeddings.word_embeddings.weight": u(vocab, 128),
        "encoder.bert.embeddings.position_embeddings.weight": u(64, 128),
        "encoder.bert.embeddings.token_type_embeddings.weight": u(2, 128),
        "encoder.bert.embeddings.LayerNorm.weight": 1 + u(128, scale=0.1),
        "encoder.bert.embeddings.LayerNorm.bias": u(128, scale=0.1),
        "encoder.bert.encoder.embedding_hidden_mapping_in.weight": u(768, 128, scale=0.09),
        "encoder.bert.encoder.embedding_hidden_mapping_in.bias": u(768, scale=0.1),
        "encoder.bert_encoder.weight": u(512, 768, scale=0.04),
        "encoder.bert_encoder.bias": u(512, scale=0.1),
        "encoder.predictor.duration_proj.linear_layer.weight": u(50, 512, scale=0.05),
        "encoder.predictor.duration_proj.linear_layer.bias": u(50, scale=0.5),
    }
    sizes = {"attention.query": (768, 768), "attention.key": (768, 768), "attention.value": (768, 768),
             "attention.dense": (768, 768), "ffn": (2048, 768), "ffn_output": (768, 2048)}  # fmt: skip
    for part, (o, i) in sizes.items():
        t[f"{LAYER}{part}.weight"] = u(o, i, scale=1.5 / np.sqrt(i))
        t[f"{LAYER}{part}.bias"] = u(o, scale=0.1)
    for part in ("attention.LayerNorm", "full_layer_layer_norm"):
        t[f"{LAYER}{part}.weight"] = 1 + u(768, scale=0.1)
        t[f"{LAYER}{part}.bias"] = u(768, scale=0.1)
    for i in (1, 3, 5):
        t[f"encoder.predictor.text_encoder.lstms.{i}.fc.weight"] = u(1024, 128, scale=0.05)
        t[f"encoder.predictor.text_encoder.lstms.{i}.fc.bias"] = u(1024, scale=0.1)
    lstms = {
        name: LstmWeights(u(2, 1024, 640, scale=0.06), u(2, 1024, 256, scale=0.06), u(2, 1024, scale=0.1))
        for name in [f"encoder.predictor.text_encoder.lstms.{i}" for i in (0, 2, 4)] + ["encoder.predictor.lstm"]
    }
    return KokoroOnnx(tensors=t, lstms=lstms)


def _ln(x: Array, w: Array | None = None, b: Array | None = None, eps: float = 1e-12) -> Array:
    centred = x - x.mean(-1, keepdims=True)
    y = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps)
    return y * w + b if w is not None and b is not None else y


def _lstm(x: Array, weights: LstmWeights) -> Array:
    """Bidirectional LSTM over x (T, I) in float64, torch's gate order."""
    steps = x.shape[0]
    hidden = weights.w_hh.shape[2]
    out = np.zeros((steps, 2 * hidden))
    for d in range(2):
        w_ih, w_hh, b = (np.asarray(a, np.float64)[d] for a in (weights.w_ih, weights.w_hh, weights.bias))
        h, c = np.zeros(hidden), np.zeros(hidden)
        for t in range(steps) if d == 0 else range(steps - 1, -1, -1):
            z = w_ih @ x[t] + w_hh @ h + b
            i, f, g, o = np.split(z, 4)
            c = c / (1 + np.exp(-f)) + np.tanh(g) / (1 + np.exp(-i))
            h = np.tanh(c) / (1 + np.exp(-o))
            out[t, d * hidden : (d + 1) * hidden] = h
    return out


def reference(weights: KokoroOnnx, ids: Array, style: Array, speed: float) -> tuple[Array, Array]:
    """(raw durations, duration-encoder features) in float64."""
    w = {n: np.asarray(v, np.float64) for n, v in weights.tensors.items()}

    def lin(x: Array, name: str) -> Array:
        result: Array = x @ w[name + ".weight"].T + w[name + ".bias"]
        return result

    n = ids.size
    emb = "encoder.bert.embeddings."
    e = w[emb + "word_embeddings.weight"][ids] + w[emb + "position_embeddings.weight"][:n]
    e = e + w[emb + "token_type_embeddings.weight"][0]
    e = _ln(e, w["encoder.bert.embeddings.LayerNorm.weight"], w["encoder.bert.embeddings.LayerNorm.bias"])
    h = lin(e, "encoder.bert.encoder.embedding_hidden_mapping_in")
    for _ in range(12):
        q, k, v = (lin(h, f"{LAYER}attention.{p}").reshape(n, 12, 64).transpose(1, 0, 2) for p in QKV)
        s = q @ k.transpose(0, 2, 1) / 8.0
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        a = lin((p @ v).transpose(1, 0, 2).reshape(n, 768), LAYER + "attention.dense")
        a = _ln(h + a, w[LAYER + "attention.LayerNorm.weight"], w[LAYER + "attention.LayerNorm.bias"])
        f = lin(a, LAYER + "ffn")
        f = 0.5 * f * (1 + np.tanh(0.7978845608028654 * (f + 0.044715 * f**3)))
        h = _ln(lin(f, LAYER + "ffn_output") + a, w[LAYER + "full_layer_layer_norm.weight"],
                w[LAYER + "full_layer_layer_norm.bias"])  # fmt: skip
    s_half = np.asarray(style, np.float64)[128:]
    x = np.concatenate([lin(h, "encoder.bert_encoder"), np.tile(s_half, (n, 1))], -1)
    for i in range(3):
        x = _lstm(x, weights.lstms[f"encoder.predictor.text_encoder.lstms.{2 * i}"])
        gb = lin(s_half, f"encoder.predictor.text_encoder.lstms.{2 * i + 1}.fc")
        x = (1 + gb[:512]) * _ln(x, eps=1e-5) + gb[512:]
        x = np.concatenate([x, np.tile(s_half, (n, 1))], -1)
    y = _lstm(x, weights.lstms["encoder.predictor.lstm"])
    bins = 1 / (1 + np.exp(-lin(y, "encoder.predictor.duration_proj.linear_layer")))
    return bins.sum(-1) / speed, x


def test_durations_random_weights_match_numpy(rng: np.random.Generator) -> None:
    weights = _random_weights(rng)
    model = KokoroDurations(weights)
    for length, speed in ((7, 1.0), (13, 1.3)):
        ids = np.concatenate([[0], rng.integers(1, 40, length - 2), [0]])
        style = rng.uniform(-0.5, 0.5, 256).astype(np.float32)
        out = model(ids, style, speed)
        raw, features = reference(weights, ids, style, speed)
        np.testing.assert_allclose(out.raw, raw, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(out.features.to_numpy(), features, atol=5e-4)
        assert out.frames.dtype == np.int64
        assert (out.frames >= 1).all()
        np.testing.assert_array_equal(out.frames, np.maximum(np.rint(out.raw), 1))


def test_durations_bad_inputs(rng: np.random.Generator) -> None:
    weights = _random_weights(rng)
    model = KokoroDurations(weights)
    style = np.zeros(256, np.float32)
    with pytest.raises(ArgumentError, match=r"\[0, 40\)"):
        model(np.array([0, 45, 0]), style)
    with pytest.raises(ShapeError, match="1-D integer"):
        model(np.array([[0, 1, 0]]), style)
    with pytest.raises(ShapeError, match="256 values"):
        model(np.array([0, 1, 0]), style[:128])
    with pytest.raises(ArgumentError, match="speed"):
        model(np.array([0, 1, 0]), style, speed=0.0)
    del weights.tensors[f"{LAYER}ffn.weight"]
    with pytest.raises(KokoroModelError, match=r"ffn\.weight"):
        KokoroDurations(weights)


def test_durations_equal_onnxruntime_float_twin() -> None:
    pytest.importorskip("onnx")
    from pygpukit.tts.fetch import MODEL_FILE, model_dir
    from pygpukit.tts.onnx_reader import read_onnx

    path = model_dir() / MODEL_FILE
    if not path.is_file():
        if os.environ.get("PYGPUKIT_REQUIRE_MODELS") == "1":
            pytest.fail(f"Kokoro model not cached at {path} (python ci/fetch_kokoro.py)")
        pytest.skip(f"Kokoro model not cached at {path} (python ci/fetch_kokoro.py)")
    voices = np.load(model_dir() / "voices_ja.npz")
    model = KokoroDurations(read_onnx(path))
    cases = json.loads(DATA.read_text(encoding="utf-8"))["cases"]
    assert len(cases) == 15
    same_as_int8 = 0
    for case in cases:
        ids = np.array(case["ids"])
        out = model(ids, voices[case["voice"]][ids.size - 3].reshape(256))
        np.testing.assert_array_equal(out.frames, case["twin_frames"], err_msg=f"{case['voice']} {case['ids']}")
        np.testing.assert_allclose(out.raw, case["twin_raw"], atol=1e-3)
        same_as_int8 += bool(np.array_equal(out.frames, case["int8_frames"]))
    assert same_as_int8 >= 5  # 7 of 15 on 2026-11-24: the int8 graph quantizes activations (docs/tts.md)
