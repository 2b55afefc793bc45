"""``python -m pygpukit transcribe``: the output formats, the dispatch from pygpukit's command line, files
written with --output-dir, and typed errors turned into exit status 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pygpukit.__main__ import main as pygpukit_main
from pygpukit.asr import cli, longform
from pygpukit.asr.longform import Segment, TranscriptionResult

RESULT = TranscriptionResult(" Hello there. General Kenobi.", [
    Segment(1, 0, 0.0, 1.5, " Hello there.", [1, 2], 0.0, -0.2, 1.1, 0.01),
    Segment(2, 0, 3661.25, 3662.0, " General Kenobi.", [3], 0.0, -0.3, 1.0, 0.02),
], "en", 3662.0)  # fmt: skip


def test_formats() -> None:
    assert cli.format_result(RESULT, "txt") == "Hello there.\nGeneral Kenobi.\n"
    assert cli.format_result(RESULT, "srt") == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n2\n01:01:01,250 --> 01:01:02,000\nGeneral Kenobi.\n"
    )
    assert cli.format_result(RESULT, "vtt") == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n01:01:01.250 --> 01:01:02.000\nGeneral Kenobi.\n\n"
    )
    data = json.loads(cli.format_result(RESULT, "json"))
    assert data["text"] == RESULT.text
    assert data["segments"][1]["start"] == 3661.25
    with pytest.raises(Exception, match="unknown output format 'doc'"):
        cli.format_result(RESULT, "doc")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []

    def transcribe(model: Any, audio: Any, **kwargs: Any) -> TranscriptionResult:
        if not Path(audio).exists():
            from pygpukit.audio.io import AudioFileError

            raise AudioFileError(f"load: no such audio file: {audio!r}", path=str(audio))
        calls.append((str(audio), kwargs))
        return RESULT

    monkeypatch.setattr(longform, "transcribe", transcribe)
    from pygpukit.asr import model as model_module

    monkeypatch.setattr(model_module.WhisperModel, "from_pretrained", classmethod(lambda cls, *a, **k: object()))
    return calls


def test_dispatch_and_options(fake: list[tuple[str, dict[str, Any]]], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    audio = tmp_path / "talk.wav"
    audio.write_bytes(b"")
    options = ["--beam-size", "1", "--temperature", "0", "--initial-prompt", "Star Wars", "--no-progress", "--vad",
               "--word-timestamps"]  # fmt: skip
    status = pygpukit_main(["transcribe", str(audio), "--output", "vtt", *options])
    assert status == 0
    assert capsys.readouterr().out.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.")
    ((name, kwargs),) = fake
    assert name == str(audio)
    assert kwargs["beam_size"] == 1
    assert kwargs["temperature"] == (0.0,)
    assert kwargs["initial_prompt"] == "Star Wars"
    assert kwargs["progress"] is False
    assert kwargs["vad_filter"] is True
    assert kwargs["word_timestamps"] is True
    out = tmp_path / "out"
    assert pygpukit_main(["transcribe", str(audio), "-o", "srt", "--output-dir", str(out), "--no-progress"]) == 0
    assert (out / "talk.srt").read_text().startswith("1\n00:00:00,000 --> 00:00:01,500\n")


def test_missing_file_is_exit_status_1(fake: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert pygpukit_main(["transcribe", str(tmp_path / "absent.wav"), "--no-progress"]) == 1
    assert "no such audio file" in capsys.readouterr().err


def test_bad_audio_is_a_typed_error(tmp_path: Path) -> None:
    from pygpukit.audio.io import AudioFileError
    from pygpukit.core.errors import ArgumentError

    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt ")
    with pytest.raises(AudioFileError):
        longform.load_audio(broken)
    with pytest.raises(ArgumentError, match=r"shape \(2, 3\)"):
        longform.load_audio(np.zeros((2, 3), np.float32))
