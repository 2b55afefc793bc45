"""Kokoro's F0 and energy (N) predictor on pygpukit ops: the duration encoder's features, expanded to
frames by the predicted durations, -> F0 and N curves at twice the frame rate.

    en = features of each phoneme repeated for its frames                      (640, F)
    x  = the predictor's shared bidirectional LSTM over en                     (512, F)
    F0 = F0_proj(F0.2(F0.1(F0.0(x, s), s), s)),  N likewise with N.0-2 and N_proj   (2F,)

Each F0.i / N.i is an AdaIN residual block (StyleTTS2's AdainResBlk1d, LeakyReLU 0.2):
``(residual(x) + shortcut(x)) / sqrt(2)`` with residual = conv2(lrelu(adain2(conv1(pool(lrelu(adain1(x)))))))
and shortcut = conv1x1(upsample(x)); block 1 upsamples by 2 (nearest repeat on the shortcut, a depthwise
ConvTranspose1d k3 s2 on the residual) and changes 512 -> 256 channels. ``s`` is the style's second half.
Uses the ops added for Kokoro: adain, leaky_relu, conv_transpose1d, lstm.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.core.array import GPUArray
from pygpukit.core.errors import ShapeError

from .errors import KokoroModelError
from .onnx_reader import KokoroOnnx

__all__ = ["KokoroProsody", "adain_res_block", "conv", "expand"]

_SLOPE = 0.2
_EPS = 1e-5
_BLOCKS = 3
_BLOCK_PARAMS = ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "norm1.fc.weight", "norm1.fc.bias",
                 "norm2.fc.weight", "norm2.fc.bias")  # fmt: skip


def expand(features: GPUArray, frames: Any) -> GPUArray:
    """Repeat row t of ``features`` (T, C) ``frames[t]`` times and return the (C, sum(frames)) result
    (Kokoro's ``features^T @ alignment``, the alignment being one-hot)."""
    counts = np.asarray(frames, np.int64)
    if features.ndim != 2 or counts.shape != (features.shape[0],) or (counts < 0).any():
        raise ShapeError(f"expand: features {features.shape} need one frame count >= 0 per row, got {counts.shape}")
    index = gp.from_numpy(np.repeat(np.arange(counts.size, dtype=np.int64), counts))
    rows: GPUArray = gp.embedding(features.contiguous(), index)  # (F, C)
    return rows.transpose((1, 0)).contiguous()


def _adain(w: dict[str, GPUArray], x: GPUArray, s: GPUArray, name: str) -> GPUArray:
    h = gp.linear(s[None], w[name + ".fc.weight"], w[name + ".fc.bias"])[0]
    half = h.shape[0] // 2
    return gp.adain(x, h[:half], h[half:], _EPS)  # type: ignore[no-any-return]


def conv(w: dict[str, GPUArray], x: GPUArray, name: str, bias: bool = True, stride: int = 1) -> GPUArray:
    """conv1d with ``w[name + ".weight"]`` (and ``.bias``), padding K // 2 (Kokoro's convolutions)."""
    weight = w[name + ".weight"]
    b = w[name + ".bias"] if bias else None
    return gp.conv1d(x, weight, b, stride=stride, padding=weight.shape[2] // 2)  # type: ignore[no-any-return]


def adain_res_block(w: dict[str, GPUArray], x: GPUArray, s: GPUArray, name: str, upsample: bool) -> GPUArray:
    """StyleTTS2's AdainResBlk1d (LeakyReLU 0.2) on x (C, L): ``(residual + shortcut) / sqrt(2)``; with
    ``upsample`` the residual's depthwise ConvTranspose1d (k3 s2) and the shortcut's nearest repeat double L;
    the shortcut is projected by ``name.conv1x1`` where the weights have one (C_in != C_out)."""
    h = gp.leaky_relu(_adain(w, x, s, name + ".norm1"), _SLOPE)
    if upsample:
        h = gp.conv_transpose1d(h, w[name + ".pool.weight"], w[name + ".pool.bias"], stride=2, padding=1,
                                output_padding=1, groups=h.shape[0])  # fmt: skip
    h = conv(w, h, name + ".conv1")
    h = gp.leaky_relu(_adain(w, h, s, name + ".norm2"), _SLOPE)
    h = conv(w, h, name + ".conv2")
    shortcut = x
    if upsample:  # nearest x2 along time
        c, n = x.shape
        shortcut = gp.broadcast_to(x[:, :, None], (c, n, 2)).contiguous().reshape(c, 2 * n)
    if name + ".conv1x1.weight" in w:
        shortcut = conv(w, shortcut, name + ".conv1x1", bias=False)
    return (h + shortcut) * float(1.0 / np.sqrt(2.0))


class KokoroProsody:
    """The F0 / N predictor with weights uploaded once (``dtype`` float32, float16 or bfloat16)."""

    def __init__(self, weights: KokoroOnnx, dtype: Any = gp.float32) -> None:
        self.dtype = dtype
        prefix = "encoder.predictor."
        names = [f"{prefix}{b}_proj.{p}" for b in ("F0", "N") for p in ("weight", "bias")]
        for branch in ("F0", "N"):
            for i in range(_BLOCKS):
                block = f"{prefix}{branch}.{i}."
                names += [block + p for p in _BLOCK_PARAMS]
                if i == 1:
                    names += [block + p for p in ("conv1x1.weight", "pool.weight", "pool.bias")]
        missing = [n for n in names if n not in weights.tensors]
        if f"{prefix}shared" not in weights.lstms:
            missing.append(f"{prefix}shared")
        if missing:
            raise KokoroModelError(f"the Kokoro weights lack {len(missing)} tensors of the F0 / N predictor: "
                                   f"{', '.join(missing[:5])}")  # fmt: skip
        self._w = {n[len(prefix) :]: gp.from_numpy(np.ascontiguousarray(weights.tensors[n])).astype(dtype)
                   for n in names}  # fmt: skip
        shared = weights.lstms[f"{prefix}shared"]
        self._shared = tuple(gp.from_numpy(a).astype(dtype) for a in (shared.w_ih, shared.w_hh, shared.bias))

    def __call__(self, expanded: GPUArray, style: Any) -> tuple[GPUArray, GPUArray]:
        """``expanded``: the duration encoder's features repeated per frame, (640, F) (:func:`expand`);
        ``style``: the voice's (256,) style vector. Returns the F0 and N curves, each (2F,)."""
        if expanded.ndim != 2 or expanded.shape[0] != self._shared[0].shape[2]:
            raise ShapeError(f"kokoro prosody: expanded features must be ({self._shared[0].shape[2]}, F), "
                             f"got {expanded.shape}")  # fmt: skip
        ref = np.asarray(style, np.float32).reshape(-1)
        if ref.size != 256:
            raise ShapeError(f"kokoro prosody: style must have 256 values, got {ref.size}")
        s = gp.from_numpy(ref[128:]).astype(self.dtype)
        w_ih, w_hh, bias = self._shared
        x, _, _ = gp.lstm(expanded.transpose((1, 0)).contiguous()[None], w_ih, w_hh, bias)
        x = x[0].transpose((1, 0)).contiguous()  # (512, F)
        curves = []
        for branch in ("F0", "N"):
            h = x
            for i in range(_BLOCKS):
                h = adain_res_block(self._w, h, s, f"{branch}.{i}", upsample=i == 1)
            curves.append(conv(self._w, h, f"{branch}_proj")[0])
        return curves[0], curves[1]
