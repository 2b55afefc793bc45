"""Reading Kokoro-82M's int8 ONNX export (kokoro-v1.0.int8.onnx) into float weights named after Kokoro's
modules.

The file is onnxruntime's dynamic quantization of the float export: convolution weights are uint8 with a
per-tensor zero point (ConvInteger), linear weights int8 with per-column zero points and scales
(MatMulInteger), the LSTMs int8 per direction (com.microsoft DynamicQuantizeLSTM), two embedding tables
int8 (DequantizeLinear after the Gather). Activations are quantized at run time (DynamicQuantizeLinear,
uint8 per tensor). A weight's scale is not found by name (onnxruntime's optimizer merged equal
initializers, so names are shared): it is traced in the graph, integer op -> [Add of the quantized
bias] -> Cast -> Mul(., Mul(activation scale, weight scale)). Every weight is dequantized with
DequantizeLinear's rule ``(q - zero_point) * scale`` (:func:`dequantize_linear`).

Names: torch's parameter names where the export kept them (``decoder.decoder.generator.resblocks.0.
adain1.0.fc.weight``); weights that weight normalisation folded (named ``/.../Mul_output_0``) are named
after the node that consumes them (``decoder.decoder.asr_res.0.weight``); LSTMs after their node
(``encoder.predictor.text_encoder.lstms.0``), converted to torch's layout and gate order (see
:class:`LstmWeights`). The file is untrusted input: everything wrong with it raises
:class:`~pygpukit.tts.errors.KokoroModelError` naming what is wrong.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pygpukit.core.errors import MissingDistributionError

from .errors import KokoroModelError

__all__ = [
    "INPUTS",
    "OUTPUTS",
    "KokoroOnnx",
    "LstmWeights",
    "dequantize_linear",
    "dynamic_quantize_linear",
    "read_onnx",
]

Array = np.ndarray[Any, Any]
INPUTS = ("tokens", "style", "speed")
OUTPUTS = ("audio",)
_MAX_BYTES = 1 << 30  # Kokoro is 92 MB; anything near 1 GiB is not this model
_MODULES = ("bert", "bert_encoder", "text_encoder", "predictor", "decoder")
_PREDICTOR_PARTS = frozenset({"F0", "N", "shared", "F0_proj", "N_proj", "duration_proj"})


def dequantize_linear(q: Array, scale: Any, zero_point: Any = 0, axis: int = 1) -> Array:
    """ONNX DequantizeLinear in float64: ``(q - zero_point) * scale``; a 1-D ``scale`` / ``zero_point``
    applies along ``axis`` of ``q`` (per channel), a scalar to the whole tensor."""
    values = np.asarray(q).astype(np.float64)
    s = np.asarray(scale, np.float64)
    z = np.asarray(zero_point).astype(np.float64)
    if s.ndim == 1 and values.ndim > 1:
        shape = [1] * values.ndim
        shape[axis] = s.size
        s = s.reshape(shape)
        z = z.reshape(shape) if z.ndim == 1 else z
    result: Array = (values - z) * s
    return result


def _dequantized(what: str, q: Array, scale: Any, zero_point: Any = 0, axis: int = 1, *, per_direction: bool = False
                 ) -> Array:  # fmt: skip
    """:func:`dequantize_linear` of tensors read from the file, whose shapes nothing guarantees: a scale
    or zero point that does not fit ``q`` raises KokoroModelError naming ``what`` and the shapes.
    ``per_direction``: the scale and zero point hold one value per leading index of ``q`` (LSTMs)."""
    try:
        if per_direction:
            scale, zero_point = np.asarray(scale)[:, None, None], np.asarray(zero_point)[:, None, None]
        return dequantize_linear(q, scale, zero_point, axis)
    except (ValueError, IndexError, TypeError) as exc:  # NumPy's shape and conversion errors
        raise KokoroModelError(
            f"{what}: a tensor of shape {np.shape(q)} and dtype {np.asarray(q).dtype} cannot be dequantized with a "
            f"scale of shape {np.shape(scale)} and a zero point of shape {np.shape(zero_point)} ({exc})"
        ) from None


def dynamic_quantize_linear(x: Array) -> tuple[Array, float, int]:
    """ONNX DynamicQuantizeLinear: uint8 values, scale and zero point of ``x`` (range widened to hold 0,
    scale = range / 255, zero point and values rounded half to even and saturated to [0, 255])."""
    values = np.asarray(x, np.float32)
    low = min(float(values.min(initial=0.0)), 0.0)
    high = max(float(values.max(initial=0.0)), 0.0)
    scale = np.float32((high - low) / 255.0)
    if scale == 0:
        return np.zeros(values.shape, np.uint8), 0.0, 0
    zero = int(np.clip(np.rint(np.float32(0.0 - low) / scale), 0, 255))
    q = np.clip(np.rint(values / scale) + zero, 0, 255).astype(np.uint8)
    return q, float(scale), zero


@dataclass
class LstmWeights:
    """One LSTM in torch's layout and gate order (input, forget, cell, output), ready for
    :func:`pygpukit.ops.lstm`: ``w_ih`` (D, 4H, I), ``w_hh`` (D, 4H, H), ``bias`` (D, 4H) = b_ih + b_hh.
    The ONNX file holds W (D, I, 4H), R (D, H, 4H) and B (D, 8H) in ONNX's order (i, o, f, c)."""

    w_ih: Array
    w_hh: Array
    bias: Array

    @property
    def hidden(self) -> int:
        return int(self.w_hh.shape[2])

    @property
    def directions(self) -> int:
        return int(self.w_hh.shape[0])


