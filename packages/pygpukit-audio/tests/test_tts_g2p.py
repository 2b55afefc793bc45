"""Kokoro's text input (issue 22): Japanese text -> misaki's G2P -> phonemes -> token ids of Kokoro's vocabulary.

With misaki importable (the ``ja`` extra: misaki, fugashi, jaconv, mojimoji, unidic-lite; offline): fixed
sentences give misaki's phonemes, every character of which is in vocab.json, with and without pyopenjtalk;
``synthesize(text)`` feeds the model the ids of those phonemes, sentence by sentence; ``slow``: a short
text synthesized on the current backend.
Without misaki those tests skip, naming the extra. The typed errors of a missing G2P (import failure, and
MeCab without a dictionary) are checked with stand-in modules, so they run whether misaki is installed or not.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from typing import Any

import numpy as np
import pytest

from pygpukit.core.errors import MissingDistributionError

HAS_MISAKI = importlib.util.find_spec("misaki") is not None
needs_misaki = pytest.mark.skipif(not HAS_MISAKI, reason="misaki is not installed (pip install 'pygpukit-audio[ja]')")

# misaki 0.9's JAG2P() (cutlet romanizer, UniDic through fugashi) on sentences whose readings the full
# UniDic and unidic-lite agree on.
SENTENCES = {
    "\u3053\u3093\u306b\u3061\u306f\u3002\u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059\u3002":
        "ko\u0272\u0272i\u02a8i\u03b2a. k\u02b2o\u02d0 \u03b2a i\u02d0 te\u014bk\u02b2i des\u0268.",
    "\u6771\u4eac\u90fd\u306b\u4f4f\u3093\u3067\u3044\u307e\u3059\u3002":
        "to\u02d0k\u02b2o\u02d0to \u0272i s\u0268nde imas\u0268.",
    "\u3042\u308a\u304c\u3068\u3046\u3054\u3056\u3044\u307e\u3059\u3002\u307e\u305f\u6765\u307e\u3059\u306d\uff01":
        "a\u027e\u02b2i\u0261ato\u02d0 \u0261o\u02a3aimas\u0268. mata k\u02b2imas\u0268 ne!",
}  # fmt: skip


def _vocab() -> dict[str, int]:
    from pygpukit.tts.fetch import model_dir

    path = model_dir() / "vocab.json"
    if not path.is_file():
        pytest.skip(f"Kokoro's vocab.json not cached at {path} (python ci/fetch_kokoro.py)")
    vocab: dict[str, int] = json.loads(path.read_text(encoding="utf-8"))["vocab"]
    return vocab


def _model() -> Any:
    pytest.importorskip("onnx")
    from pygpukit.tts import KokoroModel
    from pygpukit.tts.fetch import MODEL_FILE, model_dir

    folder = model_dir()
    if not (folder / MODEL_FILE).is_file():
        pytest.skip(f"Kokoro model not cached at {folder} (python ci/fetch_kokoro.py)")
    return KokoroModel.from_pretrained(folder)


@pytest.fixture(scope="module")
def model() -> Any:
    return _model()


def test_missing_misaki_raises_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.tts.kokoro_model import _g2p

    monkeypatch.setitem(sys.modules, "misaki.ja", None)  # import misaki.ja -> ImportError
    with pytest.raises(MissingDistributionError, match=r"pygpukit-audio\[ja\]") as info:
        _g2p()
    assert "misaki.ja" in str(info.value)


def test_mecab_without_dictionary_raises_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygpukit.tts.kokoro_model import _g2p

    class JAG2P:  # what misaki's JAG2P() raises when fugashi finds unidic without its downloaded data
        def __init__(self) -> None:
            raise RuntimeError("\nFailed initializing MeCab. Please see the README for possible solutions:\n")

    monkeypatch.setitem(sys.modules, "misaki.ja", types.SimpleNamespace(JAG2P=JAG2P))
    with pytest.raises(MissingDistributionError, match=r"python -m unidic download.*Failed initializing MeCab"):
        _g2p()


@needs_misaki
@pytest.mark.parametrize("text", list(SENTENCES))
def test_g2p_phonemes_are_in_kokoros_vocabulary(text: str) -> None:
    from pygpukit.tts.kokoro_model import _g2p

    vocab = _vocab()
    phonemes, _ = _g2p()(text)
    assert phonemes == SENTENCES[text]
    assert [c for c in phonemes if c not in vocab] == []
    ids = [vocab[c] for c in phonemes]
    assert min(ids) > 0
    assert max(ids) <= max(vocab.values())


@needs_misaki
def test_g2p_without_pyopenjtalk(monkeypatch: pytest.MonkeyPatch) -> None:
    """misaki.ja imports pyopenjtalk (the ja extra leaves it out): without it, the same romanizer that
    JAG2P() runs is built directly, with the same phonemes."""
    from pygpukit.tts.kokoro_model import _g2p

    monkeypatch.setitem(sys.modules, "pyopenjtalk", None)
    monkeypatch.delitem(sys.modules, "misaki.ja", raising=False)
    g2p = _g2p()
    assert type(g2p).__name__ == "Cutlet"
    for text, phonemes in SENTENCES.items():
        assert g2p(text)[0] == phonemes


@needs_misaki
def test_text_reaches_the_model_as_phoneme_ids(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """synthesize(text): one chunk per sentence, each the ids of misaki's phonemes (0 at both ends)."""
    text = next(iter(SENTENCES))
    seen: list[str] = []

    def run(phonemes: str, table: Any, speed: float) -> Any:
        seen.append(phonemes)
        return np.zeros(600, np.float32)

    monkeypatch.setattr(model, "_run", run)
    assert model.synthesize(text).shape == (1200,)
    assert seen == ["ko\u0272\u0272i\u02a8i\u03b2a.", "k\u02b2o\u02d0 \u03b2a i\u02d0 te\u014bk\u02b2i des\u0268."]
    assert model.phonemize(text) == SENTENCES[text]
    for phonemes in seen:
        ids = model.ids(phonemes)
        assert ids.size == len(phonemes) + 2
        assert ids[0] == ids[-1] == 0
        assert ids[1:-1].tolist() == [model.vocab[c] for c in phonemes]


@needs_misaki
@pytest.mark.slow
def test_short_text_synthesis(model: Any) -> None:
    """The shortest Japanese text through the whole model (about 2 minutes on the CPU simulation)."""
    audio = model.synthesize("\u3042\u3002")  # "a." in misaki's alphabet
    assert len(model.last_durations) == 1
    frames = model.last_durations[0].frames
    assert frames.shape == (4,)  # 0, a, ., 0
    assert audio.shape == (600 * int(frames.sum()),)
    assert audio.dtype == np.float32
    assert np.isfinite(audio).all()
    assert 0.01 < np.abs(audio).max() <= 1.5
