"""Kokoro's duration path on pygpukit ops: phoneme ids and a voice's style vector -> frames per phoneme.

    ALBERT (12 passes of one shared layer, 768 wide, 12 heads, tanh GELU) over the ids
    -> bert_encoder (768 -> 512)
    -> the prosody predictor's duration encoder: three times [bidirectional LSTM (640 -> 2 x 256) on the
       features with the style's second half appended, then AdaLayerNorm: (1 + gamma) * layer_norm(x) +
       beta with gamma, beta = fc(style)]
    -> the predictor's LSTM, duration_proj (512 -> 50), sigmoid, sum over the 50 bins / speed
    -> round, at least 1 frame (a frame is 600 samples at 24 kHz).

Weights come from :func:`pygpukit.tts.onnx_reader.read_onnx` (float32, dequantized). This is what the float
twin of the ONNX file (ci/kokoro_float_twin.py) computes: docs/tts.md has the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.core.array import GPUArray
from pygpukit.core.errors import ArgumentError, ShapeError

from .errors import KokoroModelError
from .onnx_reader import KokoroOnnx

__all__ = ["STYLE_SIZE", "DurationOutput", "KokoroDurations"]

STYLE_SIZE = 256  # ref_s: [:128] conditions the decoder, [128:] the prosody predictor
_HEADS = 12
_LAYERS = 12
_ALBERT_EPS = 1e-12
_ADA_EPS = 1e-5
_LAYER = "encoder.bert.encoder.albert_layer_groups.0.albert_layers.0."


@dataclass
class DurationOutput:
    """``frames`` (int per phoneme id, >= 1), the unrounded ``raw`` durations, and ``features`` (T, 640):
    the duration encoder's output, which the F0 / N predictor and the decoder's alignment use."""

    frames: np.ndarray[Any, Any]
    raw: np.ndarray[Any, Any]
    features: GPUArray


class KokoroDurations:
    """The duration path with weights uploaded once (``dtype`` float32, float16 or bfloat16)."""

    def __init__(self, weights: KokoroOnnx, dtype: Any = gp.float32) -> None:
        self.dtype = dtype
        names = ["encoder.bert.embeddings.word_embeddings.weight", "encoder.bert.embeddings.position_embeddings.weight",
                 "encoder.bert.embeddings.token_type_embeddings.weight", "encoder.bert.embeddings.LayerNorm.weight",
                 "encoder.bert.embeddings.LayerNorm.bias", "encoder.bert.encoder.embedding_hidden_mapping_in.weight",
                 "encoder.bert.encoder.embedding_hidden_mapping_in.bias", "encoder.bert_encoder.weight",
                 "encoder.bert_encoder.bias", "encoder.predictor.duration_proj.linear_layer.weight",
                 "encoder.predictor.duration_proj.linear_layer.bias"]  # fmt: skip
        for part in ("attention.query", "attention.key", "attention.value", "attention.dense", "ffn", "ffn_output"):
            names += [f"{_LAYER}{part}.weight", f"{_LAYER}{part}.bias"]
        for part in ("attention.LayerNorm", "full_layer_layer_norm"):
            names += [f"{_LAYER}{part}.weight", f"{_LAYER}{part}.bias"]
        for i in (1, 3, 5):
            names += [f"encoder.predictor.text_encoder.lstms.{i}.fc.weight",
                      f"encoder.predictor.text_encoder.lstms.{i}.fc.bias"]  # fmt: skip
        missing = [n for n in names if n not in weights.tensors]
        lstms = [f"encoder.predictor.text_encoder.lstms.{i}" for i in (0, 2, 4)] + ["encoder.predictor.lstm"]
        missing += [n for n in lstms if n not in weights.lstms]
        if missing:
            raise KokoroModelError(f"the Kokoro weights lack {len(missing)} tensors of the duration path: "
                                   f"{', '.join(missing[:5])}")  # fmt: skip
        self._w = {n: gp.from_numpy(np.ascontiguousarray(weights.tensors[n])).astype(dtype) for n in names}
        self._lstm = {
            n: tuple(gp.from_numpy(a).astype(dtype) for a in (w.w_ih, w.w_hh, w.bias))
            for n, w in ((n, weights.lstms[n]) for n in lstms)
        }
        self._vocab = int(weights.tensors[names[0]].shape[0])
        self._positions = int(weights.tensors[names[1]].shape[0])

    def _lin(self, x: GPUArray, name: str, activation: str | None = None) -> GPUArray:
        result: GPUArray = gp.linear(x, self._w[name + ".weight"], self._w[name + ".bias"], activation)
        return result

    def _albert(self, ids: GPUArray, length: int) -> GPUArray:
        w = self._w
        e = gp.embedding(w["encoder.bert.embeddings.word_embeddings.weight"], ids)  # (L, 128)
        e = e + w["encoder.bert.embeddings.position_embeddings.weight"][:length]
        e = e + w["encoder.bert.embeddings.token_type_embeddings.weight"][0]
        e = gp.layernorm(e, w["encoder.bert.embeddings.LayerNorm.weight"], w["encoder.bert.embeddings.LayerNorm.bias"],
                         _ALBERT_EPS)  # fmt: skip
        h = self._lin(e, "encoder.bert.encoder.embedding_hidden_mapping_in")  # (L, 768)
        width = h.shape[-1]
        head = width // _HEADS
        scale = 1.0 / float(np.sqrt(head))
        for _ in range(_LAYERS):  # ALBERT: one layer's weights, applied 12 times
            q, k, v = (
                self._lin(h, _LAYER + f"attention.{n}").reshape(length, _HEADS, head).transpose((1, 0, 2))
                for n in ("query", "key", "value")
            )
            scores = gp.softmax(gp.matmul(q.contiguous(), k.transpose((0, 2, 1)).contiguous()) * scale, axis=-1)
            context = gp.matmul(scores, v.contiguous()).transpose((1, 0, 2)).contiguous().reshape(length, width)
            attended = gp.layernorm(h + self._lin(context, _LAYER + "attention.dense"),
                                    w[_LAYER + "attention.LayerNorm.weight"], w[_LAYER + "attention.LayerNorm.bias"],
                                    _ALBERT_EPS)  # fmt: skip
            ffn = self._lin(self._lin(attended, _LAYER + "ffn", "gelu_tanh"), _LAYER + "ffn_output")
            h = gp.layernorm(ffn + attended, w[_LAYER + "full_layer_layer_norm.weight"],
                             w[_LAYER + "full_layer_layer_norm.bias"], _ALBERT_EPS)  # fmt: skip
        return h

    def _bilstm(self, name: str, x: GPUArray) -> GPUArray:
        w_ih, w_hh, bias = self._lstm[name]
        out, _, _ = gp.lstm(x[None], w_ih, w_hh, bias)
        result: GPUArray = out[0]
        return result

    def __call__(self, ids: Any, style: Any, speed: float = 1.0) -> DurationOutput:
        """``ids``: the phoneme ids with Kokoro's 0 at both ends (1-D ints); ``style``: the voice's (256,)
        style vector for this length; ``speed`` > 0 divides the durations."""
        tokens = np.asarray(ids)
        if tokens.ndim != 1 or tokens.size < 2 or tokens.dtype.kind not in "iu":
            raise ShapeError(f"kokoro durations: ids must be a 1-D integer sequence of at least 2, got {tokens.shape}")
        if tokens.min() < 0 or tokens.max() >= self._vocab or tokens.size > self._positions:
            raise ArgumentError(f"kokoro durations: ids must lie in [0, {self._vocab}) and number at most "
                                f"{self._positions}, got {tokens.size} ids in [{tokens.min()}, "
                                f"{tokens.max()}]")  # fmt: skip
        ref = np.asarray(style, np.float32).reshape(-1)
        if ref.size != STYLE_SIZE:
            raise ShapeError(f"kokoro durations: style must have {STYLE_SIZE} values, got {ref.size}")
        if not (isinstance(speed, (int, float)) and np.isfinite(speed) and speed > 0):
            raise ArgumentError(f"kokoro durations: speed must be a finite number > 0, got {speed!r}")
        length = int(tokens.size)
        ids_dev = gp.from_numpy(tokens.astype(np.int64))
        s = gp.from_numpy(ref[STYLE_SIZE // 2 :]).astype(self.dtype)  # (128,)
        s_rows = gp.broadcast_to(s, (length, s.shape[0])).contiguous()
        x = self._lin(self._albert(ids_dev, length), "encoder.bert_encoder")  # (L, 512)
        x = gp.concatenate([x, s_rows], axis=-1)
        for i in range(3):
            x = self._bilstm(f"encoder.predictor.text_encoder.lstms.{2 * i}", x)  # (L, 512)
            h = self._lin(s[None], f"encoder.predictor.text_encoder.lstms.{2 * i + 1}.fc")[0]  # (1024,)
            half = h.shape[0] // 2
            x = gp.layernorm(x, None, None, _ADA_EPS) * (h[:half] + 1.0) + h[half:]
            x = gp.concatenate([x, s_rows], axis=-1)  # (L, 640)
        y = self._bilstm("encoder.predictor.lstm", x)
        bins = gp.sigmoid(self._lin(y, "encoder.predictor.duration_proj.linear_layer"))  # (L, 50)
        raw = gp.sum(bins.astype(gp.float32), axis=-1).to_numpy().astype(np.float64) / float(speed)
        frames = np.maximum(np.rint(raw), 1).astype(np.int64)  # torch.round: half to even, as np.rint
        return DurationOutput(frames=frames, raw=raw, features=x)
