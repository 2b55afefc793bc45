"""Streaming transcription: buffering, partial and final segments, stream times and the conditioning
prompt (with a stand-in decoder), and a real stream of three clips (slow)."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pygpukit.asr import longform, streaming
from pygpukit.asr.longform import Segment, TranscriptionResult
from pygpukit.core.errors import ArgumentError

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


def test_partial_then_final(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[float, Any]] = []

    def fake(model: Any, audio: Any, **kw: Any) -> TranscriptionResult:
        duration = len(audio) / 16000
        calls.append((duration, kw["initial_prompt"]))
        # one segment per whole second of the buffer
        segs = [Segment(i + 1, 0, float(i), float(i + 1), f" s{i}", [100 + i], 0.0, -0.1, 1.0, 0.0)
                for i in range(int(duration))]  # fmt: skip
        return TranscriptionResult("".join(s.text for s in segs), segs)

    monkeypatch.setattr(longform, "transcribe", fake)
    stream = streaming.StreamingTranscriber(object(), chunk_length=2.0, overlap=1.0)
    assert stream.feed(np.zeros(16000, np.float32)) == []  # 1 s: no decode yet
    out = stream.feed(np.zeros(16000, np.float32))  # 2 s: decode; [0, 1) is final, [1, 2) partial
    assert [(s.start, s.end, s.final) for s in out] == [(0.0, 1.0, True), (1.0, 2.0, False)]
    out = stream.feed(np.zeros(2 * 16000, np.float32))  # buffer 1..4 s: decoded again with s0 as prompt
    assert calls[-1] == (3.0, [100])
    assert [(s.start, s.end, s.final) for s in out] == [(1.0, 2.0, True), (2.0, 3.0, True), (3.0, 4.0, False)]
    out = stream.finish()
    assert [(s.start, s.end, s.final) for s in out] == [(3.0, 4.0, True)]
    assert calls[-1][1] == [100, 100, 101]
    assert stream.finish() == []
    with pytest.raises(ArgumentError, match="chunk_length"):
        streaming.StreamingTranscriber(object(), chunk_length=0)
    with pytest.raises(ArgumentError, match="vad_filter"):
        streaming.StreamingTranscriber(object(), vad_filter=True)
    with pytest.raises(ArgumentError, match="1-D"):
        stream.feed(np.zeros((2, 2), np.float32))


@pytest.mark.slow
@pytest.mark.audio_data
def test_real_stream(whisper_tiny: Path, speech_16k: list[Path]) -> None:
    import soundfile as sf

    from pygpukit.asr import WhisperModel, transcribe_streaming

    root = next(p for p in speech_16k if p.name == "001.wav").parent.parent
    keys = ["cards/001.wav", "cards/003.wav", "librivox/sense_and_sensibility_01_austen_64kb-0930.wav"]
    gap = np.zeros(8000, np.float32)
    audio = np.concatenate([x for k in keys for x in (sf.read(root / k, dtype="float32")[0], gap)])
    model = WhisperModel.from_pretrained(whisper_tiny)
    pieces = (audio[i : i + 8000] for i in range(0, len(audio), 8000))
    segments = list(transcribe_streaming(model, pieces, chunk_length=4.0, overlap=1.0))
    finals = [s for s in segments if s.final]
    assert finals
    assert all(a.end <= b.start + 1e-6 for a, b in itertools.pairwise(finals))
    transcripts = json.loads((Path(__file__).parent / "data" / "pocketsphinx_transcripts.json").read_text())
    edits, words = ref.wer(" ".join(transcripts[k] for k in keys), " ".join(s.text for s in finals))
    assert edits / words <= 0.2, [s.text for s in finals]
