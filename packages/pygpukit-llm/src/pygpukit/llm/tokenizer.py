"""Tokenizers for pygpukit.llm: a typed wrapper around a Hugging Face ``tokenizers.Tokenizer``.

A :class:`Tokenizer` comes from a ``tokenizer.json`` (with the ``tokenizer_config.json`` beside it) or from the
tokenizer metadata of a GGUF file. For GGUF files the vocabulary is turned into a ``tokenizers`` pipeline the way
transformers does it when loading ``AutoTokenizer.from_pretrained(dir, gguf_file=...)``, so the token ids agree
with transformers (and with llama.cpp) for the same file:

* ``tokenizer.ggml.model == "gpt2"``: byte-level BPE. The split regex is chosen from ``tokenizer.ggml.pre``
  (Llama 3, Qwen 2, GPT-4o families); other values use GPT-2's byte-level regex.
* ``tokenizer.ggml.model == "llama"``: SentencePiece-style BPE with byte fallback. Spaces become ``U+2581`` and,
  when ``tokenizer.ggml.add_space_prefix`` is true (the default), one is prepended to each run of text. Merges are
  taken from the file or derived from the token scores. Gemma files get their own spelling of space tokens.

:class:`StreamDecoder` turns generated token ids into text incrementally without ever emitting half of a UTF-8
sequence.

The module is over 600 lines because the two GGUF vocabulary builders, the tokenizer.json path and the
stream decoder share the byte-level and SentencePiece spelling rules.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _BackendTokenizer

from pygpukit.core.errors import ArgumentError, PyGPUkitError

__all__ = ["END_OF_TURN_TOKENS", "StreamDecoder", "Tokenizer", "TokenizerError"]


class TokenizerError(PyGPUkitError, ValueError):
    """A tokenizer could not be built: missing or malformed files, or a GGUF vocabulary of an unsupported kind."""


# Tokens that end a turn or a document in common chat models. When one of them is a special token of the
# vocabulary it joins ``Tokenizer.eos_token_ids``, so generation stops on it even where the configured eos differs
# (SmolLM2 and Qwen name <|im_end|> as eos but base-model text ends in <|endoftext|>; Llama 3 ends turns in
# <|eot_id|> while its eos is <|end_of_text|>).
END_OF_TURN_TOKENS: tuple[str, ...] = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|end|>",
)

_SPACE_MARK = "\u2581"  # SentencePiece's visible space

# llama.cpp's token types (tokenizer.ggml.token_type).
_TYPE_CONTROL = 3
_TYPE_USER_DEFINED = 4

# Split regexes of byte-level vocabularies, by the GGUF's tokenizer.ggml.pre. They are the pre-tokenizer patterns
# that the models' own tokenizer.json files use; a vocabulary is only right with the split its merges were
# learned on (the default GPT-2 regex splits digits and contractions differently).
_SPLIT_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS: dict[str, str] = {
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "dbrx",
            "smaug-bpe",
        ),
        _SPLIT_LLAMA3,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _SPLIT_QWEN2),
    "qwen35": _SPLIT_QWEN35,
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), _SPLIT_GPT4O),
    "tekken": _SPLIT_TEKKEN,
}

# Architectures whose SentencePiece vocabularies follow Gemma's conventions (raw-space tokens, no prefix space,
# merge priority given by the order of the tokens rather than by their scores).
_GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible spelling of bytes as printable characters (the alphabet of byte-level vocabularies).

    Bytes that are printable Latin-1 characters stand for themselves; every other byte takes the next unused code
    point from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    spelling = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def _as_token_string(value: Any) -> str | None:
    """A special token as configured: a string, or an AddedToken-like dict with ``content``."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TokenizerError(f"cannot read a special token from {value!r}: expected a string or {{'content': ...}}")


