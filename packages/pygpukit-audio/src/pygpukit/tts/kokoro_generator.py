"""Kokoro's iSTFTNet generator on pygpukit ops: the decoder front's (512, 2F) features, the F0 curve and the
style's first half -> 600 F samples of 24 kHz audio. What the ONNX export computes (docs/tts.md):

    harmonic source (SineGen, 9 harmonics, no random terms in the export):
        rad_h  = frac(F0 * h / 24000) per F0 value (h = 1..9)
        phase  = cumsum(rad_h) * 2 * pi * 300, then linearly resized x300 (half-pixel)
        source = tanh(l_linear(0.1 * sin(phase) * [F0 upsampled > 10]))            (600F,)
    har = [|STFT|; angle(STFT)] of the source (n_fft 20, hop 5, periodic Hann, reflect padding 10)
    2 times i: x = ups.i(leaky_relu(x, 0.1)) (+ a reflect pad of 1 on the left after ups.1)
               x = x + noise_res.i(noise_convs.i(har))
               x = mean of resblocks.3i..3i+2 (AdaINResBlock1: AdaIN, snake, dilated conv, AdaIN, snake, conv)
    x = conv_post(leaky_relu(x, 0.01))                                               (22, 120F + 1)
    audio = the export's inverse STFT of exp(x[:11]) * e^(i sin(x[11:])): a ConvTranspose1d with its
        inverse basis (stride 5), its traced window sum (20 values) dividing the first samples, x4, [10:-10].
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pygpukit as gp
from pygpukit.core.array import GPUArray
from pygpukit.core.errors import ShapeError

from .errors import KokoroModelError
from .onnx_reader import KokoroOnnx

__all__ = ["SAMPLES_PER_FRAME", "SAMPLE_RATE", "KokoroGenerator"]

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 600  # a duration frame; the F0 curve has two values per frame
_PREFIX = "decoder.generator."
_HARMONICS = 9
_UPSAMPLE = 300  # F0 values -> samples (ups 10 x 6, iSTFT hop 5)
_N_FFT, _HOP = 20, 5
_BINS = _N_FFT // 2 + 1
_VOICED = 10.0
_SINE_AMP = 0.1
_EPS = 1e-5
_DILATIONS = (1, 3, 5)
_RES_KERNELS = (3, 7, 11)
_NOISE_KERNELS = (7, 11)
_UPS = ((10, 5), (6, 3))  # stride, padding of ups.0 (k20) and ups.1 (k12)
_NOISE_CONVS = ((6, 3), (1, 0))  # stride, padding of noise_convs.0 (k12) and noise_convs.1 (k1)
_TINY = float(np.finfo(np.float32).tiny)


def _block_names(name: str) -> list[str]:
    names = []
    for j in range(len(_DILATIONS)):
        for p in ("adain1", "adain2"):
            names += [f"{name}.{p}.{j}.fc.weight", f"{name}.{p}.{j}.fc.bias"]
        for p in ("convs1", "convs2"):
            names += [f"{name}.{p}.{j}.weight", f"{name}.{p}.{j}.bias"]
        names += [f"{name}.alpha1.{j}", f"{name}.alpha2.{j}"]
    return names


def stft_basis() -> np.ndarray[Any, Any]:
    """(22, 1, 20) float32: rows k = 0..10 ``hann[n] cos(2 pi k n / 20)``, rows 11..21 ``-hann[n] sin(...)``:
    a stride-5 conv1d with it is ONNX's onesided STFT (real parts, then imaginary parts)."""
    n = np.arange(_N_FFT)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / _N_FFT)  # periodic Hann
    angle = 2 * np.pi * np.outer(np.arange(_BINS), n) / _N_FFT
    return np.concatenate([window * np.cos(angle), -window * np.sin(angle)])[:, None, :].astype(np.float32)


