"""Timings of pygpukit.audio's music features on the device: cqt, chroma_cqt (tuning given), chroma_stft,
spectral_contrast and hpss of a batch of signals, and librosa's time for the same call when librosa is installed.

    python benchmarks/music_bench.py --batch 16 --seconds 30 --sr 22050 --out $OUT/music.json

Each entry is the best of ``--repeats`` means of ``--calls`` calls after one warm-up call (host time included,
the device synchronised after each mean); float32 input. Results go to ``--out`` as JSON and to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import time
from typing import Any

import numpy as np


def _time(fn: Any, calls: int, repeats: int) -> float:
    from pygpukit.core.stream import synchronize

    fn()
    synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--sr", type=int, default=22050)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import pygpukit.audio as audio
    from pygpukit.core.array import from_numpy

    rng = np.random.default_rng(0)
    host = (0.3 * rng.standard_normal((args.batch, int(args.seconds * args.sr)))).astype(np.float32)
    y = from_numpy(host)
    spec = audio.stft(y)
    sr = args.sr
    cases = {
        "cqt": (lambda: audio.cqt(y, sr=sr), "cqt", {"sr": sr}),
        "chroma_cqt": (lambda: audio.chroma_cqt(y=y, sr=sr, tuning=0.0), "feature.chroma_cqt",
                       {"sr": sr, "tuning": 0.0}),
        "chroma_stft": (lambda: audio.chroma_stft(y=y, sr=sr, tuning=0.0), "feature.chroma_stft",
                        {"sr": sr, "tuning": 0.0}),
        "spectral_contrast": (lambda: audio.spectral_contrast(y=y, sr=sr), "feature.spectral_contrast", {"sr": sr}),
        "hpss": (lambda: audio.hpss(spec), None, {}),
    }  # fmt: skip
    librosa: Any = None
    with contextlib.suppress(ImportError):
        librosa = importlib.import_module("librosa")
    results: dict[str, Any] = {"batch": args.batch, "seconds": args.seconds, "sr": sr}
    for name, (fn, ref_name, kw) in cases.items():
        entry: dict[str, Any] = {"pygpukit_ms": 1e3 * _time(fn, args.calls, args.repeats)}
        if librosa is not None and ref_name is not None:
            target: Any = librosa
            for part in ref_name.split("."):
                target = getattr(target, part)
            start = time.perf_counter()
            if ref_name == "cqt":
                target(host, **kw)
            else:
                target(y=host, **kw)
            entry["librosa_ms"] = 1e3 * (time.perf_counter() - start)
            entry["speedup"] = entry["librosa_ms"] / entry["pygpukit_ms"]
        results[name] = entry
        print(name, json.dumps(entry))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
