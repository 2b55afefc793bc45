"""transcribe_batch: the recordings' windows encoded and greedily decoded in batches, step by step (each
row after its own prompt), everything else per recording as transcribe does; equal results to
transcribing one by one."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pygpukit.asr import batch, longform
from pygpukit.asr.decoding import DecodeResult
from pygpukit.core.errors import ArgumentError

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


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

    def __init__(self) -> None:
        self.encoded: list[tuple[int, ...]] = []

    def encode(self, window: Any) -> Any:
        self.encoded.append(window.shape)
        return window if window.ndim == 3 else window.reshape(1, *window.shape)


def test_batch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    batches: list[int] = []
    singles: list[float] = []

    def fake_batch(model: Any, enc: Any, prompts: list[list[int]], rules: Any, **kw: Any) -> list[DecodeResult]:
        batches.append(enc.shape[0])
        assert prompts == [[50360, 32, 104, 105, 50257]] * 3  # " hi", each row's
        assert kw["sot_index"] == [4] * 3
        # row 1 fails the log-probability threshold and falls back on its own
        return [DecodeResult([50363, 40 + r, 50413], -0.1, -2.0 if r == 1 else -0.1, 0.0, 0.0) for r in range(3)]

    def fake_window(model: Any, enc: Any, prompt: list[int], rules: Any, **kw: Any) -> DecodeResult:
        singles.append(kw["temperature"])
        return DecodeResult([50363, 99, 50413], -0.1, -0.2, 0.0, kw["temperature"])

    monkeypatch.setattr(batch, "decode_batch", fake_batch)
    monkeypatch.setattr(longform, "decode_window", fake_window)
    model = _Model()
    audios = [np.zeros(16000 * n, np.float32) for n in (2, 3, 4)]
    results = batch.transcribe_batch(model, audios, beam_size=1, temperature=(0.0, 0.4), initial_prompt="hi")
    assert batches == [3]
    assert model.encoded == [(3, 80, 3000)]
    assert singles == [0.4]  # only the failing row decodes again, at the next temperature
    assert [r.text for r in results] == ["40", "99", "42"]
    assert [r.duration for r in results] == [2.0, 3.0, 4.0]
    with pytest.raises(ArgumentError, match="batch_size"):
        batch.transcribe_batch(model, audios, batch_size=0)


def test_beam_search_encodes_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "decode_batch", lambda *a, **k: pytest.fail("beam search must not batch-decode"))
    monkeypatch.setattr(
        longform, "decode_window", lambda *a, **k: DecodeResult([50363, 7, 50413], -0.1, -0.1, 0.0, 0.0)
    )
    model = _Model()
    results = batch.transcribe_batch(model, [np.zeros(16000, np.float32)] * 3, batch_size=2, beam_size=5)
    assert model.encoded == [(2, 80, 3000), (1, 80, 3000)]
    assert [r.text for r in results] == ["7"] * 3


def test_features_computed_once_per_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    """transcribe_batch hands each recording's features to its transcription: the log-mel front end runs
    once, for the whole group in one batch, and a recording longer than 30 s gets its later windows from
    those features, encoded and decoded in the batch of that step (here alone: the other one is done),
    after a prompt of its own first window's text."""
    calls: list[list[int]] = []
    from pygpukit.asr.features import log_mel_batch
    from pygpukit.asr.features import log_mel_spectrogram as real

    def counted(signals: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append([int(s.shape[-1]) for s in signals])
        return log_mel_batch(signals, *args, **kwargs)

    monkeypatch.setattr(batch, "log_mel_batch", counted)
    monkeypatch.setattr(longform, "log_mel_spectrogram", lambda *a, **k: pytest.fail("features computed twice"))
    windows: list[float] = []
    prompts_seen: list[list[list[int]]] = []

    def fake_batch(model: Any, enc: Any, prompts: list[list[int]], *a: Any, **k: Any) -> list[DecodeResult]:
        prompts_seen.append(prompts)
        if enc.shape[0] == 1:
            windows.append(float(np.asarray(enc.to_numpy(), np.float64).mean()))
        return [DecodeResult([50363, 40 + r + 36 * (enc.shape[0] == 1), 50413], -0.1, -0.1, 0.0, 0.0)
                for r in range(enc.shape[0])]  # fmt: skip

    monkeypatch.setattr(batch, "decode_batch", fake_batch)
    monkeypatch.setattr(longform, "decode_window", lambda *a, **k: pytest.fail("a window decoded alone"))
    model = _Model()
    rng = np.random.default_rng(3)
    audios = [rng.standard_normal(16000 * n).astype(np.float32) * 0.1 for n in (2, 35)]
    results = batch.transcribe_batch(model, audios, beam_size=1, temperature=0.0)
    assert calls == [[32000, 560000]]
    assert [r.text for r in results] == ["40", "4176"]  # the 35 s recording: a second window
    assert model.encoded == [(2, 80, 3000), (1, 80, 3000)]
    assert prompts_seen == [[[50257]] * 2, [[50360, 50363, 41, 50413, 50257]]]  # after the first window's text
    # its second window (frames 3000..3500, zero-padded to 3000) is cut from the features computed in the batch
    full = np.asarray(real(audios[1], 80, padding=160).to_numpy(), np.float64)
    assert windows == [pytest.approx(full[:, 3000:3500].sum() / (80 * 3000), rel=1e-6)]


@pytest.mark.slow
@pytest.mark.audio_data
def test_batch_equals_one_by_one(whisper_tiny: Path, speech_16k: list[Path]) -> None:
    from pygpukit.asr import WhisperModel, transcribe_batch

    model = WhisperModel.from_pretrained(whisper_tiny)
    root = next(p for p in speech_16k if p.name == "001.wav").parent.parent
    keys = ["cards/001.wav", "cards/004.wav", "librivox/sense_and_sensibility_01_austen_64kb-0930.wav"]
    reference = ref.load_reference()["clips"]
    results = transcribe_batch(model, [root / k for k in keys], beam_size=1, temperature=0.0, word_timestamps=True)
    for key, result in zip(keys, results, strict=True):
        expected = reference[key]["greedy_words"]
        assert result.text == expected["text"]
        for ours, theirs in zip(result.segments, expected["segments"], strict=True):
            assert abs(ours.start - theirs["start"]) <= 0.02
            assert abs(ours.end - theirs["end"]) <= 0.02
            assert [w.word for w in ours.words or ()] == [w[0] for w in theirs["words"]]


@pytest.mark.slow
@pytest.mark.audio_data
def test_later_windows_batched_after_their_own_prompts(whisper_tiny: Path, speech_16k: list[Path]) -> None:
    """Two recordings of 34 s (the ten clips in two orders): each has a second window, decoded in one batch
    after a different prompt per row (its first window's text), through the graph decoder's per-row start
    (recorded and replayed on the CPU backend): the same segments, tokens and log-probabilities as each
    recording transcribed alone."""
    import soundfile as sf

    from pygpukit.asr import WhisperModel, transcribe, transcribe_batch

    model = WhisperModel.from_pretrained(whisper_tiny)
    root = next(p for p in speech_16k if p.name == "001.wav").parent.parent
    clips = [
        sf.read(c, dtype="float32")[0] for c in sorted(root.glob("cards/*.wav")) + sorted(root.glob("librivox/*.wav"))
    ]
    audios = [np.concatenate(clips[5:] + clips[:5]), np.concatenate(clips[::-1])]
    model.graph_decode = True
    try:
        alone = [transcribe(model, a, beam_size=1, temperature=0.0) for a in audios]
        batched = transcribe_batch(model, audios, beam_size=1, temperature=0.0)
    finally:
        model.graph_decode = None
    for ours, theirs in zip(batched, alone, strict=True):
        assert len({s.seek for s in theirs.segments}) == 2, "two windows"
        assert ours.text == theirs.text
        assert [s.tokens for s in ours.segments] == [s.tokens for s in theirs.segments]
        assert [(s.start, s.end) for s in ours.segments] == [(s.start, s.end) for s in theirs.segments]
        for a, b in zip(ours.segments, theirs.segments, strict=True):
            assert a.avg_logprob == pytest.approx(b.avg_logprob, rel=1e-6, abs=1e-7)


@pytest.mark.gpu
@pytest.mark.audio_data
def test_gpu_batch_graph_equals_eager_and_single(whisper_tiny: Path, speech_16k: list[Path]) -> None:
    """On the GPU, float32: the batch-16 graph decode gives what the eager batch loop and what transcribing
    each clip alone give (tokens, log-probabilities, no-speech probabilities); the timings are printed."""
    import time

    from pygpukit.asr import WhisperModel, transcribe, transcribe_batch

    model = WhisperModel.from_pretrained(whisper_tiny, dtype="float32")
    root = next(p for p in speech_16k if p.name == "001.wav").parent.parent
    clips = sorted(root.glob("cards/*.wav")) + sorted(root.glob("librivox/*.wav"))
    files = (clips + clips[:6])[:16]
    runs: dict[str, Any] = {}
    times: dict[str, float] = {}
    try:
        for name, flag, batched in (("eager", False, True), ("graph", True, True), ("single", True, False)):
            model.graph_decode = flag

            def go(b: bool = batched) -> Any:
                if b:
                    return transcribe_batch(model, files, beam_size=1, temperature=0.0, batch_size=16)
                return [transcribe(model, f, beam_size=1, temperature=0.0) for f in files]

            go()  # warm-up: kernels, plans, the captured step of this batch size
            start = time.perf_counter()
            runs[name] = go()
            times[name] = time.perf_counter() - start
    finally:
        model.graph_decode = None
    print(f"16 files: one by one {times['single']:.3f} s, batch 16 graph {times['graph']:.3f} s "
          f"({times['single'] / times['graph']:.2f}x), batch 16 eager {times['eager']:.3f} s")  # fmt: skip
    for other in ("eager", "single"):
        for ours, theirs in zip(runs["graph"], runs[other], strict=True):
            assert ours.text == theirs.text
            assert [s.tokens for s in ours.segments] == [s.tokens for s in theirs.segments]
            for a, b in zip(ours.segments, theirs.segments, strict=True):
                assert a.avg_logprob == pytest.approx(b.avg_logprob, rel=1e-5, abs=1e-6)
                # The first step's logits come from GEMMs of another batch size (16 rows against 1) or
                # another path (the eager loop's host softmax): on the H100 the no-speech probabilities
                # were 1.5e-5 apart (relative) for both, with equal tokens and texts.
                assert a.no_speech_prob == pytest.approx(b.no_speech_prob, rel=1e-4, abs=1e-7)
    assert len({r.text for r in runs["graph"]}) == 10, "the ten clips decode to ten different texts"
