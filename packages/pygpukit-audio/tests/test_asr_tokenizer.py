"""WhisperTokenizer on tiny.en's tokenizer.json: special tokens, the suppressed set (equal to the
CTranslate2 config's suppress_ids), prompts, decoding with timestamps, and typed errors for bad files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pygpukit.asr import TokenizerError, WhisperTokenizer
from pygpukit.core.errors import ArgumentError


def test_special_tokens_and_suppression(whisper_tiny: Path) -> None:
    tok = WhisperTokenizer(whisper_tiny / "tokenizer.json")
    assert not tok.multilingual
    assert (tok.eot, tok.sot, tok.sot_prev, tok.no_speech, tok.no_timestamps, tok.timestamp_begin) == (
        50256, 50257, 50360, 50361, 50362, 50363)  # fmt: skip
    config = json.loads((whisper_tiny / "config.json").read_text())
    assert list(tok.suppressed_tokens((-1,))) == sorted(config["suppress_ids"])
    assert tok.sot_sequence(None, "transcribe") == [tok.sot]
    ids = tok.encode(" Hello world")
    assert tok.decode([tok.timestamp_begin, *ids, tok.eot]) == " Hello world"
    assert tok.decode_with_timestamps([tok.timestamp_begin, *ids, tok.timestamp_begin + 50]) == (
        "<|0.00|> Hello world<|1.00|>")  # fmt: skip
    with pytest.raises(ArgumentError, match="task"):
        tok.sot_sequence(None, "summarize")
    with pytest.raises(ArgumentError, match="unknown language code 'xx'"):
        tok.language_token("xx")


def test_bad_files(tmp_path: Path, whisper_tiny: Path) -> None:
    with pytest.raises(TokenizerError, match="cannot read"):
        WhisperTokenizer(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(TokenizerError, match=r"not a valid tokenizer\.json"):
        WhisperTokenizer(broken)
    data = json.loads((whisper_tiny / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|notimestamps|>"]
    data["model"]["vocab"].pop("<|notimestamps|>", None)
    stripped = tmp_path / "stripped.json"
    stripped.write_text(json.dumps(data))
    with pytest.raises(TokenizerError, match=re.escape("no <|notimestamps|> token")):
        WhisperTokenizer(stripped)
