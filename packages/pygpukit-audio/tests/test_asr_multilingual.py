"""Multilingual Whisper (issue 17): language detection, the translate task and timestamps with multilingual
token ids, on a random-weight multilingual model (large-v3's vocabulary layout, 51866 tokens) against
transformers' WhisperForConditionalGeneration and WhisperTokenizerFast on the CPU. Only English tiny.en
weights ship, so the vocabulary is a synthetic byte-level BPE with Whisper's special tokens at their real
ids (v2: 99 languages, 51865 tokens; v3: 100, 51866). torch and transformers are test references only:
without them the comparisons skip; the tokenizer's own checks run anyway."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pygpukit.asr import WhisperConfig, WhisperModel, WhisperTokenizer, detect_language, transcribe
from pygpukit.asr import longform as lf
from pygpukit.asr.features import HOP_LENGTH, log_mel_spectrogram, pad_or_trim
from pygpukit.asr.tokenizer import LANGUAGES
from pygpukit.core.errors import ArgumentError

_spec = importlib.util.spec_from_file_location("asr_reference", Path(__file__).with_name("asr_reference.py"))
assert _spec is not None
assert _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

CFG = WhisperConfig(n_mels=128, n_audio_ctx=1500, d_model=128, encoder_layers=2, encoder_heads=2, n_vocab=51866,
                    n_text_ctx=64, decoder_layers=2, decoder_heads=2)  # fmt: skip
# openai-whisper's ids: <|endoftext|>, <|startoftranscript|>, <|ja|>, <|translate|>, <|transcribe|>,
# <|startofprev|>, no-speech, <|notimestamps|>, <|0.00|>
V3 = (50257, 50258, 50266, 50359, 50360, 50362, 50363, 50364, 50365)
V2 = (50257, 50258, 50266, 50358, 50359, 50361, 50362, 50363, 50364)
NO_FALLBACK: dict[str, Any] = {"temperature": 0.0, "beam_size": 1, "compression_ratio_threshold": None,
                               "log_prob_threshold": None, "no_speech_threshold": None}  # fmt: skip


def make_tokenizer(path: Path, v3: bool = True) -> Path:
    """A tokenizer.json laid out as Whisper's multilingual ones: 50257 byte-level BPE tokens (the 256 bytes,
    a few merges, fillers), then <|endoftext|>, <|startoftranscript|>, the languages, the task and
    prompt tokens, <|notimestamps|> and the 1501 timestamps."""
    tokenizers = pytest.importorskip("tokenizers")
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("\u0120", "h"), ("\u0120h", "e"), ("l", "l"), ("\u0120he", "ll"), ("\u0120hell", "o")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    while len(vocab) < 50257:
        vocab[f"<filler{len(vocab)}>"] = len(vocab)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    languages = LANGUAGES if v3 else LANGUAGES[:-1]
    specials = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{c}|>" for c in languages), "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>" if v3 else "<|nocaptions|>",
                "<|notimestamps|>", *(f"<|{i * 0.02:.2f}|>" for i in range(1501))]  # fmt: skip
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in specials])
    tok.save(str(path))
    return path


@pytest.mark.parametrize("v3", [True, False], ids=["v3", "v2"])
def test_multilingual_tokenizer_ids(tmp_path: Path, v3: bool) -> None:
    tok = WhisperTokenizer(make_tokenizer(tmp_path / "tokenizer.json", v3))
    assert tok.multilingual  # told apart from English-only vocabularies by <|endoftext|> = 50257
    assert tok.vocab_size == (51866 if v3 else 51865)
    eot, sot, ja, translate, transcribe_, prev, no_speech, no_ts, tsb = V3 if v3 else V2
    assert (tok.eot, tok.sot, tok.translate, tok.transcribe, tok.sot_prev, tok.no_speech, tok.no_timestamps,
            tok.timestamp_begin) == (eot, sot, translate, transcribe_, prev, no_speech, no_ts, tsb)  # fmt: skip
    assert len(tok.language_tokens) == (100 if v3 else 99)
    assert tok.language_tokens[sot + 1] == "en"
    assert tok.language_tokens[ja] == "ja"
    assert tok.sot_sequence("ja", "translate") == [sot, ja, translate]
    assert tok.sot_sequence(None, "transcribe") == [sot, sot + 1, transcribe_]
    assert {sot, prev, no_speech, translate, transcribe_} <= set(tok.suppressed_tokens((-1,)))
    ids = tok.encode(" hello w\u00f6rld")
    assert tok.decode([tsb, *ids, tsb + 50, eot]) == " hello w\u00f6rld"
    assert tok.decode_with_timestamps([tsb, *ids, tsb + 50]) == "<|0.00|> hello w\u00f6rld<|1.00|>"
    with pytest.raises(ArgumentError, match="unknown language code 'xx'"):
        tok.sot_sequence("xx")


def test_word_split_by_language(tmp_path: Path) -> None:
    """Languages written without spaces split into characters (faster-whisper's split_tokens_on_unicode)."""
    from pygpukit.asr.words import _split_words

    tok = WhisperTokenizer(make_tokenizer(tmp_path / "tokenizer.json"))
    ids = tok.encode(" hello \u3053\u3093\u306b\u3061\u306f")
    words, pieces = _split_words(tok, [*ids, tok.eot])
    assert words == [" hello", " \u3053\u3093\u306b\u3061\u306f", ""]  # the end token decodes to nothing
    words, pieces = _split_words(tok, [*ids, tok.eot], on_spaces=False)
    assert words == [" hello", " ", "\u3053", "\u3093", "\u306b", "\u3061", "\u306f", ""]
    assert [t for p in pieces for t in p] == [*ids, tok.eot]  # each character's 3 UTF-8 byte tokens together


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any], Any]:
    """(our random multilingual model, its weights, 3 s of audio)."""
    path = make_tokenizer(tmp_path_factory.mktemp("ml") / "tokenizer.json")
    weights = ref.random_weights(CFG, seed=23)
    weights["dec.pos"] *= 6.0  # positions that differ enough for greedy decoding not to repeat one token
    ours = WhisperModel(CFG, weights, WhisperTokenizer(path), dtype="float32")
    t = np.arange(16000 * 3) / 16000
    audio = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)
             + 0.05 * np.random.default_rng(5).standard_normal(t.size)).astype(np.float32)  # fmt: skip
    return ours, weights, audio