def _int_list(value: Any) -> list[int]:
    """``None``, an int or a list of ints as a list."""
    if value is None:
        return []
    if isinstance(value, bool):
        raise TokenizerError(f"expected a token id or a list of them, got {value!r}")
    if isinstance(value, int):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(v, int) for v in value):
        return [int(v) for v in value]
    raise TokenizerError(f"expected a token id or a list of them, got {value!r}")


def _split_merge(merge: str) -> tuple[str, str]:
    """One GGUF merge rule "left right" as a pair. The separator is the first space after the first character,
    so a left part that starts with a space still parses."""
    cut = merge.find(" ", 1)
    if cut < 0:
        raise TokenizerError(f"malformed merge rule {merge!r}: expected 'left right'")
    return merge[:cut], merge[cut + 1 :]


def _merges_from_scores(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a scored vocabulary without merge rules (SentencePiece BPE files).

    Every way of cutting a token into two tokens of the vocabulary is a merge that produces it, ranked by the
    produced token's score (higher first). Cuts of one token are ordered by the ids of their parts; equal scores
    keep longer left parts, then longer right parts, first. This is the order transformers derives, and with it
    BPE reproduces SentencePiece's highest-score-first merging."""
    if len(scores) != len(tokens):
        raise TokenizerError(f"{len(tokens)} tokens but {len(scores)} scores")
    ids: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        ids[tok] = i
    score_of: dict[str, float] = {}
    for tok, score in zip(tokens, scores, strict=True):
        score_of[tok] = float(score)
    candidates: list[tuple[float, int, int, str, str]] = []
    for piece, score in score_of.items():
        cuts = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in ids and piece[k:] in ids]
        cuts.sort(key=lambda cut: (ids[cut[0]], ids[cut[1]]))
        candidates.extend((score, len(left), len(right), left, right) for left, right in cuts)
    # sorted() is stable also with reverse=True, so ties keep the order built above.
    candidates.sort(key=lambda c: (c[0], c[1], c[2]), reverse=True)
    return [(c[3], c[4]) for c in candidates]


