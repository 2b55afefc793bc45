"""Kokoro-82M text to speech on pygpukit: :class:`KokoroModel` (``from_pretrained``, ``synthesize``,
``generate_stream``, ``voices``).

Phoneme strings (misaki's IPA-like alphabet, the characters of ``vocab.json``) always work; text goes
through misaki's Japanese G2P (the ``ja`` extra of pygpukit-audio: misaki with fugashi and unidic-lite,
offline) when it is installed. A chunk of at most 510 phonemes runs: text encoder, durations, F0 / N, decoder front,
generator (docs/tts.md); longer input is cut at sentence ends.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.core.errors import ArgumentError, MissingDistributionError

from .errors import KokoroModelError
from .fetch import MODEL_FILE
from .kokoro_decoder import KokoroDecoderFront
from .kokoro_durations import DurationOutput, KokoroDurations
from .kokoro_generator import SAMPLE_RATE, KokoroGenerator
from .kokoro_prosody import KokoroProsody, expand
from .kokoro_text import KokoroTextEncoder
from .onnx_reader import read_onnx

__all__ = ["MAX_PHONEMES", "SAMPLE_RATE", "KokoroModel", "split_sentences"]

Array = np.ndarray[Any, Any]
MAX_PHONEMES = 510  # ALBERT's 512 positions less the two boundary ids; the voice tables' 510 rows
DEFAULT_VOICE = "jf_alpha"
_STOPS = ".!?\u3002\uff01\uff1f"
# after a run of stops: the Japanese ones end a sentence anywhere, . ! ? only before a space or the end
_SENTENCE = re.compile(rf"(?<=[\u3002\uff01\uff1f])(?![{_STOPS}])\s*|(?<=[.!?])(?![{_STOPS}])(?:\s+|$)")
_DTYPES = {"float32": gp.float32, "float16": gp.float16, "bfloat16": gp.bfloat16}


def split_sentences(text: str) -> list[str]:
    """Cut after ``. ! ?`` followed by a space (or the end) and after the Japanese full stops, the
    punctuation kept (a run such as ``...`` stays whole); empty pieces dropped."""
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def _g2p() -> Any:
    """misaki's ``JAG2P()`` as Kokoro's pipeline builds it: the cutlet romanizer on MeCab (fugashi) with
    a UniDic dictionary (unidic-lite, bundled in its wheel, when the full unidic is absent). misaki.ja
    imports pyopenjtalk for its other mode only; without pyopenjtalk the same romanizer is built directly
    (``JAG2P()(text)`` is ``Cutlet()(text)``)."""
    try:
        try:
            make = importlib.import_module("misaki.ja").JAG2P
        except ImportError as exc:
            if exc.name != "pyopenjtalk":
                raise
            make = importlib.import_module("misaki.cutlet").Cutlet
    except ImportError as exc:
        raise MissingDistributionError(
            f"Kokoro text input needs misaki's Japanese G2P, which cannot be imported ({exc}): pip install "
            "'pygpukit-audio[ja]'; or pass phonemes (phonemes=True, speak --phonemes)"
        ) from exc
    try:
        return make()
    except RuntimeError as exc:  # fugashi: MeCab found no dictionary (unidic installed but not downloaded)
        raise MissingDistributionError(
            "Kokoro text input: misaki's Japanese G2P found no MeCab dictionary (the 'unidic' package is "
            "installed without its data, which 'python -m unidic download' fetches; without 'unidic', "
            "fugashi uses 'unidic-lite' of pygpukit-audio[ja]): " + str(exc).strip().splitlines()[0]
        ) from exc


class KokoroModel:
    """Kokoro-82M with its weights on the device. ``voice``: the default voice (a name, a mix such as
    ``{"jf_alpha": 0.7, "jm_kumo": 0.3}`` or ``"jf_alpha:0.7,jm_kumo:0.3"``, or a (510, 1, 256) table)."""

    def __init__(self, path: str | os.PathLike[str], voice: Any = DEFAULT_VOICE, dtype: Any = "float32") -> None:
        folder = Path(path)
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise ArgumentError(f"KokoroModel: dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
            dtype = _DTYPES[dtype]
        self.dtype = dtype
        self.path = folder
        try:
            vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))["vocab"]
            if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
                raise TypeError("vocab is not a mapping of characters to ids")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KokoroModelError(f"{str(folder / 'vocab.json')!r} is missing or not Kokoro's vocabulary "
                                   f"({type(exc).__name__}: {exc})") from exc  # fmt: skip
        self.vocab: dict[str, int] = vocab
        try:
            with np.load(folder / "voices_ja.npz") as table:
                self._voices = {name: np.asarray(table[name], np.float32) for name in table.files}
        except Exception as exc:  # zipfile / pickle / OS errors of a missing or corrupt archive
            raise KokoroModelError(f"{str(folder / 'voices_ja.npz')!r} is missing or not a voice archive "
                                   f"({type(exc).__name__}: {exc})") from exc  # fmt: skip
        for name, table in self._voices.items():
            if table.shape != (MAX_PHONEMES, 1, 256):
                raise KokoroModelError(f"voice {name!r} has shape {table.shape}, expected ({MAX_PHONEMES}, 1, 256)")
        if not self._voices:
            raise KokoroModelError(f"{str(folder / 'voices_ja.npz')!r} holds no voices")
        weights = read_onnx(folder / MODEL_FILE)
        self._durations = KokoroDurations(weights, dtype)
        self._prosody = KokoroProsody(weights, dtype)
        self._text = KokoroTextEncoder(weights, dtype)
        self._front = KokoroDecoderFront(weights, dtype)
        self._generator = KokoroGenerator(weights, dtype)
        self.voice = self._voice_table(voice)
        self.sample_rate = SAMPLE_RATE
        self.last_durations: list[DurationOutput] = []
        self._g2p: Any = None

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str] | None = None, voice: Any = DEFAULT_VOICE,
                        dtype: Any = "float32") -> KokoroModel:  # fmt: skip
        """Load the model from ``path`` (a folder with kokoro-v1.0.int8.onnx, vocab.json and voices_ja.npz;
        None: :func:`pygpukit.tts.fetch`, which downloads it once into the cache)."""
        if path is None:
            from .fetch import fetch

            path = fetch()
        return cls(path, voice=voice, dtype=dtype)

    def voices(self) -> list[str]:
        """The shipped voices' names."""
        return sorted(self._voices)

    def _voice_table(self, voice: Any) -> Array:
        if isinstance(voice, np.ndarray):
            table = np.asarray(voice, np.float32)
            if table.shape not in ((MAX_PHONEMES, 1, 256), (MAX_PHONEMES, 256), (256,)):
                raise ArgumentError(f"KokoroModel: a voice array must be (510, 1, 256) or (256,), got {table.shape}")
            return np.broadcast_to(table.reshape(-1, 256), (MAX_PHONEMES, 256)).reshape(MAX_PHONEMES, 1, 256)
        if isinstance(voice, str) and (":" in voice or "," in voice):
            mix: dict[str, float] = {}
            for part in voice.split(","):
                name, _, weight = part.partition(":")
                try:
                    mix[name.strip()] = float(weight) if weight else 1.0
                except ValueError as exc:
                    raise ArgumentError(f"KokoroModel: voice mix {voice!r}: weight {weight!r} is not a number") from exc
            voice = mix
        if isinstance(voice, str):
            if voice not in self._voices:
                raise ArgumentError(f"KokoroModel: unknown voice {voice!r}; voices: {', '.join(self.voices())}")
            return self._voices[voice]
        if isinstance(voice, Mapping):
            weights = {str(k): float(v) for k, v in voice.items()}
            total = sum(weights.values())
            if not weights or not np.isfinite(total) or total <= 0 or min(weights.values()) < 0:
                raise ArgumentError(f"KokoroModel: a voice mix needs weights >= 0 with a positive sum, got {weights}")
            tables = [self._voice_table(name) * (w / total) for name, w in weights.items()]
            return np.sum(tables, axis=0).astype(np.float32)  # type: ignore[no-any-return]
        raise ArgumentError(f"KokoroModel: voice must be a name, a mix or an array, got {type(voice).__name__}")

    def phonemize(self, text: str) -> str:
        """Japanese text -> phonemes with misaki's G2P (the ``ja`` extra)."""
        if self._g2p is None:
            self._g2p = _g2p()
        result = self._g2p(text)
        return str(result[0] if isinstance(result, tuple) else result)

    def ids(self, phonemes: str) -> Array:
        """Kokoro's token ids of a phoneme string: 0, the ids of its characters in the vocabulary (others
        are dropped, as kokoro-onnx does), 0."""
        return np.array([0, *(self.vocab[c] for c in phonemes if c in self.vocab), 0], np.int64)

    def _chunks(self, text: str, phonemes: bool, split: bool = True) -> list[str]:
        if not isinstance(text, str):
            raise ArgumentError(f"KokoroModel: text must be a str, got {type(text).__name__}")
        pieces = []
        for sentence in split_sentences(text) if split else [text.strip()]:
            ph = sentence if phonemes else self.phonemize(sentence)
            ph = "".join(c for c in ph if c in self.vocab).strip()
            while len(ph) > MAX_PHONEMES:  # one over-long sentence: cut at the last space that fits
                cut = ph.rfind(" ", 0, MAX_PHONEMES + 1)
                cut = cut if cut > 0 else MAX_PHONEMES
                pieces.append(ph[:cut].strip())
                ph = ph[cut:].strip()
            if ph:
                pieces.append(ph)
        return pieces

    def _run(self, phonemes: str, table: Array, speed: float) -> Array:
        ids = self.ids(phonemes)
        style = table[ids.size - 3].reshape(256)
        durations = self._durations(ids, style, speed=speed)
        self.last_durations.append(durations)
        f0, n = self._prosody(expand(durations.features, durations.frames), style)
        text_features = self._text(ids)
        x = self._front(expand(text_features.transpose((1, 0)), durations.frames), f0, n, style)
        audio: Array = self._generator(x, f0, style).to_numpy().astype(np.float32)
        return audio

    def _check_speed(self, speed: float) -> float:
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not np.isfinite(speed) or speed <= 0:
            raise ArgumentError(f"KokoroModel: speed must be a finite number > 0, got {speed!r}")
        return float(speed)

    def generate_stream(self, text: str, voice: Any = None, speed: float = 1.0, *, phonemes: bool = False,
                        split: bool = True) -> Iterator[Array]:  # fmt: skip
        """Yield 24 kHz float32 audio sentence by sentence (``phonemes``: ``text`` is already phonemes;
        ``split=False``: one chunk, cut only past 510 phonemes)."""
        speed = self._check_speed(speed)
        table = self.voice if voice is None else self._voice_table(voice)
        self.last_durations = []
        for chunk in self._chunks(text, phonemes, split):
            yield self._run(chunk, table, speed)

    def synthesize(self, text: str, voice: Any = None, speed: float = 1.0, *, phonemes: bool = False,
                   split: bool = True) -> Array:  # fmt: skip
        """The whole utterance as 24 kHz float32 audio (``phonemes``: ``text`` is already phonemes;
        ``split``: synthesize sentence by sentence, else as one chunk as Kokoro's own pipeline does up
        to 510 phonemes)."""
        parts = list(self.generate_stream(text, voice, speed, phonemes=phonemes, split=split))
        if not parts:
            raise ArgumentError(f"KokoroModel: {text!r} has no phonemes Kokoro knows")
        return np.concatenate(parts) if len(parts) > 1 else parts[0]
