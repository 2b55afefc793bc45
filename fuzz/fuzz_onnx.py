"""Fuzz target: Kokoro's int8 ONNX file (pygpukit.tts.onnx_reader: ``read_onnx``, ``graph_op_counts``).

Contract: any file gives a KokoroOnnx whose tensors and LSTM weights are float32 arrays, or
KokoroModelError. The seeds are small graphs in onnxruntime's quantized patterns (ConvInteger and
MatMulInteger with their scale chains, Gather + DequantizeLinear, DynamicQuantizeLSTM, a float Conv and
MatMul), serialized by onnx. The first input byte chooses whether the graph's inputs and outputs are
checked (``check_io``); the rest is the file. protobuf's parser is C (upb): atheris traces only the
reader's Python, but a crash in the parser still ends the run with the input saved.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import instrumented, main, scratch_dir, skip_unless_importable

skip_unless_importable("onnx", "onnx", "the tts extra: pip install 'pygpukit-audio[tts]'")
with instrumented("pygpukit.tts.onnx_reader"):
    from pygpukit.tts.errors import KokoroModelError
    from pygpukit.tts.onnx_reader import graph_op_counts, read_onnx

ERRORS = (KokoroModelError,)
_FILE = scratch_dir("onnx") / "kokoro.onnx"


def _quant_chain(kind: str, scope: str, w_name: str, wq: Any, wz: Any, ws: Any, tag: str
                 ) -> tuple[list[Any], list[Any]]:  # fmt: skip
    """onnxruntime's pattern: DynamicQuantizeLinear(style) -> {Conv,MatMul}Integer -> Cast -> Mul(., Mul(scales))."""
    from onnx import TensorProto, helper, numpy_helper

    q, s, z = f"q{tag}", f"s{tag}", f"z{tag}"
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["style"], [q, s, z], name=f"{scope}_dql{tag}"),
        helper.make_node(kind, [q, w_name, z, f"{w_name}_zero_point"], [f"i{tag}"], name=f"{scope}/Op_quant"),
        helper.make_node("Cast", [f"i{tag}"], [f"c{tag}"], to=TensorProto.FLOAT, name=f"cast{tag}"),
        helper.make_node("Mul", [s, f"{w_name}_scale"], [f"p{tag}"], name=f"scales{tag}"),
        helper.make_node("Mul", [f"c{tag}", f"p{tag}"], [f"out{tag}"], name=f"mul{tag}"),
    ]
    inits = [numpy_helper.from_array(wq, w_name), numpy_helper.from_array(wz, f"{w_name}_zero_point"),
             numpy_helper.from_array(ws, f"{w_name}_scale")]  # fmt: skip
    return nodes, inits


def _model(rng: np.random.Generator, hidden: int = 2, feat: int = 3) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    def init(values: Any, name: str) -> Any:
        return numpy_helper.from_array(values, name)

    nodes, inits = _quant_chain("ConvInteger", "/decoder/decoder/asr_res/asr_res.0",
                                "/decoder/decoder/asr_res/Mul_output_0_quantized",
                                rng.integers(0, 256, (4, 3, 3)).astype(np.uint8), np.array(71, np.uint8),
                                np.array(0.013, np.float32), "a")  # fmt: skip
    more, more_inits = _quant_chain("MatMulInteger", "/decoder/decoder/generator/resblocks.0/adain1.0/fc",
                                    "decoder.decoder.generator.resblocks.0.adain1.0.fc.weight_quantized",
                                    rng.integers(-128, 128, (4, 3)).astype(np.int8), np.zeros(3, np.int8),
                                    rng.uniform(0.01, 0.05, 3).astype(np.float32), "b")  # fmt: skip
    nodes += more
    inits += more_inits
    embedding = "encoder.bert.embeddings.word_embeddings.weight_quantized"
    nodes += [
        helper.make_node("Gather", [embedding, "tokens"], ["g"], name="/encoder/bert/embeddings/Gather"),
        helper.make_node("DequantizeLinear", ["g", "emb_s", "emb_z"], ["e"], name="/encoder/bert/dq"),
        helper.make_node("DynamicQuantizeLSTM", ["xl", "W", "R", "B", "", "", "", "", "Ws", "Z", "Rs", "Z"],
                         ["y", "yh", "yc"], name="/encoder/predictor/text_encoder/lstms.0/LSTM_quant",
                         domain="com.microsoft", direction="bidirectional", hidden_size=hidden),
        helper.make_node("Conv", ["style", "/decoder/decoder/noise_convs.0/Mul_output_0"], ["cv"],
                         name="/decoder/decoder/noise_convs.0/Conv"),
        helper.make_node("MatMul", ["style", "onnx::MatMul_9"], ["mm"], name="/encoder/predictor/l_linear/MatMul"),
        helper.make_node("Mul", ["speed", "e"], ["audio"], name="/out"),
    ]  # fmt: skip
    inits += [
        init(rng.integers(-128, 128, (5, 2)).astype(np.int8), embedding), init(np.array(0.02, np.float32), "emb_s"),
        init(np.array(3, np.int8), "emb_z"), init(rng.integers(-128, 128, (2, feat, 4 * hidden)).astype(np.int8), "W"),
        init(rng.integers(-128, 128, (2, hidden, 4 * hidden)).astype(np.int8), "R"),
        init(rng.normal(size=(2, 8 * hidden)).astype(np.float32), "B"),
        init(rng.uniform(0.005, 0.02, 2).astype(np.float32), "Ws"), init(np.zeros(2, np.int8), "Z"),
        init(rng.uniform(0.005, 0.02, 2).astype(np.float32), "Rs"),
        init(rng.normal(size=(2, 3, 3)).astype(np.float32), "/decoder/decoder/noise_convs.0/Mul_output_0"),
        init(rng.normal(size=(3, 2)).astype(np.float32), "onnx::MatMul_9"),
        init(rng.normal(size=3).astype(np.float32), "decoder.decoder.generator.resblocks.0.adain1.0.fc.bias"),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "kokoro-like",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, None]),
         helper.make_tensor_value_info("style", TensorProto.FLOAT, [1, 256]),
         helper.make_tensor_value_info("speed", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, None)], initializer=inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    raw: bytes = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    return raw


def seeds() -> list[bytes]:
    rng = np.random.default_rng(31)
    model = _model(rng)
    return [b"\x01" + model, b"\x00" + _model(rng, hidden=1, feat=1), b"\x00" + model[: len(model) // 2]]


def one_input(data: bytes) -> None:
    if not data:
        return
    _FILE.write_bytes(data[1:])
    try:
        found = read_onnx(_FILE, check_io=bool(data[0] & 1))
    except KokoroModelError:
        return
    for name, values in found.tensors.items():
        assert isinstance(name, str)
        assert values.dtype == np.float32, (name, values.dtype)
    for lstm in found.lstms.values():
        assert lstm.w_ih.dtype == lstm.w_hh.dtype == lstm.bias.dtype == np.float32
        assert lstm.w_hh.shape == (lstm.directions, 4 * lstm.hidden, lstm.hidden)
    assert sum(graph_op_counts(_FILE).values()) == sum(found.op_counts.values())


if __name__ == "__main__":
    main("onnx", one_input, seeds)
