"""Tests of pygpukit.llm.tokenizer: GGUF vocabularies (byte-level and SentencePiece) against transformers'
golden outputs, round trips, tokenizer.json loading, and incremental (streaming) decoding."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pygpukit.core.errors import ArgumentError, PyGPUkitError
from pygpukit.llm.tokenizer import StreamDecoder, Tokenizer, TokenizerError

SpmFactory = Callable[..., dict[str, Any]]
DATA_DIR = Path(__file__).resolve().parent / "data"
TOKEN_NORMAL = 1  # llama.cpp token types
TOKEN_CONTROL = 3
CORPUS: list[str] = json.loads((DATA_DIR / "tokenizer_corpus.json").read_text(encoding="utf-8"))
SMOLLM2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<file_sep>", "<empty_output>"]


def _golden(name: str) -> dict[str, Any]:
    """tests/data/tokenizer_golden_<name>.json, written by make_tokenizer_golden.py with transformers."""
    data: dict[str, Any] = json.loads((DATA_DIR / f"tokenizer_golden_{name}.json").read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="module")
def smollm2(smollm2_metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(smollm2_metadata)


@pytest.fixture(scope="module")
def spm(synthetic_spm: SpmFactory) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(synthetic_spm())


@pytest.fixture(scope="module")
def byte_level() -> Tokenizer:
    """A small byte-level vocabulary (every byte, a few merges, ChatML control tokens): needs no model file."""
    return Tokenizer.from_gguf_metadata(_digits_vocab("default"))


@pytest.fixture(params=["byte_level", "spm", "smollm2"])
def any_tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    tok: Tokenizer = request.getfixturevalue(request.param)
    return tok


def _stream(tok: Tokenizer, ids: list[int], **kwargs: Any) -> list[str]:
    decoder = StreamDecoder(tok, **kwargs)
    return [decoder.push(i) for i in ids] + [decoder.flush()]


# -- the corpus -----------------------------------------------------------------------------------------------------


def test_corpus_covers_the_required_kinds_of_text() -> None:
    assert len(CORPUS) >= 200
    assert len(set(CORPUS)) == len(CORPUS)
    assert "" in CORPUS
    assert max(len(s) for s in CORPUS) > 4000
    joined = "".join(CORPUS)
    for probe in ("\u4f60", "\u0645", "\u0928", "\u0301", "\u200d", "\U0001f1ef", "\t", "\r\n", "<|im_end|>", "{\n  "):
        assert probe in joined, probe


# -- SmolLM2 (byte-level BPE from GGUF) -----------------------------------------------------------------------------


def test_smollm2_special_tokens(smollm2: Tokenizer) -> None:
    assert smollm2.vocab_size == len(smollm2) == 49152
    assert (smollm2.bos_token, smollm2.bos_token_id) == ("<|im_start|>", 1)
    assert (smollm2.eos_token, smollm2.eos_token_id) == ("<|im_end|>", 2)
    assert smollm2.pad_token_id == 2
    assert smollm2.unk_token_id == 0
    assert smollm2.eos_token_ids == (2, 0)  # <|im_end|>, then <|endoftext|> as an end-of-document token
    assert smollm2.add_bos_token is False
    assert smollm2.add_eos_token is False
    assert len(smollm2.special_tokens) == 17
    assert all(smollm2.special_tokens[t] == i for i, t in enumerate(SMOLLM2_SPECIALS[:3]))
    assert smollm2.chat_template is not None
    assert smollm2.chat_template.startswith("{% for message in messages %}")
    assert smollm2.token_to_id("<|im_end|>") == 2
    assert smollm2.id_to_token(2) == "<|im_end|>"
    assert smollm2.id_to_token(10**9) is None
    assert smollm2.is_special(0)
    assert not smollm2.is_special(100)


def test_smollm2_matches_transformers_golden(smollm2: Tokenizer) -> None:
    golden = _golden("smollm2")
    encodings = golden["encodings"]
    assert [e["text"] for e in encodings] == CORPUS, "the golden was made from another corpus: regenerate it"
    for e in encodings:
        text = e["text"]
        assert smollm2.encode(text, add_special_tokens=False) == e["ids"], text
        assert smollm2.encode(text) == e["ids_special"], text
        assert smollm2.decode(e["ids"]) == e["decoded"], text
        assert smollm2.decode(e["ids"], skip_special_tokens=True) == e["decoded_skip"], text
    for d in golden["decodes"]:
        assert smollm2.decode(d["ids"]) == d["decoded"], d["ids"]
        assert smollm2.decode(d["ids"], skip_special_tokens=True) == d["decoded_skip"], d["ids"]
        assert [smollm2.id_to_token(i) for i in d["ids"]] == d["tokens"]
    assert golden["len"] == smollm2.vocab_size
    assert golden["chat_template"] == smollm2.chat_template
    assert {int(i): t for i, t in golden["added_tokens"].items()} == {i: t for t, i in smollm2.special_tokens.items()}


def test_smollm2_batch_equals_single(smollm2: Tokenizer) -> None:
    texts = CORPUS[:50]
    assert smollm2.encode_batch(texts) == [smollm2.encode(t) for t in texts]
    assert smollm2.encode_batch(texts, add_special_tokens=False) == [
        smollm2.encode(t, add_special_tokens=False) for t in texts
    ]


@pytest.mark.parametrize("name", ["byte_level", "smollm2"])
def test_byte_level_round_trip(name: str, request: pytest.FixtureRequest) -> None:
    # Byte-level BPE loses nothing: every string comes back exactly, special-token strings included (they encode to
    # their ids and decode to their text). With skip_special_tokens those strings are what disappears.
    tok: Tokenizer = request.getfixturevalue(name)
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text, text
        stripped = text
        for special in tok.special_tokens:
            stripped = stripped.replace(special, "")
        assert tok.decode(ids, skip_special_tokens=True) == stripped, text


def test_byte_level_special_tokens_in_text(smollm2: Tokenizer) -> None:
    assert smollm2.encode("<|im_start|>user\nHi<|im_end|>\n", add_special_tokens=False)[0] == 1
    ids = smollm2.encode("a<|im_end|>b", add_special_tokens=False)
    assert 2 in ids
    # Not a special token: the text of a partial tag is ordinary text.
    assert 2 not in smollm2.encode("<|im_end", add_special_tokens=False)
    assert smollm2.encode("", add_special_tokens=True) == []


# -- SentencePiece-style ("llama") vocabulary from synthetic metadata -----------------------------------------------


def _ids(tok: Tokenizer, *tokens: str) -> list[int]:
    out = [tok.token_to_id(t) for t in tokens]
    assert None not in out, tokens
    return [i for i in out if i is not None]


def test_spm_encodes_pieces_with_space_markers(spm: Tokenizer) -> None:
    assert spm.encode("Hello world", add_special_tokens=False) == _ids(spm, "\u2581Hello", "\u2581world")
    assert spm.encode("the", add_special_tokens=False) == _ids(spm, "\u2581the")
    assert spm.encode("The world is", add_special_tokens=False) == _ids(spm, "\u2581The", "\u2581world", "\u2581is")
    assert spm.encode("\u4e2d", add_special_tokens=False) == _ids(spm, "\u2581\u4e2d")
    assert spm.encode("\u00e9t\u00e9", add_special_tokens=False) == _ids(spm, "\u2581", "\u00e9t\u00e9")


def test_spm_byte_fallback(spm: Tokenizer) -> None:
    # U+20AC is not in the vocabulary: its UTF-8 bytes become <0xE2> <0x82> <0xAC>.
    ids = spm.encode("\u20ac", add_special_tokens=False)
    assert ids == _ids(spm, "\u2581", "<0xE2>", "<0x82>", "<0xAC>")
    assert spm.decode(ids) == "\u20ac"
    assert spm.decode(_ids(spm, "<0x41>", "<0x42>")) == "AB"
    assert spm.decode(_ids(spm, "<0xE2>", "<0x82>")) == "\ufffd\ufffd"  # an incomplete sequence


def test_spm_special_and_added_tokens(spm: Tokenizer) -> None:
    assert (spm.bos_token_id, spm.eos_token_id, spm.unk_token_id, spm.pad_token_id) == (1, 2, 0, None)
    assert spm.add_bos_token is True
    assert spm.encode("Hello") == [1, *spm.encode("Hello", add_special_tokens=False)]
    assert spm.encode("<s>Hello</s>", add_special_tokens=False) == [1, *_ids(spm, "\u2581Hello"), 2]
    assert spm.encode("<unk>", add_special_tokens=False) == [0]
    # A USER_DEFINED token stays whole but is not special; CONTROL tokens are special.
    think = spm.token_to_id("<think>")
    assert think is not None
    assert think in spm.encode("a<think>b", add_special_tokens=False)
    assert not spm.is_special(think)
    assert spm.special_tokens == {"<unk>": 0, "<s>": 1, "</s>": 2, "<|im_end|>": 330}
    assert spm.eos_token_ids == (2, 330)
    assert spm.decode(spm.encode("<s>Hello world</s>"), skip_special_tokens=True) == "Hello world"


def test_spm_decode_strips_only_the_prefix_space(spm: Tokenizer) -> None:
    for text in ("hello", "Hello world", "  hi", "a b  c", "the world.\nis"):
        assert spm.decode(spm.encode(text, add_special_tokens=False)) == text


def test_spm_without_space_prefix(synthetic_spm: SpmFactory) -> None:
    meta = synthetic_spm()
    meta["tokenizer.ggml.add_space_prefix"] = False
    tok = Tokenizer.from_gguf_metadata(meta)
    assert [tok.id_to_token(i) for i in tok.encode("hello", add_special_tokens=False)] == ["he", "llo"]
    assert tok.decode(tok.encode(" hello", add_special_tokens=False)) == " hello"


def test_spm_with_merge_rules(synthetic_spm: SpmFactory) -> None:
    tok = Tokenizer.from_gguf_metadata(synthetic_spm(with_merges=True))
    assert tok.encode("Hello world", add_special_tokens=False) == _ids(tok, "\u2581Hello", "\u2581world")
    # Only the listed merges apply: "\u2581the" is made from "\u2581th" + "e", but "h" + "e" merges first.
    assert tok.encode("the", add_special_tokens=False) == _ids(tok, "\u2581t", "he")


@pytest.mark.parametrize("name", ["synthetic_spm", "synthetic_spm_merges"])
def test_spm_matches_transformers_golden(name: str, synthetic_spm: SpmFactory) -> None:
    golden = _golden(name)
    tok = Tokenizer.from_gguf_metadata(synthetic_spm(with_merges=name.endswith("merges")))
    for e in golden["encodings"]:
        text = e["text"]
        if "<think>" in text:
            # transformers 5.17 does not add USER_DEFINED tokens (5.2x and llama.cpp do): the golden splits them.
            continue
        assert tok.encode(text, add_special_tokens=False) == e["ids"], text
        assert tok.decode(e["ids"]) == e["decoded"], text
        assert tok.decode(e["ids"], skip_special_tokens=True) == e["decoded_skip"], text
    for d in golden["decodes"]:
        assert tok.decode(d["ids"]) == d["decoded"], d["ids"]
        assert tok.decode(d["ids"], skip_special_tokens=True) == d["decoded_skip"], d["ids"]


# -- byte-level split regexes chosen by tokenizer.ggml.pre ----------------------------------------------------------


def _digits_vocab(pre: str) -> dict[str, Any]:
    """A byte-level vocabulary of single bytes plus the merges 1+2, 12+3 and 4+5."""
    from pygpukit.llm.tokenizer import _byte_alphabet

    alphabet = list(_byte_alphabet().values())
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [*specials, *alphabet, "12", "123", "45", "\u0120t", "he", "\u0120the", "\u00f0\u0141"]
    return {
        "general.architecture": "qwen2",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [TOKEN_CONTROL] * len(specials) + [TOKEN_NORMAL] * (len(tokens) - len(specials)),
        "tokenizer.ggml.merges": ["1 2", "12 3", "4 5", "\u0120 t", "h e", "\u0120t he", "\u00f0 \u0141"],
        "tokenizer.ggml.eos_token_id": 2,
    }


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [("default", ["123", "45"]), ("qwen2", ["1", "2", "3", "4", "5"]), ("llama-bpe", ["123", "45"])],
)
def test_byte_level_split_follows_pre(pre: str, pieces: list[str]) -> None:
    tok = Tokenizer.from_gguf_metadata(_digits_vocab(pre))
    assert [tok.id_to_token(i) for i in tok.encode("12345")] == pieces
    assert tok.decode(tok.encode("12345 <|endoftext|>")) == "12345 <|endoftext|>"
    assert tok.eos_token_ids == (2, 0)


def test_byte_level_llama3_splits_digits_in_threes() -> None:
    default = Tokenizer.from_gguf_metadata(_digits_vocab("default"))
    llama3 = Tokenizer.from_gguf_metadata(_digits_vocab("llama-bpe"))
    # GPT-2's regex keeps a run of digits together; Llama 3's cuts it into groups of at most three.
    assert [default.id_to_token(i) for i in default.encode("4512")] == ["45", "12"]
    assert [llama3.id_to_token(i) for i in llama3.encode("4512")] == ["45", "1", "2"]


# -- errors ---------------------------------------------------------------------------------------------------------


def test_gguf_errors(synthetic_spm: SpmFactory) -> None:
    meta = synthetic_spm()
    with pytest.raises(TokenizerError, match=r"unsupported GGUF tokenizer\.ggml\.model 't5'"):
        Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.model": "t5"})
    with pytest.raises(TokenizerError, match=r"no tokenizer\.ggml\.tokens"):
        Tokenizer.from_gguf_metadata({k: v for k, v in meta.items() if k != "tokenizer.ggml.tokens"})
    with pytest.raises(TokenizerError, match="scores or merges"):
        Tokenizer.from_gguf_metadata({k: v for k, v in meta.items() if k != "tokenizer.ggml.scores"})
    with pytest.raises(TokenizerError, match=r"needs tokenizer\.ggml\.merges"):
        Tokenizer.from_gguf_metadata({**_digits_vocab("default"), "tokenizer.ggml.merges": None})
    with pytest.raises(ArgumentError):
        Tokenizer.from_gguf_metadata([])  # type: ignore[arg-type]
    # An out-of-range special id means "no such token", as in llama.cpp.
    tok = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.padding_token_id": 2**32 - 1})
    assert tok.pad_token_id is None
    assert issubclass(TokenizerError, PyGPUkitError)


def test_argument_errors(spm: Tokenizer) -> None:
    with pytest.raises(ArgumentError):
        spm.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError):
        spm.encode_batch("not a list")
    with pytest.raises(ArgumentError):
        spm.decode("abc")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError):
        spm.decode([-1])
    with pytest.raises(ArgumentError):
        StreamDecoder(object())  # type: ignore[arg-type]
    with pytest.raises(ArgumentError):
        StreamDecoder(spm).push(-3)


# -- tokenizer.json / Hugging Face directories ----------------------------------------------------------------------


def _write_hf_dir(tmp_path: Path, tok: Tokenizer, **files: Any) -> Path:
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    for name, content in files.items():
        filename = name.replace("__", ".")
        text = content if isinstance(content, str) else json.dumps(content)
        (tmp_path / filename).write_text(text, encoding="utf-8")
    return tmp_path


def test_from_pretrained_reads_config_files(tmp_path: Path, synthetic_spm: SpmFactory) -> None:
    base = Tokenizer.from_gguf_metadata(synthetic_spm())
    base.backend.post_processor = None  # as a tokenizer.json without a post-processor
    directory = _write_hf_dir(
        tmp_path,
        base,
        tokenizer_config__json={
            "bos_token": {"content": "<s>", "special": True},
            "eos_token": "</s>",
            "add_bos_token": True,
            "chat_template": "{{ bos_token }}{{ messages[0]['content'] }}",
            "added_tokens_decoder": {"332": {"content": "<extra>", "special": True, "normalized": False}},
        },
        special_tokens_map__json={"unk_token": "<unk>", "eos_token": "<unk>"},
        generation_config__json={"eos_token_id": [2, 330]},
    )
    tok = Tokenizer.from_pretrained(directory)
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (1, 2, 0)  # the config's eos wins
    assert tok.add_bos_token is True
    assert tok.encode("hello")[0] == 1
    assert tok.chat_template == "{{ bos_token }}{{ messages[0]['content'] }}"
    assert tok.special_tokens["<extra>"] == 332
    assert tok.encode("<extra>", add_special_tokens=False) == [332]
    assert tok.eos_token_ids == (2, 330)

    (directory / "chat_template.jinja").write_text("JINJA", encoding="utf-8")
    assert Tokenizer.from_pretrained(directory).chat_template == "JINJA"


def test_from_file_keeps_the_backend_post_processor(tmp_path: Path, synthetic_spm: SpmFactory) -> None:
    base = Tokenizer.from_gguf_metadata(synthetic_spm())  # its post-processor adds <s>
    directory = _write_hf_dir(tmp_path, base)
    plain = Tokenizer.from_file(directory / "tokenizer.json", {"bos_token": "<s>", "eos_token": "</s>"})
    assert plain.add_bos_token is True
    assert plain.encode("hi")[0] == 1
    # A config that states the flags overrides the post-processor, as in transformers.
    off = Tokenizer.from_file(directory / "tokenizer.json", {"bos_token": "<s>", "add_bos_token": False})
    assert off.add_bos_token is False
    assert off.encode("hi") == off.encode("hi", add_special_tokens=False)
    both = Tokenizer.from_file(
        directory / "tokenizer.json",
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "add_eos_token": True},
    )
    assert (both.add_bos_token, both.add_eos_token) == (True, True)
    assert both.encode("hi")[0] == 1
    assert both.encode("hi")[-1] == 2


def test_bos_and_eos_holding_a_colon_or_a_space(tmp_path: Path, synthetic_spm: SpmFactory) -> None:
    """The BOS/EOS post-processor works for any token text (a template piece cannot hold ":" or " ")."""
    base = Tokenizer.from_gguf_metadata(synthetic_spm())
    base.backend.post_processor = None
    base.backend.add_special_tokens(["<|im:start|>", "<end of: text>"])
    directory = _write_hf_dir(tmp_path, base)
    config = {"bos_token": "<|im:start|>", "eos_token": "<end of: text>", "add_bos_token": True, "add_eos_token": True}
    tok = Tokenizer.from_file(directory / "tokenizer.json", config)
    bos, eos = tok.backend.token_to_id("<|im:start|>"), tok.backend.token_to_id("<end of: text>")
    assert (tok.bos_token_id, tok.eos_token_id) == (bos, eos)
    assert (tok.add_bos_token, tok.add_eos_token) == (True, True)
    plain = tok.encode("hi", add_special_tokens=False)
    assert tok.encode("hi") == [bos, *plain, eos]
    assert tok.backend.encode("hi").tokens[0] == "<|im:start|>"
    assert tok.encode_batch(["hi", "a"]) == [[bos, *plain, eos], [bos, *tok.encode("a", add_special_tokens=False), eos]]
    same = Tokenizer.from_file(directory / "tokenizer.json", {**config, "eos_token": "<|im:start|>"})  # eos == bos
    assert same.encode("hi") == [bos, *plain, bos]


def test_named_chat_templates(tmp_path: Path, synthetic_spm: SpmFactory) -> None:
    base = Tokenizer.from_gguf_metadata(synthetic_spm())
    templates = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
    directory = _write_hf_dir(tmp_path, base, tokenizer_config__json={"chat_template": templates})
    tok = Tokenizer.from_pretrained(directory)
    assert tok.chat_template == "D"
    assert tok.chat_templates == {"default": "D", "tool_use": "T"}


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.from_file(tmp_path / "missing.json")
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="cannot load"):
        Tokenizer.from_pretrained(tmp_path)


# -- streaming ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_stream_pieces_concatenate_to_decode(smollm2: Tokenizer, spm: Tokenizer, skip_special_tokens: bool) -> None:
    for tok in (smollm2, spm):
        for text in CORPUS:
            ids = tok.encode(text)
            pieces = _stream(tok, ids, skip_special_tokens=skip_special_tokens)
            full = tok.decode(ids, skip_special_tokens=skip_special_tokens)
            assert "".join(pieces) == full, text
            if "\ufffd" not in full:
                assert not any("\ufffd" in p for p in pieces), (text, pieces)


def test_stream_random_ids(any_tokenizer: Tokenizer) -> None:
    # Random ids include broken UTF-8 (lone continuation bytes, cut sequences, invalid byte-fallback runs).
    tok = any_tokenizer
    rng = random.Random(7)
    for _ in range(150):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 40))]
        for skip in (True, False):
            assert "".join(_stream(tok, ids, skip_special_tokens=skip)) == tok.decode(ids, skip)


def test_stream_holds_back_split_characters(any_tokenizer: Tokenizer) -> None:
    tok = any_tokenizer
    text = "ok \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f1ef\U0001f1f5!"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) > 8  # the emoji take several tokens each
    pieces = _stream(tok, ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert "" in pieces  # something was held back


def test_stream_keeps_sentencepiece_spaces(spm: Tokenizer) -> None:
    ids = spm.encode("Hello world the world", add_special_tokens=False)
    assert _stream(spm, ids)[:4] == ["Hello", " world", " the", " world"]
    # Special tokens in between are skipped without losing the next word's space.
    with_special = [ids[0], spm.eos_token_id, spm.eos_token_id, ids[1]]
    assert "".join(_stream(spm, with_special)) == "Hello world"
    assert "".join(_stream(spm, with_special, skip_special_tokens=False)) == "Hello</s></s> world"


def test_stream_with_prompt_ids(any_tokenizer: Tokenizer) -> None:
    tok = any_tokenizer
    ids = tok.encode("Hello world, the world is \u4e2d \U0001f600 ok", add_special_tokens=False)
    full = tok.decode(ids)
    for cut in range(1, len(ids)):
        prompt_text = tok.decode(ids[:cut])
        if prompt_text.endswith("\ufffd"):
            continue  # the prompt ends inside a character: no clean continuation exists
        out = "".join(_stream(tok, ids[cut:], prompt_ids=ids[:cut]))
        assert out == full[len(prompt_text) :], cut


def test_stream_window_is_bounded(any_tokenizer: Tokenizer) -> None:
    tok = any_tokenizer
    ids = tok.encode(CORPUS[-2] * 3, add_special_tokens=False)
    decoder = StreamDecoder(tok)
    out = []
    longest = 0
    for i in ids:
        out.append(decoder.push(i))
        longest = max(longest, len(decoder._context) + len(decoder._pending))
    out.append(decoder.flush())
    assert "".join(out) == tok.decode(ids)
    assert len(ids) > 1000
    assert longest <= 4 + 16  # the context plus at most one held-back byte run


def test_stream_flush_emits_incomplete_bytes(any_tokenizer: Tokenizer) -> None:
    tok = any_tokenizer
    ids = tok.encode("\U0001f600", add_special_tokens=False)
    decoder = StreamDecoder(tok)
    assert [decoder.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert decoder.flush() == tok.decode(ids[:-1])
    assert decoder.flush() == ""
