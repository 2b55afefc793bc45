"""Word timestamps from cross-attention alignment (``transcribe(..., word_timestamps=True)``).

For each window the decoder reads ``<|startoftranscript|> <|notimestamps|> text <|endoftext|>`` once more;
the cross-attention scores of the model's alignment heads (config.json's ``alignment_heads``) over the
window's frames are turned into probabilities, standardized along the token axis, median-filtered (width
7, reflect) along time and averaged over the heads; dynamic time warping of the negated matrix aligns
tokens with frames, and the first frame of each token gives word starts and ends. Word splitting,
punctuation merging and the duration heuristics are those of faster-whisper (and openai-whisper), the
alignment those of CTranslate2's ``Whisper.align``, so the times agree with faster-whisper's.
"""

from __future__ import annotations

import itertools
import string
from dataclasses import dataclass
from typing import Any

import numpy as np

from pygpukit.core.array import GPUArray

__all__ = ["Word", "add_word_timestamps"]

Array = np.ndarray[Any, Any]
TOKENS_PER_SECOND = 50  # encoder positions per second
PREPEND = "\"'\u201c\u00bf([{-"
APPEND = "\"'.\u3002,\uff0c!\uff01?\uff1f:\uff1a\u201d)]}\u3001"
SENTENCE_END = ".\u3002!\uff01?\uff1f"
NO_SPACES = ("zh", "ja", "th", "lo", "my", "yue")  # split into words by characters, as faster-whisper does


@dataclass
class Word:
    """A word with its start and end (seconds) and the mean probability of its tokens."""

    start: float
    end: float
    word: str
    probability: float


def _median_filter(x: Array, width: int) -> Array:
    """Median over a window of ``width`` along the last axis, reflect-padded (edge not repeated)."""
    half = width // 2
    if x.shape[-1] <= half:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(half, half)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.median(windows, axis=-1)  # type: ignore[no-any-return]