def source_phase(f0: Any) -> np.ndarray[Any, Any]:
    """The harmonic source's phase at the F0 rate, (2F, 9) float32, in the export's float32 order:
    ``cumsum(frac(F0 * h / 24000)) * 2 * pi * 300``."""
    f = np.asarray(f0, np.float32).reshape(-1, 1)
    rad = (f * np.arange(1, _HARMONICS + 1, dtype=np.float32)) / np.float32(SAMPLE_RATE)
    rad = rad - np.floor(rad)
    phase = np.cumsum(rad, axis=0, dtype=np.float32) * np.float32(2.0)
    return phase * np.float32(np.pi) * np.float32(_UPSAMPLE)  # type: ignore[no-any-return]


def linear_resize(n: int, scale: int) -> tuple[np.ndarray[Any, Any], ...]:
    """Indices and weights of ONNX Resize (linear, half_pixel) from n to n * scale values: output j is
    ``w0[j] * in[i0[j]] + w1[j] * in[i1[j]]``, float32 coordinates as onnxruntime computes them."""
    j = np.arange(n * scale, dtype=np.float32)
    pos = np.clip((j + np.float32(0.5)) / np.float32(scale) - np.float32(0.5), 0, n - 1).astype(np.float32)
    i0 = np.minimum(pos.astype(np.int64), n - 1)
    i1 = np.minimum(i0 + 1, n - 1)
    w1 = (pos - i0.astype(np.float32)).astype(np.float32)  # |pos - i0|, |pos - i1|: both exact in float32
    w0 = (i1.astype(np.float32) - pos).astype(np.float32)
    same = i0 == i1
    w0[same], w1[same] = 0.5, 0.5
    return i0, i1, w0, w1


