"""``python -m pygpukit speak TEXT -o out.wav [--voice V] [--phonemes] [--speed S]``: text to speech with
Kokoro-82M (pygpukit.tts). The audio is written sentence by sentence as it is synthesized; progress goes to
stderr. TEXT ``-`` reads standard input."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
import wave
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pygpukit.core.errors import ArgumentError, PyGPUkitError

__all__ = ["main", "write_wav"]


def _pcm16(audio: Any) -> bytes:
    samples = np.clip(np.asarray(audio, np.float64).reshape(-1), -1.0, 1.0)
    return np.rint(samples * 32767.0).astype("<i2").tobytes()


def write_wav(path: str | Path, chunks: Iterable[Any], sample_rate: int = 24000) -> float:
    """Write mono 16-bit PCM from float chunks (each (T,) in [-1, 1]) to ``path``; returns the seconds written."""
    samples = 0
    try:
        handle = open(path, "wb")  # noqa: SIM115 (wave closes it; opened first so a bad path fails here)
    except OSError as exc:
        raise ArgumentError(f"speak: cannot write {str(path)!r}: {exc}") from exc
    try:
        with handle, wave.open(handle, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(int(sample_rate))
            for chunk in chunks:
                data = _pcm16(chunk)
                out.writeframes(data)
                samples += len(data) // 2
    except OSError as exc:
        raise ArgumentError(f"speak: cannot write {str(path)!r}: {exc}") from exc
    return samples / float(sample_rate)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pygpukit speak", description="text to speech with Kokoro-82M")
    p.add_argument("text", help="Japanese text, or phonemes with --phonemes; - reads standard input")
    p.add_argument("-o", "--output", required=True, help="WAV file to write (24 kHz, mono, 16-bit)")
    p.add_argument("--voice", default="jf_alpha", help="voice name, or a mix such as jf_alpha:0.7,jm_kumo:0.3")
    p.add_argument("--phonemes", action="store_true", help="TEXT is phonemes (misaki's alphabet), no G2P")
    p.add_argument("--speed", type=float, default=1.0, help="speaking rate (default 1.0)")
    p.add_argument("--model", default=None, help="model folder (default: fetched into the cache)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                   help="compute dtype (default float32; the CPU simulation backend uses float32)")  # fmt: skip
    p.add_argument("--list-voices", action="store_true", help="print the voices and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "speak":
        args_list = args_list[1:]
    if "--list-voices" in args_list:  # no text or output needed
        args_list = [a for a in args_list if a != "--list-voices"] + ["-", "-o", "-", "--list-voices"]
    args = _parser().parse_args(args_list)
    from pygpukit.core.backend import BackendFallbackWarning, backend_state

    from .kokoro_model import KokoroModel, split_sentences

    def say(message: str) -> None:
        if not args.no_progress:
            print(f"pygpukit speak: {message}", file=sys.stderr, flush=True)

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", BackendFallbackWarning)
            dtype = args.dtype if backend_state().name == "cuda" else "float32"
            start = time.perf_counter()
            model = KokoroModel.from_pretrained(args.model, dtype=dtype)
        for warning in caught:
            if issubclass(warning.category, BackendFallbackWarning):
                print(f"pygpukit: {warning.message}", file=sys.stderr)
        if args.list_voices:
            print("\n".join(model.voices()))
            return 0
        text = sys.stdin.read() if args.text == "-" else args.text
        voice = model._voice_table(args.voice)  # checks the name or mix before any synthesis
        sentences = len(split_sentences(text))
        say(f"model loaded in {time.perf_counter() - start:.1f} s; {sentences} sentence(s), voice {args.voice}")
        start = time.perf_counter()

        def progress() -> Iterable[Any]:
            for i, audio in enumerate(model.generate_stream(text, voice, args.speed, phonemes=args.phonemes), 1):
                say(f"sentence {i}/{sentences}: {audio.size / model.sample_rate:.2f} s of audio "
                    f"({time.perf_counter() - start:.1f} s elapsed)")  # fmt: skip
                yield audio

        seconds = write_wav(args.output, progress(), model.sample_rate)
        if seconds == 0:
            raise ArgumentError(f"speak: {text!r} has no phonemes Kokoro knows")
        say(f"wrote {args.output} ({seconds:.2f} s)")
    except PyGPUkitError as exc:
        print(f"pygpukit speak: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
