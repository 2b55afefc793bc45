"""decode_window on a random small Whisper: greedy, sampling and beam search against log-probabilities
computed by the float64 NumPy reference for the sequences they return (which checks the KV cache, the beam
reordering and the score bookkeeping), and the argument checks."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygpukit.asr.decoding import TokenRules, decode_window
from pygpukit.asr.model import WhisperModel
from pygpukit.asr.weights import WhisperConfig
from pygpukit.core.errors import ArgumentError

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

CFG = WhisperConfig(n_mels=80, n_audio_ctx=10, d_model=128, encoder_layers=1, encoder_heads=2, n_vocab=30,
                    n_text_ctx=16, decoder_layers=2, decoder_heads=2)  # fmt: skip
EOT, SOT, NO_TS, NO_SPEECH = 20, 21, 23, 22
RULES = TokenRules(eot=EOT, no_timestamps=NO_TS, timestamp_begin=24, vocab_size=30, suppress=(SOT, NO_SPEECH),
                   timestamps=False)  # fmt: skip


@pytest.fixture(scope="module")
def setup() -> tuple[WhisperModel, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    weights = ref.random_weights(CFG, seed=26)
    # random signs in the final norm keep the tied projection from repeating the last token forever
    weights["dec.ln.g"] = 0.7 * np.random.default_rng(26).choice([-1.0, 1.0], CFG.d_model).astype(np.float32)
    mel = np.random.default_rng(22).standard_normal((80, 20)).astype(np.float32)
    return WhisperModel(CFG, weights), weights, mel, ref.encode(weights, CFG, mel)


def _logprobs(weights: dict[str, np.ndarray], enc: np.ndarray, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """Log-probabilities (after the suppression of RULES) of tokens + [EOT] following the prompt."""
    full = [*prompt, *tokens, EOT]
    logits = ref.decode(weights, CFG, enc, np.array(full[:-1]))[len(prompt) - 1 :]
    logits[:, list(RULES.suppress)] = -np.inf
    logits -= logits.max(-1, keepdims=True)
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return lp[np.arange(len(tokens) + 1), full[len(prompt) :]]


def test_greedy_follows_the_reference(setup: tuple) -> None:
    model, weights, mel, enc = setup
    prompt = [SOT]
    result = decode_window(model, model.encode(mel), prompt, RULES, sot_index=0, no_speech=NO_SPEECH)
    # the reference's greedy chain
    seq: list[int] = []
    while len(seq) < 8:  # max_new = min(16 // 2, 16 - 0)
        logits = ref.decode(weights, CFG, enc, np.array(prompt + seq))[-1]
        logits[list(RULES.suppress)] = -np.inf
        token = int(np.argmax(logits))
        if token == EOT:
            break
        seq.append(token)
    assert result.tokens == seq == [14, 28, 28, 8]
    lp = _logprobs(weights, enc, prompt, seq)
    np.testing.assert_allclose(result.sum_logprob, lp.sum(), rtol=1e-4)
    first = ref.decode(weights, CFG, enc, np.array(prompt))[0]
    np.testing.assert_allclose(result.no_speech_prob, np.exp(first - first.max())[NO_SPEECH] /
                               np.exp(first - first.max()).sum(), rtol=1e-4)  # fmt: skip


@pytest.mark.parametrize("beam", [2, 4])
def test_beam_scores_match_the_reference(setup: tuple, beam: int) -> None:
    model, weights, mel, enc = setup
    prompt = [SOT]
    result = decode_window(model, model.encode(mel), prompt, RULES, sot_index=0, no_speech=NO_SPEECH,
                           beam_size=beam)  # fmt: skip
    assert result.candidates, "beam search returns its finished hypotheses"
    greedy = decode_window(model, model.encode(mel), prompt, RULES, sot_index=0, no_speech=NO_SPEECH)
    for tokens, score in result.candidates[:beam]:
        lp = _logprobs(weights, enc, prompt, tokens)
        if len(tokens) == 8:  # stopped by the length limit: no end token scored
            lp = lp[:-1]
        np.testing.assert_allclose(score, lp.sum() / max(len(tokens), 1), rtol=1e-4, atol=1e-6)
    best = result.candidates[0][1]
    assert best >= greedy.sum_logprob / max(len(greedy.tokens), 1) - 1e-6 or len(result.tokens) == 0


def test_sampling(setup: tuple) -> None:
    model, weights, mel, enc = setup
    enc_gpu = model.encode(mel)
    cold = decode_window(model, enc_gpu, [SOT], RULES, sot_index=0, no_speech=NO_SPEECH, temperature=1e-4, best_of=3)
    greedy = decode_window(model, enc_gpu, [SOT], RULES, sot_index=0, no_speech=NO_SPEECH)
    assert cold.tokens == greedy.tokens
    assert len(cold.candidates) == 3
    hot = decode_window(model, enc_gpu, [SOT], RULES, sot_index=0, no_speech=NO_SPEECH, temperature=1.5, best_of=4,
                        rng=np.random.default_rng(3))  # fmt: skip
    for tokens, score in hot.candidates:
        lp = _logprobs(weights, enc, [SOT], tokens)
        if len(tokens) == 8:  # stopped by the length limit, or by EOT as the 8th token: either sum fits
            assert np.isclose(score * 8, lp[:-1].sum(), rtol=1e-4) or np.isclose(score * 8, lp.sum(), rtol=1e-4)
        else:
            np.testing.assert_allclose(score, lp.sum() / max(len(tokens), 1), rtol=1e-4)
    assert hot.temperature == 1.5


def test_arguments(setup: tuple) -> None:
    model, _, mel, _ = setup
    enc = model.encode(mel)
    with pytest.raises(ArgumentError, match="beam_size"):
        decode_window(model, enc, [SOT], RULES, sot_index=0, no_speech=NO_SPEECH, beam_size=0)
    with pytest.raises(ArgumentError, match="no room"):
        decode_window(model, enc, [SOT] * 17, RULES, sot_index=0, no_speech=NO_SPEECH)


TS_RULES = TokenRules(eot=EOT, no_timestamps=NO_TS, timestamp_begin=24, vocab_size=30, suppress=(SOT, NO_SPEECH),
                      suppress_blank=(3, EOT), max_initial_timestamp_index=2)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(0, 4), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_beam_rules_topk_equals_the_host_rules(rows: int, step: int, k: int, seed: int) -> None:
    """The device step of beam search (token rules, log-softmax, each row's k best) against TokenRules.apply,
    the float64 log-softmax and a stable sort of each row: the same tokens in the same order (ties, -inf
    and timestamp states included) and the same scores."""
    from pygpukit.asr.token_step import beam_rules_topk, row_state, rules_arrays
    from pygpukit.core.array import from_numpy

    rng = np.random.default_rng(seed)
    rules = TS_RULES if seed % 3 else RULES
    logits = (rng.integers(-4, 5, (rows, 30)) / 2).astype(np.float32)  # many ties
    logits[rng.random((rows, 30)) < 0.1] = -np.inf
    seqs = [[int(t) for t in rng.choice([1, 5, 9, 24, 25, 26, 27, 28], step)] for _ in range(rows)]
    scores = rng.uniform(-3, 0, rows)
    idx, val = beam_rules_topk(from_numpy(logits), from_numpy(np.array([row_state(q, 24) for q in seqs], np.int32)),
                               from_numpy(scores), *(from_numpy(a) for a in rules_arrays(rules)), k)  # fmt: skip
    host = rules.apply(logits.astype(np.float64), seqs, step)
    with np.errstate(invalid="ignore", divide="ignore"):
        top = host.max(axis=-1, keepdims=True)
        lp = host - top - np.log(np.exp(host - top).sum(axis=-1, keepdims=True)) + scores[:, None]
    got_idx, got_val = idx.to_numpy(), val.to_numpy()
    for r in range(rows):
        kept = np.flatnonzero(host[r] > -np.inf)
        want = kept[np.argsort(-host[r, kept], kind="stable")][:k]
        assert np.array_equal(got_idx[r, : len(want)], want), (r, got_idx[r], want)
        assert np.all(got_idx[r, len(want) :] == -1)
        np.testing.assert_allclose(got_val[r, : len(want)], lp[r, want], rtol=0, atol=1e-6)


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_sample_rules_step_draws_from_the_filtered_softmax(temperature: float) -> None:
    """The device sampling step: over 3000 identical rows the tokens' frequencies follow softmax(v / T) of the
    entries the rules keep (a chi-square bound), each sum gets the token's log-probability at temperature 1,
    finished rows emit <|endoftext|>, and a seed gives the same tokens again."""
    from pygpukit.asr.token_step import rules_arrays, sample_rules_step, sampling_array
    from pygpukit.core.array import from_numpy

    rows = 3000
    rng = np.random.default_rng(7)
    row = rng.normal(0, 1.5, 30).astype(np.float32)
    logits = from_numpy(np.tile(row, (rows, 1)))
    seqs = [[5, 9]] * rows
    state = np.array([[2, 9, 5, -1, 0]] * rows, np.int32)
    state[0, 4] = 1  # a finished row
    arrays = [from_numpy(a) for a in rules_arrays(TS_RULES)]

    def draw(seed: int) -> tuple[np.ndarray, np.ndarray]:
        tokens, sums = from_numpy(np.zeros(rows, np.int32)), from_numpy(np.zeros(rows, np.float64))
        sampling = from_numpy(sampling_array(temperature, seed))
        sample_rules_step(logits, tokens, from_numpy(state), sums, *arrays, sampling)
        return tokens.to_numpy(), sums.to_numpy()

    tokens, sums = draw(11)
    assert tokens[0] == EOT
    assert sums[0] == 0.0
    host = TS_RULES.apply(np.tile(row.astype(np.float64), (1, 1)), seqs[:1], 2)[0]
    kept = np.flatnonzero(host > -np.inf)
    lp = host - host[kept].max() - np.log(np.exp(host[kept] - host[kept].max()).sum())
    np.testing.assert_allclose(sums[1:], lp[tokens[1:]], rtol=0, atol=1e-6)
    p = np.exp(host[kept] / temperature - (host[kept] / temperature).max())
    p /= p.sum()
    counts = np.array([(tokens[1:] == t).sum() for t in kept], np.float64)
    assert counts.sum() == rows - 1
    expected = p * (rows - 1)
    big = expected >= 5
    chi2 = (((counts - expected) ** 2 / expected)[big]).sum()
    assert chi2 < 3 * big.sum() + 30, (chi2, counts, expected)
    assert np.array_equal(draw(11)[0], tokens)
    assert not np.array_equal(draw(12)[0], tokens)
