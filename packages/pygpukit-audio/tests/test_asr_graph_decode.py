"""Greedy decoding through the captured decode step (pygpukit.asr.graph_decode, token_step): the device
token rules against TokenRules.apply + argmax on random logits and random histories, graph decoding
against the eager loop (tokens identical, log-probability sums and no-speech probabilities equal) on a
random small Whisper, alone and batched, and on the real tiny.en with a real clip. The CPU backend runs
the captured step as recorded calls; the gpu-marked tests run the CUDA graph."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pygpukit.asr import graph_decode
from pygpukit.asr.decoding import TokenRules, decode_batch, decode_window
from pygpukit.asr.model import WhisperModel
from pygpukit.asr.token_step import greedy_rules_step, rules_arrays
from pygpukit.asr.weights import WhisperConfig
from pygpukit.core.array import from_numpy
from pygpukit.core.backend import current_backend
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

EOT, SOT, NO_SPEECH, NO_TS, TSB, VOCAB = 20, 21, 22, 23, 24, 40
CFG = WhisperConfig(n_mels=80, n_audio_ctx=10, d_model=128, encoder_layers=1, encoder_heads=2, n_vocab=VOCAB,
                    n_text_ctx=24, decoder_layers=2, decoder_heads=2)  # fmt: skip


def _rules(timestamps: bool, max_initial: int = 5) -> TokenRules:
    return TokenRules(eot=EOT, no_timestamps=NO_TS, timestamp_begin=TSB, vocab_size=VOCAB,
                      suppress=(SOT, NO_SPEECH, 3), suppress_blank=(5, EOT), timestamps=timestamps,
                      max_initial_timestamp_index=max_initial)  # fmt: skip


def _history(rng: np.random.Generator, length: int) -> list[int]:
    """A random history the rules could have produced: text and non-decreasing timestamps."""
    seq: list[int] = [TSB + int(rng.integers(0, 4))] if length else []
    while len(seq) < length:
        if rng.random() < 0.4:
            seq.append(min(VOCAB - 1, max(t for t in seq if t >= TSB) + int(rng.integers(0, 3))))
        else:
            seq.append(int(rng.integers(0, EOT)))
    return seq


def _state(seq: list[int], done: bool) -> list[int]:
    stamps = [t for t in seq if t >= TSB]
    last = seq[-1] if seq else -1
    return [len(seq), last, seq[-2] if len(seq) >= 2 else last, stamps[-1] if stamps else -1, int(done)]


@pytest.mark.parametrize("timestamps", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rules_step_equals_token_rules(timestamps: bool, dtype: str) -> None:
    rules = _rules(timestamps)
    suppress, blank, params = (from_numpy(a) for a in rules_arrays(rules))
    rng = np.random.default_rng(7)
    forced = 0
    # The CPU backend computes in float64 throughout; the kernel's exponentials are float32's expf (each
    # within 2 ulp, summed in float64): about 1e-8 on these log-probabilities (H100, 2026-12-07).
    lp_tol = 1e-12 if current_backend() == "cpu" else 1e-6
    for trial in range(40):
        rows = 6
        logits = from_numpy(rng.standard_normal((rows, VOCAB)).astype(np.float32) * 2).astype(dtype)
        values = logits.astype("float32").to_numpy().astype(np.float64)
        if trial % 3 == 0:
            values[:, TSB:] += 1.5  # timestamps together likelier than any text token, sometimes
            logits = from_numpy(values.astype(np.float32)).astype(dtype)
            values = logits.astype("float32").to_numpy().astype(np.float64)
        step = 0 if trial % 5 == 0 else int(rng.integers(1, 6))
        seqs = [_history(rng, step) for _ in range(rows)]
        done = [bool(r == 0 and step > 0) for r in range(rows)]
        state = from_numpy(np.array([_state(s, d) for s, d in zip(seqs, done, strict=True)], np.int32))
        sums = from_numpy(np.full(rows, -1.0))
        tokens = from_numpy(np.zeros(rows, np.int32))
        greedy_rules_step(logits, tokens, state, sums, suppress, blank, params)
        masked = rules.apply(values.copy(), seqs, step)
        top = masked.max(-1, keepdims=True)
        lp = masked - top - np.log(np.exp(masked - top).sum(-1, keepdims=True))
        expected = lp.argmax(-1)
        forced += int(np.sum((values.argmax(-1) < TSB) & (expected >= TSB)))
        got, new_state, new_sums = tokens.to_numpy(), state.to_numpy(), sums.to_numpy()
        for r in range(rows):
            if done[r]:
                assert got[r] == EOT
                assert list(new_state[r]) == _state(seqs[r], True)
                assert new_sums[r] == -1.0
                continue
            assert got[r] == expected[r], (trial, r, seqs[r])
            np.testing.assert_allclose(new_sums[r], -1.0 + lp[r, expected[r]], rtol=0, atol=lp_tol)
            after = seqs[r] if expected[r] == EOT else [*seqs[r], int(expected[r])]
            assert list(new_state[r]) == _state(after, expected[r] == EOT)
    if timestamps:
        assert forced > 0, "the timestamp-forcing rule was never exercised"


def test_rules_step_checks_arguments() -> None:
    suppress, blank, params = (from_numpy(a) for a in rules_arrays(_rules(True)))
    logits = from_numpy(np.zeros((2, VOCAB), np.float32))
    tokens, state, sums = (from_numpy(np.zeros(2, np.int32)), from_numpy(np.zeros((2, 5), np.int32)),
                           from_numpy(np.zeros(2)))  # fmt: skip
    with pytest.raises(ShapeError, match=r"state must be a contiguous \(2, 5\)"):
        greedy_rules_step(logits, tokens, from_numpy(np.zeros((2, 4), np.int32)), sums, suppress, blank, params)
    with pytest.raises(DTypeError, match="sum_lp must be float64"):
        greedy_rules_step(logits, tokens, state, from_numpy(np.zeros(2, np.float32)), suppress, blank, params)
    with pytest.raises(DTypeError, match="logits must be float32, float16 or bfloat16, got int32"):
        greedy_rules_step(from_numpy(np.zeros((2, VOCAB), np.int32)), tokens, state, sums, suppress, blank, params)
    with pytest.raises(ShapeError, match="outside the vocabulary of 40"):
        rules_arrays(TokenRules(eot=EOT, no_timestamps=NO_TS, timestamp_begin=TSB, vocab_size=VOCAB, suppress=(40,)))


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", [(8, 0), (9, 0)])
def test_rules_kernel_compiles(arch: tuple[int, int]) -> None:
    from pygpukit.asr import token_step
    from pygpukit.core.compiler import compile_source

    program = compile_source(token_step._SOURCE, arch=arch)
    for suffix in ("f32", "f16", "bf16"):
        assert f"whisper_greedy_step_{suffix}".encode() in program.binary


@pytest.fixture(scope="module")
def small() -> WhisperModel:
    weights = ref.random_weights(CFG, seed=26)
    weights["dec.ln.g"] = 0.7 * np.random.default_rng(26).choice([-1.0, 1.0], CFG.d_model).astype(np.float32)
    # timestamps compete with text: a few of their embeddings lifted toward the final norm's direction
    weights["dec.embed"][TSB:] += 0.3 * weights["dec.ln.g"] / 0.7
    return WhisperModel(CFG, weights)


def _both(model: WhisperModel, fn: Any) -> tuple[Any, Any]:
    try:
        model.graph_decode = False
        eager = fn()
        model.graph_decode = True
        graph = fn()
    finally:
        model.graph_decode = None
    return eager, graph


@pytest.mark.parametrize("timestamps", [False, True])
def test_graph_decode_equals_eager(small: WhisperModel, timestamps: bool) -> None:
    rules = _rules(timestamps)
    produced: set[int] = set()
    for seed in range(4):
        enc = small.encode(np.random.default_rng(seed).standard_normal((80, 20)).astype(np.float32))
        prompt = [SOT] if seed % 2 == 0 else [7, 9, SOT]  # a previous-text prompt changes the positions
        eager, graph = _both(small, lambda e=enc, p=prompt: decode_window(small, e, p, rules, sot_index=len(p) - 1,
                                                                          no_speech=NO_SPEECH))  # fmt: skip
        assert graph.tokens == eager.tokens
        np.testing.assert_allclose(graph.sum_logprob, eager.sum_logprob, rtol=1e-5)
        np.testing.assert_allclose(graph.avg_logprob, eager.avg_logprob, rtol=1e-5)
        assert graph.no_speech_prob == pytest.approx(eager.no_speech_prob, rel=1e-6)
        produced.update(eager.tokens)
    if timestamps:
        assert any(t >= TSB for t in produced)
    decoder = graph_decode.graph_decoder(small, 1)
    assert decoder is graph_decode.graph_decoder(small, 1), "one captured decoder per batch size, reused"
    assert decoder.num_nodes > 10


@pytest.mark.parametrize("timestamps", [False, True])
def test_beam_graph_equals_eager(small: WhisperModel, timestamps: bool) -> None:
    """Beam search through the captured step (cache reorder, decoder and candidates in one replay) against
    the eager loop: the same hypotheses in the same order, scores within float32 rounding."""
    rules = _rules(timestamps)
    for seed in range(3):
        enc = small.encode(np.random.default_rng(seed).standard_normal((80, 20)).astype(np.float32))
        prompt = [SOT] if seed % 2 == 0 else [7, 9, SOT]
        eager, graph = _both(small, lambda e=enc, p=prompt: decode_window(
            small, e, p, rules, sot_index=len(p) - 1, no_speech=NO_SPEECH, beam_size=3))  # fmt: skip
        assert [c[0] for c in graph.candidates] == [c[0] for c in eager.candidates]
        np.testing.assert_allclose([c[1] for c in graph.candidates], [c[1] for c in eager.candidates], rtol=1e-5)
        assert graph.tokens == eager.tokens
        np.testing.assert_allclose(graph.sum_logprob, eager.sum_logprob, rtol=1e-5)
        assert graph.no_speech_prob == pytest.approx(eager.no_speech_prob, rel=1e-6)
    decoder = graph_decode.beam_graph_decoder(small, 3)
    assert decoder is graph_decode.beam_graph_decoder(small, 3)
    assert decoder.num_nodes > 10


@pytest.mark.parametrize("temperature", [0.4, 1.0])
def test_sampled_graph_equals_eager(small: WhisperModel, temperature: float) -> None:
    """The temperature fallback's sampling through the captured step (best_of rows of one window, T and
    the seed in device memory) against the eager loop with the same generator: the same samples, sums
    within float32 rounding; one captured step serves both temperatures."""
    rules = _rules(True)
    for seed in range(2):
        enc = small.encode(np.random.default_rng(seed + 10).standard_normal((80, 20)).astype(np.float32))
        eager, graph = _both(small, lambda e=enc, s=seed: decode_window(
            small, e, [SOT], rules, sot_index=0, no_speech=NO_SPEECH, temperature=temperature, best_of=4,
            rng=np.random.default_rng(s)))  # fmt: skip
        assert [c[0] for c in graph.candidates] == [c[0] for c in eager.candidates]
        np.testing.assert_allclose([c[1] for c in graph.candidates], [c[1] for c in eager.candidates], rtol=1e-5)
        assert graph.tokens == eager.tokens
        assert graph.temperature == eager.temperature == temperature
        assert graph.no_speech_prob == pytest.approx(eager.no_speech_prob, rel=1e-6)
        assert len({tuple(c[0]) for c in eager.candidates}) > 1, "the rows draw different samples"
    decoder = graph_decode.sample_graph_decoder(small, 4)
    assert decoder is graph_decode.sample_graph_decoder(small, 4)
    assert decoder.num_nodes > 10


def test_graph_decode_batch_equals_eager(small: WhisperModel) -> None:
    rules = _rules(True)
    mel = np.random.default_rng(5).standard_normal((3, 80, 20)).astype(np.float32)
    enc = small.encode(mel)
    eager, graph = _both(small, lambda: decode_batch(small, enc, [SOT], rules, sot_index=0, no_speech=NO_SPEECH))
    for e, g in zip(eager, graph, strict=True):
        assert g.tokens == e.tokens
        np.testing.assert_allclose(g.sum_logprob, e.sum_logprob, rtol=1e-5)
        assert g.no_speech_prob == pytest.approx(e.no_speech_prob, rel=1e-6)
    assert len({tuple(e.tokens) for e in eager}) > 1, "the rows decode differently"


def test_batch_rows_after_their_own_prompts(small: WhisperModel) -> None:
    """decode_batch with a prompt per row (transcribe_batch's later windows: each row after its recording's
    previous text, of different lengths): each row as decode_window gives it alone, through the graph
    decoder's per-row start and through the eager loop's groups of equal prompts."""
    rules = _rules(True)
    mel = np.random.default_rng(8).standard_normal((4, 80, 20)).astype(np.float32)
    enc = small.encode(mel)
    prompts = [[7, 9, SOT], [SOT], [11, 12, 13, 14, 15, SOT], [7, 9, SOT]]
    sots = [len(p) - 1 for p in prompts]
    eager, graph = _both(small, lambda: decode_batch(small, enc, prompts, rules, sot_index=sots, no_speech=NO_SPEECH))
    for r, (e, g) in enumerate(zip(eager, graph, strict=True)):
        alone = decode_window(small, enc[r : r + 1], prompts[r], rules, sot_index=sots[r], no_speech=NO_SPEECH)
        assert g.tokens == e.tokens == alone.tokens
        np.testing.assert_allclose(g.sum_logprob, alone.sum_logprob, rtol=1e-5)
        np.testing.assert_allclose(e.sum_logprob, alone.sum_logprob, rtol=1e-5)
        assert g.no_speech_prob == pytest.approx(alone.no_speech_prob, rel=1e-5)
    assert len({tuple(e.tokens) for e in eager}) > 1, "the rows decode differently"
    with pytest.raises(ArgumentError, match="prompts"):
        decode_batch(small, enc, prompts[:3], rules, sot_index=sots[:3], no_speech=NO_SPEECH)


def test_use_graph_default(small: WhisperModel) -> None:
    from pygpukit.core import backend

    assert small.graph_decode is None
    assert graph_decode.use_graph(small) == (backend.backend_state().name == "cuda")
    assert graph_decode.use_graph(object()) is False  # objects without the attribute: the eager loop


def test_capture_failure_falls_back_when_automatic(small: WhisperModel, monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.asr import decoding
    from pygpukit.core.errors import PyGPUkitError

    model = WhisperModel(small.config, {k: v.to_numpy() for k, v in small.w.items()})
    enc = model.encode(np.random.default_rng(1).standard_normal((80, 20)).astype(np.float32))
    rules = _rules(True)
    model.graph_decode = False
    eager = decode_window(model, enc, [SOT], rules, sot_index=0, no_speech=NO_SPEECH)

    def refuse(*args: Any) -> None:
        raise PyGPUkitError("capture refused (test)")

    monkeypatch.setattr(graph_decode, "GraphDecoder", refuse)
    monkeypatch.setattr(decoding, "use_graph", lambda m: m.graph_decode is not False)
    model.graph_decode = True  # asked for: the error is raised
    with pytest.raises(PyGPUkitError, match="capture refused"):
        decode_window(model, enc, [SOT], rules, sot_index=0, no_speech=NO_SPEECH)
    model.graph_decode = None  # automatic: a warning, then the eager loop
    with pytest.warns(RuntimeWarning, match="capture refused"):
        fallback = decode_window(model, enc, [SOT], rules, sot_index=0, no_speech=NO_SPEECH)
    assert fallback.tokens == eager.tokens
    assert model.graph_decode is False


@pytest.mark.audio_data
def test_tiny_en_graph_equals_eager(whisper_tiny: Path, speech_16k: list[Path]) -> None:
    import soundfile as sf

    from pygpukit.asr.features import HOP_LENGTH, N_FRAMES, log_mel_spectrogram, pad_or_trim
    from pygpukit.asr.longform import token_rules

    model = WhisperModel.from_pretrained(whisper_tiny)
    tok = model.tokenizer
    assert tok is not None
    root = next(p for p in speech_16k if p.name == "001.wav").parent.parent
    audio, _ = sf.read(root / "cards/005.wav", dtype="float32")
    features = log_mel_spectrogram(audio, model.config.n_mels, padding=HOP_LENGTH)  # as transcribe's first window
    enc = model.encode(pad_or_trim(features[:, : min(N_FRAMES, features.shape[-1] - 1)].contiguous()))
    rules = token_rules(model, (-1,), True, False, 1.0)
    prompt = tok.sot_sequence(None, "transcribe")
    eager, graph = _both(model, lambda: decode_window(model, enc, prompt, rules, sot_index=prompt.index(tok.sot),
                                                      no_speech=tok.no_speech))  # fmt: skip
    assert graph.tokens == eager.tokens
    np.testing.assert_allclose(graph.sum_logprob, eager.sum_logprob, rtol=1e-5)
    expected = json.loads((Path(__file__).parent / "data" / "whisper_reference.json").read_text())
    text = tok.decode([t for t in graph.tokens if t < tok.eot]).strip()
    assert text == expected["clips"]["cards/005.wav"]["greedy"]["text"]


@pytest.mark.gpu
@pytest.mark.audio_data
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_graph_equals_eager_all_clips(whisper_tiny: Path, speech_16k: list[Path], dtype: str) -> None:
    """On the GPU: every clip's greedy text through the CUDA graph equals the eager loop's, batched too."""
    import time

    from pygpukit.asr import transcribe, transcribe_batch

    model = WhisperModel.from_pretrained(whisper_tiny, dtype=dtype)
    root = next(p for p in speech_16k if p.name == "001.wav").parent.parent
    clips = sorted(root.glob("cards/*.wav")) + sorted(root.glob("librivox/*.wav"))
    times = {}
    texts = {}
    for flag in (False, True):
        model.graph_decode = flag
        transcribe(model, clips[0], beam_size=1, temperature=0.0)  # warm-up (the graph captured here)
        start = time.perf_counter()
        texts[flag] = [transcribe(model, c, beam_size=1, temperature=0.0).text for c in clips]
        times[flag] = time.perf_counter() - start
    differing = [(a, b) for a, b in zip(texts[False], texts[True], strict=True) if a != b]
    print(f"{dtype}: eager {times[False]:.2f} s, graph {times[True]:.2f} s for {len(clips)} clips; differing "
          f"{differing}")  # fmt: skip
    # float32: identical; float16: the step's matmul + add rounds the bias twice where linear rounds once
    assert len(differing) <= (0 if dtype == "float32" else 1)
    batched = transcribe_batch(model, clips, beam_size=1, temperature=0.0, batch_size=16)
    batch_differs = sum(r.text != t for r, t in zip(batched, texts[True], strict=True))
    assert batch_differs <= (0 if dtype == "float32" else 1)


@pytest.mark.slow
@pytest.mark.audio_data
def test_tiny_en_long_form_through_the_graph(whisper_tiny: Path, speech_16k: list[Path]) -> None:
    """The 35 s concatenation (two windows, the second with the previous text as its prompt) through the
    graph decoder: faster-whisper's text and segment timestamps, as the eager loop gives them."""
    import soundfile as sf

    from pygpukit.asr import transcribe

    transcripts = json.loads((Path(__file__).parent / "data" / "pocketsphinx_transcripts.json").read_text())
    root = next(p for p in speech_16k if p.name == "001.wav").parent.parent
    keys = sorted((k for k in transcripts if k != "source"), key=lambda k: (k[0], k))
    audio = np.concatenate([sf.read(root / k, dtype="float32")[0] for k in keys])
    expected = ref.load_reference()["clips"]["concat/all.wav"]["greedy"]
    model = WhisperModel.from_pretrained(whisper_tiny)
    model.graph_decode = True
    result = transcribe(model, audio, beam_size=1, temperature=0.0)
    assert result.text == expected["text"]
    assert [(round(s.start, 2), round(s.end, 2)) for s in result.segments] == [
        (round(e["start"], 2), round(e["end"], 2)) for e in expected["segments"]
    ]