class Tokenizer:
    """A text tokenizer: encodes text to token ids and decodes ids back, with the model's special tokens.

    Build one with :meth:`from_pretrained` (a Hugging Face model directory), :meth:`from_file` (a
    ``tokenizer.json``) or :meth:`from_gguf_metadata` (the metadata of a GGUF file). ``backend`` is the wrapped
    ``tokenizers.Tokenizer``.
    """

    def __init__(
        self,
        backend: _BackendTokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        add_bos_token: bool | None = None,
        add_eos_token: bool | None = None,
        chat_template: str | None = None,
        chat_templates: Mapping[str, str] | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        clean_up_tokenization_spaces: bool = False,
    ) -> None:
        """Wrap ``backend``.

        ``add_bos_token`` / ``add_eos_token``: when either is given, the backend's post-processor is replaced by
        one that adds exactly those tokens (as transformers does when a config states them); when both are None
        the backend's own post-processor stays and the flags are read off what it does.
        ``extra_eos_token_ids``: further ids that end generation (e.g. a generation config's eos list).
        """
        if not isinstance(backend, _BackendTokenizer):
            raise ArgumentError(f"backend must be a tokenizers.Tokenizer, got {type(backend).__name__}")
        self.backend: _BackendTokenizer = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.pad_token = pad_token
        self.unk_token = unk_token
        self.bos_token_id: int | None = self._id_of(bos_token)
        self.eos_token_id: int | None = self._id_of(eos_token)
        self.pad_token_id: int | None = self._id_of(pad_token)
        self.unk_token_id: int | None = self._id_of(unk_token)
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self.chat_templates: dict[str, str] = dict(chat_templates or {})
        self.chat_template: str | None = chat_template
        if chat_template is None and "default" in self.chat_templates:
            self.chat_template = self.chat_templates["default"]

        if add_bos_token is not None or add_eos_token is not None:
            self._set_post_processor(bool(add_bos_token), bool(add_eos_token))
        self.add_bos_token, self.add_eos_token = self._probe_added_specials()

        self.special_tokens: dict[str, int] = {
            str(tok.content): int(i) for i, tok in sorted(backend.get_added_tokens_decoder().items()) if tok.special
        }
        self._special_ids = frozenset(self.special_tokens.values())
        self._byte_ids: frozenset[int] | None = None
        eos_ids: list[int] = []
        for i in [
            *([] if self.eos_token_id is None else [self.eos_token_id]),
            *extra_eos_token_ids,
            *(self.special_tokens[t] for t in END_OF_TURN_TOKENS if t in self.special_tokens),
        ]:
            if int(i) not in eos_ids:
                eos_ids.append(int(i))
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)

    # -- construction -------------------------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], config: Mapping[str, Any] | None = None) -> Tokenizer:
        """Load a ``tokenizer.json``. ``config`` is the model's ``tokenizer_config.json`` as a mapping (special
        tokens, ``add_bos_token``, ``chat_template`` ...); it may also hold ``eos_token_id`` (an id or a list, as in
        ``generation_config.json``), whose ids join :attr:`eos_token_ids`."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise TokenizerError(f"tokenizer file not found: {path}")
        try:
            backend = _BackendTokenizer.from_file(path)
        except Exception as exc:  # the Rust side raises plain Exception on malformed JSON
            raise TokenizerError(f"cannot load {path}: {exc}") from exc
        try:
            return cls._from_backend_and_config(backend, dict(config or {}))
        except PyGPUkitError:
            raise
        except Exception as exc:  # a config value of the wrong type, or the Rust side refusing an added token
            raise TokenizerError(f"cannot load {path} with its config: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str]) -> Tokenizer:
        """Load the tokenizer of a Hugging Face model directory: ``tokenizer.json`` plus, where present,
        ``tokenizer_config.json``, ``special_tokens_map.json`` (fills special tokens the config leaves out),
        ``chat_template.jinja`` / ``chat_template.json`` (the chat template, overriding the config's) and the
        ``eos_token_id`` list of ``generation_config.json`` (extra stop ids in :attr:`eos_token_ids`)."""
        directory = os.fspath(directory)
        if not os.path.isdir(directory):
            raise TokenizerError(f"not a directory: {directory}")
        tokenizer_json = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(tokenizer_json):
            raise TokenizerError(f"{directory} has no tokenizer.json")
        config = _read_json(os.path.join(directory, "tokenizer_config.json")) or {}
        special_map = _read_json(os.path.join(directory, "special_tokens_map.json")) or {}
        for key, value in special_map.items():
            if config.get(key) is None:
                config[key] = value
        jinja_path = os.path.join(directory, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            try:
                with open(jinja_path, encoding="utf-8") as f:
                    config["chat_template"] = f.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise TokenizerError(f"cannot read {jinja_path}: {exc}") from exc
        else:
            template_json = _read_json(os.path.join(directory, "chat_template.json"))
            if template_json and "chat_template" in template_json:
                config["chat_template"] = template_json["chat_template"]
        generation = _read_json(os.path.join(directory, "generation_config.json")) or {}
        if "eos_token_id" in generation:
            config["eos_token_id"] = generation["eos_token_id"]
        return cls.from_file(tokenizer_json, config)

    @classmethod
    def _from_backend_and_config(cls, backend: _BackendTokenizer, config: dict[str, Any]) -> Tokenizer:
        # Tokens the config declares but the tokenizer.json lacks are added, as transformers does.
        added = config.get("added_tokens_decoder") or {}
        if not isinstance(added, Mapping):
            raise TokenizerError("tokenizer_config.json: added_tokens_decoder must be an object")
        for _, spec in sorted(added.items(), key=lambda item: int(item[0])):
            if not isinstance(spec, Mapping) or not isinstance(spec.get("content"), str):
                raise TokenizerError(f"tokenizer_config.json: malformed added token {spec!r}")
            if backend.token_to_id(spec["content"]) is None:
                token = AddedToken(
                    spec["content"],
                    single_word=bool(spec.get("single_word", False)),
                    lstrip=bool(spec.get("lstrip", False)),
                    rstrip=bool(spec.get("rstrip", False)),
                    normalized=bool(spec.get("normalized", not spec.get("special", False))),
                    special=bool(spec.get("special", False)),
                )
                if token.special:
                    backend.add_special_tokens([token])
                else:
                    backend.add_tokens([token])

        chat_template: str | None = None
        chat_templates: dict[str, str] = {}
        raw_template = config.get("chat_template")
        if isinstance(raw_template, str):
            chat_template = raw_template
        elif isinstance(raw_template, Sequence):
            # Several named templates: [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
            for entry in raw_template:
                if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                    chat_templates[entry["name"]] = str(entry.get("template", ""))
        elif raw_template is not None:
            raise TokenizerError(f"chat_template must be a string or a list of named templates, got {raw_template!r}")

        def flag(name: str) -> bool | None:
            value = config.get(name)
            return None if value is None else bool(value)

        return cls(
            backend,
            bos_token=_as_token_string(config.get("bos_token")),
            eos_token=_as_token_string(config.get("eos_token")),
            pad_token=_as_token_string(config.get("pad_token")),
            unk_token=_as_token_string(config.get("unk_token")),
            add_bos_token=flag("add_bos_token"),
            add_eos_token=flag("add_eos_token"),
            chat_template=chat_template,
            chat_templates=chat_templates,
            extra_eos_token_ids=_int_list(config.get("eos_token_id")),
            clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
        )

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build the tokenizer a GGUF file describes from its metadata (GGUF key -> Python value).

        Uses ``tokenizer.ggml.*`` (model, pre, tokens, token_type, scores, merges, special token ids, add_bos_token,
        add_eos_token, add_space_prefix, eot/eom ids), ``tokenizer.chat_template`` and ``general.architecture``.
        Tokens typed CONTROL become special tokens and USER_DEFINED ones plain added tokens, so that both are
        matched whole in text. A vocabulary the tokenizers library refuses raises :class:`TokenizerError`."""
        try:
            return cls._from_gguf_metadata(metadata)
        except PyGPUkitError:
            raise
        except Exception as exc:  # the Rust side raises plain Exception / ValueError (a merge of unknown tokens)
            raise TokenizerError(f"cannot build the GGUF tokenizer: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def _from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        if not isinstance(metadata, Mapping):
            raise ArgumentError(f"metadata must be a mapping, got {type(metadata).__name__}")
        kind = metadata.get("tokenizer.ggml.model")
        raw_tokens = metadata.get("tokenizer.ggml.tokens")
        if not isinstance(raw_tokens, Sequence) or isinstance(raw_tokens, str) or not raw_tokens:
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens list")
        tokens: list[str] = [str(t) for t in raw_tokens]
        token_types = list(metadata.get("tokenizer.ggml.token_type") or [])
        architecture = str(metadata.get("general.architecture", ""))

        def token_at(key: str) -> str | None:
            value = metadata.get(key)
            # Absent or out of range (converters write -1 or 2**32-1 for "none"): no such token, as in llama.cpp.
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(tokens):
                return None
            return tokens[value]

        if kind == "gpt2":
            backend = _byte_level_backend(tokens, metadata)
            default_add_bos = False
        elif kind == "llama":
            if architecture in _GEMMA_ARCHITECTURES:
                backend = _gemma_backend(tokens, metadata)
            else:
                backend = _sentencepiece_backend(tokens, metadata)
            # llama.cpp adds BOS to SentencePiece vocabularies whose file does not say otherwise.
            default_add_bos = True
        else:
            raise TokenizerError(
                f"unsupported GGUF tokenizer.ggml.model {kind!r}: supported are 'gpt2' (byte-level BPE) and "
                "'llama' (SentencePiece BPE)"
            )

        specials = {
            name: token_at(f"tokenizer.ggml.{key}")
            for name, key in (
                ("bos", "bos_token_id"),
                ("eos", "eos_token_id"),
                ("unk", "unknown_token_id"),
                ("pad", "padding_token_id"),
            )
        }
        _add_gguf_tokens(backend, tokens, token_types, byte_level=kind == "gpt2", named=specials.values())

        extra_eos = [
            int(metadata[key])
            for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
            if isinstance(metadata.get(key), int) and 0 <= int(metadata[key]) < len(tokens)
        ]
        add_bos = metadata.get("tokenizer.ggml.add_bos_token")
        add_eos = metadata.get("tokenizer.ggml.add_eos_token")
        template = metadata.get("tokenizer.chat_template")
        return cls(
            backend,
            bos_token=specials["bos"],
            eos_token=specials["eos"],
            pad_token=specials["pad"],
            unk_token=specials["unk"],
            add_bos_token=default_add_bos if add_bos is None else bool(add_bos),
            add_eos_token=False if add_eos is None else bool(add_eos),
            chat_template=template if isinstance(template, str) else None,
            extra_eos_token_ids=extra_eos,
        )

    # -- properties ---------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (``len(tokenizer)`` in transformers)."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, eos={self.eos_token!r}, "
            f"add_bos_token={self.add_bos_token}, chat_template={'yes' if self.chat_template else 'no'})"
        )

    # -- encoding and decoding ----------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. ``add_special_tokens`` adds BOS/EOS as the tokenizer is configured to; special
        tokens written in the text (``<|im_end|>``) are always recognised."""
        if not isinstance(text, str):
            raise ArgumentError(f"text must be a str, got {type(text).__name__}")
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """:meth:`encode` for several texts (encoded in parallel by the backend)."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ArgumentError("texts must be a sequence of str")
        return [list(e.ids) for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``. Bytes that do not form complete UTF-8 characters decode to U+FFFD."""
        id_list = self._check_ids(ids)
        text = str(self.backend.decode(id_list, skip_special_tokens=skip_special_tokens))
        if self.clean_up_tokenization_spaces and not isinstance(self.backend.model, models.BPE):
            # transformers applies this WordPiece-era clean-up only to non-BPE models (it would corrupt BPE text).
            text = _clean_up_spaces(text)
        return text

    def token_to_id(self, token: str) -> int | None:
        """Id of ``token`` (a vocabulary or added token), or None."""
        value = self.backend.token_to_id(token)
        return None if value is None else int(value)

    def id_to_token(self, token_id: int) -> str | None:
        """The token string of ``token_id`` (in the vocabulary's own spelling), or None if out of range."""
        value = self.backend.id_to_token(int(token_id))
        return None if value is None else str(value)

    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is a special token (skipped by ``skip_special_tokens=True``)."""
        return token_id in self._special_ids

    # -- helpers ------------------------------------------------------------------------------------------------

    def _fallback_byte_ids(self) -> frozenset[int]:
        """Ids of the byte-fallback tokens ``<0x00>``..``<0xFF>`` (empty unless the model falls back to bytes)."""
        if self._byte_ids is None:
            ids: set[int] = set()
            if getattr(self.backend.model, "byte_fallback", False):
                for token, i in self.backend.get_vocab(with_added_tokens=False).items():
                    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                        ids.add(int(i))
            self._byte_ids = frozenset(ids)
        return self._byte_ids

    def _id_of(self, token: str | None) -> int | None:
        if token is None:
            return None
        value = self.backend.token_to_id(token)
        return None if value is None else int(value)

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        if isinstance(ids, (str, bytes)):
            raise ArgumentError("ids must be an iterable of int")
        out = [int(i) for i in ids]
        if any(i < 0 for i in out):
            raise ArgumentError("token ids must be non-negative")
        return out

    def _set_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        """Install a post-processor adding BOS/EOS (transformers' rule: a flag without its token is ignored)."""
        bos, eos = self.bos_token, self.eos_token
        add_bos = add_bos and bos is not None and self.bos_token_id is not None
        add_eos = add_eos and eos is not None and self.eos_token_id is not None
        # The template names the tokens by the keys BOS and EOS, mapped to their ids and strings below: a
        # template piece is "name:type_id", which a token holding ":" or a space (<|im:start|>) cannot be.
        single = " ".join([*(["BOS:0"] if add_bos else []), "$A:0", *(["EOS:0"] if add_eos else [])])
        pair = " ".join([single, *(["BOS:1"] if add_bos else []), "$B:1", *(["EOS:1"] if add_eos else [])])
        special: list[dict[str, Any]] = []
        if add_bos and bos is not None and self.bos_token_id is not None:
            special.append({"id": "BOS", "ids": [self.bos_token_id], "tokens": [bos]})
        if add_eos and eos is not None and self.eos_token_id is not None:
            special.append({"id": "EOS", "ids": [self.eos_token_id], "tokens": [eos]})
        self.backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)

    def _probe_added_specials(self) -> tuple[bool, bool]:
        """(adds BOS, adds EOS) as observed on a probe text: the post-processor may come from a tokenizer.json."""
        plain = self.backend.encode("a", add_special_tokens=False).ids
        full = self.backend.encode("a", add_special_tokens=True).ids
        if len(full) <= len(plain):
            return False, False
        n = len(plain)
        adds_bos = self.bos_token_id is not None and full[0] == self.bos_token_id and full[1 : 1 + n] == plain
        adds_eos = self.eos_token_id is not None and full[-1] == self.eos_token_id and full[-1 - n : -1] == plain
        return adds_bos, adds_eos


def _read_json(path: str) -> dict[str, Any] | None:
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
        raise TokenizerError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return data


def _clean_up_spaces(text: str) -> str:
    """Remove the spaces WordPiece decoding leaves before punctuation and inside English contractions."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


def _gguf_merges(metadata: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None:
        return None
    if isinstance(merges, str) or not isinstance(merges, Sequence):
        raise TokenizerError("tokenizer.ggml.merges must be a list of strings")
    return [_split_merge(str(m)) for m in merges]


def _byte_level_backend(tokens: list[str], metadata: Mapping[str, Any]) -> _BackendTokenizer:
    """Byte-level BPE (GPT-2 style) from a GGUF vocabulary."""
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        # A token outside the byte alphabet (a mislabelled added token) is respelled from its UTF-8 bytes so the
        # model's vocabulary stays byte-level.
        key = tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8"))
        vocab[key] = i
    merges = _gguf_merges(metadata)
    if merges is None:
        raise TokenizerError("a byte-level (gpt2) GGUF vocabulary needs tokenizer.ggml.merges")
    backend = _BackendTokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    split = _PRE_SPLITS.get(str(metadata.get("tokenizer.ggml.pre", "")))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_backend(tokens: list[str], metadata: Mapping[str, Any]) -> _BackendTokenizer:
    """SentencePiece-style BPE with byte fallback (Llama 1/2, Mistral, Phi-3 ...) from a GGUF vocabulary.

    Spaces are written as U+2581 by the normalizer, which also prepends one to every run of text when the file's
    add_space_prefix is true (default): after a special token too, as llama.cpp and the original Llama
    tokenizer.json do."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = _gguf_merges(metadata)
    if merges is None:
        scores = metadata.get("tokenizer.ggml.scores")
        if scores is None:
            raise TokenizerError("a SentencePiece (llama) GGUF vocabulary needs tokenizer.ggml.scores or merges")
        merges = _merges_from_scores(tokens, list(scores))
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    backend = _BackendTokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True, dropout=None)
    )
    add_prefix = metadata.get("tokenizer.ggml.add_space_prefix")
    add_prefix = True if add_prefix is None else bool(add_prefix)
    steps: list[normalizers.Normalizer] = []
    if add_prefix:
        steps.append(normalizers.Prepend(_SPACE_MARK))
    steps.append(normalizers.Replace(" ", _SPACE_MARK))
    backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = None
    backend.decoder = _spm_decoder(strip_prefix=add_prefix)
    return backend


def _gemma_backend(tokens: list[str], metadata: Mapping[str, Any]) -> _BackendTokenizer:
    """Gemma's SentencePiece BPE: runs of spaces are stored as raw spaces (renamed to U+2581 runs here), no
    prefix space, and merges ranked by the order of the tokens in the file."""
    respelled = [_SPACE_MARK * len(t) if t and not t.strip(" ") else t for t in tokens]
    vocab = {tok: i for i, tok in enumerate(respelled)}
    merges = _gguf_merges(metadata)
    if merges is None:
        merges = _merges_from_scores(respelled, [-float(i) for i in range(len(respelled))])
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = respelled[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(respelled) else None
    backend = _BackendTokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True, dropout=None)
    )
    backend.normalizer = normalizers.Replace(" ", _SPACE_MARK)
    backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    backend.decoder = _spm_decoder(strip_prefix=False)
    return backend


