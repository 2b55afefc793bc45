"""pygpukit.tts.onnx_reader: Kokoro's int8 ONNX file read into float weights.

Synthetic graphs built with onnx.helper in onnxruntime's quantized patterns (ConvInteger, MatMulInteger,
DynamicQuantizeLSTM, Gather + DequantizeLinear) check the dequantization against float64 NumPy and ONNX's
own reference evaluator (DequantizeLinear, DynamicQuantizeLinear, and the standard LSTM for the gate
reordering, run against pygpukit.ops.lstm); corrupt files raise KokoroModelError. The real model is
checked when it is in the cache (ci/fetch_kokoro.py). Needs the ``onnx`` package (the ``tts`` extra).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pygpukit as gp

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from pygpukit.tts.errors import KokoroModelError  # noqa: E402
from pygpukit.tts.onnx_reader import dequantize_linear, dynamic_quantize_linear, read_onnx  # noqa: E402

Array = np.ndarray[Any, Any]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _run(node: Any, inputs: dict[str, Array], outputs: list[str], inits: list[Any] | None = None) -> list[Any]:
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs], initializer=inits or [],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    return list(ReferenceEvaluator(model).run(None, inputs))


def test_dequantize_and_dynamic_quantize_match_onnx(rng: np.random.Generator) -> None:
    q = rng.integers(-128, 128, size=(5, 7)).astype(np.int8)
    scale = rng.uniform(0.001, 0.1, size=7).astype(np.float32)
    zero = rng.integers(-5, 5, size=7).astype(np.int8)
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)
    inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero, "z")]
    (expected,) = _run(node, {}, ["y"], inits)
    np.testing.assert_allclose(dequantize_linear(q, scale, zero, axis=1), expected, rtol=1e-6)
    exact = (q.astype(np.float64) - zero.astype(np.float64)[None, :]) * scale.astype(np.float64)[None, :]
    np.testing.assert_allclose(dequantize_linear(q, scale, zero, axis=1), exact, rtol=1e-12)
    for x in (rng.normal(size=(3, 50)).astype(np.float32), rng.uniform(0.5, 2.0, size=9).astype(np.float32)):
        yq, ys, yz = _run(helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"]), {"x": x},
                          ["y", "s", "z"])  # fmt: skip
        q8, s8, z8 = dynamic_quantize_linear(x)
        np.testing.assert_array_equal(q8, yq)
        assert s8 == pytest.approx(float(ys), rel=1e-7)
        assert z8 == int(yz)


def _init(values: Array, name: str) -> Any:
    return numpy_helper.from_array(values, name)


def _quant_chain(kind: str, module_path: str, x: str, w_name: str, wq: Array, wzp: Array, ws: Array, tag: str
                 ) -> tuple[list[Any], list[Any]]:  # fmt: skip
    """onnxruntime's pattern: DQL(x) -> {Conv,MatMul}Integer -> Cast -> Mul(., Mul(x_scale, w_scale))."""
    q, s, z = f"{x}_q{tag}", f"{x}_s{tag}", f"{x}_z{tag}"
    nodes = [
        helper.make_node("DynamicQuantizeLinear", [x], [q, s, z], name=f"{module_path}_dql{tag}"),
        helper.make_node(kind, [q, w_name, z, f"{w_name}_zero_point"], [f"i{tag}"], name=f"{module_path}/Op_quant"),
        helper.make_node("Cast", [f"i{tag}"], [f"c{tag}"], to=TensorProto.FLOAT, name=f"cast{tag}"),
        helper.make_node("Mul", [s, f"{w_name}_scale"], [f"p{tag}"], name=f"scales{tag}"),
        helper.make_node("Mul", [f"c{tag}", f"p{tag}"], [f"out{tag}"], name=f"mul{tag}"),
    ]
    inits = [_init(wq, w_name), _init(wzp, f"{w_name}_zero_point"), _init(ws, f"{w_name}_scale")]
    return nodes, inits


