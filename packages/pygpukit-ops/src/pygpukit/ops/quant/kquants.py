"""Quantizers for the GGUF k-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), in NumPy on the host.

The ``gguf`` Python package (0.19) has no quantizer for these types (``gguf.quants.quantize`` raises
NotImplementedError), so there is no Python reference to be equal to. These follow llama.cpp's
reference quantizers (``quantize_row_q*_K_ref`` in ggml-quants.c, the ones ``llama-quantize`` uses
without an importance matrix), step for step, in float32, vectorized over all sub-blocks at once:

- Q2_K: per 16-element sub-block a weighted least-absolute-deviation fit ``x ~ s * q - m`` (q in 0..3,
  weights |x|) over 16 candidate scales (make_qkx2_quants), then the 16 scales and mins as 4-bit
  multiples of two float16 super-block scales and a final requantization with them.
- Q3_K: per 16-element sub-block a symmetric 3-bit fit (q in -4..3) refined by coordinate descent
  on the x^2-weighted error (make_q3_quants), scales as 6-bit multiples of one float16 scale.
- Q4_K / Q5_K: per 32-element sub-block the weighted least-squares fit ``x ~ s * q - m`` (q in 0..15 or
  0..31, weights ``rms(sub-block) + |x|``) over 21 (16) candidate scales, scales and mins as 6-bit
  multiples of two float16 super-block scales, final requantization.
- Q6_K: per 16-element sub-block a symmetric 6-bit fit (q in -32..31) over 19 candidate scales
  (make_qx_quants, weights x^2), scales as int8 multiples of one float16 scale.

Every sum over a sub-block adds its terms left to right in float32 like the C loops (the sub-blocks
are laid out as columns so that NumPy's reductions run in that order), so the bytes equal a scalar
float32 transcription of the C code (tests/test_quant_kquants.py compares them). A C build that
contracts ``a + b * c`` into FMAs (``-march=native``) rounds some sums differently and can pick
another candidate scale where two candidates' errors tie to the last bit. Speed: a 4096 x 4096
float32 matrix quantizes in 1.5 to 3.5 s on one core (docs/quantization.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["KQUANT_QUANTIZERS", "quantize_kquant_blocks"]

Array = np.ndarray[Any, Any]
_F = np.float32
_EPS = _F(1e-15)  # GROUP_MAX_EPS


def _nearest(v: Array) -> Array:
    """llama.cpp's nearest_int: round half to even (the FPU's rounding), as int32."""
    result: Array = np.rint(v).astype(np.int32)
    return result


def _f16(v: Array) -> Array:
    """float32 rounded to float16 and back (GGML_FP32_TO_FP16 then GGML_FP16_TO_FP32)."""
    result: Array = v.astype(np.float16).astype(_F)
    return result


def _f16_bytes(v: Array) -> Array:
    result: Array = v.astype(np.float16).view(np.uint8).reshape(v.shape[0], 2)
    return result


def _safe(d: Array) -> Array:
    result: Array = np.where(d == 0, _F(1), d).astype(_F)
    return result


def _columns(x: Array) -> Array:
    """(S, n) sub-blocks as a contiguous (n, S) array: reductions over axis 0 then add element by
    element in C's order (x[0] + x[1] + ...), not NumPy's pairwise order along a contiguous axis."""
    result: Array = np.ascontiguousarray(x.T)
    return result


def _qkx2(
    x: Array, w: Array, nmax: int, rmin: float, rdelta: float, nstep: int, mad: bool
) -> tuple[Array, Array, Array]:
    """make_qkx2_quants over sub-blocks x (S, n) with weights w: (scale (S,), the_min (S,), qv (S, n))."""
    err: Callable[[Array], Array] = np.abs if mad else np.square
    x, w = _columns(x), _columns(w)
    lo = np.minimum(x.min(axis=0), _F(0))
    hi = x.max(axis=0)
    flat = hi == lo
    span = _safe(hi - lo)
    sum_w = w.sum(axis=0)
    sum_x = (w * x).sum(axis=0)
    iscale = _F(nmax) / span
    scale = _F(1) / iscale
    qv = np.clip(_nearest(iscale[None, :] * (x - lo[None, :])), 0, nmax).astype(_F)
    best = (w * err(scale[None, :] * qv + lo[None, :] - x)).sum(axis=0)
    for step in range(nstep + 1):
        iscale = (_F(rmin) + _F(rdelta) * _F(step) + _F(nmax)) / _safe(hi - lo)
        aux = np.clip(_nearest(iscale[None, :] * (x - lo[None, :])), 0, nmax).astype(_F)
        sum_l = (w * aux).sum(axis=0)
        sum_l2 = (w * aux * aux).sum(axis=0)
        sum_xl = (w * aux * x).sum(axis=0)
        det = sum_w * sum_l2 - sum_l * sum_l
        ok = det > 0
        det = _safe(det)
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = this_min > 0
        this_scale = np.where(positive, sum_xl / _safe(sum_l2), this_scale).astype(_F)
        this_min = np.where(positive, _F(0), this_min).astype(_F)
        cur = (w * err(this_scale[None, :] * aux + this_min[None, :] - x)).sum(axis=0)
        better = ok & (cur < best) & ~flat
        qv = np.where(better[None, :], aux, qv)
        best = np.where(better, cur, best)
        scale = np.where(better, this_scale, scale)
        lo = np.where(better, this_min, lo)
    scale = np.where(flat, _F(0), scale).astype(_F)
    qv = np.where(flat[None, :], _F(0), qv)
    return scale, (-lo).astype(_F), qv.astype(np.int32).T


def _signed_max(x: Array) -> tuple[Array, Array]:
    """(the element of largest |x| per column, first on ties; that |x|)."""
    at = np.abs(x).argmax(axis=0)[None, :]
    top = np.take_along_axis(x, at, axis=0)[0]
    return top, np.abs(top)


def _qx(x: Array, nmax: int) -> tuple[Array, Array]:
    """make_qx_quants with rmse_type 1 (weights x^2): (scale (S,), qv (S, n) in 0..2*nmax-1)."""
    x = _columns(x)
    top, amax = _signed_max(x)
    zero = amax < _EPS
    top = np.where(zero, _F(1), top).astype(_F)
    w = x * x

    def fit(iscale: Array) -> tuple[Array, Array, Array]:
        lv = np.clip(_nearest(iscale[None, :] * x), -nmax, nmax - 1).astype(_F)
        return lv, (w * x * lv).sum(axis=0), (w * lv * lv).sum(axis=0)

    lv, sumlx, suml2 = fit(_F(-nmax) / top)
    scale = np.where(suml2 != 0, sumlx / _safe(suml2), _F(0)).astype(_F)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        cand, slx, sl2 = fit(-(_F(nmax) + _F(0.1) * _F(step)) / top)
        better = (sl2 > 0) & (slx * slx > best * sl2)
        lv = np.where(better[None, :], cand, lv)
        scale = np.where(better, slx / _safe(sl2), scale).astype(_F)
        best = np.where(better, scale * slx, best)
    qv = np.where(zero[None, :], 0, lv.astype(np.int32) + nmax)
    return np.where(zero, _F(0), scale).astype(_F), qv.T


def _q3(x: Array, nmax: int) -> tuple[Array, Array]:
    """make_q3_quants with do_rmse: (scale (S,), qv (S, n) in 0..2*nmax-1)."""
    x = _columns(x)
    top, amax = _signed_max(x)
    zero = amax < _EPS
    iscale = _F(-nmax) / np.where(zero, _F(1), top).astype(_F)
    qv = np.clip(_nearest(iscale[None, :] * x), -nmax, nmax - 1).astype(_F)
    w = x * x
    sumlx = (w * x * qv).sum(axis=0)
    suml2 = (w * qv * qv).sum(axis=0)
    active = ~zero
    for _ in range(5):
        changed = np.zeros(x.shape[1], dtype=bool)
        for i in range(x.shape[0]):
            xi, wi, li = x[i], w[i], qv[i]
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            new = np.clip(_nearest(xi * sl2 / np.where(slx > 0, slx, _F(1))), -nmax, nmax - 1).astype(_F)
            slx2 = slx + wi * xi * new
            sl22 = sl2 + wi * new * new
            take = active & (slx > 0) & (new != li) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            qv[i] = np.where(take, new, li)
            sumlx = np.where(take, slx2, sumlx)
            suml2 = np.where(take, sl22, suml2)
            changed |= take
        active &= changed
        if not active.any():
            break
    scale = np.where(suml2 > 0, sumlx / _safe(suml2), _F(0)).astype(_F)
    out = np.where(zero[None, :], 0, qv.astype(np.int32) + nmax)
    return np.where(zero, _F(0), scale).astype(_F), out.T


def _pack2(qv: Array) -> Array:
    """(B, 256) 2-bit values -> (B, 64): byte j/4 + l of each 128 half holds qv[j+l+32*s] << 2s."""
    q = qv.astype(np.uint8).reshape(-1, 2, 4, 32)
    packed = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    result: Array = packed.reshape(-1, 64)
    return result


def _pack4(qv: Array) -> Array:
    """(B, 256) 4-bit values -> (B, 128): per 64 elements, 32 bytes of (qv[l] | qv[l + 32] << 4)."""
    q = qv.astype(np.uint8).reshape(-1, 4, 2, 32)
    result: Array = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    return result


def _scale_min_k4(ls: Array, lm: Array) -> Array:
    """Eight 6-bit scales and mins (B, 8) into the 12 bytes of Q4_K/Q5_K."""
    ls = ls.astype(np.uint8)
    lm = lm.astype(np.uint8)
    out = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return out


def _q2_k(x: Array) -> Array:
    b = x.shape[0]
    sub = x.reshape(-1, 16)
    scales, mins, qv = _qkx2(sub, np.abs(sub), 3, -0.5, 0.1, 15, True)
    scales, mins = scales.reshape(b, 16), mins.reshape(b, 16)
    max_scale = np.maximum(scales.max(axis=1), _F(0))
    max_min = np.maximum(mins.max(axis=1), _F(0))
    has_s, has_m = max_scale > 0, max_min > 0
    ls = np.where(has_s[:, None], _nearest((_F(15) / _safe(max_scale))[:, None] * scales), 0)
    lm = np.where(has_m[:, None], _nearest((_F(15) / _safe(max_min))[:, None] * mins), 0)
    d = np.where(has_s, max_scale / _F(15), _F(0)).astype(_F)
    dmin = np.where(has_m, max_min / _F(15), _F(0)).astype(_F)
    sc = (ls & 0xF).astype(_F) * _f16(d)[:, None]
    dm = (lm & 0xF).astype(_F) * _f16(dmin)[:, None]
    again = np.clip(_nearest((sub + dm.reshape(-1, 1)) / _safe(sc.reshape(-1, 1))), 0, 3)
    qv = np.where(sc.reshape(-1, 1) != 0, again, qv).reshape(b, 256)
    byte_scales = ((ls & 0xF) | ((lm & 0xF) << 4)).astype(np.uint8)
    return np.concatenate([byte_scales, _pack2(qv), _f16_bytes(d), _f16_bytes(dmin)], axis=1)


def _q3_k(x: Array) -> Array:
    b = x.shape[0]
    sub = x.reshape(-1, 16)
    scales, qv = _q3(sub, 4)
    scales = scales.reshape(b, 16)
    top, _ = _signed_max(scales.T)
    has = top != 0
    iscale = _F(-32) / np.where(has, top, _F(1)).astype(_F)
    lq = np.where(has[:, None], np.clip(_nearest(iscale[:, None] * scales), -32, 31) + 32, 0).astype(np.uint8)
    packed = np.zeros((b, 12), dtype=np.uint8)
    packed[:, :8] = (lq[:, :8] & 0xF) | ((lq[:, 8:] & 0xF) << 4)
    high = (lq >> 4).reshape(b, 4, 4)  # [j // 4, j % 4]
    packed[:, 8:] = high[:, 0] | (high[:, 1] << 2) | (high[:, 2] << 4) | (high[:, 3] << 6)
    d = np.where(has, _F(1) / iscale, _F(0)).astype(_F)
    sc = (lq.astype(np.int32) - 32).astype(_F) * _f16(d)[:, None]
    sc = np.where(has[:, None], sc, _F(0)).reshape(-1, 1)
    again = np.clip(_nearest(sub / _safe(sc)), -4, 3) + 4
    qv = np.where(sc != 0, again, qv).reshape(b, 256)
    hbits = (qv > 3).astype(np.uint8).reshape(b, 8, 32)
    hmask = np.zeros((b, 32), dtype=np.uint8)
    for bit in range(8):
        hmask |= hbits[:, bit] << bit
    qv = np.where(qv > 3, qv - 4, qv)
    return np.concatenate([hmask, _pack2(qv), packed, _f16_bytes(d)], axis=1)


def _q45_k(x: Array, nmax: int) -> tuple[Array, Array, Array, Array]:
    """Q4_K / Q5_K common part: (d, dmin, packed 12 scale bytes, qv (B, 256))."""
    b = x.shape[0]
    sub = x.reshape(-1, 32)
    av = np.sqrt(_columns(sub * sub).sum(axis=0) / _F(32))
    w = av[:, None] + np.abs(sub)
    if nmax == 15:
        scales, mins, qv = _qkx2(sub, w, 15, -1.0, 0.1, 20, False)
    else:
        scales, mins, qv = _qkx2(sub, w, 31, -0.5, 0.1, 15, False)
    scales, mins = scales.reshape(b, 8), mins.reshape(b, 8)
    max_scale = np.maximum(scales.max(axis=1), _F(0))
    max_min = np.maximum(mins.max(axis=1), _F(0))
    inv_s = np.where(max_scale > 0, _F(63) / _safe(max_scale), _F(0)).astype(_F)
    inv_m = np.where(max_min > 0, _F(63) / _safe(max_min), _F(0)).astype(_F)
    ls = np.minimum(_nearest(inv_s[:, None] * scales), 63)
    lm = np.minimum(_nearest(inv_m[:, None] * mins), 63)
    d = (max_scale / _F(63)).astype(_F)
    dmin = (max_min / _F(63)).astype(_F)
    sc = (_f16(d)[:, None] * ls.astype(_F)).reshape(-1, 1)
    dm = (_f16(dmin)[:, None] * lm.astype(_F)).reshape(-1, 1)
    again = np.clip(_nearest((sub + dm) / _safe(sc)), 0, nmax)
    qv = np.where(sc != 0, again, qv).reshape(b, 256)
    return d, dmin, _scale_min_k4(ls, lm), qv


def _q4_k(x: Array) -> Array:
    d, dmin, scales, qv = _q45_k(x, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), scales, _pack4(qv)], axis=1)


def _q5_k(x: Array) -> Array:
    d, dmin, scales, qv = _q45_k(x, 31)
    b = x.shape[0]
    high = (qv >> 4).astype(np.uint8).reshape(b, 8, 32)  # [64-chunk * 2 + half, l]
    qh = np.zeros((b, 32), dtype=np.uint8)
    for bit in range(8):
        qh |= high[:, bit] << bit
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), scales, qh, _pack4(qv & 0xF)], axis=1)


def _q6_k(x: Array) -> Array:
    b = x.shape[0]
    sub = x.reshape(-1, 16)
    scales, qv = _qx(sub, 32)
    scales = scales.reshape(b, 16)
    top, amax = _signed_max(scales.T)
    zero = amax < _EPS
    iscale = _F(-128) / np.where(zero, _F(1), top).astype(_F)
    d = np.where(zero, _F(0), _F(1) / iscale).astype(_F)
    ls = np.where(zero[:, None], 0, np.minimum(127, _nearest(iscale[:, None] * scales)))
    sc = (_f16(d)[:, None] * ls.astype(_F)).reshape(-1, 1)
    again = np.clip(_nearest(sub / _safe(sc)), -32, 31) + 32
    qv = np.where(sc != 0, again, qv).reshape(b, 256)
    qv = np.where(zero[:, None], 0, qv).astype(np.uint8)
    q = qv.reshape(b, 2, 4, 32)  # [128-half, quarter, l]
    ql = ((q[:, :, 0:2] & 0xF) | ((q[:, :, 2:4] & 0xF) << 4)).reshape(b, 128)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    return np.concatenate([ql, qh.reshape(b, 64), ls.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=1)


KQUANT_QUANTIZERS: dict[str, Callable[[Array], Array]] = {
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
"""Per format: float32 super-blocks (B, 256) -> their raw bytes (B, block bytes)."""


def quantize_kquant_blocks(blocks: Array, fmt: str) -> Array:
    """The raw bytes (B, block bytes) of float32 super-blocks (B, 256) in k-quant ``fmt``."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return KQUANT_QUANTIZERS[fmt](np.ascontiguousarray(blocks, dtype=_F))
