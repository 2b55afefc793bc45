"""pygpukit.asr on the CUDA backend: the front end, real tiny.en logits per dtype against the float64 NumPy
reference, and greedy transcription of every pocketsphinx-testdata clip against faster-whisper's stored
output (text identical in float32; word error rate no worse in float16). Every test needs a GPU."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

TRANSCRIPTS = json.loads((Path(__file__).parent / "data" / "pocketsphinx_transcripts.json").read_text())
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 8e-2}


def _rel(ours: Any, expected: Any) -> float:
    return float(np.max(np.abs(np.asarray(ours, np.float64) - expected)) / np.max(np.abs(expected)))


def _root(speech_16k: list[Path]) -> Path:
    return next(p for p in speech_16k if p.name == "001.wav").parent.parent


@pytest.mark.audio_data
@pytest.mark.parametrize("n_mels", [80, 128])
def test_gpu_features(speech_16k: list[Path], n_mels: int) -> None:
    import soundfile as sf

    from pygpukit.asr import whisper_features

    audio, _ = sf.read(_root(speech_16k) / "cards/005.wav", dtype="float32")
    np.testing.assert_allclose(whisper_features(audio, n_mels).to_numpy(), ref.features(audio, n_mels), atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_random_config(dtype: str) -> None:
    from pygpukit.asr import WhisperConfig, WhisperModel

    cfg = WhisperConfig(n_mels=128, n_audio_ctx=64, d_model=256, encoder_layers=2, encoder_heads=4, n_vocab=300,
                        n_text_ctx=32, decoder_layers=2, decoder_heads=4)  # fmt: skip
    weights = ref.random_weights(cfg, seed=11)
    rng = np.random.default_rng(12)
    mel = rng.standard_normal((128, 128)).astype(np.float32)
    tokens = rng.integers(0, 300, 20)
    logits = WhisperModel(cfg, weights, dtype=dtype).forward(mel, tokens).to_numpy()[0]
    assert _rel(logits, ref.forward(weights, cfg, mel, tokens)) <= TOLERANCE[dtype]


@pytest.mark.audio_data
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_tiny_en_logits(whisper_tiny: Path, speech_16k: list[Path], dtype: str) -> None:
    import soundfile as sf

    from pygpukit.asr import WhisperModel, whisper_features
    from pygpukit.asr.weights import load_ct2

    config, weights = load_ct2(whisper_tiny)
    audio, _ = sf.read(_root(speech_16k) / "librivox/sense_and_sensibility_01_austen_64kb-0870.wav", dtype="float32")
    mel = whisper_features(audio).to_numpy()
    tokens = np.array([50257, 50363, 843, 1770, 13, 1757, 16189, 3822])
    expected = ref.forward(weights, config, mel, tokens)
    model = WhisperModel(config, weights, dtype=dtype)
    assert _rel(model.forward(mel, tokens).to_numpy()[0], expected) <= TOLERANCE[dtype]


@pytest.mark.audio_data
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_transcribe_all_clips(whisper_tiny: Path, speech_16k: list[Path], dtype: str) -> None:
    from pygpukit.asr import WhisperModel, transcribe

    model = WhisperModel.from_pretrained(whisper_tiny, dtype=dtype)
    reference = ref.load_reference()["clips"]
    ours_edits = theirs_edits = 0
    differing = []
    start = time.perf_counter()
    for key, transcript in TRANSCRIPTS.items():
        if key == "source":
            continue
        expected = reference[key]["greedy"]
        result = transcribe(model, _root(speech_16k) / key, beam_size=1, temperature=0.0)
        if result.text != expected["text"]:
            differing.append((key, result.text, expected["text"]))
        for ours, theirs in zip(result.segments, expected["segments"], strict=False):
            assert abs(ours.start - theirs["start"]) <= 0.5
            assert abs(ours.end - theirs["end"]) <= 0.5
        ours_edits += ref.wer(transcript, result.text)[0]
        theirs_edits += ref.wer(transcript, expected["text"])[0]
    print(f"{dtype}: {time.perf_counter() - start:.2f} s for 10 clips; edits ours {ours_edits}, faster-whisper "
          f"{theirs_edits}; differing texts {differing}")  # fmt: skip
    if dtype == "float32":
        assert differing == []
    assert ours_edits <= theirs_edits


@pytest.mark.audio_data
def test_gpu_beam_search(whisper_tiny: Path, speech_16k: list[Path]) -> None:
    from pygpukit.asr import WhisperModel, transcribe

    model = WhisperModel.from_pretrained(whisper_tiny, dtype="float32")
    reference = ref.load_reference()["clips"]
    for key in [k for k in TRANSCRIPTS if k != "source"]:
        result = transcribe(model, _root(speech_16k) / key, beam_size=5, temperature=0.0)
        assert result.text == reference[key]["beam5"]["text"], key


@pytest.mark.audio_data
def test_gpu_word_timestamps(whisper_tiny: Path, speech_16k: list[Path]) -> None:
    from pygpukit.asr import WhisperModel, transcribe

    model = WhisperModel.from_pretrained(whisper_tiny, dtype="float32")
    reference = ref.load_reference()["clips"]
    worst = 0.0
    for key in [k for k in TRANSCRIPTS if k != "source"]:
        expected = reference[key]["greedy_words"]
        result = transcribe(model, _root(speech_16k) / key, beam_size=1, temperature=0.0, word_timestamps=True)
        ours = [(w.word, w.start, w.end) for s in result.segments for w in s.words or ()]
        theirs = [(w[0], w[1], w[2]) for s in expected["segments"] for w in s["words"]]
        assert [w[0] for w in ours] == [w[0] for w in theirs], key
        worst = max([worst] + [max(abs(a[1] - b[1]), abs(a[2] - b[2])) for a, b in zip(ours, theirs, strict=True)])
    print(f"word timestamps: largest difference from faster-whisper {worst:.3f} s")
    assert worst <= 0.1