@dataclass
class KokoroOnnx:
    """What :func:`read_onnx` found: float32 ``tensors`` by name, ``lstms`` by module name, the graph's
    op counts, and how each weight was stored (``quantized``: name -> 'uint8 conv', 'int8 linear', ...)."""

    tensors: dict[str, Array] = field(default_factory=dict)
    lstms: dict[str, LstmWeights] = field(default_factory=dict)
    op_counts: dict[str, int] = field(default_factory=dict)
    quantized: dict[str, str] = field(default_factory=dict)

    def module(self, name: str) -> dict[str, Array]:
        """The tensors of one of Kokoro's top modules (``bert``, ``bert_encoder``, ``text_encoder``,
        ``predictor``, ``decoder``) with that prefix removed."""
        if name not in _MODULES:
            raise KokoroModelError(f"unknown Kokoro module {name!r}; modules: {', '.join(_MODULES)}")
        prefix = "decoder." if name == "decoder" else f"encoder.{name}."
        return {key[len(prefix) :]: value for key, value in self.tensors.items() if _module_of(key) == name}


def _module_of(name: str) -> str:
    """The Kokoro top module of a parameter name: ``encoder.bert.x`` -> bert, ``encoder.predictor.x``
    -> predictor, ``decoder.x`` -> decoder, ..."""
    parts = name.split(".")
    if parts[0] == "decoder":
        return "decoder"
    if len(parts) > 1 and parts[0] == "encoder" and parts[1] in _MODULES:
        return parts[1]
    return "other"


def _canonical(name: str) -> str:
    """Kokoro's names start ``kmodel.`` in torch; the export's top wrappers are ``encoder`` (bert,
    bert_encoder, text_encoder, predictor) and ``decoder`` (the decoder itself, ``decoder.decoder``).
    Keys of :attr:`KokoroOnnx.tensors` keep the export's form with the duplicate ``decoder`` dropped."""
    if name.startswith("decoder.decoder."):
        name = name[len("decoder.") :]
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] == "encoder" and parts[1] in _PREDICTOR_PARTS:  # scopes that omit it
        name = "encoder.predictor." + ".".join(parts[1:])
    return name


def _node_module(node_name: str) -> str:
    """torch module path of a node: ``/encoder/text_encoder/cnn.0/cnn.0.0/Conv_quant`` ->
    ``encoder.text_encoder.cnn.0.0`` (a scope repeating its parent's name plus an index replaces it)."""
    parts = [p for p in node_name.split("/") if p][:-1]
    result: list[str] = []
    for part in parts:
        if result and part.startswith(result[-1] + "."):
            result[-1] = part
        else:
            result.append(part)
    return ".".join(result)


def _import_onnx() -> Any:
    try:  # an optional dependency (the tts extra), imported by name so the type check needs no stubs
        onnx = importlib.import_module("onnx")
        numpy_helper = importlib.import_module("onnx.numpy_helper")
    except ImportError as exc:
        raise MissingDistributionError(
            "reading Kokoro's ONNX file needs the onnx package: pip install 'pygpukit-audio[tts]'"
        ) from exc
    return onnx, numpy_helper


