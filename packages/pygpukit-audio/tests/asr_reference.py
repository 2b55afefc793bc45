"""Float64 NumPy references for the pygpukit.asr tests (loaded by the test modules from this file):

- ``features``: transformers' WhisperFeatureExtractor algorithm (pad or cut to 30 s, periodic Hann window,
  reflect-centred STFT, Slaney mel filters, log10 with a 1e-10 floor, last frame dropped, max - 8 clamp,
  (x + 4) / 4), written from its description;
- ``forward``: Whisper's encoder and decoder (openai-whisper's model.py semantics) on the common weight
  layout of pygpukit.asr.weights;
- ``random_weights``: a random small Whisper in that layout; ``write_ct2``: a CTranslate2 model.bin writer
  (the reader's inverse, for round trips and corruption tests); ``wer``: word error rate.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import erf

Array = np.ndarray[Any, Any]


# -- front end -------------------------------------------------------------------------------------
def _hz_to_mel(f: Array) -> Array:
    f = np.asarray(f, dtype=np.float64)
    lin = 3.0 * f / 200.0
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-12) / 1000.0) * 27.0 / np.log(6.4), lin)


def _mel_to_hz(m: Array) -> Array:
    m = np.asarray(m, dtype=np.float64)
    lin = 200.0 * m / 3.0
    return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), lin)


def mel_filters(n_mels: int, sr: int = 16000, n_fft: int = 400) -> Array:
    """(n_freq, n_mels) Slaney-normalized triangular filters on the Slaney mel scale (transformers' layout)."""
    fft_freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    filter_freqs = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sr / 2), n_mels + 2))
    diff = np.diff(filter_freqs)
    slopes = filter_freqs[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    bank = np.maximum(0.0, np.minimum(down, up))
    return bank * (2.0 / (filter_freqs[2 : n_mels + 2] - filter_freqs[:n_mels]))


def features(audio: Array, n_mels: int = 80, total: int | None = 480000) -> Array:
    """transformers' WhisperFeatureExtractor (padding to ``total`` samples; None keeps the length)."""
    x = np.asarray(audio, dtype=np.float64)
    if total is not None:
        x = np.pad(x[:total], (0, max(0, total - len(x))))
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    padded = np.pad(x, 200, mode="reflect")
    n_frames = 1 + (len(padded) - 400) // 160
    idx = np.arange(400)[None, :] + 160 * np.arange(n_frames)[:, None]
    spec = np.abs(np.fft.rfft(padded[idx] * window, axis=-1)) ** 2  # (frames, 201)
    mel = mel_filters(n_mels).T @ spec.T  # (n_mels, frames)
    logs = np.log10(np.maximum(mel, 1e-10))[:, :-1]
    logs = np.maximum(logs, logs.max() - 8.0)
    return (logs + 4.0) / 4.0


# -- model -----------------------------------------------------------------------------------------
def _gelu(x: Array) -> Array:
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _ln(x: Array, w: dict[str, Array], name: str) -> Array:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w[name + ".g"] + w[name + ".b"]


def _lin(x: Array, w: dict[str, Array], name: str) -> Array:
    return x @ w[name + ".w"].T + w[name + ".b"]


def _attend(q: Array, k: Array, v: Array, heads: int, causal: bool) -> Array:
    lq, lk, d = q.shape[0], k.shape[0], q.shape[1]
    hd = d // heads
    qh, kh, vh = (a.reshape(a.shape[0], heads, hd).transpose(1, 0, 2) for a in (q, k, v))
    scores = qh @ kh.transpose(0, 2, 1) / np.sqrt(hd)
    if causal:
        scores = scores + np.triu(np.full((lq, lk), -np.inf), 1 + lk - lq)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    return (scores @ vh).transpose(1, 0, 2).reshape(lq, d)


def _conv(x: Array, weight: Array, bias: Array, stride: int) -> Array:
    xp = np.pad(x, ((0, 0), (1, 1)))
    t_out = (xp.shape[1] - 3) // stride + 1
    out = np.zeros((weight.shape[0], t_out))
    for k in range(3):
        out += weight[:, :, k] @ xp[:, k : k + stride * (t_out - 1) + 1 : stride]
    return out + bias[:, None]


def encode(w: dict[str, Array], cfg: Any, mel: Array) -> Array:
    w = {k: np.asarray(v, dtype=np.float64) for k, v in w.items()}
    x = _gelu(_conv(np.asarray(mel, np.float64), w["enc.conv1.w"], w["enc.conv1.b"], 1))
    x = _gelu(_conv(x, w["enc.conv2.w"], w["enc.conv2.b"], 2)).T + w["enc.pos"]
    d = cfg.d_model
    for i in range(cfg.encoder_layers):
        p = f"enc.{i}"
        qkv = _lin(_ln(x, w, p + ".attn_ln"), w, p + ".qkv")
        x = x + _lin(_attend(qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :], cfg.encoder_heads, False), w, p + ".out")
        x = x + _lin(_gelu(_lin(_ln(x, w, p + ".mlp_ln"), w, p + ".fc1")), w, p + ".fc2")
    return _ln(x, w, "enc.ln")