def _negative_dtw(x: Array) -> list[tuple[int, int]]:
    """CTranslate2's DTW of -x: the (token, frame) path from (0, 0) to (n - 1, m - 1)."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    cost[0, 0] = 0.0
    values = x.astype(np.float32)
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = -values[i - 1, j - 1] + c
            trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = n, m
    path: list[tuple[int, int]] = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    return path


def _split_words(tok: Any, tokens: list[int], on_spaces: bool = True) -> tuple[list[str], list[list[int]]]:
    """faster-whisper's split_tokens_on_spaces (built on split_tokens_on_unicode), or with ``on_spaces``
    False split_tokens_on_unicode alone (the languages written without spaces: each whole character a word)."""
    full = tok.decode_with_timestamps(tokens)
    subwords: list[str] = []
    pieces: list[list[int]] = []
    current: list[int] = []
    offset = 0
    for token in tokens:
        current.append(token)
        decoded = tok.decode_with_timestamps(current)
        at = decoded.find("\ufffd")
        if at < 0 or (at + offset < len(full) and full[at + offset] == "\ufffd"):
            subwords.append(decoded)
            pieces.append(current)
            current = []
            offset += len(decoded)
    if not on_spaces:
        return subwords, pieces
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for subword, sub_tokens in zip(subwords, pieces, strict=True):
        special = sub_tokens[0] >= tok.eot
        if special or subword.startswith(" ") or subword.strip() in string.punctuation or not words:
            words.append(subword)
            word_tokens.append(list(sub_tokens))
        else:
            words[-1] += subword
            word_tokens[-1].extend(sub_tokens)
    return words, word_tokens


def _merge_punctuations(alignment: list[dict[str, Any]]) -> None:
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        previous, following = alignment[i], alignment[j]
        if previous["word"].startswith(" ") and previous["word"].strip() in PREPEND:
            following["word"] = previous["word"] + following["word"]
            following["tokens"] = previous["tokens"] + following["tokens"]
            previous["word"], previous["tokens"] = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        previous, following = alignment[i], alignment[j]
        if not previous["word"].endswith(" ") and following["word"] in APPEND:
            previous["word"] = previous["word"] + following["word"]
            previous["tokens"] = previous["tokens"] + following["tokens"]
            following["word"], following["tokens"] = "", []
        else:
            i = j
        j += 1


def _alignment(model: Any, encoder_out: GPUArray, text: list[int], num_frames: int,
               start: list[int]) -> list[dict[str, Any]]:  # fmt: skip
    tok = model.tokenizer
    heads = model.config.alignment_heads or tuple(
        (layer, h) for layer in range(model.config.decoder_layers // 2, model.config.decoder_layers)
        for h in range(model.config.decoder_heads)
    )  # fmt: skip
    tokens = [*start, tok.no_timestamps, *text, tok.eot]
    frames = num_frames // 2
    if not text or frames == 0:
        return []
    scores, logits = model.cross_attention_scores(encoder_out, tokens, heads)  # (heads, L, n_ctx), (L, V)
    scores = scores[:, :, :frames].astype(np.float64)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    probs = (probs - probs.mean(-2, keepdims=True)) / np.sqrt(probs.var(-2, keepdims=True))
    weights = _median_filter(probs, 7).mean(0)
    matrix = weights[len(start) : len(start) + len(text) + 1]
    path = _negative_dtw(matrix)
    text_logits = logits[:, : tok.eot].astype(np.float64)
    text_logits = np.exp(text_logits - text_logits.max(-1, keepdims=True))
    token_probs = text_logits / text_logits.sum(-1, keepdims=True)
    outputs = tokens[1:]
    text_probs = [float(token_probs[len(start) + t, outputs[len(start) + t]]) for t in range(len(text))]
    language = tok.language_tokens.get(start[1]) if tok.multilingual and len(start) > 1 else None
    words, word_tokens = _split_words(tok, [*text, tok.eot], on_spaces=language not in NO_SPACES)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    text_idx = np.array([p[0] for p in path])
    time_idx = np.array([p[1] for p in path])
    jumps = np.pad(np.diff(text_idx), (1, 0), constant_values=1).astype(bool)
    jump_times = time_idx[jumps] / TOKENS_PER_SECOND
    starts, ends = jump_times[boundaries[:-1]], jump_times[boundaries[1:]]
    probabilities = [float(np.mean(text_probs[i:j])) for i, j in itertools.pairwise(boundaries)]
    return [{"word": w, "tokens": t, "start": float(s), "end": float(e), "probability": p}
            for w, t, s, e, p in zip(words, word_tokens, starts, ends, probabilities, strict=False)]  # fmt: skip


def add_word_timestamps(model: Any, segments: list[dict[str, Any]], encoder_out: GPUArray, num_frames: int,
                        last_speech_timestamp: float, start_sequence: list[int], fps: int = 100) -> None:  # fmt: skip
    """Add ``words`` to the window's segments (dicts with seek, start, end, tokens), adjusting their
    start and end as faster-whisper does; ``start_sequence`` is the window's start-of-transcript tokens."""
    if not segments:
        return
    tok = model.tokenizer
    per_segment = [[t for t in s["tokens"] if t < tok.eot] for s in segments]
    alignment = _alignment(model, encoder_out, [t for part in per_segment for t in part], num_frames, start_sequence)
    durations = np.array([w["end"] - w["start"] for w in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):
        for i in range(1, len(alignment)):
            if alignment[i]["end"] - alignment[i]["start"] > longest:
                if alignment[i]["word"] in SENTENCE_END:
                    alignment[i]["end"] = alignment[i]["start"] + longest
                elif alignment[i - 1]["word"] in SENTENCE_END:
                    alignment[i]["start"] = alignment[i]["end"] - longest
    _merge_punctuations(alignment)
    time_offset = segments[0]["seek"] / fps
    index = 0
    for segment, tokens in zip(segments, per_segment, strict=True):
        saved = 0
        words: list[dict[str, Any]] = []
        while index < len(alignment) and saved < len(tokens):
            timing = alignment[index]
            if timing["word"]:
                start, end = round(time_offset + timing["start"], 2), round(time_offset + timing["end"], 2)
                words.append({"word": timing["word"], "start": start, "end": end, "probability": timing["probability"]})
            saved += len(timing["tokens"])
            index += 1
        if words:
            first = words[0]
            if first["end"] - last_speech_timestamp > median * 4 and (
                first["end"] - first["start"] > longest
                or (len(words) > 1 and words[1]["end"] - first["start"] > longest * 2)
            ):
                if len(words) > 1 and words[1]["end"] - words[1]["start"] > longest:
                    boundary = max(words[1]["end"] / 2, words[1]["end"] - longest)
                    first["end"] = words[1]["start"] = boundary
                first["start"] = max(0, first["end"] - longest)
            if segment["start"] < first["end"] and segment["start"] - 0.5 > first["start"]:
                first["start"] = max(0, min(first["end"] - median, segment["start"]))
            else:
                segment["start"] = first["start"]
            last = words[-1]
            if segment["end"] > last["start"] and segment["end"] + 0.5 < last["end"]:
                last["end"] = max(last["start"] + median, segment["end"])
            else:
                segment["end"] = last["end"]
            last_speech_timestamp = segment["end"]
        segment["words"] = [Word(w["start"], w["end"], w["word"], w["probability"]) for w in words]
