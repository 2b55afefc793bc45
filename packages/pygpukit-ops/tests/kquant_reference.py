"""A scalar transcription of llama.cpp's reference k-quant quantizers (quantize_row_q*_K_ref with their
make_qkx2_quants / make_qx_quants / make_q3_quants), one element at a time in float32 like the C loops:
the reference test_quant_kquants.py compares pygpukit's vectorized quantizers with, block by block."""

from __future__ import annotations

from typing import Any

import numpy as np

F = np.float32
Vec = list[Any]


def ni(v):
    return int(np.rint(F(v)))


def f16(v):
    return F(np.float16(F(v)))


def qkx2(x, w, nmax, rmin, rdelta, nstep, mad):
    n = len(x)
    lo, hi, sw, sx = x[0], x[0], w[0], w[0] * x[0]
    for i in range(1, n):
        lo, hi = min(lo, x[i]), max(hi, x[i])
        sw = F(sw + w[i])
        sx = F(sx + w[i] * x[i])
    lo = min(lo, F(0))
    if hi == lo:
        return F(0), F(-lo), [0] * n
    iscale = F(F(nmax) / F(hi - lo))
    scale = F(F(1) / iscale)
    lv = [max(0, min(nmax, ni(iscale * F(x[i] - lo)))) for i in range(n)]
    best = F(0)
    for i in range(n):
        d = F(F(scale * F(lv[i])) + lo) - x[i]
        best = F(best + w[i] * (abs(d) if mad else d * d))
    for s in range(nstep + 1):
        iscale = F(F(F(rmin) + F(rdelta) * F(s)) + F(nmax)) / F(hi - lo)
        aux = [max(0, min(nmax, ni(iscale * F(x[i] - lo)))) for i in range(n)]
        sl = sl2 = sxl = F(0)
        for i in range(n):
            li = F(aux[i])
            sl = F(sl + w[i] * li)
            sl2 = F(sl2 + w[i] * li * li)
            sxl = F(sxl + w[i] * li * x[i])
        det = F(sw * sl2 - sl * sl)
        if det > 0:
            ts = F(F(sw * sxl - sx * sl) / det)
            tm = F(F(sl2 * sx - sl * sxl) / det)
            if tm > 0:
                tm = F(0)
                ts = F(sxl / sl2)
            cur = F(0)
            for i in range(n):
                d = F(F(ts * F(aux[i])) + tm) - x[i]
                cur = F(cur + w[i] * (abs(d) if mad else d * d))
            if cur < best:
                lv, best, scale, lo = aux, cur, ts, tm
    return scale, F(-lo), lv


def signed_max(v):
    top, amax = F(0), F(0)
    for t in v:
        if abs(t) > amax:
            amax, top = abs(t), t
    return top, amax


def qx(x, nmax):
    top, amax = signed_max(x)
    if amax < F(1e-15):
        return F(0), [0] * len(x)

    def fit(iscale):
        ls = [max(-nmax, min(nmax - 1, ni(iscale * x[i]))) for i in range(len(x))]
        slx = sl2 = F(0)
        for i, li in enumerate(ls):
            w = x[i] * x[i]
            slx = F(slx + w * x[i] * F(li))
            sl2 = F(sl2 + w * F(li) * F(li))
        return ls, slx, sl2

    ls, slx, sl2 = fit(F(-nmax) / top)
    scale = F(slx / sl2) if sl2 else F(0)
    best = F(scale * slx)
    for s in range(-9, 10):
        if s == 0:
            continue
        c, a, b = fit(-F(F(nmax) + F(0.1) * F(s)) / top)
        if b > 0 and a * a > best * b:
            ls = c
            scale = F(a / b)
            best = F(scale * a)
    return scale, [li + nmax for li in ls]


def q3(x, nmax):
    top, amax = signed_max(x)
    if amax < F(1e-15):
        return F(0), [0] * len(x)
    iscale = F(-nmax) / top
    lv = [max(-nmax, min(nmax - 1, ni(iscale * x[i]))) for i in range(len(x))]
    slx = sl2 = F(0)
    for i in range(len(x)):
        w = x[i] * x[i]
        slx = F(slx + w * x[i] * F(lv[i]))
        sl2 = F(sl2 + w * F(lv[i]) * F(lv[i]))
    for _ in range(5):
        changed = 0
        for i in range(len(x)):
            w = x[i] * x[i]
            a = F(slx - w * x[i] * F(lv[i]))
            if a > 0:
                b = F(sl2 - w * F(lv[i]) * F(lv[i]))
                nl = max(-nmax, min(nmax - 1, ni(x[i] * b / a)))
                if nl != lv[i]:
                    a = F(a + w * x[i] * F(nl))
                    b = F(b + w * F(nl) * F(nl))
                    if b > 0 and a * a * sl2 > slx * slx * b:
                        lv[i] = nl
                        slx = a
                        sl2 = b
                        changed += 1
        if not changed:
            break
    return (F(slx / sl2) if sl2 > 0 else F(0)), [li + nmax for li in lv]


def h16(v):
    return list(np.array([v], np.float16).view(np.uint8))


def pack2(lv):
    out = []
    for j in range(0, 256, 128):
        for li in range(32):
            out.append(lv[j + li] | (lv[j + li + 32] << 2) | (lv[j + li + 64] << 4) | (lv[j + li + 96] << 6))
    return out


