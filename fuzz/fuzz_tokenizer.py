"""Fuzz target: the tokenizer files of a checkpoint directory (pygpukit.llm.tokenizer,
``Tokenizer.from_pretrained``): ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``,
``generation_config.json``, ``chat_template.json`` and ``chat_template.jinja``.

Contract: any content of any one of those files (the others valid) gives a tokenizer that encodes and
decodes, or TokenizerError. The first input byte chooses the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import instrumented, main, scratch_dir

with instrumented("pygpukit.llm.tokenizer"):
    from pygpukit.llm.tokenizer import Tokenizer, TokenizerError

ERRORS = (TokenizerError,)
_DIR = scratch_dir("tokenizer")
_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
          "chat_template.json", "chat_template.jinja")  # fmt: skip


def _valid() -> dict[str, bytes]:
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, "a": 3, "b": 4, "ab": 5, "\u0120": 6, "\u0120a": 7, "c": 8}
    backend = Backend(models.BPE(vocab=vocab, merges=[("a", "b"), ("\u0120", "a")], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    config = {
        "bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}, "unk_token": "<unk>",
        "add_bos_token": True, "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "added_tokens_decoder": {"9": {"content": "<|im_end|>", "special": True}, "10": {"content": "<x>"}},
        "clean_up_tokenization_spaces": True,
    }  # fmt: skip
    return {
        "tokenizer.json": backend.to_str().encode(),
        "tokenizer_config.json": json.dumps(config).encode(),
        "special_tokens_map.json": json.dumps({"pad_token": "<unk>"}).encode(),
        "generation_config.json": json.dumps({"eos_token_id": [1, 9]}).encode(),
        "chat_template.json": json.dumps({"chat_template": [{"name": "default", "template": "{{ 1 }}"}]}).encode(),
        "chat_template.jinja": "{{ messages[0]['content'] }}\u00e9".encode(),
    }


_VALID = _valid()


def seeds() -> list[bytes]:
    return [bytes([i]) + _VALID[name] for i, name in enumerate(_FILES)] + [b"\x01" + b"[" * 5000]


def one_input(data: bytes) -> None:
    if not data:
        return
    chosen = _FILES[data[0] % len(_FILES)]
    for name in _FILES:
        if name == "chat_template.jinja" and chosen != name:  # it overrides chat_template.json: only when fuzzed
            (_DIR / name).unlink(missing_ok=True)
        else:
            (_DIR / name).write_bytes(data[1:] if name == chosen else _VALID[name])
    try:
        tokenizer = Tokenizer.from_pretrained(_DIR)
    except TokenizerError:
        return
    ids = tokenizer.encode("ab a<|im_end|>c")
    assert all(isinstance(i, int) for i in ids)
    tokenizer.decode(ids, skip_special_tokens=True)
    assert len(tokenizer) == tokenizer.vocab_size


if __name__ == "__main__":
    main("tokenizer", one_input, seeds)