def decode(w: dict[str, Array], cfg: Any, enc: Array, tokens: Array) -> Array:
    w = {k: np.asarray(v, dtype=np.float64) for k, v in w.items()}
    d = cfg.d_model
    x = w["dec.embed"][np.asarray(tokens)] + w["dec.pos"][: len(tokens)]
    for i in range(cfg.decoder_layers):
        p = f"dec.{i}"
        qkv = _lin(_ln(x, w, p + ".attn_ln"), w, p + ".qkv")
        x = x + _lin(_attend(qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :], cfg.decoder_heads, True), w, p + ".out")
        q = _lin(_ln(x, w, p + ".cross_ln"), w, p + ".cross_q")
        kv = _lin(enc, w, p + ".cross_kv")
        x = x + _lin(_attend(q, kv[:, :d], kv[:, d:], cfg.decoder_heads, False), w, p + ".cross_out")
        x = x + _lin(_gelu(_lin(_ln(x, w, p + ".mlp_ln"), w, p + ".fc1")), w, p + ".fc2")
    return _ln(x, w, "dec.ln") @ w["dec.embed"].T


def forward(w: dict[str, Array], cfg: Any, mel: Array, tokens: Array) -> Array:
    return decode(w, cfg, encode(w, cfg, mel), tokens)


