"""How well does onnxruntime on Kokoro's int8 model agree with itself? The issue's target (waveform SNR >= 30 dB
against onnxruntime on kokoro-v1.0.int8.onnx, identical durations) is only meaningful if onnxruntime's own legitimate
configurations on the same model and inputs meet it against each other: this runs the int8 model under several
session configurations (graph optimization level, intra-op threads, onnxruntime's own saved optimized graph) for the
phoneme strings of ci/kokoro_reference.py and compares each with the default configuration (ORT_ENABLE_ALL, default
threads): equal total length, identical frames per phoneme, waveform SNR over the common length.

``python ci/kokoro_ort_self_agreement.py MODEL_DIR [--model FILE] [--voices a,b] [--strings 0,1] [--json OUT.json]``
(MODEL_DIR: what ci/fetch_kokoro.py fetched; needs numpy, onnx and onnxruntime: a reference environment, not the
project's). The model is given two extra graph outputs, the frames per phoneme and the unrounded durations
(kokoro_reference.FRAMES / RAW); the configuration ``as shipped`` runs the file unmodified (audio only) to show
that these outputs do not change the audio. ``--model`` runs another file instead of the int8 one, for example the
float twin of ci/kokoro_float_twin.py as a control that the configurations do change a float graph's arithmetic.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from kokoro_reference import FRAMES, PHONEMES, RAW  # type: ignore[import-not-found]  # ci/ is sys.path[0]

MODEL = "kokoro-v1.0.int8.onnx"


@dataclass(frozen=True)
class Config:
    name: str
    level: str  # a GraphOptimizationLevel member
    threads: int  # intra_op_num_threads; 0: onnxruntime's default
    model: str = "extra"  # "extra": the file with FRAMES and RAW as outputs; "shipped": unmodified; "saved": ORT's


CONFIGS = (
    Config("default: ORT_ENABLE_ALL, default threads", "ORT_ENABLE_ALL", 0),
    Config("default again (new session)", "ORT_ENABLE_ALL", 0),
    Config("ORT_ENABLE_ALL, 1 thread", "ORT_ENABLE_ALL", 1),
    Config("ORT_ENABLE_ALL, 2 threads", "ORT_ENABLE_ALL", 2),
    Config("ORT_ENABLE_EXTENDED", "ORT_ENABLE_EXTENDED", 0),
    Config("ORT_ENABLE_BASIC", "ORT_ENABLE_BASIC", 0),
    Config("ORT_DISABLE_ALL", "ORT_DISABLE_ALL", 0),
    Config("ORT_DISABLE_ALL, 1 thread", "ORT_DISABLE_ALL", 1),
    Config("ORT_DISABLE_ALL, 2 threads", "ORT_DISABLE_ALL", 2),
    Config("saved ORT_ENABLE_ALL graph, run with ORT_DISABLE_ALL", "ORT_DISABLE_ALL", 0, "saved"),
    Config("as shipped (no extra outputs), ORT_ENABLE_ALL", "ORT_ENABLE_ALL", 0, "shipped"),
)


def snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    """10 log10(sum ref^2 / sum (ref - x)^2) over the common length, in float64; inf when bit-exact there."""
    n = min(ref.size, x.size)
    r, d = ref[:n].astype(np.float64), ref[:n].astype(np.float64) - x[:n].astype(np.float64)
    noise = float(np.sum(d * d))
    return math.inf if noise == 0.0 else 10.0 * math.log10(float(np.sum(r * r)) / noise)


def _session(ort: Any, model: bytes | str, config: Config, save: str | None = None) -> Any:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, config.level)
    options.intra_op_num_threads = config.threads
    if save is not None:
        options.optimized_model_filepath = save
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _nodes(ort: Any, model: bytes, level: str, tmp: str) -> int:
    """How many nodes onnxruntime's optimized graph has at this level (it saves it, onnx counts)."""
    path = str(Path(tmp) / f"{level}.onnx")
    _session(ort, model, Config("", level, 0), save=path)
    onnx = importlib.import_module("onnx")
    count = len(onnx.load(path, load_external_data=False).graph.node)
    for leftover in Path(tmp).iterdir():
        leftover.unlink()
    return count