def _load_model(path: str | os.PathLike[str]) -> Any:
    onnx, _ = _import_onnx()
    file = Path(path)
    if not file.is_file():
        raise KokoroModelError(f"Kokoro model file {str(file)!r} does not exist or is not a file")
    size = file.stat().st_size
    if size == 0 or size > _MAX_BYTES:
        raise KokoroModelError(f"Kokoro model file {str(file)!r} has {size} bytes, not an ONNX model of Kokoro")
    try:
        model = onnx.load_model_from_string(file.read_bytes())
    except Exception as exc:  # protobuf's DecodeError, or anything the parser raises on garbage
        raise KokoroModelError(f"{str(file)!r} is not a readable ONNX model ({type(exc).__name__}: {exc})") from exc
    # ONNX's protos are proto2, whose strings are not checked for UTF-8: protobuf then gives bytes.
    graph = model.graph
    for what, texts in (
        ("node", (t for n in graph.node for t in (n.name, n.op_type, n.domain, *n.input, *n.output))),
        ("initializer", (t.name for t in graph.initializer)),
        ("graph input or output", (v.name for v in (*graph.input, *graph.output))),
    ):
        for text in texts:
            if not isinstance(text, str):
                raise KokoroModelError(f"{str(file)!r}: a {what} name is not UTF-8 text ({text!r:.80})")
    return model


