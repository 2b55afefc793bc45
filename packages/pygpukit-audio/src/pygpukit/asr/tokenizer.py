"""Whisper's tokenizer: a Hugging Face ``tokenizers`` byte-level BPE (tokenizer.json) with the special tokens
Whisper's prompts need (start of transcript, language, task, timestamps, previous-text marker).

``vocabulary.txt`` (CTranslate2's one token per line) is only used to check the size of the vocabulary
against the model; ``tokenizers`` is imported when a tokenizer is built (the ``asr`` extra).
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from typing import Any

from pygpukit.core.errors import ArgumentError, PyGPUkitError

__all__ = ["LANGUAGES", "TokenizerError", "WhisperTokenizer"]

# Whisper's language codes in token order (<|en|> is the first language token).
_LANGUAGE_CODES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt "
    "la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc "
    "ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue"
)
LANGUAGES = tuple(_LANGUAGE_CODES.split())


class TokenizerError(PyGPUkitError, ValueError):
    """tokenizer.json is missing, malformed, or lacks a special token Whisper needs."""


def _symbols() -> list[str]:
    symbols = list('"#()*+/:;<=>@[\\]^_`{|}~')
    symbols += ["\u300c", "\u300d", "\u300e", "\u300f"]
    symbols += [
        "<<",
        ">>",
        "<<<",
        ">>>",
        "--",
        "---",
        "-(",
        "-[",
        "('",
        '("',
        "((",
        "))",
        "(((",
        ")))",
        "[[",
        "]]",
        "{{",
        "}}",
    ]
    symbols += ["\u266a\u266a", "\u266a\u266a\u266a"]
    return symbols


_MISC = "\u2669\u266a\u266b\u266c\u266d\u266e\u266f"  # musical symbols; the first token is suppressed


class WhisperTokenizer:
    """Encoding, decoding and the special token ids of a Whisper vocabulary."""

    def __init__(self, path: str | os.PathLike[str], *, multilingual: bool | None = None) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - the asr extra installs it
            raise TokenizerError(
                "pygpukit.asr needs the 'tokenizers' package: pip install 'pygpukit-audio[asr]'"
            ) from exc
        text = os.fspath(path)
        try:
            json.loads(Path(text).read_text(encoding="utf-8"))
            self._tok = Tokenizer.from_file(text)
        except OSError as exc:
            raise TokenizerError(f"{text}: cannot read the tokenizer: {exc.strerror or exc}") from exc
        except (ValueError, Exception) as exc:  # tokenizers raises a plain Exception for bad files
            raise TokenizerError(f"{text}: not a valid tokenizer.json: {exc}") from exc
        self.path = text
        for token in ("<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>"):
            if self._tok.token_to_id(token) is None:
                raise TokenizerError(f"{text}: the vocabulary has no {token} token")
        # English-only vocabularies end the text at 50256, multilingual ones (one more text token) at 50257;
        # both put <|startoftranscript|> right after <|endoftext|> and both hold the language tokens.
        self.multilingual = (self.eot == 50257) if multilingual is None else bool(multilingual)

    def _id(self, token: str) -> int:
        found = self._tok.token_to_id(token)
        if found is None:
            raise TokenizerError(f"{self.path}: the vocabulary has no {token} token")
        return int(found)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @cached_property
    def eot(self) -> int:
        return self._id("<|endoftext|>")

    @cached_property
    def sot(self) -> int:
        return self._id("<|startoftranscript|>")

    @cached_property
    def sot_prev(self) -> int:
        return self._id("<|startofprev|>")

    @cached_property
    def sot_lm(self) -> int:
        return self._id("<|startoflm|>")

    @cached_property
    def transcribe(self) -> int:
        return self._id("<|transcribe|>")

    @cached_property
    def translate(self) -> int:
        return self._id("<|translate|>")

    @cached_property
    def no_timestamps(self) -> int:
        return self._id("<|notimestamps|>")

    @cached_property
    def no_speech(self) -> int:
        found = self._tok.token_to_id("<|nospeech|>")
        return int(found) if found is not None else self._id("<|nocaptions|>")

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    def language_token(self, language: str) -> int:
        if language not in LANGUAGES:
            raise ArgumentError(f"unknown language code {language!r}; Whisper knows: {' '.join(LANGUAGES)}")
        return self._id(f"<|{language}|>")

    @cached_property
    def language_tokens(self) -> dict[int, str]:
        """Token id -> language code of every language token in the vocabulary."""
        found: dict[int, str] = {}
        for code in LANGUAGES:
            token = self._tok.token_to_id(f"<|{code}|>")
            if token is not None:
                found[int(token)] = code
        return found

    def sot_sequence(self, language: str | None = None, task: str = "transcribe") -> list[int]:
        """<|startoftranscript|>, then for multilingual models the language and task tokens."""
        if task not in ("transcribe", "translate"):
            raise ArgumentError(f"task must be 'transcribe' or 'translate', got {task!r}")
        sequence = [self.sot]
        if self.multilingual:
            sequence.append(self.language_token(language or "en"))
            sequence.append(self.transcribe if task == "transcribe" else self.translate)
        return sequence

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: Any) -> str:
        """The text of the tokens below <|endoftext|> (timestamps and special tokens dropped)."""
        return str(self._tok.decode([int(t) for t in tokens if int(t) < self.eot]))

    def decode_with_timestamps(self, tokens: Any) -> str:
        parts: list[str] = []
        run: list[int] = []
        for token in (int(t) for t in tokens):
            if token >= self.timestamp_begin:
                parts.append(self.decode(run))
                run = []
                parts.append(f"<|{(token - self.timestamp_begin) * 0.02:.2f}|>")
            else:
                run.append(token)
        parts.append(self.decode(run))
        return "".join(parts)

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """Tokens of speaker tags and non-speech annotations (as faster-whisper and openai-whisper)."""
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in _symbols() + list(_MISC):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in _MISC:
                    result.add(tokens[0])
        return tuple(sorted(result))

    def suppressed_tokens(self, suppress_tokens: Any = (-1,)) -> tuple[int, ...]:
        """faster-whisper's rule: -1 stands for the non-speech tokens; the task/start tokens always join."""
        chosen = [int(t) for t in (suppress_tokens or ()) if int(t) >= 0]
        if suppress_tokens and -1 in [int(t) for t in suppress_tokens]:
            chosen.extend(self.non_speech_tokens)
        specials = [self.sot, self.sot_prev, self.no_speech]
        for name in ("<|transcribe|>", "<|translate|>", "<|startoflm|>"):
            found = self._tok.token_to_id(name)
            if found is not None:
                specials.append(int(found))
        return tuple(sorted(set(chosen) | set(specials)))
