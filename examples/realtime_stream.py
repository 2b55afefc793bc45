"""Real-time streaming features: 20 ms chunks of a recording, fed as a microphone would, through a streaming
STFT, a log-mel projection (80 mels, what a speech recogniser reads) and an energy VAD, with the latency of
every chunk.

    python examples/realtime_stream.py                      # the pocketsphinx test recording, paced at 1x
    python examples/realtime_stream.py --wav speech.wav --no-pace --json out.json
    python examples/realtime_stream.py --synthetic --seconds 2

Input: ``--wav FILE``, else the first recording of the cached pocketsphinx test data
(``pygpukit.audio.testdata``, fetched when missing), else (``--synthetic``, or when neither can be had) a
synthetic voice-like signal. It is resampled to 16 kHz on the device when needed and cut into chunks of
``--chunk-ms`` (default 20 ms: 320 samples). With pacing (the default) chunk k is handed over at k * 20 ms
after the start, as a microphone delivers it; ``--no-pace`` hands them over back to back (the fastest the
pipeline goes).

Per chunk: ``StreamingSTFT.push`` (n_fft 400, hop 160: 10 ms frames) gives the frames the chunk completes;
their power spectrum goes through the mel matrix and ``power_to_db`` (ref 1, no top_db) on the device; the
VAD marks the chunk as speech when its RMS is within ``--vad-db`` dB of the loudest chunk so far. The
latency of a chunk is the wall time from its arrival (paced; waiting behind a slow chunk counts) or its
hand-over (unpaced) to its log-mel frames being complete on the device (the stream synchronised) and its
VAD decision made. The report: median, p99 and max latency, the real-time factor (processing time over
audio time) and whether the pipeline keeps up (every chunk done before the next one arrives). At the end
the streamed log-mel frames are compared with the offline ``melspectrogram`` of the whole signal (they must
agree: the streaming STFT is exact); the exit status is 1 when they do not.

Runs on the CPU simulation backend too (slower, same results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import pygpukit.audio as audio
from pygpukit.core.backend import backend_state
from pygpukit.core.stream import synchronize

SR = 16000
N_FFT = 400
HOP = 160
N_MELS = 80


def _synthetic(seconds: float) -> np.ndarray[Any, Any]:
    """Bursts of a harmonic, vowel-like sound between pauses, with a little noise."""
    t = np.arange(int(seconds * SR)) / SR
    voiced = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 12))
    envelope = (np.sin(2 * np.pi * 1.3 * t) > 0.2).astype(np.float64)
    noise = 1e-3 * np.random.default_rng(0).standard_normal(t.size)
    return (0.2 * voiced * envelope + noise).astype(np.float32)


def _signal(args: argparse.Namespace) -> tuple[np.ndarray[Any, Any], str]:
    if not args.synthetic:
        path: Path | None = Path(args.wav) if args.wav else None
        if path is None:
            try:
                from pygpukit.audio import testdata

                path = testdata.wav_files("pocketsphinx-testdata")[0]
            except Exception as error:
                print(f"no test recording ({type(error).__name__}: {error}); using a synthetic signal")
        if path is not None:
            y, sr = audio.load(path)
            if sr != SR:
                y = audio.resample(y, orig_sr=sr, target_sr=SR)
            values = y.to_numpy().astype(np.float32)
            if args.seconds:
                values = values[: int(args.seconds * SR)]
            return values, str(path)
    return _synthetic(args.seconds or 3.0), "synthetic"


class Pipeline:
    """The per-chunk work: streaming STFT, power, mel, decibels on the device; the VAD decision on the host."""

    def __init__(self, vad_db: float) -> None:
        self.stft = audio.StreamingSTFT(n_fft=N_FFT, hop_length=HOP)
        self.vad_db = vad_db
        self.loudest = 0.0
        self.frames: list[Any] = []  # log-mel (80, k) GPUArrays
        self.speech: list[bool] = []

    def _features(self, spec: Any) -> Any:
        power = audio.power_spectrum(spec)
        mel = audio.melspectrogram(S=power, sr=SR, n_fft=N_FFT, n_mels=N_MELS)
        return audio.power_to_db(mel, ref=1.0, top_db=None)

    def chunk(self, samples: np.ndarray[Any, Any]) -> None:
        spec = self.stft.push(samples)
        if spec is not None:
            self.frames.append(self._features(spec))
        rms = float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))
        self.loudest = max(self.loudest, rms)
        self.speech.append(rms > 0 and 20 * np.log10(rms / self.loudest) > -self.vad_db)
        synchronize()

    def finish(self) -> None:
        spec = self.stft.flush()
        if spec is not None:
            self.frames.append(self._features(spec))
        synchronize()


def run(args: argparse.Namespace) -> dict[str, Any]:
    y, source = _signal(args)
    chunk = round(args.chunk_ms * SR / 1000)
    pipeline = Pipeline(args.vad_db)
    pipeline.chunk(np.zeros(chunk, np.float32))  # warm-up: kernel compilation and plans, not timed
    pipeline.finish()
    pipeline = Pipeline(args.vad_db)
    latencies = []
    late = 0
    start = time.perf_counter()
    for k, begin in enumerate(range(0, y.size - chunk + 1, chunk)):
        arrival = start + k * chunk / SR if args.pace else time.perf_counter()
        now = time.perf_counter()
        if args.pace and now < arrival:
            time.sleep(arrival - now)
        elif args.pace and now > arrival + chunk / SR:
            late += 1  # the previous chunk was still being processed when this one arrived
        pipeline.chunk(y[begin : begin + chunk])
        latencies.append(time.perf_counter() - arrival)  # paced: waiting behind a slow chunk counts too
    pipeline.finish()
    chunks = len(latencies)
    busy = sum(latencies)
    audio_seconds = chunks * chunk / SR
    lat_ms = sorted(1e3 * v for v in latencies)
    streamed = np.concatenate([f.to_numpy() for f in pipeline.frames], axis=-1)
    used = y[: chunks * chunk]
    offline = audio.power_to_db(audio.melspectrogram(y=used, sr=SR, n_fft=N_FFT, hop_length=HOP, n_mels=N_MELS),
                                ref=1.0, top_db=None).to_numpy()  # fmt: skip
    error = float(np.abs(streamed - offline).max()) if streamed.shape == offline.shape else float("inf")
    audio.check_pending()
    return {
        "backend": backend_state().name,
        "source": source,
        "chunk_samples": chunk,
        "chunks": chunks,
        "audio_seconds": audio_seconds,
        "paced": bool(args.pace),
        "latency_ms": {
            "median": statistics.median(lat_ms),
            "p99": lat_ms[min(chunks - 1, int(0.99 * chunks))],
            "max": lat_ms[-1],
        },
        "real_time_factor": busy / audio_seconds,
        "keeps_up": lat_ms[-1] < 1e3 * chunk / SR and late == 0,
        "late_chunks": late,
        "log_mel_frames": int(streamed.shape[-1]),
        "speech_fraction": float(np.mean(pipeline.speech)) if pipeline.speech else 0.0,
        "max_abs_db_error_vs_offline": error,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wav", default=None, help="a WAV/FLAC file (default: the pocketsphinx test recording)")
    parser.add_argument("--synthetic", action="store_true", help="a synthetic signal instead of a recording")
    parser.add_argument("--seconds", type=float, default=None, help="use at most this much of the signal")
    parser.add_argument("--chunk-ms", type=float, default=20.0)
    parser.add_argument("--no-pace", dest="pace", action="store_false", help="hand chunks over back to back")
    parser.add_argument("--vad-db", type=float, default=30.0)
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    report = run(args)
    lat = report["latency_ms"]
    pacing = "paced" if report["paced"] else "unpaced"
    print(f"{report['source']}: {report['chunks']} chunks of {report['chunk_samples']} samples "
          f"({report['audio_seconds']:.2f} s) on {report['backend']}, {pacing}")  # fmt: skip
    print(f"latency per chunk: median {lat['median']:.3f} ms, p99 {lat['p99']:.3f} ms, max {lat['max']:.3f} ms; "
          f"real-time factor {report['real_time_factor']:.4f}; keeps up: {report['keeps_up']}")  # fmt: skip
    print(f"{report['log_mel_frames']} log-mel frames, speech in {100 * report['speech_fraction']:.0f}% of the "
          f"chunks; streamed vs offline: {report['max_abs_db_error_vs_offline']:.2e} dB")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["max_abs_db_error_vs_offline"] < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