def _synthetic(rng: np.random.Generator, hidden: int = 4, feat: int = 6) -> tuple[Any, dict[str, Any]]:
    conv_q = rng.integers(0, 256, size=(8, 6, 3)).astype(np.uint8)
    conv_z, conv_s = np.array(71, np.uint8), np.array(0.013, np.float32)
    lin_q = rng.integers(-128, 128, size=(16, 5)).astype(np.int8)  # (in, out) for x @ W
    lin_z, lin_s = np.zeros(5, np.int8), rng.uniform(0.01, 0.05, size=5).astype(np.float32)
    emb_q = rng.integers(-128, 128, size=(10, 4)).astype(np.int8)
    emb_s, emb_z = np.array(0.02, np.float32), np.array(3, np.int8)
    w_q = rng.integers(-128, 128, size=(2, feat, 4 * hidden)).astype(np.int8)
    r_q = rng.integers(-128, 128, size=(2, hidden, 4 * hidden)).astype(np.int8)
    w_s, r_s = rng.uniform(0.005, 0.02, 2).astype(np.float32), rng.uniform(0.005, 0.02, 2).astype(np.float32)
    lstm_z = np.zeros(2, np.int8)
    bias = rng.normal(size=(2, 8 * hidden)).astype(np.float32)
    lin_bias = "decoder.decoder.generator.resblocks.0.adain1.0.fc.bias"
    conv_name = "/decoder/decoder/asr_res/Mul_output_0_quantized"
    nodes, inits = _quant_chain("ConvInteger", "/decoder/decoder/asr_res/asr_res.0", "style", conv_name, conv_q,
                                conv_z, conv_s, "a")  # fmt: skip
    more, more_inits = _quant_chain("MatMulInteger", "/decoder/decoder/generator/resblocks.0/adain1.0/fc", "style",
                                    "decoder.decoder.generator.resblocks.0.adain1.0.fc.weight_quantized", lin_q, lin_z,
                                    lin_s, "b")  # fmt: skip
    nodes += more
    inits += more_inits
    nodes += [
        helper.make_node("Gather", ["encoder.bert.embeddings.word_embeddings.weight_quantized", "tokens"], ["g"],
                         name="/encoder/bert/embeddings/word_embeddings/Gather"),
        helper.make_node("DequantizeLinear", ["g", "emb_s", "emb_z"], ["e"],
                         name="/encoder/bert/embeddings/word_embeddings/Gather_quant_DequantizeLinear"),
        helper.make_node("DynamicQuantizeLSTM", ["xl", "W", "R", "B", "", "", "", "", "Ws", "Z", "Rs", "Z"],
                         ["y", "yh", "yc"], name="/encoder/predictor/text_encoder/lstms.0/LSTM_quant",
                         domain="com.microsoft", direction="bidirectional", hidden_size=hidden),
        helper.make_node("Mul", ["speed", "e"], ["audio"], name="/out"),
    ]  # fmt: skip
    inits += [_init(emb_q, "encoder.bert.embeddings.word_embeddings.weight_quantized"), _init(emb_s, "emb_s"),
              _init(emb_z, "emb_z"), _init(w_q, "W"), _init(r_q, "R"), _init(bias, "B"), _init(w_s, "Ws"),
              _init(r_s, "Rs"), _init(lstm_z, "Z"),
              _init(rng.normal(size=5).astype(np.float32), lin_bias)]  # fmt: skip
    graph = helper.make_graph(
        nodes, "kokoro-like",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, None]),
         helper.make_tensor_value_info("style", TensorProto.FLOAT, [1, 256]),
         helper.make_tensor_value_info("speed", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, None)], initializer=inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    raw = {"conv_q": conv_q, "conv_z": conv_z, "conv_s": conv_s, "lin_q": lin_q, "lin_z": lin_z, "lin_s": lin_s,
           "emb_q": emb_q, "emb_s": emb_s, "emb_z": emb_z, "w_q": w_q, "r_q": r_q, "w_s": w_s, "r_s": r_s,
           "bias": bias}  # fmt: skip
    return model, raw


