"""How sensitive is Kokoro's int8 waveform to float32-rounding-sized differences? An emulation of onnxruntime's
integer path on the GPU (DynamicQuantizeLinear, MatMulInteger / ConvInteger, DynamicQuantizeLSTM exact) still
computes its float ops (tanh, sigmoid, exp, norms, sums) in other orders than onnxruntime's CPU kernels, so it
differs from onnxruntime by float32 rounding there. This measures what that costs with onnxruntime alone: it runs
kokoro-v1.0.int8.onnx with one-ulp-sized perturbations and compares each run with the unperturbed one (the default
configuration of ci/kokoro_ort_self_agreement.py, which is bit-exact against every other one): equal total length,
identical frames per phoneme, waveform SNR over the common length.

``python ci/kokoro_int8_sensitivity.py MODEL_DIR [--voices a,b] [--strings 0,1] [--json OUT.json]`` (MODEL_DIR:
what ci/fetch_kokoro.py fetched; needs numpy, onnx and onnxruntime: a reference environment, not the project's).

The perturbations (PERTURBATIONS): the style input times (1 + 2^-23) (in float32 that is +1 ulp where the
mantissa is below 1.5, +2 ulp above), +-1 ulp at random per element (seed 0), or +1 ulp in a single element of
its decoder half or of its predictor half; by graph surgery, one intermediate tensor times (1 + 2^-23), or times
1 + 2^-23 or 1 - 2^-23 chosen per element by RandomUniformLike (fixed seeds), through an inserted Mul feeding
every consumer, at places (PLACES) in the text encoder, ALBERT, the duration and F0 predictors, the decoder and
the generator; the same at the input of every DynamicQuantizeLinear at once (all 139, 1% of their elements, or
those of /encoder/ or /decoder/ only), which is where an emulation's rounding differences would meet the integer
path; and, to show what one flipped quantization step costs, one uint8 code (the middle element) of a single
DynamicQuantizeLinear's output changed by 1. Controls: the same Muls with the factor 1 (bit-exact expected), and
a repeat of one random perturbation in a new session (bit-exact against it expected). Where the perturbed tensor
feeds a DynamicQuantizeLinear, the uint8 codes that this quantization changes are counted (its output is added
as a graph output, as FRAMES and RAW are).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from kokoro_ort_self_agreement import (  # type: ignore[import-not-found]  # ci/ is sys.path[0]
    MODEL,
    Config,
    _cpu,
    _session,
    case_arguments,
    publish,
    selected_cases,
    snr_db,
)
from kokoro_reference import FRAMES, PHONEMES, RAW  # type: ignore[import-not-found]

# 1 + 2^-23 is the float32 just above 1, 1 - 2^-23 the second below it: x times either moves x by 1 or 2 ulp
UP, DOWN = float(np.float32(1.0 + 2.0**-23)), float(np.float32(1.0 - 2.0**-23))
QUANTIZED = "*"  # a Perturbation.tensor "*PREFIX": every DynamicQuantizeLinear input whose name starts with PREFIX


@dataclass(frozen=True)
class Perturbation:
    name: str
    style: str = ""  # "scale", "random", "decoder", "predictor": how the style input is perturbed
    tensor: str = ""  # intermediates ("|"-separated) to perturb, or QUANTIZED + a name prefix
    factor: float = UP  # multiply them by this, or, when random, by UP or DOWN at random per element
    random: bool = False
    fraction: float = 1.0  # when random: the share of elements perturbed, half of them by UP, half by DOWN
    flip: bool = False  # instead: change one uint8 code (the middle element) of the quantization `tensor` feeds
    repeat: bool = False  # a repeat of the previous perturbation (is its outcome reproducible?)


PLACES = (  # label, tensor, whether it feeds a DynamicQuantizeLinear
    ("text encoder: its input (embeddings, transposed)", "/encoder/text_encoder/Transpose_output_0", True),
    ("ALBERT: embeddings LayerNorm", "/encoder/bert/embeddings/LayerNorm/LayerNormalization_output_0", True),
    (
        "duration predictor: LayerNorm of lstms.1",
        "/encoder/predictor/text_encoder/lstms.1/LayerNormalization_output_0",
        False,
    ),
    ("duration predictor: the Sigmoid summed into durations", "/encoder/predictor/Sigmoid_output_0", False),
    ("F0 predictor: F0.1 LeakyRelu", "/encoder/F0.1/actv_1/LeakyRelu_output_0", True),
    ("decoder: decode.1 LeakyRelu", "/decoder/decoder/decode.1/actv/LeakyRelu_output_0", True),
    ("generator: harmonic source Tanh", "/decoder/decoder/generator/m_source/l_tanh/Tanh_output_0", False),
    ("generator: resblocks.3 Add_3", "/decoder/decoder/generator/resblocks.3/Add_3_output_0", True),
)
PERTURBATIONS = (
    Perturbation("style x (1 + 2^-23), every element", style="scale"),
    Perturbation("style +-1 ulp at random per element (seed 0)", style="random"),
    Perturbation("style +1 ulp, one element of the decoder half (seed 0)", style="decoder"),
    Perturbation("style +1 ulp, one element of the predictor half (seed 0)", style="predictor"),
    Perturbation("control: Mul by exactly 1 at every place below", tensor="|".join(p[1] for p in PLACES), factor=1.0),
    *(Perturbation(f"{label}, x (1 + 2^-23)", tensor=tensor) for label, tensor, _ in PLACES),
    *(Perturbation(f"{label}, x (1 +- 2^-23) at random", tensor=tensor, random=True) for label, tensor, _ in PLACES),
    *(Perturbation(f"{label}: one uint8 code +-1", tensor=tensor, flip=True) for label, tensor, q in PLACES if q),
    Perturbation("every DynamicQuantizeLinear input (139), x (1 + 2^-23)", tensor=QUANTIZED),
    Perturbation("every DynamicQuantizeLinear input, x (1 +- 2^-23) at random", tensor=QUANTIZED, random=True),
    Perturbation("the same again (new session, same seeds)", tensor=QUANTIZED, random=True, repeat=True),
    Perturbation(
        "every DynamicQuantizeLinear input, 1% of elements x (1 +- 2^-23) at random",
        tensor=QUANTIZED,
        random=True,
        fraction=0.01,
    ),
    Perturbation(
        "every DynamicQuantizeLinear input of /encoder/ (72), x (1 +- 2^-23) at random",
        tensor=QUANTIZED + "/encoder/",
        random=True,
    ),
    Perturbation(
        "every DynamicQuantizeLinear input of /decoder/ (67), x (1 +- 2^-23) at random",
        tensor=QUANTIZED + "/decoder/",
        random=True,
    ),
)


def _perturb_style(style: np.ndarray, how: str) -> np.ndarray:
    """The (1, 256) style vector perturbed at float32 rounding level; [:128] goes to the decoder, [128:] to the
    predictor (the graph's Split)."""
    rng = np.random.default_rng(0)
    out: np.ndarray
    if how == "scale":
        out = style * np.float32(UP)
    elif how == "random":
        toward = np.where(rng.integers(0, 2, style.shape) == 1, np.inf, -np.inf).astype(np.float32)
        out = np.nextafter(style, toward)
    else:
        out = style.copy()
        index = int(rng.integers(0, 128)) + (128 if how == "predictor" else 0)
        out[0, index] = np.nextafter(out[0, index], np.float32(np.inf if out[0, index] >= 0 else -np.inf))
    return out


def _probes(graph: Any, tensors: list[str]) -> dict[str, str]:
    """tensor -> the uint8 output of the DynamicQuantizeLinear it feeds (where it feeds one)."""
    found = {}
    for node in graph.node:
        if node.op_type == "DynamicQuantizeLinear" and node.input[0] in tensors:
            found[node.input[0]] = node.output[0]
    return found


def _mul(onnx: Any, source: str, target: str, perturbation: Perturbation, seed: int) -> list[Any]:
    """Nodes computing target = source x factor; or, when random, x UP where RandomUniformLike(seed) draws below
    fraction / 2, x DOWN where it draws above 1 - fraction / 2, else x 1."""
    make = onnx.helper.make_node
    if not perturbation.random:
        return [make("Mul", [source, "perturbation_factor"], [target], name=target)]
    draw, up, down, half, factor = (f"{target}_{part}" for part in ("draw", "up", "down", "half", "factor"))
    return [
        make("RandomUniformLike", [source], [draw], name=draw, seed=float(seed)),
        make("Less", [draw, "perturbation_low"], [up], name=up),
        make("Greater", [draw, "perturbation_high"], [down], name=down),
        make("Where", [down, "perturbation_down", "perturbation_one"], [half], name=half),
        make("Where", [up, "perturbation_up", half], [factor], name=factor),
        make("Mul", [source, factor], [target], name=target),
    ]


def _with_mul(onnx: Any, base: Any, perturbation: Perturbation) -> bytes:
    """A copy of the model with the perturbing Mul inserted: after the producer of each named tensor, feeding
    all its consumers; or, for QUANTIZED, just before each DynamicQuantizeLinear, feeding only it."""
    model = onnx.ModelProto()
    model.CopyFrom(base)
    graph = model.graph
    low, high = perturbation.fraction / 2.0, 1.0 - perturbation.fraction / 2.0
    constants = {"factor": perturbation.factor, "low": low, "high": high, "up": UP, "down": DOWN, "one": 1.0}
    for name, value in constants.items():
        graph.initializer.append(onnx.numpy_helper.from_array(np.array(value, np.float32), f"perturbation_{name}"))
    nodes = list(graph.node)
    out: list[Any] = []
    if perturbation.tensor.startswith(QUANTIZED):
        prefix = perturbation.tensor[len(QUANTIZED) :]
        for node in nodes:
            if node.op_type == "DynamicQuantizeLinear" and node.input[0].startswith(prefix):
                name = node.input[0] + "_perturbed"
                out.extend(_mul(onnx, node.input[0], name, perturbation, seed=len(out)))
                node.input[0] = name
            out.append(node)
    else:
        targets = set(perturbation.tensor.split("|"))
        for node in nodes:
            for i, name in enumerate(node.input):
                if name in targets:
                    node.input[i] = name + "_perturbed"
            out.append(node)
            for name in node.output:
                if name in targets:
                    out.extend(_mul(onnx, name, name + "_perturbed", perturbation, seed=len(out)))
                    targets.discard(name)
        if targets:
            raise SystemExit(f"not in the graph: {sorted(targets)}")
    del graph.node[:]
    graph.node.extend(out)
    result: bytes = model.SerializeToString()
    return result


def _with_flip(onnx: Any, base: Any, tensor: str) -> bytes:
    """A copy of the model in which the uint8 output of the DynamicQuantizeLinear that `tensor` feeds has its
    middle element (flat index size // 2) changed by one code: v + 1, or 254 where v is 255."""
    model = onnx.ModelProto()
    model.CopyFrom(base)
    graph = model.graph
    (quantized,) = (n.output[0] for n in graph.node if n.op_type == "DynamicQuantizeLinear" and n.input[0] == tensor)
    for name, shape in (("flat", [-1]), ("cell", [1, 1]), ("one", [1])):
        graph.initializer.append(onnx.numpy_helper.from_array(np.array(shape, np.int64), f"flip_{name}"))
    for name, value in (("top", 255), ("two", 2), ("inc", 1)):
        graph.initializer.append(onnx.numpy_helper.from_array(np.array(value, np.int32), f"flip_{name}"))
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(2, np.int64), "flip_half"))
    parts = "i32 flat size mid at cell v top twice up new scattered shape back out"
    t = {name: f"{quantized}_flip_{name}" for name in parts.split()}
    make = onnx.helper.make_node
    nodes = [
        make("Cast", [quantized], [t["i32"]], to=onnx.TensorProto.INT32),
        make("Reshape", [t["i32"], "flip_flat"], [t["flat"]]),
        make("Size", [quantized], [t["size"]]),
        make("Div", [t["size"], "flip_half"], [t["mid"]]),
        make("Reshape", [t["mid"], "flip_one"], [t["at"]]),
        make("Reshape", [t["mid"], "flip_cell"], [t["cell"]]),
        make("Gather", [t["flat"], t["at"]], [t["v"]]),
        make("Div", [t["v"], "flip_top"], [t["top"]]),  # 1 where v is 255, else 0
        make("Mul", [t["top"], "flip_two"], [t["twice"]]),
        make("Add", [t["v"], "flip_inc"], [t["up"]]),
        make("Sub", [t["up"], t["twice"]], [t["new"]]),
        make("ScatterND", [t["flat"], t["cell"], t["new"]], [t["scattered"]]),
        make("Shape", [quantized], [t["shape"]]),
        make("Reshape", [t["scattered"], t["shape"]], [t["back"]]),
        make("Cast", [t["back"]], [t["out"]], to=onnx.TensorProto.UINT8),
    ]
    out: list[Any] = []
    for node in graph.node:
        node.input[:] = [t["out"] if name == quantized else name for name in node.input]
        out.append(node)
        if quantized in node.output:
            out.extend(nodes)
    del graph.node[:]
    graph.node.extend(out)
    result: bytes = model.SerializeToString()
    return result


