"""Kokoro's text encoder on pygpukit ops: phoneme ids -> (512, T) features for the decoder.

    x = embedding(ids)                                      (T, 512)
    3 times: x = leaky_relu(layer_norm_over_channels(conv1d(x, k5, p2)), 0.2)
    x = bidirectional LSTM (512 -> 2 x 256)                 (T, 512)

The decoder reads these features repeated per frame (:func:`pygpukit.tts.kokoro_prosody.expand`), as
Kokoro's ``t_en @ alignment``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.core.array import GPUArray
from pygpukit.core.errors import ArgumentError, ShapeError

from .errors import KokoroModelError
from .onnx_reader import KokoroOnnx

__all__ = ["KokoroTextEncoder"]

_PREFIX = "encoder.text_encoder."
_LAYERS = 3
_EPS = 1e-5
_SLOPE = 0.2


class KokoroTextEncoder:
    """The text encoder with weights uploaded once (``dtype`` float32, float16 or bfloat16)."""

    def __init__(self, weights: KokoroOnnx, dtype: Any = gp.float32) -> None:
        self.dtype = dtype
        names = ["embedding.weight"]
        for i in range(_LAYERS):
            names += [f"cnn.{i}.0.weight", f"cnn.{i}.0.bias", f"cnn.{i}.1.gamma", f"cnn.{i}.1.beta"]
        missing = [_PREFIX + n for n in names if _PREFIX + n not in weights.tensors]
        if _PREFIX + "lstm" not in weights.lstms:
            missing.append(_PREFIX + "lstm")
        if missing:
            raise KokoroModelError(f"the Kokoro weights lack {len(missing)} tensors of the text encoder: "
                                   f"{', '.join(missing[:5])}")  # fmt: skip
        self._w = {n: gp.from_numpy(np.ascontiguousarray(weights.tensors[_PREFIX + n])).astype(dtype) for n in names}
        lstm = weights.lstms[_PREFIX + "lstm"]
        self._lstm = tuple(gp.from_numpy(a).astype(dtype) for a in (lstm.w_ih, lstm.w_hh, lstm.bias))
        self._vocab = int(weights.tensors[_PREFIX + "embedding.weight"].shape[0])

    def __call__(self, ids: Any) -> GPUArray:
        """``ids``: the phoneme ids with Kokoro's 0 at both ends (1-D ints). Returns (512, T)."""
        tokens = np.asarray(ids)
        if tokens.ndim != 1 or tokens.size < 1 or tokens.dtype.kind not in "iu":
            raise ShapeError(f"kokoro text encoder: ids must be a 1-D integer sequence, got shape {tokens.shape}")
        if tokens.min() < 0 or tokens.max() >= self._vocab:
            raise ArgumentError(f"kokoro text encoder: ids must lie in [0, {self._vocab}), got "
                                f"[{tokens.min()}, {tokens.max()}]")  # fmt: skip
        x = gp.embedding(self._w["embedding.weight"], gp.from_numpy(tokens.astype(np.int64)))  # (T, 512)
        for i in range(_LAYERS):
            weight = self._w[f"cnn.{i}.0.weight"]
            h = gp.conv1d(x.transpose((1, 0)), weight, self._w[f"cnn.{i}.0.bias"], padding=weight.shape[2] // 2)
            h = gp.layernorm(h.transpose((1, 0)).contiguous(), self._w[f"cnn.{i}.1.gamma"], self._w[f"cnn.{i}.1.beta"],
                             _EPS)  # fmt: skip
            x = gp.leaky_relu(h, _SLOPE)
        w_ih, w_hh, bias = self._lstm
        out, _, _ = gp.lstm(x[None], w_ih, w_hh, bias)
        result: GPUArray = out[0].transpose((1, 0)).contiguous()
        return result