class _Graph:
    def __init__(self, model: Any, numpy_helper: Any) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        self.inits: dict[str, Any] = {t.name: t for t in graph.initializer}
        self._to_array = numpy_helper.to_array
        self._arrays: dict[str, Array] = {}
        self.producer = {out: n for n in self.nodes for out in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for n in self.nodes:
            for name in n.input:
                self.consumers.setdefault(name, []).append(n)

    def array(self, name: str, what: str) -> Array:
        found = self._arrays.get(name)
        if found is None:
            if name not in self.inits:
                raise KokoroModelError(f"{what}: initializer {name!r} is missing from the graph")
            try:
                found = self._to_array(self.inits[name])
            except Exception as exc:
                raise KokoroModelError(f"{what}: initializer {name!r} cannot be read ({exc})") from exc
            self._arrays[name] = found
        return found

    def weight_scale(self, node: Any) -> Array:
        """The weight scale of an integer op: follow its output through [Add] -> Cast -> Mul(., P)
        with P = Mul(activation scale, weight scale)."""
        frontier = list(node.output)
        for _ in range(4):
            following: list[str] = []
            for out in frontier:
                for user in self.consumers.get(out, []):
                    if user.op_type == "Mul":
                        other = [i for i in user.input if i != out]
                        product = self.producer.get(other[0]) if other else None
                        if product is not None and product.op_type == "Mul":
                            scales = [i for i in product.input if i in self.inits]
                            if len(scales) == 1:
                                return self.array(scales[0], node.name)
                        if other and other[0] in self.inits:  # the scales folded into one constant
                            return self.array(other[0], node.name)
                    if user.op_type in ("Add", "Cast"):
                        following.extend(user.output)
            frontier = following
        raise KokoroModelError(f"{node.name}: no weight scale found after the {node.op_type} node")


def _lstm(graph: _Graph, node: Any) -> LstmWeights:
    inputs = list(node.input) + [""] * (12 - len(node.input))
    what = node.name
    w = _dequantized(what, graph.array(inputs[1], what), graph.array(inputs[8], what), graph.array(inputs[9], what),
                     per_direction=True)  # fmt: skip
    r = _dequantized(what, graph.array(inputs[2], what), graph.array(inputs[10], what),
                     graph.array(inputs[11], what), per_direction=True)  # fmt: skip
    if w.ndim != 3 or r.ndim != 3 or r.shape[1] * 4 != r.shape[2] or w.shape[2] != r.shape[2]:
        raise KokoroModelError(f"{what}: LSTM weights of shapes {w.shape} and {r.shape} are not (D, I, 4H), (D, H, 4H)")
    directions, hidden = w.shape[0], r.shape[1]
    b = graph.array(inputs[3], what).astype(np.float64) if inputs[3] else np.zeros((directions, 8 * hidden))
    if b.shape != (directions, 8 * hidden):
        raise KokoroModelError(f"{what}: LSTM bias has shape {b.shape}, expected {(directions, 8 * hidden)}")
    # ONNX gate blocks i, o, f, c -> torch's i, f, g (= c), o
    order = np.concatenate([np.arange(hidden) + k * hidden for k in (0, 2, 3, 1)])
    bias = b[:, : 4 * hidden] + b[:, 4 * hidden :]
    return LstmWeights(
        w_ih=np.ascontiguousarray(w.transpose(0, 2, 1)[:, order]).astype(np.float32),
        w_hh=np.ascontiguousarray(r.transpose(0, 2, 1)[:, order]).astype(np.float32),
        bias=np.ascontiguousarray(bias[:, order]).astype(np.float32),
    )


def _weight_name(graph: _Graph, node: Any, weight: str) -> str:
    if not weight.startswith("/") and not weight.startswith("onnx::"):
        base = weight[: -len("_quantized")] if weight.endswith("_quantized") else weight
        return _canonical(base)
    return _canonical(_node_module(node.name) + ".weight")


def read_onnx(path: str | os.PathLike[str], *, check_io: bool = True) -> KokoroOnnx:
    """Read Kokoro's ONNX file: every initializer as float32 (quantized ones dequantized), the LSTMs in
    torch's layout. ``check_io`` requires the graph's inputs ``tokens, style, speed`` and output
    ``audio``. Raises :class:`KokoroModelError` for a missing, truncated or corrupt file or a graph whose
    quantized weights cannot be traced, MissingDistributionError when ``onnx`` is not installed."""
    _, numpy_helper = _import_onnx()
    model = _load_model(path)
    graph = _Graph(model, numpy_helper)
    if check_io:
        inputs = tuple(i.name for i in model.graph.input if i.name not in graph.inits)
        outputs = tuple(o.name for o in model.graph.output)
        if inputs != INPUTS or outputs != OUTPUTS:
            raise KokoroModelError(f"{str(path)!r}: graph inputs {inputs} and outputs {outputs} are not Kokoro's "
                                   f"{INPUTS} -> {OUTPUTS}")  # fmt: skip
    result = KokoroOnnx()
    for node in graph.nodes:
        result.op_counts[node.op_type] = result.op_counts.get(node.op_type, 0) + 1
    used: set[str] = set()
    for node in graph.nodes:
        if node.op_type in ("ConvInteger", "MatMulInteger"):
            if len(node.input) < 4 or node.input[1] not in graph.inits:
                raise KokoroModelError(f"{node.name}: {node.op_type} without a constant weight and zero point")
            q = graph.array(node.input[1], node.name)
            zero = graph.array(node.input[3], node.name)
            scale = graph.weight_scale(node)
            axis = 1 if node.op_type == "MatMulInteger" else 0
            values = _dequantized(node.name, q, scale, zero, axis)
            name = _weight_name(graph, node, node.input[1])
            if node.op_type == "MatMulInteger":  # stored (in, out) for x @ W; torch's Linear weight is (out, in)
                values = values.T
            result.tensors[name] = np.ascontiguousarray(values).astype(np.float32)
            result.quantized[name] = f"{q.dtype} {'conv' if axis == 0 else 'linear'}"
            used.update(node.input[1:4])
        elif node.op_type == "DynamicQuantizeLSTM":
            result.lstms[_canonical(_node_module(node.name))] = _lstm(graph, node)
            used.update(i for i in node.input[1:] if i)
        elif node.op_type == "DequantizeLinear" and node.input and node.input[0] in graph.producer:
            gather = graph.producer[node.input[0]]
            if gather.op_type == "Gather" and gather.input and gather.input[0] in graph.inits:
                if len(node.input) < 2:
                    raise KokoroModelError(f"{node.name}: DequantizeLinear of an embedding table without a scale")
                table = graph.array(gather.input[0], node.name)
                scale = graph.array(node.input[1], node.name)
                offset: Any = graph.array(node.input[2], node.name) if len(node.input) > 2 else 0
                name = _weight_name(graph, node, gather.input[0])
                result.tensors[name] = _dequantized(node.name, table, scale, offset).astype(np.float32)
                result.quantized[name] = f"{table.dtype} embedding"
                used.update(i for i in (gather.input[0], *node.input[1:]) if i)
    for name in graph.inits:
        if name in used or name.startswith(("/", "onnx::")):
            continue
        values = graph.array(name, "initializer")
        if values.dtype == np.float32 and not name.endswith(("_scale", "_zero_point")):
            result.tensors.setdefault(_canonical(name), values)
    for node in graph.nodes:  # float convolutions whose weights weight normalisation folded
        if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1 and node.input[1] in graph.inits:
            name = _weight_name(graph, node, node.input[1])
            values = graph.array(node.input[1], node.name)
            if values.dtype != np.float32:
                raise KokoroModelError(f"{node.name}: the {node.op_type} weight {node.input[1]!r} is {values.dtype}, "
                                       "not float32")  # fmt: skip
            result.tensors.setdefault(name, values)
        elif node.op_type == "MatMul" and len(node.input) > 1 and node.input[1].startswith("onnx::"):
            if node.input[1] not in graph.inits:  # a float Linear traced as x @ W (the source's l_linear) has one
                continue
            values = graph.array(node.input[1], node.name)
            if values.ndim == 2 and values.dtype == np.float32:
                name = _canonical(_node_module(node.name) + ".weight")
                result.tensors.setdefault(name, np.ascontiguousarray(values.T))
    return result


def graph_op_counts(path: str | os.PathLike[str]) -> dict[str, int]:
    """Op type -> count of the graph's nodes (domain-qualified for non-default domains)."""
    model = _load_model(path)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return counts
