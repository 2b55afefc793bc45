"""Where the time of ``transcribe_batch`` goes (issue 17, files16 target): the 16 files of asr_bench.py's
``files16`` part transcribed one by one and with batch 16, each phase timed with the stream synchronized
around it (so the totals run a little slower than asr_bench.py's): log-mel, encoder, graph decoder start,
graph decode steps (count and time), the rest of ``transcribe`` per recording.

    python benchmarks/tools/asr_batch_profile.py --model DIR --audio DIR [--dtype float16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _clips(audio_dir: Path) -> list[np.ndarray[Any, Any]]:
    import soundfile as sf

    wavs = sorted(audio_dir.glob("cards/*.wav")) + sorted(audio_dir.glob("librivox/*.wav"))
    if len(wavs) < 10:
        raise SystemExit(f"--audio {audio_dir}: expected cards/*.wav and librivox/*.wav (10 clips), found {len(wavs)}")
    return [sf.read(w, dtype="float32")[0] for w in wavs]


class Timer:
    """Wraps callables so each call's wall time (stream synchronized before and after) adds to a label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.depth = 0

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        from pygpukit.core.stream import current_stream

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:  # nested: counted by the outer label only
                return fn(*args, **kwargs)
            self.depth += 1
            current_stream().synchronize()
            start = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
                current_stream().synchronize()
                return out
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1
                self.depth -= 1

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--audio", type=Path, required=True)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--files", type=int, default=16, help="how many of the 16 files (fewer: a CPU smoke run)")
    p.add_argument(
        "--kernels",
        action="store_true",
        help="also list each run's kernels by device time (torch's profiler; GPU machine only)",
    )
    args = p.parse_args()
    from pygpukit.asr import WhisperModel, batch, graph_decode, longform

    model = WhisperModel.from_pretrained(args.model, dtype=args.dtype)
    clips = _clips(args.audio)
    files = (clips + clips[:6])[: max(1, min(args.files, 16))]
    opts: dict[str, Any] = {"beam_size": 1, "temperature": 0.0}
    plain: dict[str, Callable[[], Any]] = {"single": lambda: [longform.transcribe(model, c, **opts) for c in files],
             "batch16": lambda: batch.transcribe_batch(model, files, batch_size=16, **opts)}  # fmt: skip
    for fn in plain.values():
        fn()  # warm-up: kernels, plans, both graphs
    report: dict[str, Any] = {"dtype": args.dtype, "audio_seconds": sum(len(c) for c in files) / 16000}
    for name, fn in plain.items():
        best = min(_wall(fn) for _ in range(args.repeat))
        report[f"{name}_seconds"] = best
    report["speedup"] = report["single_seconds"] / report["batch16_seconds"]
    print(f"plain: one by one {report['single_seconds'] * 1e3:.1f} ms, batch 16 {report['batch16_seconds'] * 1e3:.1f} "
          f"ms ({report['speedup']:.2f}x)", flush=True)  # fmt: skip
    if args.kernels:
        report["kernels"] = {name: _kernels(fn) for name, fn in plain.items()}
    timer = Timer()
    patches = [(batch, "log_mel_batch"), (longform, "log_mel_spectrogram"), (model, "encode"),
               (graph_decode.GraphDecoder, "start"), (graph_decode.GraphDecoder, "step")]  # fmt: skip
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr in patches]
    for obj, attr, fn in saved:
        setattr(obj, attr, timer.wrap(f"{getattr(obj, '__name__', type(obj).__name__)}.{attr}", fn))
    try:
        for name, fn in plain.items():
            timer.reset()
            wall = _wall(fn)
            phases = {k: {"ms": v * 1e3, "calls": timer.calls[k]} for k, v in sorted(timer.seconds.items())}
            report[f"{name}_phases"] = {"wall_ms": wall * 1e3, **phases}
            print(f"{name} (synchronized phases): {wall * 1e3:.1f} ms", flush=True)
            for k, v in phases.items():
                print(f"  {k:40s} {v['ms']:8.2f} ms  {v['calls']:5d} calls", flush=True)
            rest = wall * 1e3 - sum(v["ms"] for v in phases.values())
            print(f"  {'(everything else: host work)':40s} {rest:8.2f} ms", flush=True)
    finally:
        for obj, attr, fn in saved:
            setattr(obj, attr, fn)
    print(json.dumps(report, indent=1))
    return 0


def _kernels(fn: Callable[[], Any], top: int = 30) -> dict[str, Any]:
    """The kernels of one call of ``fn`` (graph replays' included) by total device time, from torch's
    profiler (CUPTI sees every kernel of the process)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pygpukit.core.stream import current_stream

    current_stream().synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        current_stream().synchronize()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if str(getattr(event, "device_type", "")).endswith("CUDA") and event.device_time_total > 0:
            totals[event.name].append(event.device_time_total / 1e3)
    rows = sorted(((sum(v), len(v), k) for k, v in totals.items()), reverse=True)
    device_ms = sum(r[0] for r in rows)
    print(f"kernels: {device_ms:.2f} ms of device time in {sum(r[1] for r in rows)} launches", flush=True)
    for total, count, name in rows[:top]:
        print(f"  {total:8.3f} ms  x{count:5d}  {name[:100]}", flush=True)
    return {"device_ms": device_ms, "launches": sum(r[1] for r in rows),
            "top": [{"ms": t, "count": c, "kernel": n[:120]} for t, c, n in rows[:top]]}  # fmt: skip


def _wall(fn: Callable[[], Any]) -> float:
    from pygpukit.core.stream import current_stream

    current_stream().synchronize()
    start = time.perf_counter()
    fn()
    current_stream().synchronize()
    return time.perf_counter() - start


if __name__ == "__main__":
    raise SystemExit(main())
