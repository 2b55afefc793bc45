"""Word timestamps: the DTW, median filter, word splitting and punctuation merging against direct
implementations, and real clips against faster-whisper's word timestamps (data/whisper_reference.json)."""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import operator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pygpukit.asr import words

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


def _dtw_cost(x: np.ndarray, path: list[tuple[int, int]]) -> float:
    return float(-sum(x[i, j] for i, j in path))


def _best_cost(x: np.ndarray) -> float:
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf)
    cost[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost[i, j] = -x[i - 1, j - 1] + min(cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1])
    return float(cost[n, m])


@pytest.mark.parametrize("shape", [(1, 5), (4, 4), (6, 30)])
def test_dtw_finds_a_minimal_monotonic_path(shape: tuple[int, int]) -> None:
    x = np.random.default_rng(sum(shape)).standard_normal(shape)
    path = words._negative_dtw(x)
    assert path[0] == (0, 0)
    assert path[-1] == (shape[0] - 1, shape[1] - 1)
    for (i0, j0), (i1, j1) in itertools.pairwise(path):
        assert (i1 - i0, j1 - j0) in ((1, 1), (1, 0), (0, 1))
    assert _dtw_cost(x, path) == pytest.approx(_best_cost(x), rel=1e-5)


def test_median_filter_reflects() -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 12))
    got = words._median_filter(x, 7)
    padded = np.pad(x, ((0, 0), (0, 0), (3, 3)), mode="reflect")
    want = np.stack([np.median(padded[..., k : k + 7], axis=-1) for k in range(12)], axis=-1)
    np.testing.assert_array_equal(got, want)
    short = x[..., :3]
    np.testing.assert_array_equal(words._median_filter(short, 7), short)


def test_merge_punctuations() -> None:
    alignment = [{"word": w, "tokens": [i]} for i, w in enumerate([' "', "Hello", ",", " world", "."])]
    words._merge_punctuations(alignment)
    assert [a["word"] for a in alignment] == ["", ' "Hello,', "", " world.", ""]
    assert alignment[1]["tokens"] == [0, 1, 2]


def test_split_words(whisper_tiny: Path) -> None:
    from pygpukit.asr import WhisperTokenizer

    tok = WhisperTokenizer(whisper_tiny / "tokenizer.json")
    ids = tok.encode(" Unless to be cold-hearted, it's fine.")
    split, pieces = words._split_words(tok, [*ids, tok.eot])
    assert split == [" Unless", " to", " be", " cold", "-hearted", ",", " it's", " fine", ".", ""]  # as faster-whisper
    assert functools.reduce(operator.iadd, pieces, []) == [*ids, tok.eot]


def _check_words(model: Any, root: Path, key: str) -> None:
    from pygpukit.asr import transcribe

    expected = ref.load_reference()["clips"][key]["greedy_words"]
    result = transcribe(model, root / key, beam_size=1, temperature=0.0, word_timestamps=True)
    assert result.text == expected["text"]
    assert len(result.segments) == len(expected["segments"])
    for ours, theirs in zip(result.segments, expected["segments"], strict=True):
        assert abs(ours.start - theirs["start"]) <= 0.02
        assert abs(ours.end - theirs["end"]) <= 0.02
        assert ours.words is not None
        assert len(ours.words) == len(theirs["words"])
        for word, (text, start, end, probability) in zip(ours.words, theirs["words"], strict=True):
            assert word.word == text
            assert abs(word.start - start) <= 0.02
            assert abs(word.end - end) <= 0.02
            assert abs(word.probability - probability) <= 1e-3


@pytest.fixture(scope="module")
def tiny_model(whisper_tiny: Path) -> Any:
    from pygpukit.asr import WhisperModel

    return WhisperModel.from_pretrained(whisper_tiny)


def _root(speech_16k: list[Path]) -> Path:
    return next(p for p in speech_16k if p.name == "001.wav").parent.parent


@pytest.mark.audio_data
def test_word_timestamps_match_faster_whisper(tiny_model: Any, speech_16k: list[Path]) -> None:
    _check_words(tiny_model, _root(speech_16k), "cards/005.wav")


@pytest.mark.slow
@pytest.mark.audio_data
def test_word_timestamps_all_clips(tiny_model: Any, speech_16k: list[Path]) -> None:
    transcripts = json.loads((Path(__file__).parent / "data" / "pocketsphinx_transcripts.json").read_text())
    for key in transcripts:
        if key not in ("source", "cards/005.wav"):
            _check_words(tiny_model, _root(speech_16k), key)


@pytest.mark.slow
@pytest.mark.audio_data
def test_word_timestamps_long_form(tiny_model: Any, speech_16k: list[Path]) -> None:
    import soundfile as sf

    from pygpukit.asr import transcribe

    root = _root(speech_16k)
    keys = sorted((root / "cards").glob("*.wav")) + sorted((root / "librivox").glob("*.wav"))
    audio = np.concatenate([sf.read(k, dtype="float32")[0] for k in keys])
    expected = ref.load_reference()["clips"]["concat/all.wav"]["greedy_words"]
    result = transcribe(tiny_model, audio, beam_size=1, temperature=0.0, word_timestamps=True)
    assert result.text == expected["text"]
    ours = [(w.word, w.start, w.end) for s in result.segments for w in s.words or ()]
    theirs = [(w[0], w[1], w[2]) for s in expected["segments"] for w in s["words"]]
    assert [w[0] for w in ours] == [w[0] for w in theirs]
    assert max(max(abs(a[1] - b[1]), abs(a[2] - b[2])) for a, b in zip(ours, theirs, strict=True)) <= 0.02