def _spm_decoder(*, strip_prefix: bool) -> decoders.Decoder:
    steps: list[decoders.Decoder] = [decoders.Replace(_SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()]
    if strip_prefix:
        # The prepended space of the first word is not part of the text.
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    return decoders.Sequence(steps)


def _add_gguf_tokens(
    backend: _BackendTokenizer,
    tokens: list[str],
    token_types: list[Any],
    *,
    byte_level: bool,
    named: Iterable[str | None],
) -> None:
    """Register the GGUF's CONTROL tokens (and the named bos/eos/unk/pad tokens) as special tokens and its
    USER_DEFINED tokens as plain added tokens, so that text containing them maps to their ids whole.

    Only tokens the model's vocabulary already holds are added: adding any other would create ids past the
    model's embedding table."""
    alphabet = set(_byte_alphabet().values()) if byte_level else None
    special: list[str] = []
    user: list[str] = []
    for tok, kind in zip(tokens, token_types, strict=False):  # token_type may be missing
        if kind == _TYPE_CONTROL and (alphabet is None or set(tok) <= alphabet):
            special.append(tok)
        elif kind == _TYPE_USER_DEFINED:
            user.append(tok)
    for name in named:
        if name is not None and name not in special:
            special.append(name)
    in_vocab = [t for t in special if backend.token_to_id(t) is not None]
    if in_vocab:
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in in_vocab])
    user = [t for t in user if backend.token_to_id(t) is not None and t not in in_vocab]
    if user:
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


