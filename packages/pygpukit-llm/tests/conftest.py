"""Shared fixtures of the pygpukit-llm tests: the real SmolLM2 GGUF (skipped when absent), GGUF metadata as a
plain dict, and a small synthetic SentencePiece-style ("llama") vocabulary."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DATA_DIR = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # llm_testing (the tests import in importlib mode)

SMOLLM2_GGUF_ENV = "PYGPUKIT_SMOLLM2_GGUF"
# CI sets this (noxfile's tests session, after `python -m pygpukit models pull`): a missing model fails.
REQUIRE_MODELS_ENV = "PYGPUKIT_REQUIRE_MODELS"


def smollm2_path() -> Path:
    """$PYGPUKIT_SMOLLM2_GGUF, else where the model cache keeps the default model."""
    env = os.environ.get(SMOLLM2_GGUF_ENV)
    if env:
        return Path(env)
    from pygpukit.llm import hub

    source = hub.MODELS[hub.DEFAULT_MODEL]
    return hub.cache_dir() / "models" / source.name / source.filename


# llama.cpp's token types (gguf.TokenType), spelled out so that the synthetic vocabulary reads plainly.
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_BYTE = 6

SPM_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Every key-value field of a GGUF file as plain Python values (str, int, float, bool, lists of those)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue  # the header's own fields (version, counts), not metadata
        out[key] = field.contents()
    return out


def synthetic_spm_metadata(*, with_merges: bool = False) -> dict[str, Any]:
    """GGUF metadata of a tiny SentencePiece-style BPE vocabulary with byte fallback (tokenizer.ggml.model
    "llama"): <unk>/<s>/</s>, the 256 byte tokens, single characters and a few merged pieces with scores.

    Without merges the tokenizer must derive them from the scores, as transformers does for such files."""
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types: list[int] = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL]
    scores: list[float] = [0.0, 0.0, 0.0]
    for byte in range(256):
        tokens.append(f"<0x{byte:02X}>")
        types.append(TOKEN_BYTE)
        scores.append(0.0)
    chars = ["\u2581", *"abcdefghijklmnopqrstuvwxyz", *"HTW", *",.!?'", "\u00e9", "\u4e2d"]
    for i, ch in enumerate(chars):
        tokens.append(ch)
        types.append(TOKEN_NORMAL)
        scores.append(-1000.0 - i)
    # Merged pieces, best (highest score) first; every piece splits into two pieces of the vocabulary.
    pieces = [
        "\u2581t", "he", "\u2581a", "in", "\u2581th", "\u2581the", "er", "\u2581h", "el", "ll", "lo",
        "llo", "ello", "\u2581hello", "\u2581w", "or", "orl", "orld", "\u2581world", "ng", "ing", "\u2581i",
        "\u2581is", "\u2581\u2581", "\u2581\u2581\u2581\u2581", "\u2581H", "\u2581Hello", "\u2581T", "\u2581The",
        "\u2581W", "\u2581World", "\u2581\u4e2d", "\u00e9t", "\u00e9t\u00e9",
    ]  # fmt: skip
    for i, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(TOKEN_NORMAL)
        scores.append(-float(i))
    for special, kind in (("<|im_end|>", TOKEN_CONTROL), ("<think>", TOKEN_USER_DEFINED)):
        tokens.append(special)
        types.append(kind)
        scores.append(0.0)
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "general.name": "synthetic-spm",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": True,
        "tokenizer.chat_template": SPM_CHAT_TEMPLATE,
    }
    if with_merges:
        meta["tokenizer.ggml.merges"] = [_split_piece(p, set(tokens)) for p in pieces]
    return meta


def _split_piece(piece: str, vocab: set[str]) -> str:
    """The merge ("left right") that makes ``piece``: its split with the longest left part in the vocabulary."""
    for cut in range(len(piece) - 1, 0, -1):
        if piece[:cut] in vocab and piece[cut:] in vocab:
            return f"{piece[:cut]} {piece[cut:]}"
    raise AssertionError(f"no split of {piece!r}")


@pytest.fixture(scope="session")
def synthetic_spm() -> Callable[..., dict[str, Any]]:
    """:func:`synthetic_spm_metadata` (call it with ``with_merges=True`` for the variant with merge rules)."""
    return synthetic_spm_metadata


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF: $PYGPUKIT_SMOLLM2_GGUF, else the model cache; skips when absent."""
    path = smollm2_path()
    if not path.is_file():
        reason = f"SmolLM2 GGUF not found at {path} (run `python -m pygpukit models pull` or set {SMOLLM2_GGUF_ENV})"
        if os.environ.get(REQUIRE_MODELS_ENV) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="session")
def smollm2_metadata(smollm2_gguf: Path) -> dict[str, Any]:
    """The SmolLM2 GGUF's metadata as a plain dict (read once per session)."""
    return gguf_metadata(smollm2_gguf)
