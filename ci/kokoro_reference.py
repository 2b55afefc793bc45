"""Write the references of Kokoro's text encoder, duration and F0 / N predictors and decoder front that the tests of
packages/pygpukit-audio (test_tts_durations.py, _prosody.py, _text.py, _decoder.py) compare with
(tests/data/kokoro_reference.json): onnxruntime on the float twin (ci/kokoro_float_twin.py) and on the int8
model, for three phoneme strings and every shipped voice: raw and rounded durations of both; the twin's F0
and N curves, its text-encoder features and decoder-front output (both projected, see PROJECTION) for the
voices of CURVE_VOICES.

``python ci/kokoro_reference.py MODEL_DIR TWIN.onnx OUT.json`` (MODEL_DIR: what
ci/fetch_kokoro.py fetched; needs numpy, onnx and onnxruntime: a reference environment, not the project's).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

PHONEMES = [
    "ko\u0272\u0272i\u02a8iwa. k\u02b2o\u02d0wa i\u02d0 ten\u02a8i des\u026f.",
    "wata\u0161iwa gak\u026fse\u02d0 des\u026f.",
    "a\u027eigato\u02d0 gozaimas\u026f. matakimas\u026f ne!",
]  # Japanese (misaki's romanizer), as IPA-like strings
RAW = "/encoder/predictor/ReduceSum_output_0"  # sigmoid(duration_proj(...)).sum(-1), before / speed
FRAMES = "/encoder/Clip_output_0"  # round(raw / speed) clipped to >= 1
F0, N = "/encoder/F0_proj/Conv_output_0", "/encoder/N_proj/Conv_output_0"  # (1, 1, 2 x frames)
TEXT = "/encoder/text_encoder/Transpose_2_output_0"  # the text encoder's (1, 512, T) features
DECODER = "/decoder/decoder/decode.3/Div_4_output_0"  # the decoder front's (1, 512, 2F) output
CURVE_VOICES = ("jf_alpha", "jm_kumo")
# The text features are stored projected to 8 x T: PROJECTION (seed 0) @ features.
PROJECTION = np.random.default_rng(0).standard_normal((8, 512)) / np.sqrt(512.0)


def _session(path: Path) -> Any:
    onnx = importlib.import_module("onnx")
    ort = importlib.import_module("onnxruntime")
    model = onnx.load(str(path))
    for name in (RAW, FRAMES, F0, N, TEXT, DECODER):
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main(model_dir: Path, twin: Path, out: Path) -> None:
    vocab = json.loads((model_dir / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    voices = np.load(model_dir / "voices_ja.npz")
    sessions = {"twin": _session(twin), "int8": _session(model_dir / "kokoro-v1.0.int8.onnx")}
    cases = []
    for text in PHONEMES:
        ids = [0, *(vocab[c] for c in text if c in vocab), 0]
        for voice in voices.files:
            style = voices[voice][len(ids) - 3].reshape(1, 256).astype(np.float32)
            feeds = {"tokens": np.array([ids], np.int64), "style": style, "speed": np.array([1.0], np.float32)}
            case: dict[str, Any] = {"phonemes": text, "ids": ids, "voice": voice}
            for tag, session in sessions.items():
                raw, frames, f0, n, features, decoded = session.run([RAW, FRAMES, F0, N, TEXT, DECODER], feeds)
                case[f"{tag}_raw"] = [float(v) for v in raw.reshape(-1)]
                case[f"{tag}_frames"] = [int(v) for v in frames.reshape(-1)]
                if tag == "twin" and voice in CURVE_VOICES:
                    case["twin_f0"] = [float(f"{v:.7g}") for v in f0.reshape(-1)]
                    case["twin_n"] = [float(f"{v:.7g}") for v in n.reshape(-1)]
                    projected = PROJECTION @ features[0].astype(np.float64)
                    case["twin_text_proj"] = [[float(f"{v:.7g}") for v in row] for row in projected]
                    projected = PROJECTION @ decoded[0].astype(np.float64)
                    case["twin_decoder_proj"] = [[float(f"{v:.7g}") for v in row] for row in projected]
            cases.append(case)
    source = "onnxruntime CPU on kokoro-v1.0.int8.onnx (int8) and its float twin (twin), speed 1"
    lines = ",\n".join(json.dumps(case, ensure_ascii=True, separators=(",", ":")) for case in cases)
    out.write_text(f'{{"source": {json.dumps(source)},\n"cases": [\n{lines}\n]}}\n', "utf-8")  # a case a line


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
