"""Kokoro-82M on the GPU in one run (issue 22): pygpukit.tts against onnxruntime on the same int8 model.

    python benchmarks/tools/tts_bench.py [--model DIR] [--voice jf_alpha] [--repeat 5] [--out FILE]

``--model``: the folder ``python -m pygpukit.tts.fetch`` fills (default: the cache; nothing is downloaded
if it is there). Needs onnx (the ``tts`` extra) and onnxruntime (onnxruntime-gpu for the CUDA provider).
Writes ``$OUT/tts_bench.json`` (or ``--out``) and a summary on stdout.

- ``synthesize``: one sentence of about 200 phonemes (SENTENCE, misaki's alphabet), voice ``--voice``:
  pygpukit ``KokoroModel.synthesize`` (float32, and ``--dtype`` if another) against onnxruntime's
  InferenceSession on kokoro-v1.0.int8.onnx with the CUDA execution provider when it is available, else the
  CPU provider (both when CUDA is there); median of ``--repeat`` runs after one warm-up each; the speed-up
  (target >= 5x) and the real-time factor.
- ``stream``: time to the first audio of ``generate_stream`` on three sentences (the first chunk), and the
  total.
- ``durations``: whether our frames per phoneme equal onnxruntime's on the int8 model (they need not:
  docs/tts.md) and the audio lengths.

A failing part is recorded as an error in the JSON and the others still run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

# ~200 phonemes: three Japanese sentences in misaki's alphabet
SENTENCE = (
    "ko\u0272\u0272i\u02a8iwa. k\u02b2o\u02d0wa i\u02d0 ten\u02a8i des\u026f ne. wata\u0161iwa gak\u026fse\u02d0 "
    "des\u026f. a\u027eigato\u02d0 gozaimas\u026f. matakimas\u026f ne! "
    "a\u0255itawa to\u02d0k\u02b2o\u02d0e ikimas\u026f. so\u027ekaa, tomodatit\u0255i to \u0255okud\u0291i o "
    "\u0255imas\u026f. hontoni tano\u0255ikatta des\u026f."
)


def _median_time(fn: Any, repeat: int) -> tuple[float, Any]:
    result = fn()  # warm-up (kernel compilation, graph optimization)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Kokoro folder (default: the cache, fetched if missing)")
    p.add_argument("--voice", default="jf_alpha")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--out", default=None, help="JSON file (default $OUT/tts_bench.json, else tts_bench.json)")
    args = p.parse_args(argv)
    import pygpukit as gp
    from pygpukit.core.backend import backend_state
    from pygpukit.tts import KokoroModel, fetch

    folder = Path(args.model) if args.model else fetch()
    report: dict[str, Any] = {"python": platform.python_version(), "backend": backend_state().name,
                              "voice": args.voice, "repeat": args.repeat}  # fmt: skip
    model = KokoroModel.from_pretrained(folder, voice=args.voice)
    phonemes = "".join(c for c in SENTENCE if c in model.vocab)
    report["phonemes"] = len(phonemes)
    ids = model.ids(phonemes)
    style = model._voice_table(args.voice)[ids.size - 3].reshape(1, 256).astype(np.float32)

    def sync() -> None:
        if backend_state().name == "cuda":
            gp.synchronize()

    def ours() -> Any:
        audio = model.synthesize(phonemes, phonemes=True, split=False)
        sync()
        return audio

    try:
        seconds, audio = _median_time(ours, args.repeat)
        length = audio.size / 24000
        report["pygpukit"] = {"float32_s": seconds, "audio_s": length, "rtf": seconds / length,
                              "frames": model.last_durations[0].frames.tolist()}  # fmt: skip
        if args.dtype != "float32":
            low = KokoroModel.from_pretrained(folder, voice=args.voice, dtype=args.dtype)
            report["pygpukit"][f"{args.dtype}_s"], _ = _median_time(
                lambda: low.synthesize(phonemes, phonemes=True, split=False), args.repeat
            )
    except Exception:
        report["pygpukit_error"] = traceback.format_exc()
    try:
        ort = importlib.import_module("onnxruntime")  # a reference, not a dependency

        feeds = {"tokens": ids[None], "style": style, "speed": np.array([1.0], np.float32)}
        available = ort.get_available_providers()
        providers = [pr for pr in ("CUDAExecutionProvider", "CPUExecutionProvider") if pr in available]
        report["onnxruntime"] = {"version": ort.__version__}
        for provider in providers:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            session = ort.InferenceSession(str(folder / "kokoro-v1.0.int8.onnx"), options, providers=[provider])
            t, (ref,) = _median_time(lambda s=session: s.run(["audio"], feeds), args.repeat)
            report["onnxruntime"][provider] = {"s": t, "audio_s": ref.size / 24000}
            if "pygpukit" in report:
                report["onnxruntime"][provider]["speedup_of_pygpukit"] = t / report["pygpukit"]["float32_s"]
    except Exception:
        report["onnxruntime_error"] = traceback.format_exc()
    try:
        stamps = []
        start = time.perf_counter()
        for chunk in model.generate_stream(phonemes, phonemes=True):
            sync()
            stamps.append((time.perf_counter() - start, chunk.size / 24000))
        report["stream"] = {"first_audio_s": stamps[0][0], "total_s": stamps[-1][0], "chunks": stamps}
    except Exception:
        report["stream_error"] = traceback.format_exc()
    out = Path(args.out) if args.out else Path(os.environ.get("OUT", ".")) / "tts_bench.json"
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in report.items() if not k.endswith("_error")}, indent=1)[:4000])
    for key in [k for k in report if k.endswith("_error")]:
        print(f"{key}:\n{report[key]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