class StreamDecoder:
    """Incremental detokenizer: :meth:`push` one generated id at a time and get the new text.

    Pieces never end in half of a UTF-8 character: while the decoded tail ends in U+FFFD (an incomplete byte
    sequence) the text is held back until later bytes complete it, or until :meth:`flush`. The pieces of a
    sequence concatenate to ``tokenizer.decode(ids, skip_special_tokens=...)``.

    Each push decodes only a short window (a few ids of already-emitted context plus the pending ids), so the cost
    per token is constant. The context keeps SentencePiece's leading space: decoding a window whose first token is
    ``"\u2581word"`` on its own would drop the space. ``prompt_ids`` seed that context, so the first generated
    word keeps its space after the prompt; the pieces then continue ``decode(prompt_ids)``.
    """

    _CONTEXT = 4  # ids of emitted text kept as decoding context (at least)
    _MAX_BYTE_RUN = 16  # byte-fallback ids held back at most while their text is complete
    _MAX_PENDING = 64  # ids held back at most while their text ends in U+FFFD

    def __init__(
        self, tokenizer: Tokenizer, skip_special_tokens: bool = True, prompt_ids: Iterable[int] | None = None
    ) -> None:
        if not isinstance(tokenizer, Tokenizer):
            raise ArgumentError(f"tokenizer must be a pygpukit Tokenizer, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self.skip_special_tokens = bool(skip_special_tokens)
        # Special ids produce no text when skipped, so they are dropped up front; keeping them in the window could
        # leave a context of only skipped ids, whose decode would then strip the next word's leading space.
        self._skipped = tokenizer._special_ids if self.skip_special_tokens else frozenset()
        # Byte fallback decodes a run of byte tokens as a whole: one invalid byte turns the entire run into U+FFFD,
        # so the text of a run is final only once a non-byte token ends it.
        self._byte_ids = tokenizer._fallback_byte_ids()
        # The context is made of whole "segments": the ids between two points where the text ended on a complete
        # character. A window cut inside a character would decode differently on its own (byte fallback turns a
        # whole broken byte run into U+FFFD), and then its text would not be a prefix of the longer window's.
        self._segments: deque[list[int]] = deque()
        self._context: list[int] = []
        self._context_text = ""
        self._pending: list[int] = []
        self._sent = 0  # characters of the pending ids' text already returned
        if prompt_ids is not None:
            self._seed([int(i) for i in prompt_ids if int(i) not in self._skipped])

    def _seed(self, prompt: list[int]) -> None:
        # Take the prompt's last few ids, reaching back until they start on a whole character.
        for n in range(min(self._CONTEXT, len(prompt)), min(self._CONTEXT + 8, len(prompt)) + 1):
            ids = prompt[-n:]
            text = self._decode(ids)
            if not text.startswith("\ufffd") and not text.endswith("\ufffd"):
                self._segments.append(ids)
                self._context, self._context_text = ids, text
                return

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return str(self.tokenizer.backend.decode(ids, skip_special_tokens=self.skip_special_tokens))

    def push(self, token_id: int) -> str:
        """Add one token id; returns the text it completes (possibly "")."""
        token_id = int(token_id)
        if token_id < 0:
            raise ArgumentError(f"token id must be non-negative, got {token_id}")
        if token_id in self._skipped:
            return ""
        self._pending.append(token_id)
        text = self._pending_text()
        in_byte_run = token_id in self._byte_ids
        if in_byte_run and len(self._pending) < self._MAX_BYTE_RUN and len(self._pending) < self._MAX_PENDING:
            return ""
        if text.endswith("\ufffd"):
            if len(self._pending) < self._MAX_PENDING:
                # Emit what is certain: everything before the trailing replacement characters.
                stable = "" if in_byte_run else text.rstrip("\ufffd")
                piece = stable[self._sent :]
                self._sent = max(self._sent, len(stable))
                return piece
            piece = text[self._sent :]
            self._restart()  # bytes that never completed: give up the context rather than mis-continue it
            return piece
        piece = text[self._sent :]
        self._advance()
        return piece

    def flush(self) -> str:
        """Return any held-back text (an incomplete character decodes to U+FFFD) and reset the pending state."""
        if not self._pending:
            return ""
        piece = self._pending_text()[self._sent :]
        self._restart()
        return piece

    def _pending_text(self) -> str:
        full = self._decode(self._context + self._pending)
        return full[len(self._context_text) :]

    def _advance(self) -> None:
        """The pending ids ended on a whole character: they become the newest context segment."""
        self._segments.append(self._pending)
        total = sum(len(seg) for seg in self._segments)
        while total - len(self._segments[0]) >= self._CONTEXT:
            total -= len(self._segments.popleft())
        self._context = [i for seg in self._segments for i in seg]
        self._context_text = self._decode(self._context)
        self._pending = []
        self._sent = 0

    def _restart(self) -> None:
        self._segments.clear()
        self._context, self._context_text = [], ""
        self._pending = []
        self._sent = 0