def run(model_dir: Path, voices: list[str], strings: list[int]) -> dict[str, Any]:
    onnx = importlib.import_module("onnx")  # a reference tool's dependency, not the project's
    importlib.import_module("onnx.numpy_helper")
    ort = importlib.import_module("onnxruntime")
    vocab = json.loads((model_dir / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    tables = np.load(model_dir / "voices_ja.npz")
    base = onnx.load(str(model_dir / MODEL))
    probes = _probes(base.graph, [p[1] for p in PLACES])
    extra = [FRAMES, RAW, *probes.values()]
    for name in (FRAMES, RAW):
        base.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    for name in probes.values():
        base.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UINT8, None))
    names = ["audio", *extra]
    config = Config("default", "ORT_ENABLE_ALL", 0)

    cases = []
    for index in strings:
        ids = [0, *(vocab[c] for c in PHONEMES[index] if c in vocab), 0]
        for voice in voices:
            style = tables[voice][len(ids) - 3].reshape(1, 256).astype(np.float32)
            feeds = {"tokens": np.array([ids], np.int64), "style": style, "speed": np.array([1.0], np.float32)}
            cases.append({"string": index, "phonemes": PHONEMES[index], "voice": voice, "feeds": feeds})

    def outputs(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
        values = dict(zip(names, session.run(names, feeds), strict=True))
        values["audio"] = values["audio"].reshape(-1)
        values[FRAMES] = [int(v) for v in values[FRAMES].reshape(-1)]
        return values

    start = time.perf_counter()
    session = _session(ort, base.SerializeToString(), config)
    reference = [outputs(session, case["feeds"]) for case in cases]
    reference_seconds = time.perf_counter() - start
    print(f"reference: {reference_seconds:.1f} s", file=sys.stderr)

    rows = []
    previous: list[np.ndarray] = []
    for perturbation in PERTURBATIONS:
        start = time.perf_counter()
        if perturbation.flip:
            session = _session(ort, _with_flip(onnx, base, perturbation.tensor), config)
        elif perturbation.tensor:
            session = _session(ort, _with_mul(onnx, base, perturbation), config)
        else:
            session = _session(ort, base.SerializeToString(), config)
        per_case, audio = [], []
        flips = [0, 0]  # uint8 values changed, values, at the quantization the perturbed tensor feeds
        for case, ref in zip(cases, reference, strict=True):
            feeds = dict(case["feeds"])
            if perturbation.style:
                feeds["style"] = _perturb_style(feeds["style"], perturbation.style)
            got = outputs(session, feeds)
            audio.append(got["audio"])
            same_length = ref["audio"].size == got["audio"].size
            snr = snr_db(ref["audio"], got["audio"])
            entry: dict[str, Any] = {
                "string": case["string"],
                "voice": case["voice"],
                "samples_ref": int(ref["audio"].size),
                "samples": int(got["audio"].size),
                "equal_length": same_length,
                "bitexact": same_length and bool(np.array_equal(ref["audio"], got["audio"])),
                "waveform_snr_db": None if math.isinf(snr) else round(snr, 2),
                "frames_identical": ref[FRAMES] == got[FRAMES],
                "frames_differing": sum(a != b for a, b in zip(ref[FRAMES], got[FRAMES], strict=True)),
                "raw_max_abs_diff": float(np.max(np.abs(ref[RAW].astype(np.float64) - got[RAW]))),
            }
            probe = None if perturbation.flip else probes.get(perturbation.tensor)
            if probe is not None and ref[probe].shape == got[probe].shape:
                changed = int(np.count_nonzero(ref[probe] != got[probe]))
                entry["uint8_changed"] = [changed, int(ref[probe].size)]
                flips[0] += changed
                flips[1] += int(ref[probe].size)
            per_case.append(entry)
        seconds = time.perf_counter() - start
        print(f"{perturbation.name}: {seconds:.1f} s", file=sys.stderr)
        row: dict[str, Any] = {"perturbation": perturbation.name, "style": perturbation.style,
                               "tensor": perturbation.tensor, "factor": perturbation.factor,
                               "seconds": round(seconds, 1), "cases": per_case}  # fmt: skip
        if flips[1]:
            row["uint8_changed_total"] = flips
        if perturbation.flip:
            row["uint8_changed_total"] = "one per case, forced"
        if perturbation.repeat:
            same = sum(a.size == b.size and bool(np.array_equal(a, b)) for a, b in zip(audio, previous, strict=True))
            row["bitexact_vs_previous_row"] = same
        previous = audio
        rows.append(row)
    summary = [
        {"string": c["string"], "phonemes": c["phonemes"], "voice": c["voice"], "frames": r[FRAMES],
         "samples": int(r["audio"].size)}
        for c, r in zip(cases, reference, strict=True)
    ]  # fmt: skip
    return {
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpu": _cpu(),
        "cpu_count": os.cpu_count(),
        "model": MODEL,
        "reference_config": "ORT_ENABLE_ALL, default threads; extra outputs: frames, raw durations, probes",
        "reference_seconds": round(reference_seconds, 1),
        "cases": summary,
        "rows": rows,
    }


def _snr(value: float) -> str:
    return "bit-exact" if math.isinf(value) else f"{value:.1f} dB"


def table(report: dict[str, Any]) -> str:
    """The markdown table: one row per perturbation against the unperturbed run."""
    n = len(report["cases"])
    lines = [
        f"| perturbation ({n} cases) | equal length | frames per phoneme identical | bit-exact "
        "| waveform SNR min / median / max | below 30 dB | uint8 values changed at the next quantization |",
        "| --- | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for row in report["rows"]:
        cases = row["cases"]
        snrs = sorted(math.inf if c["waveform_snr_db"] is None else c["waveform_snr_db"] for c in cases)
        spread = f"{_snr(snrs[0])} / {_snr(statistics.median(snrs))} / {_snr(snrs[-1])}"
        if isinstance(row.get("uint8_changed_total"), list):
            changed, total = row["uint8_changed_total"]
            flips = f"{changed} of {total} ({changed / total:.1e})"
        else:
            flips = row.get("uint8_changed_total", "-")
        if "bitexact_vs_previous_row" in row:
            flips = f"(bit-exact against the previous row in {row['bitexact_vs_previous_row']} / {n})"
        lines.append(
            f"| {row['perturbation']} | {sum(c['equal_length'] for c in cases)} / {n} "
            f"| {sum(c['frames_identical'] for c in cases)} / {n} | {sum(c['bitexact'] for c in cases)} / {n} "
            f"| {spread} | {sum(s < 30.0 for s in snrs)} / {n} | {flips} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    case_arguments(parser)
    args = parser.parse_args()
    report = run(args.model_dir, *selected_cases(args))
    publish(report, [table(report)], args.json)


if __name__ == "__main__":
    main()