def test_word_timestamps_split_by_the_language(multilingual: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """transcribe(word_timestamps=True): Japanese text split into characters, German on spaces; English-only
    models refuse detect_language."""
    from pygpukit.asr import words

    ours, _, audio = multilingual
    seen: list[bool] = []
    real = words._split_words

    def split(tok: Any, tokens: list[int], on_spaces: bool = True) -> Any:
        seen.append(on_spaces)
        return real(tok, tokens, on_spaces)

    monkeypatch.setattr(words, "_split_words", split)
    for language, on_spaces in (("ja", False), ("de", True)):
        seen.clear()
        result = transcribe(ours, audio, language=language, word_timestamps=True, **NO_FALLBACK)
        assert result.language == language
        assert seen
        assert set(seen) == {on_spaces}  # every window's words
    monkeypatch.setattr(ours.tokenizer, "multilingual", False)
    with pytest.raises(ArgumentError, match="English-only"):
        detect_language(ours, audio)


# -- against transformers -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(multilingual: Any) -> tuple[Any, Any, Any, Any]:
    """(ours, transformers' model, transformers' tokenizer, the audio) for the random multilingual model."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pygpukit.asr.hf_export import transformers_config, transformers_state_dict

    ours, weights, audio = multilingual
    path = ours.tokenizer.path
    hf = transformers.WhisperForConditionalGeneration(
        transformers.WhisperConfig(**transformers_config(CFG), attn_implementation="eager")
    )
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in transformers_state_dict(weights, CFG).items()}, strict=True)
    hf = hf.eval()
    hf_tok = transformers.WhisperTokenizerFast(tokenizer_file=str(path), unk_token="<|endoftext|>",
                                               bos_token="<|endoftext|>", eos_token="<|endoftext|>")  # fmt: skip
    return ours, hf, hf_tok, audio


def _window(ours: Any, audio: Any) -> Any:
    features = log_mel_spectrogram(audio, CFG.n_mels, padding=HOP_LENGTH)
    return pad_or_trim(features[:, : features.shape[-1] - 1].contiguous()).to_numpy()


def _generation_config(ours: Any, **extra: Any) -> Any:
    from transformers import GenerationConfig

    tok = ours.tokenizer
    return GenerationConfig(decoder_start_token_id=tok.sot, eos_token_id=tok.eot, pad_token_id=tok.eot,
                            lang_to_id={f"<|{c}|>": i for i, c in tok.language_tokens.items()},
                            task_to_id={"transcribe": tok.transcribe, "translate": tok.translate},
                            no_timestamps_token_id=tok.no_timestamps, prev_sot_token_id=tok.sot_prev,
                            is_multilingual=True, suppress_tokens=list(tok.suppressed_tokens((-1,))),
                            begin_suppress_tokens=[*tok.encode(" "), tok.eot], max_initial_timestamp_index=50,
                            **extra)  # fmt: skip


def test_detect_language_matches_transformers(models: Any) -> None:
    import torch

    ours, hf, _, audio = models
    window = torch.from_numpy(_window(ours, audio))[None]
    chosen = int(hf.detect_language(input_features=window, generation_config=_generation_config(ours))[0])
    with torch.no_grad():
        logits = hf(input_features=window, decoder_input_ids=torch.tensor([[ours.tokenizer.sot]])).logits[0, -1]
    ids = sorted(ours.tokenizer.language_tokens)
    theirs = torch.softmax(logits.double()[ids], -1).numpy()
    language, probability, probs = detect_language(ours, audio)
    assert language == ours.tokenizer.language_tokens[chosen]
    assert language != "en"  # a choice, not the default
    mine = dict(probs)
    assert len(mine) == len(ids) == 100
    np.testing.assert_allclose([mine[ours.tokenizer.language_tokens[i]] for i in ids], theirs, rtol=1e-3, atol=1e-6)
    assert probability == max(mine.values())
    result = transcribe(ours, audio, **NO_FALLBACK, without_timestamps=True)
    assert result.language == language


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], Any]]:
    calls: list[tuple[list[int], Any]] = []
    from pygpukit.asr.decoding import decode_window as real

    def spy(model: Any, enc: Any, prompt: list[int], rules: Any, **kw: Any) -> Any:
        result = real(model, enc, prompt, rules, **kw)
        calls.append((list(prompt), result))
        return result

    monkeypatch.setattr(lf, "decode_window", spy)
    return calls


def test_translate_task_matches_transformers(models: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """task='translate': the forced tokens <|startoftranscript|> <|ja|> <|translate|> <|notimestamps|>
    (transformers' tokenizer prefix and generate), then the same greedy tokens as transformers' generate."""
    import torch

    ours, hf, hf_tok, audio = models
    calls = _spy(monkeypatch)
    transcribe(ours, audio, language="ja", task="translate", without_timestamps=True, **NO_FALLBACK)
    (prompt, result), = calls  # fmt: skip
    hf_tok.set_prefix_tokens(language="ja", task="translate", predict_timestamps=False)
    assert prompt == hf_tok.prefix_tokens == [50258, 50266, 50359, 50364]
    window = torch.from_numpy(_window(ours, audio))[None]
    with torch.no_grad():
        config = _generation_config(ours, do_sample=False, num_beams=1, max_new_tokens=len(result.tokens) + 1)
        out = hf.generate(window, generation_config=config, language="ja", task="translate", return_timestamps=False)
    theirs = out.tolist()[0] if hasattr(out, "tolist") else out["sequences"].tolist()[0]
    theirs = theirs[len(prompt) :] if theirs[: len(prompt)] == prompt else theirs
    if len(result.tokens) == CFG.n_text_ctx // 2:  # our length limit; theirs went one token further
        theirs = theirs[: len(result.tokens)]
    assert [t for t in theirs if t != ours.tokenizer.eot] == result.tokens
    assert len(set(result.tokens)) > 10  # a varied text, not one token repeated


def test_timestamps_with_multilingual_ids(models: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Timestamped greedy decoding (task transcribe, language ja): each of our tokens is the choice of
    Whisper's timestamp rules on transformers' logits for the same prefix; segments from the timestamp
    tokens counted from <|0.00|> = 50365."""
    import torch

    ours, hf, _, audio = models
    calls = _spy(monkeypatch)
    segments = transcribe(ours, audio, language="ja", task="transcribe", **NO_FALLBACK).segments
    prompt, result = calls[0]
    assert prompt == [50258, 50266, 50360]
    tokens = result.tokens
    stamps = [t for t in tokens if t >= 50365]
    assert stamps
    assert stamps[0] - 50365 <= 50
    window = torch.from_numpy(_window(ours, audio))[None]
    with torch.no_grad():
        logits = hf(input_features=window, decoder_input_ids=torch.tensor([prompt + tokens])).logits[0]
    rules = lf.token_rules(ours, (-1,), True, False, 1.0)
    ended = len(tokens) < CFG.n_text_ctx // 2  # stopped by <|endoftext|>, not by the length limit
    for step, token in enumerate(tokens + ([ours.tokenizer.eot] if ended else [])):
        row = logits[len(prompt) - 1 + step].double().numpy()[None].copy()
        assert int(np.argmax(rules.apply(row, [tokens[:step]], step)[0])) == token, step
    # this model's text has one pair of timestamps, then text that the next window would redo: one segment,
    # from the first timestamp to the pair (faster-whisper's rule)
    pairs = [i for i in range(1, len(tokens)) if tokens[i - 1] >= 50365 and tokens[i] >= 50365]
    assert len(pairs) == 1
    assert len(segments) == 1
    assert (segments[0].start, segments[0].end) == pytest.approx(((tokens[0] - 50365) * 0.02,
                                                                  (tokens[pairs[0]] - 50365) * 0.02))  # fmt: skip
    assert segments[0].tokens == tokens[: pairs[0]]
    # transformers' generate with timestamps (its own timestamp rules) ends its first segment at the same
    # pair, with the same tokens
    config = _generation_config(ours, do_sample=False, num_beams=1, max_new_tokens=pairs[0] + 2)
    with torch.no_grad():
        out = hf.generate(window, generation_config=config, language="ja", task="transcribe", return_timestamps=True)
    theirs = out.tolist()[0] if hasattr(out, "tolist") else out["sequences"].tolist()[0]
    assert theirs[: pairs[0] + 1] == tokens[: pairs[0] + 1]
