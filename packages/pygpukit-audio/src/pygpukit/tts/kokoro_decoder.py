"""The front of Kokoro's decoder on pygpukit ops: text features per frame, F0 and N curves and the style's
first half -> the (512, 2F) input of the iSTFTNet generator.

    F0 = F0_conv(F0 curve) (k3, stride 2: 2F -> F),  N = N_conv(N curve)
    x  = encode([asr; F0; N], s)                                  (1024, F)
    asr_res = asr_res(asr)                                        (64, F), a 1x1 convolution
    decode.0-2: x = block([x; asr_res; F0; N], s)                 (1024, F)
    decode.3:   x = block([x; asr_res; F0; N], s), upsampling     (512, 2F)

``asr``: the text encoder's features repeated per frame (:func:`pygpukit.tts.kokoro_prosody.expand`);
the blocks are AdainResBlk1d (:func:`pygpukit.tts.kokoro_prosody.adain_res_block`). The generator (harmonic
source, upsampling, AdaIN residual blocks with snake activations, iSTFT) is
:class:`pygpukit.tts.kokoro_generator.KokoroGenerator`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.core.array import GPUArray
from pygpukit.core.errors import ShapeError

from .errors import KokoroModelError
from .kokoro_prosody import adain_res_block, conv
from .onnx_reader import KokoroOnnx

__all__ = ["KokoroDecoderFront"]

_PREFIX = "decoder."
_BLOCK_PARAMS = ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "norm1.fc.weight", "norm1.fc.bias",
                 "norm2.fc.weight", "norm2.fc.bias", "conv1x1.weight")  # fmt: skip


class KokoroDecoderFront:
    """encode and decode.0-3 with weights uploaded once (``dtype`` float32, float16 or bfloat16)."""

    def __init__(self, weights: KokoroOnnx, dtype: Any = gp.float32) -> None:
        self.dtype = dtype
        names = [f"{c}.{p}" for c in ("F0_conv", "N_conv", "asr_res.0") for p in ("weight", "bias")]
        for block in ("encode", "decode.0", "decode.1", "decode.2", "decode.3"):
            names += [f"{block}.{p}" for p in _BLOCK_PARAMS]
        names += ["decode.3.pool.weight", "decode.3.pool.bias"]
        missing = [_PREFIX + n for n in names if _PREFIX + n not in weights.tensors]
        if missing:
            raise KokoroModelError(f"the Kokoro weights lack {len(missing)} tensors of the decoder: "
                                   f"{', '.join(missing[:5])}")  # fmt: skip
        self._w = {n: gp.from_numpy(np.ascontiguousarray(weights.tensors[_PREFIX + n])).astype(dtype) for n in names}

    def __call__(self, asr: GPUArray, f0: GPUArray, n: GPUArray, style: Any) -> GPUArray:
        """``asr`` (512, F); ``f0`` and ``n`` (2F,) from :class:`~pygpukit.tts.kokoro_prosody.KokoroProsody`;
        ``style`` the voice's (256,) vector (its first half conditions the decoder). Returns (512, 2F)."""
        if asr.ndim != 2 or f0.shape != (2 * asr.shape[1],) or n.shape != f0.shape:
            raise ShapeError(f"kokoro decoder: asr (C, F) needs F0 and N curves of 2F values, got asr {asr.shape}, "
                             f"F0 {f0.shape}, N {n.shape}")  # fmt: skip
        ref = np.asarray(style, np.float32).reshape(-1)
        if ref.size != 256:
            raise ShapeError(f"kokoro decoder: style must have 256 values, got {ref.size}")
        w = self._w
        s = gp.from_numpy(ref[:128]).astype(self.dtype)
        f0_f = conv(w, f0[None], "F0_conv", stride=2)  # (1, F)
        n_f = conv(w, n[None], "N_conv", stride=2)
        x = adain_res_block(w, gp.concatenate([asr, f0_f, n_f], axis=0), s, "encode", upsample=False)
        asr_res = conv(w, asr, "asr_res.0")
        for i in range(4):
            x = gp.concatenate([x, asr_res, f0_f, n_f], axis=0)
            x = adain_res_block(w, x, s, f"decode.{i}", upsample=i == 3)
        return x