def random_weights(cfg: Any, seed: int = 0) -> dict[str, Array]:
    from pygpukit.asr.weights import expected_shapes

    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith(".g"):
            out[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name in ("enc.pos", "dec.pos", "dec.embed"):
            out[name] = 0.5 * rng.standard_normal(shape)
        else:
            fan_in = shape[1] * (shape[2] if len(shape) == 3 else 1) if len(shape) > 1 else 10
            out[name] = rng.standard_normal(shape) / np.sqrt(fan_in)
    for name in list(out):  # Whisper's key projections have no bias
        if name.endswith("qkv.b"):
            d = out[name].shape[0] // 3
            out[name][d : 2 * d] = 0.0
        if name.endswith("cross_kv.b"):
            out[name][: out[name].shape[0] // 2] = 0.0
    return {k: v.astype(np.float32) for k, v in out.items()}


# -- CTranslate2 writer ----------------------------------------------------------------------------
_TYPE_IDS = {np.dtype("float32"): 0, np.dtype("int8"): 1, np.dtype("int16"): 2, np.dtype("int32"): 3,
             np.dtype("float16"): 4}  # fmt: skip


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def ct2_bytes(variables: dict[str, Array], aliases: dict[str, str] | None = None, spec: str = "WhisperSpec") -> bytes:
    out = [struct.pack("<I", 6), _string(spec), struct.pack("<I", 3), struct.pack("<I", len(variables))]
    for name, value in variables.items():
        arr = np.ascontiguousarray(value)
        out += [_string(name), struct.pack("<B", arr.ndim), struct.pack(f"<{arr.ndim}I", *arr.shape),
                struct.pack("<B", _TYPE_IDS[arr.dtype]), struct.pack("<I", arr.nbytes), arr.tobytes()]  # fmt: skip
    aliases = aliases or {}
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_string(alias), _string(target)]
    return b"".join(out)


_TO_CT2 = {
    "attn_ln.g": "self_attention/layer_norm/gamma", "attn_ln.b": "self_attention/layer_norm/beta",
    "qkv.w": "self_attention/linear_0/weight", "qkv.b": "self_attention/linear_0/bias",
    "out.w": "self_attention/linear_1/weight", "out.b": "self_attention/linear_1/bias",
    "mlp_ln.g": "ffn/layer_norm/gamma", "mlp_ln.b": "ffn/layer_norm/beta", "fc1.w": "ffn/linear_0/weight",
    "fc1.b": "ffn/linear_0/bias", "fc2.w": "ffn/linear_1/weight", "fc2.b": "ffn/linear_1/bias",
    "cross_ln.g": "attention/layer_norm/gamma", "cross_ln.b": "attention/layer_norm/beta",
    "cross_q.w": "attention/linear_0/weight", "cross_q.b": "attention/linear_0/bias",
    "cross_kv.w": "attention/linear_1/weight", "cross_kv.b": "attention/linear_1/bias",
    "cross_out.w": "attention/linear_2/weight", "cross_out.b": "attention/linear_2/bias",
}  # fmt: skip
_TOP = {"enc.conv1.w": "encoder/conv1/weight", "enc.conv1.b": "encoder/conv1/bias",
        "enc.conv2.w": "encoder/conv2/weight", "enc.conv2.b": "encoder/conv2/bias",
        "enc.pos": "encoder/position_encodings/encodings", "enc.ln.g": "encoder/layer_norm/gamma",
        "enc.ln.b": "encoder/layer_norm/beta", "dec.embed": "decoder/embeddings/weight",
        "dec.pos": "decoder/position_encodings/encodings", "dec.ln.g": "decoder/layer_norm/gamma",
        "dec.ln.b": "decoder/layer_norm/beta"}  # fmt: skip


def to_ct2(weights: dict[str, Array], cfg: Any, dtype: Any = np.float16) -> dict[str, Array]:
    out: dict[str, Array] = {"encoder/num_heads": np.array(cfg.encoder_heads, np.int16),
                             "decoder/num_heads": np.array(cfg.decoder_heads, np.int16)}  # fmt: skip
    for name, value in weights.items():
        if name in _TOP:
            out[_TOP[name]] = value.astype(dtype)
        else:
            side, layer, rest = name.split(".", 2)
            out[f"{'encoder' if side == 'enc' else 'decoder'}/layer_{layer}/{_TO_CT2[rest]}"] = value.astype(dtype)
    return out


def write_ct2(folder: Path, weights: dict[str, Array], cfg: Any, dtype: Any = np.float16) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.bin"
    path.write_bytes(ct2_bytes(to_ct2(weights, cfg, dtype), {"decoder/projection/weight": "decoder/embeddings/weight"}))
    return path


# -- scoring ---------------------------------------------------------------------------------------
_NUMBERS = {"0": "zero", "1": "one", "2": "two", "3": "three", "4": "four", "5": "five", "6": "six", "7": "seven",
            "8": "eight", "9": "nine", "10": "ten", "mr": "mister"}  # fmt: skip


def normalize(text: str) -> list[str]:
    """Lower case, hyphens as spaces, punctuation dropped, digits and 'Mr.' spelled as the transcripts do."""
    words = re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " ")).split()
    return [_NUMBERS.get(w, w) for w in words]


def wer(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) after :func:`normalize`."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1], len(ref)


def load_reference() -> dict[str, Any]:
    import json

    return dict(json.loads((Path(__file__).parent / "data" / "whisper_reference.json").read_text()))
