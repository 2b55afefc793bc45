"""WhisperModel's encoder and decoder against a float64 NumPy reference: random small configs in float32,
float16 and bfloat16, incremental decoding through the KV cache, beam reordering, and the real tiny.en."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pygpukit.asr.model import WhisperModel
from pygpukit.asr.weights import WhisperConfig
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

SMALL = WhisperConfig(n_mels=80, n_audio_ctx=12, d_model=128, encoder_layers=2, encoder_heads=2, n_vocab=50,
                      n_text_ctx=10, decoder_layers=2, decoder_heads=2)  # fmt: skip
# relative error bound (max |ours - reference| / max |reference|) of the logits per dtype
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 8e-2}


def _rel(ours: Any, expected: Any) -> float:
    return float(np.max(np.abs(np.asarray(ours, np.float64) - expected)) / np.max(np.abs(expected)))


def _inputs(cfg: WhisperConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    mel = rng.standard_normal((cfg.n_mels, 2 * cfg.n_audio_ctx)).astype(np.float32)
    tokens = rng.integers(0, cfg.n_vocab, 7)
    return mel, tokens


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_random_config_forward(dtype: str) -> None:
    weights = ref.random_weights(SMALL, seed=1)
    model = WhisperModel(SMALL, weights, dtype=dtype)
    mel, tokens = _inputs(SMALL, 2)
    expected = ref.forward(weights, SMALL, mel, tokens)
    logits = model.forward(mel, tokens).to_numpy()
    assert logits.shape == (1, len(tokens), SMALL.n_vocab)
    assert logits.dtype == np.float32
    assert _rel(logits[0], expected) <= TOLERANCE[dtype]
    enc = model.encode(mel).to_numpy()
    assert enc.shape == (1, SMALL.n_audio_ctx, SMALL.d_model)
    assert _rel(enc[0], ref.encode(weights, SMALL, mel)) <= TOLERANCE[dtype]


def test_incremental_decoding_equals_full_forward() -> None:
    weights = ref.random_weights(SMALL, seed=4)
    model = WhisperModel(SMALL, weights)
    mel, tokens = _inputs(SMALL, 5)
    enc = model.encode(mel)
    expected = ref.forward(weights, SMALL, mel, tokens)
    state = model.new_state(enc)
    steps = [model.logits(model.decode(tokens[None, :3], state)).to_numpy()[0]]
    for t in tokens[3:]:
        steps.append(model.logits(model.decode(np.array([[t]]), state)).to_numpy()[0])
    assert state.length == len(tokens)
    assert _rel(np.concatenate(steps), expected) <= 1e-4
    # One-token steps made their decode workspaces (self and cross attention) and the cross lengths once.
    assert sorted(key[0] for key in state.scratch) == ["cross_lengths", "workspace", "workspace"]
    kept = dict(state.scratch)
    model.decode(np.array([[tokens[0]]]), state)
    assert all(state.scratch[key] is value for key, value in kept.items())


def test_batched_rows_and_reorder() -> None:
    weights = ref.random_weights(SMALL, seed=6)
    model = WhisperModel(SMALL, weights)
    mel, _ = _inputs(SMALL, 7)
    enc = model.encode(mel)
    state = model.new_state(enc, repeat=3)
    prefixes = np.array([[1, 2], [3, 4], [5, 6]])
    model.decode(prefixes, state)
    model.reorder(state, [2, 0, 2])  # rows now continue prefixes 2, 0, 2
    last = model.logits(model.decode(np.array([[7], [8], [9]]), state)).to_numpy()[:, 0]
    ref_enc = ref.encode(weights, SMALL, mel)
    for row, (src, nxt) in enumerate(((2, 7), (0, 8), (2, 9))):
        expected = ref.decode(weights, SMALL, ref_enc, np.array([*prefixes[src], nxt]))[-1]
        assert _rel(last[row], expected) <= 1e-4


def test_errors_are_typed() -> None:
    weights = ref.random_weights(SMALL)
    with pytest.raises(DTypeError, match="int8"):
        WhisperModel(SMALL, weights, dtype="int8")
    model = WhisperModel(SMALL, weights)
    with pytest.raises(ShapeError, match=r"\(batch, 80, 24\)"):
        model.encode(np.zeros((80, 30), np.float32))
    state = model.new_state(model.encode(np.zeros((80, 24), np.float32)))
    with pytest.raises(ArgumentError, match=r"token ids must be in \[0, 50\)"):
        model.decode(np.array([[50]]), state)
    with pytest.raises(ArgumentError, match="exceed the context of 10"):
        model.decode(np.zeros((1, 11), np.int64), state)
    with pytest.raises(ShapeError, match="batch=1"):
        model.decode(np.zeros((2, 1), np.int64), state)


@pytest.mark.slow
def test_real_tiny_en_logits(whisper_tiny: Path, speech_16k: list[Path]) -> None:
    import soundfile as sf

    from pygpukit.asr.features import whisper_features
    from pygpukit.asr.weights import load_ct2

    config, weights = load_ct2(whisper_tiny)
    model = WhisperModel(config, weights)
    audio, _ = sf.read(next(p for p in speech_16k if p.name == "0880.wav" or p.name.endswith("0880.wav")),
                       dtype="float32")  # fmt: skip
    mel = whisper_features(audio).to_numpy()
    tokens = np.array([50257, 50363, 679, 373, 407, 281])
    expected = ref.forward(weights, config, mel, tokens)
    assert _rel(model.forward(mel, tokens).to_numpy()[0], expected) <= 1e-4
