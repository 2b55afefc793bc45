"""``python -m pygpukit transcribe FILE... [--model M] [--output txt|srt|vtt|json]``: speech to text with
Whisper (pygpukit.asr). Transcripts go to stdout, or with ``--output-dir`` to one file per input named
after it; a progress bar (seconds of audio) goes to stderr."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pygpukit.core.errors import PyGPUkitError

from .longform import DEFAULT_TEMPERATURES, Segment, TranscriptionResult

__all__ = ["format_result", "main"]

FORMATS = ("txt", "srt", "vtt", "json")


def _stamp(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def format_result(result: TranscriptionResult, fmt: str) -> str:
    """The transcript as plain text (one segment a line), SubRip, WebVTT or JSON."""
    segments: list[Segment] = result.segments
    if fmt == "txt":
        return "".join(s.text.strip() + "\n" for s in segments)
    if fmt == "srt":
        return "\n".join(f"{i}\n{_stamp(s.start, ',')} --> {_stamp(s.end, ',')}\n{s.text.strip()}\n"
                         for i, s in enumerate(segments, 1))  # fmt: skip
    if fmt == "vtt":
        body = "".join(f"{_stamp(s.start, '.')} --> {_stamp(s.end, '.')}\n{s.text.strip()}\n\n" for s in segments)
        return "WEBVTT\n\n" + body
    if fmt == "json":
        return json.dumps(result.to_dict(), indent=1) + "\n"
    raise PyGPUkitError(f"unknown output format {fmt!r}; choose one of {', '.join(FORMATS)}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pygpukit transcribe", description="transcribe speech with Whisper")
    p.add_argument("files", nargs="+", metavar="FILE", help="audio files (any format soundfile reads)")
    p.add_argument("--model", default=None, help="registered name (default whisper-tiny.en) or model directory")
    p.add_argument("--output", "-o", choices=FORMATS, default="txt", help="transcript format (default txt)")
    p.add_argument("--output-dir", default=None, help="write FILE's transcript to DIR/<FILE stem>.<format>")
    p.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"),
                   help="compute dtype (default float16; the CPU simulation backend uses float32)")  # fmt: skip
    p.add_argument("--language", default=None, help="language code (multilingual models; default: detected)")
    p.add_argument("--task", default="transcribe", choices=("transcribe", "translate"))
    p.add_argument("--beam-size", type=int, default=5, help="beam size at temperature 0 (1: greedy)")
    p.add_argument("--temperature", type=float, nargs="+", default=list(DEFAULT_TEMPERATURES),
                   help="temperatures tried in order when a window fails the thresholds")  # fmt: skip
    p.add_argument("--initial-prompt", default=None, help="text that conditions the first window")
    p.add_argument("--word-timestamps", action="store_true", help="word start/end times (in the json output)")
    p.add_argument("--vad", action="store_true", help="transcribe only the stretches an energy VAD marks as speech")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "transcribe":
        args_list = args_list[1:]
    args = _parser().parse_args(args_list)
    from pygpukit.core.backend import BackendFallbackWarning, backend_state

    from .model import WhisperModel

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", BackendFallbackWarning)
            dtype = args.dtype if backend_state().name == "cuda" else "float32"
            model = WhisperModel.from_pretrained(args.model, dtype=dtype)
        for warning in caught:
            if issubclass(warning.category, BackendFallbackWarning):
                print(f"pygpukit: {warning.message}", file=sys.stderr)
        out_dir = Path(args.output_dir) if args.output_dir else None
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
        for name in args.files:
            result = _run(model, name, args)
            text = format_result(result, args.output)
            if out_dir is None:
                if len(args.files) > 1 and args.output in ("txt",):
                    sys.stdout.write(f"== {name}\n")
                sys.stdout.write(text)
                sys.stdout.flush()
            else:
                target = out_dir / f"{Path(name).stem}.{args.output}"
                target.write_text(text, encoding="utf-8")
                print(f"pygpukit: wrote {target}", file=sys.stderr)
    except PyGPUkitError as exc:
        print(f"pygpukit transcribe: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _run(model: Any, name: str, args: argparse.Namespace) -> TranscriptionResult:
    from .longform import transcribe

    return transcribe(model, name, language=args.language, task=args.task, temperature=tuple(args.temperature),
                      beam_size=args.beam_size, initial_prompt=args.initial_prompt, progress=not args.no_progress,
                      vad_filter=args.vad, word_timestamps=args.word_timestamps)  # fmt: skip