def q2_k(x):
    scales, mins, lv = [], [], []
    for j in range(16):
        sub = x[16 * j : 16 * j + 16]
        s, m, li = qkx2(sub, [abs(v) for v in sub], 3, -0.5, 0.1, 15, True)
        scales.append(s)
        mins.append(m)
        lv += li
    ms, mm = max([F(0), *scales]), max([F(0), *mins])
    sc = [ni(F(15) / ms * s) if ms > 0 else 0 for s in scales]
    d = F(ms / F(15)) if ms > 0 else F(0)
    mn = [ni(F(15) / mm * m) if mm > 0 else 0 for m in mins]
    dmin = F(mm / F(15)) if mm > 0 else F(0)
    for j in range(16):
        dd = F(f16(d) * F(sc[j]))
        if not dd:
            continue
        dm = F(f16(dmin) * F(mn[j]))
        for i in range(16):
            lv[16 * j + i] = max(0, min(3, ni(F(x[16 * j + i] + dm) / dd)))
    return [sc[j] | (mn[j] << 4) for j in range(16)] + pack2(lv) + h16(d) + h16(dmin)


def q3_k(x):
    scales, lv = [], []
    for j in range(16):
        s, li = q3(x[16 * j : 16 * j + 16], 4)
        scales.append(s)
        lv += li
    top, _ = signed_max(scales)
    b = [0] * 12
    d = F(0)
    if top:
        iscale = F(-32) / top
        for j in range(16):
            li = max(-32, min(31, ni(iscale * scales[j]))) + 32
            if j < 8:
                b[j] = li & 0xF
            else:
                b[j - 8] |= (li & 0xF) << 4
            b[8 + j % 4] |= (li >> 4) << (2 * (j // 4))
        d = F(F(1) / iscale)
    for j in range(16):
        sc = (b[j] & 0xF) if j < 8 else (b[j - 8] >> 4)
        sc = (sc | (((b[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
        dd = F(f16(d) * F(sc))
        if not dd:
            continue
        for i in range(16):
            lv[16 * j + i] = max(-4, min(3, ni(x[16 * j + i] / dd))) + 4
    hm = [0] * 32
    for j in range(256):
        if lv[j] > 3:
            hm[j % 32] |= 1 << (j // 32)
            lv[j] -= 4
    return hm + pack2(lv) + b + h16(d)


def q45_k(x, nmax):
    scales, mins, lv = [], [], []
    for j in range(8):
        sub = x[32 * j : 32 * j + 32]
        s2 = F(0)
        for v in sub:
            s2 = F(s2 + v * v)
        av = F(np.sqrt(F(s2 / F(32))))
        w = [F(av + abs(v)) for v in sub]
        if nmax == 15:
            s, m, li = qkx2(sub, w, 15, -1.0, 0.1, 20, False)
        else:
            s, m, li = qkx2(sub, w, 31, -0.5, 0.1, 15, False)
        scales.append(s)
        mins.append(m)
        lv += li
    ms, mm = max([F(0), *scales]), max([F(0), *mins])
    inv_s = F(F(63) / ms) if ms > 0 else F(0)
    inv_m = F(F(63) / mm) if mm > 0 else F(0)
    ls = [min(63, ni(inv_s * s)) for s in scales]
    lm = [min(63, ni(inv_m * m)) for m in mins]
    b = [0] * 12
    for j in range(8):
        if j < 4:
            b[j] = ls[j]
            b[j + 4] = lm[j]
        else:
            b[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4)
            b[j - 4] |= (ls[j] >> 4) << 6
            b[j] |= (lm[j] >> 4) << 6
    d, dmin = F(ms / F(63)), F(mm / F(63))
    for j in range(8):
        dd = F(f16(d) * F(ls[j]))
        if not dd:
            continue
        dm = F(f16(dmin) * F(lm[j]))
        for i in range(32):
            lv[32 * j + i] = max(0, min(nmax, ni(F(x[32 * j + i] + dm) / dd)))
    return h16(d) + h16(dmin) + b, lv


def q4_k(x):
    head, lv = q45_k(x, 15)
    qs = []
    for j in range(0, 256, 64):
        qs += [lv[j + li] | (lv[j + li + 32] << 4) for li in range(32)]
    return head + qs


def q5_k(x):
    head, lv = q45_k(x, 31)
    qh, qs = [0] * 32, []
    for c, j in enumerate(range(0, 256, 64)):
        for li in range(32):
            a, b = lv[j + li], lv[j + li + 32]
            if a > 15:
                a -= 16
                qh[li] |= 1 << (2 * c)
            if b > 15:
                b -= 16
                qh[li] |= 1 << (2 * c + 1)
            qs.append(a | (b << 4))
    return head + qh + qs


def q6_k(x):
    scales, lv = [], []
    for j in range(16):
        s, li = qx(x[16 * j : 16 * j + 16], 32)
        scales.append(s)
        lv += li
    top, amax = signed_max(scales)
    if amax < F(1e-15):
        return [0] * 210
    iscale = F(-128) / top
    d = F(F(1) / iscale)
    sc = [min(127, ni(iscale * s)) for s in scales]
    for j in range(16):
        dd = F(f16(d) * F(sc[j]))
        if not dd:
            continue
        for i in range(16):
            lv[16 * j + i] = max(-32, min(31, ni(x[16 * j + i] / dd))) + 32
    ql, qh = [0] * 128, [0] * 64
    for h, j in enumerate(range(0, 256, 128)):
        for li in range(32):
            q = [lv[j + li + 32 * t] for t in range(4)]
            ql[64 * h + li] = (q[0] & 0xF) | ((q[2] & 0xF) << 4)
            ql[64 * h + li + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4)
            qh[32 * h + li] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6)
    return ql + qh + list(np.array(sc, np.int8).view(np.uint8)) + h16(d)


SCALAR = {"Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k}


def quantize_scalar(block, fmt):
    x = [F(v) for v in np.asarray(block, np.float32)]
    return np.array(SCALAR[fmt](x), dtype=np.uint8)
