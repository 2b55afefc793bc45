"""Write the float twin of Kokoro's int8 ONNX file: the same graph with every quantized weight dequantized
(DequantizeLinear's rule) and no run-time activation quantization, for onnxruntime to run as the float
reference of a float implementation (docs/tts.md says why the int8 graph cannot be one).

``python ci/kokoro_float_twin.py IN.onnx OUT.onnx`` (needs numpy and onnx; onnxruntime runs the result).
The rewrite: DynamicQuantizeLinear(x) -> (x, scale 1, zero point 0); ConvInteger / MatMulInteger -> Conv /
MatMul with the float weight ``q - zero_point`` (the following Mul by activation scale x weight scale, now
the weight scale alone, finishes the dequantization); the quantized bias path (Floor of bias / scales, Cast
to int32) -> the exact float bias; DynamicQuantizeLSTM -> LSTM with ``(W - zero_point) * scale``
transposed to ONNX's (D, 4H, I); initializers no node uses any more are dropped.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np


def twin(src: str, dst: str) -> int:
    onnx = importlib.import_module("onnx")  # a reference tool's dependency, not the project's
    TensorProto, helper, numpy_helper = onnx.TensorProto, onnx.helper, onnx.numpy_helper  # noqa: N806

    model = onnx.load(src)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}

    def arr(name: str) -> Any:
        return numpy_helper.to_array(inits[name])

    nodes: list[Any] = []
    extra = [numpy_helper.from_array(np.array(1.0, np.float32), "__twin_one"),
             numpy_helper.from_array(np.array(0.0, np.float32), "__twin_zero")]  # fmt: skip
    count = 0
    for n in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "DynamicQuantizeLinear":
            y, s, z = n.output
            nodes += [helper.make_node("Identity", [n.input[0]], [y], name=n.name + "_x"),
                      helper.make_node("Identity", ["__twin_one"], [s], name=n.name + "_s"),
                      helper.make_node("Identity", ["__twin_zero"], [z], name=n.name + "_z")]  # fmt: skip
        elif n.op_type in ("ConvInteger", "MatMulInteger"):
            weight = arr(n.input[1]).astype(np.float32) - arr(n.input[3]).astype(np.float32)
            name = f"__twin_w{count}"
            count += 1
            extra.append(numpy_helper.from_array(weight.astype(np.float32), name))
            op = "Conv" if n.op_type == "ConvInteger" else "MatMul"
            nodes.append(helper.make_node(op, [n.input[0], name], list(n.output), name=n.name + "_f", **attrs))
        elif n.op_type == "DynamicQuantizeLSTM":
            i = list(n.input) + [""] * (12 - len(n.input))
            w = (arr(i[1]).astype(np.float64) - arr(i[9])[:, None, None]) * arr(i[8])[:, None, None]
            r = (arr(i[2]).astype(np.float64) - arr(i[11])[:, None, None]) * arr(i[10])[:, None, None]
            wn, rn = f"__twin_lw{count}", f"__twin_lr{count}"
            count += 1
            extra += [numpy_helper.from_array(w.transpose(0, 2, 1).astype(np.float32), wn),
                      numpy_helper.from_array(r.transpose(0, 2, 1).astype(np.float32), rn)]  # fmt: skip
            nodes.append(helper.make_node("LSTM", [i[0], wn, rn, i[3], i[4], i[5], i[6]], list(n.output),
                                          name=n.name + "_f", **attrs))  # fmt: skip
        elif n.op_type == "Cast" and attrs.get("to") == TensorProto.INT32 and "bias" in n.name:
            nodes.append(helper.make_node("Cast", list(n.input), list(n.output), name=n.name, to=TensorProto.FLOAT))
        elif n.op_type == "Floor" and n.name.endswith("bias_quant_rounded"):
            nodes.append(helper.make_node("Identity", list(n.input), list(n.output), name=n.name))
        else:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input}
    kept = [t for t in [*graph.initializer, *extra] if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.value_info[:]
    onnx.save(model, dst)
    return count


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(f"{twin(sys.argv[1], sys.argv[2])} quantized nodes rewritten -> {sys.argv[2]}")