def _save(model: Any, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def test_reader_dequantizes_and_names(rng: np.random.Generator, tmp_path: Path) -> None:
    model, raw = _synthetic(rng)
    result = read_onnx(_save(model, tmp_path / "m.onnx"))
    conv = result.tensors["decoder.asr_res.0.weight"]
    np.testing.assert_allclose(conv, (raw["conv_q"].astype(np.float64) - 71) * float(raw["conv_s"]), rtol=1e-6)
    assert result.quantized["decoder.asr_res.0.weight"] == "uint8 conv"
    lin = result.tensors["decoder.generator.resblocks.0.adain1.0.fc.weight"]
    assert lin.shape == (5, 16)  # torch's (out, in)
    np.testing.assert_allclose(lin, (raw["lin_q"].astype(np.float64) * raw["lin_s"].astype(np.float64)).T, rtol=1e-6)
    assert "generator.resblocks.0.adain1.0.fc.bias" in result.module("decoder")
    emb = result.tensors["encoder.bert.embeddings.word_embeddings.weight"]
    np.testing.assert_allclose(emb, (raw["emb_q"].astype(np.float64) - 3) * 0.02, rtol=1e-6)
    assert set(result.module("bert")) == {"embeddings.word_embeddings.weight"}
    assert result.op_counts["DynamicQuantizeLSTM"] == 1
    assert list(result.lstms) == ["encoder.predictor.text_encoder.lstms.0"]


def test_reader_lstm_matches_onnx_lstm(rng: np.random.Generator, tmp_path: Path) -> None:
    """The reordered torch-layout weights through pygpukit.ops.lstm give ONNX's LSTM on the dequantized
    ONNX-layout weights (ONNX's reference evaluator, float64 inputs)."""
    hidden, feat, steps = 4, 6, 7
    model, raw = _synthetic(rng, hidden, feat)
    weights = read_onnx(_save(model, tmp_path / "m.onnx")).lstms["encoder.predictor.text_encoder.lstms.0"]
    w = raw["w_q"].astype(np.float64) * raw["w_s"][:, None, None]
    r = raw["r_q"].astype(np.float64) * raw["r_s"][:, None, None]
    x = rng.normal(size=(steps, 1, feat))
    node = helper.make_node("LSTM", ["x", "w", "r", "b"], ["y"], direction="bidirectional", hidden_size=hidden)
    feeds = {"x": x, "w": w.transpose(0, 2, 1), "r": r.transpose(0, 2, 1), "b": raw["bias"].astype(np.float64)}
    (y,) = _run(node, feeds, ["y"])
    expected = np.asarray(y).transpose(2, 0, 1, 3).reshape(1, steps, 2 * hidden)  # (T, D, N, H) -> (N, T, D * H)
    out, _, _ = gp.lstm(gp.from_numpy(x.transpose(1, 0, 2).astype(np.float32)), gp.from_numpy(weights.w_ih),
                        gp.from_numpy(weights.w_hh), gp.from_numpy(weights.bias))  # fmt: skip
    np.testing.assert_allclose(out.to_numpy(), expected, atol=2e-5)


def test_corrupt_files_raise_typed_errors(rng: np.random.Generator, tmp_path: Path) -> None:
    model, _ = _synthetic(rng)
    data = model.SerializeToString()
    with pytest.raises(KokoroModelError, match="does not exist"):
        read_onnx(tmp_path / "missing.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(KokoroModelError, match="0 bytes"):
        read_onnx(tmp_path / "empty.onnx")
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(KokoroModelError, match="not a readable ONNX model"):
        read_onnx(tmp_path / "cut.onnx")
    (tmp_path / "noise.onnx").write_bytes(rng.integers(0, 256, 4096).astype(np.uint8).tobytes())
    with pytest.raises(KokoroModelError):
        read_onnx(tmp_path / "noise.onnx")
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    wrong.graph.output[0].name = "waveform"
    with pytest.raises(KokoroModelError, match="waveform"):
        read_onnx(_save(wrong, tmp_path / "io.onnx"))
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    kept = [n for n in broken.graph.node if not n.name.startswith("mula")]  # the ConvInteger's scale Mul
    del broken.graph.node[:]
    broken.graph.node.extend(kept)
    with pytest.raises(KokoroModelError, match="no weight scale"):
        read_onnx(_save(broken, tmp_path / "scale.onnx"))
    missing = onnx.ModelProto()
    missing.CopyFrom(model)
    inits = [t for t in missing.graph.initializer if t.name != "Ws"]
    del missing.graph.initializer[:]
    missing.graph.initializer.extend(inits)
    with pytest.raises(KokoroModelError, match="'Ws' is missing"):
        read_onnx(_save(missing, tmp_path / "init.onnx"))


def _real_model() -> Path:
    from pygpukit.tts.fetch import MODEL_FILE, model_dir

    path = model_dir() / MODEL_FILE
    if not path.is_file():
        if os.environ.get("PYGPUKIT_REQUIRE_MODELS") == "1":
            pytest.fail(f"Kokoro model not cached at {path} (python ci/fetch_kokoro.py)")
        pytest.skip(f"Kokoro model not cached at {path} (python ci/fetch_kokoro.py)")
    return path


def test_real_kokoro_model_reads() -> None:
    result = read_onnx(_real_model())
    assert len(result.lstms) == 6
    for weights in result.lstms.values():
        assert weights.directions == 2
        assert weights.hidden == 256
    kinds = list(result.quantized.values())
    assert (kinds.count("uint8 conv"), kinds.count("int8 linear"), kinds.count("int8 embedding")) == (87, 148, 4)
    assert set(result.lstms) == {"encoder.text_encoder.lstm", "encoder.predictor.text_encoder.lstms.0",
                                 "encoder.predictor.text_encoder.lstms.2", "encoder.predictor.text_encoder.lstms.4",
                                 "encoder.predictor.lstm", "encoder.predictor.shared"}  # fmt: skip
    assert result.tensors["decoder.generator.ups.0.weight"].shape == (512, 256, 20)
    assert result.tensors["encoder.predictor.F0.1.pool.weight"].shape == (512, 1, 3)
    assert result.tensors["encoder.text_encoder.embedding.weight"].shape == (178, 512)
    assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in result.tensors.values())