def run(model_dir: Path, voices: list[str], strings: list[int], model_file: Path | None = None) -> dict[str, Any]:
    onnx = importlib.import_module("onnx")  # a reference tool's dependency, not the project's
    ort = importlib.import_module("onnxruntime")
    vocab = json.loads((model_dir / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    tables = np.load(model_dir / "voices_ja.npz")
    shipped = str(model_file if model_file is not None else model_dir / MODEL)
    model = onnx.load(shipped)
    for name in (FRAMES, RAW):
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    extra = model.SerializeToString()

    cases = []
    for index in strings:
        ids = [0, *(vocab[c] for c in PHONEMES[index] if c in vocab), 0]
        for voice in voices:
            style = tables[voice][len(ids) - 3].reshape(1, 256).astype(np.float32)
            feeds = {"tokens": np.array([ids], np.int64), "style": style, "speed": np.array([1.0], np.float32)}
            cases.append({"string": index, "phonemes": PHONEMES[index], "voice": voice, "feeds": feeds})

    outputs: dict[str, list[dict[str, Any]]] = {}
    timing: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        levels = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
        nodes = {level: _nodes(ort, extra, level, tmp) for level in levels}
        saved = str(Path(tmp) / "optimized.onnx")
        for config in CONFIGS:
            start = time.perf_counter()
            if config.model == "saved":
                _session(ort, extra, Config("", "ORT_ENABLE_ALL", 0), save=saved)  # writes the optimized graph
                session = _session(ort, saved, config)
            else:
                session = _session(ort, shipped if config.model == "shipped" else extra, config)
            names = ["audio"] if config.model == "shipped" else ["audio", FRAMES, RAW]
            results = []
            for case in cases:
                values = session.run(names, case["feeds"])
                result = {"audio": values[0].reshape(-1)}
                if len(values) == 3:
                    result["frames"] = [int(v) for v in values[1].reshape(-1)]
                    result["raw"] = values[2].reshape(-1).astype(np.float64)
                results.append(result)
            outputs[config.name] = results
            timing[config.name] = time.perf_counter() - start
            print(f"{config.name}: {timing[config.name]:.1f} s", file=sys.stderr)

    reference = outputs[CONFIGS[0].name]
    rows = []
    for config in CONFIGS[1:]:
        per_case = []
        for case, ref, got in zip(cases, reference, outputs[config.name], strict=True):
            same_length = ref["audio"].size == got["audio"].size
            entry: dict[str, Any] = {
                "string": case["string"],
                "voice": case["voice"],
                "samples_ref": int(ref["audio"].size),
                "samples": int(got["audio"].size),
                "equal_length": same_length,
                "bitexact": same_length and bool(np.array_equal(ref["audio"], got["audio"])),
            }
            snr = snr_db(ref["audio"], got["audio"])
            entry["waveform_snr_db"] = None if math.isinf(snr) else round(snr, 2)
            if "frames" in got:
                entry["frames_identical"] = ref["frames"] == got["frames"]
                entry["frames_differing"] = sum(a != b for a, b in zip(ref["frames"], got["frames"], strict=True))
                entry["raw_max_abs_diff"] = float(np.max(np.abs(ref["raw"] - got["raw"])))
            per_case.append(entry)
        rows.append({"config": config.name, "level": config.level, "threads": config.threads,
                     "model": config.model, "seconds": round(timing[config.name], 1), "cases": per_case})  # fmt: skip
    summary = [
        {
            "string": c["string"],
            "phonemes": c["phonemes"],
            "voice": c["voice"],
            "frames": r["frames"],
            "samples": int(r["audio"].size),
        }
        for c, r in zip(cases, reference, strict=True)
    ]
    return {
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpu": _cpu(),
        "cpu_count": os.cpu_count(),
        "model": Path(shipped).name,
        "optimized_graph_nodes": nodes,
        "reference_config": CONFIGS[0].name,
        "reference_seconds": round(timing[CONFIGS[0].name], 1),
        "cases": summary,
        "rows": rows,
    }


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _range(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:.1f} dB" if lo == hi else f"{lo:.1f} to {hi:.1f} dB"


def table(report: dict[str, Any]) -> str:
    """The markdown table: one row per configuration against the default one."""
    n = len(report["cases"])
    lines = [
        f"| configuration vs default ({n} cases) | equal length | frames per phoneme identical "
        "| bit-exact | waveform SNR, equal lengths | waveform SNR, lengths differ |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for row in report["rows"]:
        cases = row["cases"]
        equal = sum(c["equal_length"] for c in cases)
        frames = f"{sum(c['frames_identical'] for c in cases)} / {n}" if "frames_identical" in cases[0] else "n/a"
        exact = sum(c["bitexact"] for c in cases)
        same = [c["waveform_snr_db"] for c in cases if c["equal_length"] and not c["bitexact"]]
        other = [c["waveform_snr_db"] for c in cases if not c["equal_length"]]
        same_text = _range(same) if same else ("bit-exact" if equal else "-")
        if same and exact:
            same_text += f" ({exact} bit-exact)"
        lines.append(f"| {row['config']} | {equal} / {n} | {frames} | {exact} / {n} | {same_text} | {_range(other)} |")
    return "\n".join(lines)


def case_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every Kokoro onnxruntime measurement takes: the model folder, the cases, the JSON file."""
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--voices", default="", help="comma-separated voices (default: all of voices_ja.npz)")
    parser.add_argument("--strings", default="", help="comma-separated indices into kokoro_reference.PHONEMES")
    parser.add_argument("--json", type=Path, help="write the full report here")


def selected_cases(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    """The voices and phoneme-string indices :func:`case_arguments` selected (default: all)."""
    voices = args.voices.split(",") if args.voices else list(np.load(args.model_dir / "voices_ja.npz").files)
    strings = [int(s) for s in args.strings.split(",")] if args.strings else list(range(len(PHONEMES)))
    return voices, strings


def publish(report: dict[str, Any], lines: list[str], json_path: Path | None) -> None:
    """Print the run's machine line and ``lines``; write ``report`` as JSON to ``json_path`` when given."""
    print(f"onnxruntime {report['onnxruntime']}, {report['cpu']} ({report['cpu_count']} CPUs), {report['model']}")
    print("\n".join(lines))
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    case_arguments(parser)
    parser.add_argument("--model", type=Path, help=f"run this file instead of MODEL_DIR/{MODEL}")
    args = parser.parse_args()
    report = run(args.model_dir, *selected_cases(args), args.model)
    nodes = ", ".join(f"{k} {v}" for k, v in report["optimized_graph_nodes"].items())
    publish(report, [f"nodes of the optimized graph: {nodes}", table(report)], args.json)


if __name__ == "__main__":
    main()
