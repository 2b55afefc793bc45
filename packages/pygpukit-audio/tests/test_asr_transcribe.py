"""Transcription: the token rules, segment splitting, temperature fallback and prompts (unit tests), and
real speech (pocketsphinx-testdata) against faster-whisper's output stored in data/whisper_reference.json
(made by ci/whisper_reference.py: faster-whisper 1.2.1, CTranslate2 4.8.5, CPU float32, same model):
greedy text identical, segment timestamps within 0.5 s, word error rate no worse."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pygpukit.asr import longform as tr
from pygpukit.asr.decoding import DecodeResult, TokenRules

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

EOT, NO_TS, TSB, VOCAB = 10, 12, 13, 20
RULES = TokenRules(eot=EOT, no_timestamps=NO_TS, timestamp_begin=TSB, vocab_size=VOCAB, suppress=(3,),
                   suppress_blank=(4, EOT), max_initial_timestamp_index=2)  # fmt: skip
CI_CLIPS = ["cards/001.wav", "librivox/sense_and_sensibility_01_austen_64kb-0880.wav"]
TRANSCRIPTS = json.loads((Path(__file__).parent / "data" / "pocketsphinx_transcripts.json").read_text())


def _masked(seq: list[int], step: int, logits: np.ndarray | None = None) -> np.ndarray:
    values = np.zeros((1, VOCAB)) if logits is None else logits[None].copy()
    return np.isinf(RULES.apply(values, [seq], step)[0])


def test_token_rules() -> None:
    first = _masked([], 0)
    assert first[:TSB].all()
    assert not first[TSB : TSB + 3].any()
    assert first[TSB + 3 :].all()
    after_pair = _masked([TSB, 5, TSB + 2, TSB + 2], 4)
    assert after_pair[TSB:].all()
    assert not after_pair[5]
    assert after_pair[3]
    assert after_pair[NO_TS]
    logits = np.zeros(VOCAB)
    logits[5] = logits[EOT] = 5.0
    after_text_end = _masked([TSB + 1, 5, TSB + 4], 3, logits)
    assert after_text_end[:EOT].all()
    assert not after_text_end[EOT]
    assert after_text_end[TSB : TSB + 4].all()
    assert not after_text_end[TSB + 4 :].any()
    after_text = _masked([TSB + 3, 5], 2, logits)
    # CTranslate2's rule: when the remaining timestamps outweigh every other token, EOT is masked too
    assert _masked([TSB + 1, 5, TSB + 4], 3)[:TSB].all()
    assert after_text[TSB : TSB + 4].all()
    assert not after_text[TSB + 4 :].any()
    assert not after_text[5]
    # timestamps together more likely than any text token: text is suppressed
    logits = np.zeros(VOCAB)
    logits[5] = 1.0
    assert _masked([TSB, 5], 2, logits)[:TSB].all()


def test_split_segments() -> None:
    tokens = [TSB, 1, 2, TSB + 50, TSB + 50, 3, TSB + 100]
    segments, seek = tr._split(tokens, TSB, 1.0, 3000, 30.0, 100)
    assert [(s["start"], s["end"]) for s in segments] == [(1.0, 2.0), (2.0, 3.0)]
    assert seek == 3100
    segments, seek = tr._split([TSB, 1, TSB + 50, TSB + 50, 2], TSB, 0.0, 3000, 30.0, 0)
    assert len(segments) == 1
    assert seek == 100
    segments, seek = tr._split([1, 2], TSB, 0.0, 1200, 12.0, 0)
    assert segments[0]["end"] == 12.0
    assert seek == 1200
    assert tr.compression_ratio("") == 0.0
    assert tr.compression_ratio("ab" * 200) > 2.4


class _Tok:
    multilingual = False
    eot, sot, sot_prev, no_timestamps, no_speech, timestamp_begin = 50256, 50257, 50360, 50362, 50361, 50363

    def decode(self, tokens: Any) -> str:
        return " ".join(str(t) for t in tokens if t < self.eot)

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def sot_sequence(self, language: Any, task: Any) -> list[int]:
        return [self.sot]

    def suppressed_tokens(self, tokens: Any) -> tuple[int, ...]:
        return ()


class _Model:
    class config:  # noqa: N801
        n_mels, n_vocab, n_text_ctx = 80, 51864, 448

    tokenizer = _Tok()

    def encode(self, window: Any) -> Any:
        assert window.shape == (80, 3000)
        return window


def test_fallback_and_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[int], float]] = []
    plans = {0.0: -2.0, 0.5: -0.5}  # temperature -> average log-probability

    def fake(model: Any, enc: Any, prompt: list[int], rules: Any, **kw: Any) -> DecodeResult:
        calls.append((prompt, kw["temperature"]))
        return DecodeResult([50363, 40, 41, 50413], -1.0, plans[kw["temperature"]], 0.1, kw["temperature"])

    monkeypatch.setattr(tr, "decode_window", fake)
    result = tr.transcribe(_Model(), np.zeros(16000 * 40, np.float32), temperature=(0.0, 0.5), initial_prompt="hi")
    # window 1 falls back to 0.5 (log-prob -2 < -1); its temperature > 0.5? no: the prompt keeps the text
    assert [t for _, t in calls] == [0.0, 0.5, 0.0, 0.5]
    assert calls[0][0] == [50360, ord(" "), ord("h"), ord("i"), 50257]
    assert calls[2][0] == [*calls[0][0][:-1], 50363, 40, 41, 50413, 50257]  # previous text, timestamps kept
    assert [(s.start, s.end, s.temperature) for s in result.segments] == [(0.0, 1.0, 0.5), (30.0, 31.0, 0.5)]
    assert result.text == "40 4140 41"
    assert result.duration == 40.0
    calls.clear()
    plans[0.0] = -3.0  # every temperature fails: the best average log-probability wins
    plans[0.5] = -2.5
    result = tr.transcribe(_Model(), np.zeros(16000 * 5, np.float32), temperature=(0.0, 0.5))
    assert result.segments[0].avg_logprob == -2.5
    assert result.segments[0].temperature == 0.5


def test_no_speech_skips_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tr, "decode_window", lambda *a, **k: DecodeResult([50363, 40, 50413], -5.0, -2.0, 0.9, 0.0))
    result = tr.transcribe(_Model(), np.zeros(16000 * 3, np.float32), temperature=0.0)
    assert result.segments == []
    assert result.text == ""


def _check_clip(model: Any, root: Path, key: str, expected: dict[str, Any]) -> tuple[str, list[tr.Segment]]:
    result = tr.transcribe(model, root / key, beam_size=1, temperature=0.0)
    assert result.text == expected["text"], key
    assert len(result.segments) == len(expected["segments"])
    for ours, theirs in zip(result.segments, expected["segments"], strict=True):
        assert abs(ours.start - theirs["start"]) <= 0.5
        assert abs(ours.end - theirs["end"]) <= 0.5
        assert ours.text == theirs["text"]
    return result.text, result.segments


@pytest.fixture(scope="module")
def tiny_model(whisper_tiny: Path) -> Any:
    from pygpukit.asr import WhisperModel

    return WhisperModel.from_pretrained(whisper_tiny)


def _root(speech_16k: list[Path]) -> Path:
    return next(p for p in speech_16k if p.name == "001.wav").parent.parent


@pytest.mark.audio_data
@pytest.mark.parametrize("key", CI_CLIPS)
def test_greedy_matches_faster_whisper(tiny_model: Any, speech_16k: list[Path], key: str) -> None:
    _check_clip(tiny_model, _root(speech_16k), key, ref.load_reference()["clips"][key]["greedy"])


@pytest.mark.slow
@pytest.mark.audio_data
def test_all_clips_word_error_rate(tiny_model: Any, speech_16k: list[Path]) -> None:
    reference = ref.load_reference()["clips"]
    ours_edits = theirs_edits = words = 0
    for key, transcript in TRANSCRIPTS.items():
        if key == "source":
            continue
        text, _ = _check_clip(tiny_model, _root(speech_16k), key, reference[key]["greedy"])
        edits, n = ref.wer(transcript, text)
        fw_edits, _ = ref.wer(transcript, reference[key]["greedy"]["text"])
        assert edits <= fw_edits, key
        ours_edits, theirs_edits, words = ours_edits + edits, theirs_edits + fw_edits, words + n
    assert ours_edits <= theirs_edits
    assert ours_edits / words < 0.25


@pytest.mark.slow
@pytest.mark.audio_data
def test_beam_search_matches_faster_whisper(tiny_model: Any, speech_16k: list[Path]) -> None:
    root, reference = _root(speech_16k), ref.load_reference()["clips"]
    for key in ("cards/005.wav", "librivox/sense_and_sensibility_01_austen_64kb-0930.wav"):
        result = tr.transcribe(tiny_model, root / key, beam_size=5, temperature=0.0)
        assert result.text == reference[key]["beam5"]["text"], key


@pytest.mark.slow
@pytest.mark.audio_data
def test_long_form_concatenation(tiny_model: Any, speech_16k: list[Path]) -> None:
    import soundfile as sf

    root = _root(speech_16k)
    keys = [k for k in TRANSCRIPTS if k != "source"]
    audio = np.concatenate([sf.read(root / k, dtype="float32")[0] for k in sorted(keys, key=lambda k: (k[0], k))])
    expected = ref.load_reference()["clips"]["concat/all.wav"]["greedy"]
    result = tr.transcribe(tiny_model, audio, beam_size=1, temperature=0.0)
    assert len(result.segments) == len(expected["segments"])
    assert result.segments[-1].start > 30.0
    for ours, theirs in zip(result.segments, expected["segments"], strict=True):
        assert abs(ours.start - theirs["start"]) <= 0.5
        assert abs(ours.end - theirs["end"]) <= 0.5
    assert result.text == expected["text"]


def test_speech_map_and_chunks() -> None:
    from pygpukit.asr.speech import SpeechMap, VadOptions, speech_chunks
    from pygpukit.core.array import asarray
    from pygpukit.core.errors import ArgumentError

    m = SpeechMap([(16000, 32000), (80000, 96000)])  # 1-2 s and 5-6 s of the recording
    assert (m.original(0.0), m.original(0.5), m.original(1.0), m.original(1.5)) == (1.0, 1.5, 5.0, 5.5)
    assert m.original(1.0, is_end=True) == 2.0
    rng = np.random.default_rng(9)
    signal = np.zeros(16000 * 10, np.float32)
    signal[16000 * 2 : 16000 * 3] = rng.standard_normal(16000) * 0.3
    signal[16000 * 7 : 16000 * 8] = rng.standard_normal(16000) * 0.3
    chunks = speech_chunks(asarray(signal), VadOptions(speech_pad=0.2, min_silence_duration=1.0))
    assert len(chunks) == 2
    for (lo, hi), start in zip(chunks, (2, 7), strict=True):
        assert abs(lo / 16000 - (start - 0.2)) < 0.03
        assert abs(hi / 16000 - (start + 1.2)) < 0.03
    assert speech_chunks(asarray(signal), VadOptions(min_silence_duration=5.0))[0][1] > 16000 * 8
    with pytest.raises(ArgumentError, match="unknown keys"):
        VadOptions.of({"threshold": 0.5})


def test_vad_filter_maps_timestamps(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths: list[int] = []

    def fake(model: Any, enc: Any, prompt: list[int], rules: Any, **kw: Any) -> DecodeResult:
        return DecodeResult([50363, 40, 50413, 50418, 41, 50463], -0.1, -0.1, 0.0, 0.0)  # 0-1 s, 1.1-2 s

    monkeypatch.setattr(tr, "decode_window", fake)
    real_features = tr.log_mel_spectrogram
    monkeypatch.setattr(tr, "log_mel_spectrogram", lambda s, n, padding: lengths.append(s.shape[0]) or
                        real_features(s, n, padding=padding))  # fmt: skip
    signal = np.zeros(16000 * 20, np.float32)
    signal[16000 * 5 : 16000 * 6] = np.random.default_rng(1).standard_normal(16000) * 0.3
    signal[16000 * 12 : 16000 * 13] = np.random.default_rng(2).standard_normal(16000) * 0.3
    result = tr.transcribe(_Model(), signal, temperature=0.0, vad_filter=True,
                           vad_options={"speech_pad": 0.0, "min_silence_duration": 1.0})  # fmt: skip
    assert lengths
    assert abs(lengths[0] - 32000) < 1500
    assert [(round(s.start), round(s.end)) for s in result.segments] == [(5, 6), (12, 13)]
    assert result.duration == 20.0
    silent = tr.transcribe(_Model(), np.zeros(16000, np.float32), vad_filter=True)
    assert silent.segments == []
    assert silent.duration == 1.0


@pytest.mark.slow
@pytest.mark.audio_data
def test_vad_on_real_speech(tiny_model: Any, speech_16k: list[Path]) -> None:
    import soundfile as sf

    root = _root(speech_16k)
    first, _ = sf.read(root / "cards/001.wav", dtype="float32")
    second, _ = sf.read(root / "cards/003.wav", dtype="float32")
    quiet = np.random.default_rng(0).standard_normal(16000 * 12).astype(np.float32) * 1e-4
    audio = np.concatenate([quiet, first, quiet, second, quiet[: 16000 * 3]])
    result = tr.transcribe(tiny_model, audio, beam_size=1, temperature=0.0, vad_filter=True)
    assert "10 of clubs" in result.text
    assert "7 of clubs" in result.text
    assert abs(result.segments[0].start - 12.0) <= 1.0
    assert abs(result.segments[-1].start - (24.0 + len(first) / 16000)) <= 1.0