class KokoroGenerator:
    """The generator with weights uploaded once (``dtype`` float32, float16 or bfloat16; the harmonic
    source's phase and its STFT stay float32)."""

    def __init__(self, weights: KokoroOnnx, dtype: Any = gp.float32) -> None:
        self.dtype = dtype
        names = ["m_source.l_linear.weight", "m_source.l_linear.bias", "conv_post.weight", "conv_post.bias",
                 "stft.istft.stft.inverse_basis", "stft.istft.stft.window_sum"]  # fmt: skip
        for i in range(2):
            names += [f"ups.{i}.weight", f"ups.{i}.bias", f"noise_convs.{i}.weight", f"noise_convs.{i}.bias"]
            names += _block_names(f"noise_res.{i}")
        for b in range(2 * len(_RES_KERNELS)):
            names += _block_names(f"resblocks.{b}")
        missing = [_PREFIX + n for n in names if _PREFIX + n not in weights.tensors]
        if missing:
            raise KokoroModelError(f"the Kokoro weights lack {len(missing)} tensors of the generator: "
                                   f"{', '.join(missing[:5])}")  # fmt: skip
        host = {n: np.ascontiguousarray(weights.tensors[_PREFIX + n], np.float32) for n in names}
        basis_shape = host["stft.istft.stft.inverse_basis"].shape
        if host["m_source.l_linear.weight"].size != _HARMONICS or basis_shape != (2 * _BINS, 1, _N_FFT):
            raise KokoroModelError(f"the generator's l_linear {host['m_source.l_linear.weight'].shape} or inverse "
                                   f"basis {host['stft.istft.stft.inverse_basis'].shape} is not Kokoro's (9 "
                                   f"harmonics, a 20-point iSTFT)")  # fmt: skip
        host["m_source.l_linear.weight"] = host["m_source.l_linear.weight"].reshape(1, _HARMONICS)
        for n in [n for n in names if ".alpha" in n]:
            host[n] = host[n].reshape(-1)
        self._window_sum = host.pop("stft.istft.stft.window_sum").reshape(-1)
        keep32 = ("m_source.l_linear.weight", "m_source.l_linear.bias")
        self._w = {n: gp.from_numpy(v) if n in keep32 else gp.from_numpy(v).astype(dtype) for n, v in host.items()}
        self._basis = gp.from_numpy(stft_basis())
        self._resize: dict[int, tuple[GPUArray, ...]] = {}

    # -- the harmonic source ------------------------------------------------------------------------
    def _resize_tables(self, n: int) -> tuple[GPUArray, ...]:
        found = self._resize.get(n)
        if found is None:
            i0, i1, w0, w1 = linear_resize(n, _UPSAMPLE)
            found = (gp.from_numpy(i0), gp.from_numpy(i1), gp.from_numpy(w0[:, None]), gp.from_numpy(w1[:, None]))
            if len(self._resize) > 64:
                self._resize.clear()
            self._resize[n] = found
        return found

    def source(self, f0: Any) -> GPUArray:
        """The harmonic source (600F,) float32 of the F0 curve (2F,) (a GPUArray or array-like)."""
        f = np.asarray(f0.to_numpy() if isinstance(f0, GPUArray) else f0, np.float32).reshape(-1)
        if f.size == 0:
            raise ShapeError("kokoro generator: the F0 curve is empty")
        i0, i1, w0, w1 = self._resize_tables(f.size)
        phase = gp.from_numpy(source_phase(f))  # (2F, 9)
        up = gp.embedding(phase, i0) * w0 + gp.embedding(phase, i1) * w1  # (L, 9)
        voiced = gp.from_numpy((f > _VOICED).astype(np.float32)[:, None])  # (2F, 1): nearest x300 below
        uv = gp.broadcast_to(voiced[:, :, None], (f.size, _UPSAMPLE, 1)).contiguous().reshape(f.size * _UPSAMPLE, 1)
        sines = gp.sin(up) * _SINE_AMP * uv
        merged = gp.tanh(gp.linear(sines, self._w["m_source.l_linear.weight"], self._w["m_source.l_linear.bias"]))
        return merged.reshape(f.size * _UPSAMPLE)  # type: ignore[no-any-return]

    def harmonics(self, source: GPUArray) -> GPUArray:
        """[magnitude; phase] (22, L / 5 + 1) of the source's STFT (reflect padding n_fft / 2)."""
        n = source.shape[0]
        half = _N_FFT // 2
        if n <= half:
            raise ShapeError(f"kokoro generator: the source needs more than {half} samples, got {n}")
        reflect = np.concatenate([np.arange(half, 0, -1), np.arange(n), np.arange(n - 2, n - 2 - half, -1)])
        padded = gp.embedding(source.reshape(n, 1), gp.from_numpy(reflect.astype(np.int64))).reshape(1, n + 2 * half)
        spec = gp.conv1d(padded, self._basis, stride=_HOP)  # (22, frames)
        re, im = spec[:_BINS].contiguous(), spec[_BINS:].contiguous()
        magnitude = gp.sqrt(re * re + im * im)
        return gp.concatenate([magnitude, gp.atan2(im, re)], axis=0)  # type: ignore[no-any-return]

    # -- the network --------------------------------------------------------------------------------
    def _adain(self, x: GPUArray, s: GPUArray, name: str) -> GPUArray:
        h = gp.linear(s[None], self._w[name + ".fc.weight"], self._w[name + ".fc.bias"])[0]
        half = h.shape[0] // 2
        return gp.adain(x, h[:half], h[half:], _EPS)  # type: ignore[no-any-return]

    def _resblock(self, x: GPUArray, s: GPUArray, name: str, kernel: int) -> GPUArray:
        w = self._w
        for j, d in enumerate(_DILATIONS):
            h = gp.snake(self._adain(x, s, f"{name}.adain1.{j}"), w[f"{name}.alpha1.{j}"])
            h = gp.conv1d(h, w[f"{name}.convs1.{j}.weight"], w[f"{name}.convs1.{j}.bias"],
                          padding=d * (kernel - 1) // 2, dilation=d)  # fmt: skip
            h = gp.snake(self._adain(h, s, f"{name}.adain2.{j}"), w[f"{name}.alpha2.{j}"])
            h = gp.conv1d(h, w[f"{name}.convs2.{j}.weight"], w[f"{name}.convs2.{j}.bias"], padding=(kernel - 1) // 2)
            x = h + x
        return x

    def spectrum(self, x: GPUArray, har: GPUArray, style: Any) -> GPUArray:
        """conv_post's (22, 120F + 1) output from the features ``x`` (512, 2F) and ``har``."""
        ref = np.asarray(style, np.float32).reshape(-1)
        if ref.size not in (128, 256):
            raise ShapeError(f"kokoro generator: style must have 256 (or its first 128) values, got {ref.size}")
        s = gp.from_numpy(ref[:128]).astype(self.dtype)
        w = self._w
        har = har.astype(self.dtype)
        kernels = len(_RES_KERNELS)
        for i, ((stride, pad), (n_stride, n_pad)) in enumerate(zip(_UPS, _NOISE_CONVS, strict=True)):
            x = gp.leaky_relu(x, 0.1)
            xs = gp.conv1d(har, w[f"noise_convs.{i}.weight"], w[f"noise_convs.{i}.bias"], stride=n_stride,
                           padding=n_pad)  # fmt: skip
            xs = self._resblock(xs, s, f"noise_res.{i}", _NOISE_KERNELS[i])
            x = gp.conv_transpose1d(x, w[f"ups.{i}.weight"], w[f"ups.{i}.bias"], stride=stride, padding=pad)
            if i == len(_UPS) - 1:  # ReflectionPad1d((1, 0))
                x = gp.concatenate([x[:, 1:2].contiguous(), x], axis=1)
            if x.shape != xs.shape:
                raise ShapeError(f"kokoro generator: upsampled features {x.shape} and source features {xs.shape} "
                                 f"differ (the F0 curve must have 2 values per feature frame)")  # fmt: skip
            x = x + xs
            acc = self._resblock(x, s, f"resblocks.{i * kernels}", _RES_KERNELS[0])
            for j in range(1, kernels):
                acc = acc + self._resblock(x, s, f"resblocks.{i * kernels + j}", _RES_KERNELS[j])
            x = acc / float(kernels)
        x = gp.leaky_relu(x, 0.01)
        return gp.conv1d(x, w["conv_post.weight"], w["conv_post.bias"], padding=3)  # type: ignore[no-any-return]

    def inverse(self, spec: GPUArray) -> GPUArray:
        """The export's inverse STFT of conv_post's output (22, T) -> (T - 1) * 5 float32 samples."""
        spec = spec.astype(gp.float32)
        magnitude = gp.exp(spec[:_BINS].contiguous())
        phase = gp.sin(spec[_BINS:].contiguous())
        frames = gp.concatenate([magnitude * gp.cos(phase), magnitude * gp.sin(phase)], axis=0)
        basis = self._w["stft.istft.stft.inverse_basis"].astype(gp.float32)
        wav = gp.conv_transpose1d(frames, basis, stride=_HOP)[0]  # (n,)
        n = wav.shape[0]
        half = _N_FFT // 2
        # the traced window sum covers its own length only: samples there (> tiny) are divided by it
        ws = self._window_sum[: min(self._window_sum.size, n)]
        lo, hi = half, min(ws.size, n - half)
        parts = []
        if hi > lo:
            divisor = np.where(ws[lo:hi] > _TINY, ws[lo:hi], 1.0).astype(np.float32)
            parts.append(wav[lo:hi] / gp.from_numpy(divisor))
        parts.append(wav[max(hi, lo) : n - half])
        out = gp.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        return out * float(_N_FFT // _HOP)  # type: ignore[no-any-return]

    def __call__(self, x: GPUArray, f0: Any, style: Any) -> GPUArray:
        """``x`` (512, 2F) from :class:`~pygpukit.tts.kokoro_decoder.KokoroDecoderFront`, ``f0`` the F0
        curve (2F,), ``style`` the voice's (256,) vector. Returns 600 F float32 samples at 24 kHz."""
        frames = np.asarray(f0.shape if isinstance(f0, GPUArray) else np.shape(f0))
        if x.ndim != 2 or frames.size != 1 or int(frames[0]) != x.shape[1]:
            raise ShapeError(f"kokoro generator: x (C, 2F) needs an F0 curve of 2F values, got x {x.shape}, "
                             f"F0 {tuple(frames)}")  # fmt: skip
        har = self.harmonics(self.source(f0))
        return self.inverse(self.spectrum(x.astype(self.dtype), har, style))
