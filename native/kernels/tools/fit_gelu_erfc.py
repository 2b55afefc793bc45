"""Fit the polynomial of the GELU (erf form) used for fp16, bf16 and fp8 results (elementwise/functors.cuh,
GeluErfNarrow), and check it against float64 over every finite fp16 and bf16 input.

The form: with t = |x| / sqrt(2) and tau = 1 / (1 + t / 2), erfc(t) = tau * exp(-t^2 + P(tau)), where
P is smooth on tau in (0, 1] (P(0) = -ln(2 sqrt(pi)) from erfc's asymptote). The kernel computes
h = erfc(t) / 2 = tau * 2^(-t^2 log2(e) + Q(tau)), Q = P log2(e) - 1, with one reciprocal and one
exp2 on the special function unit, and GELU(x) = x * (x < 0 ? h : 1 - h). A relative error e in h is
at most e in the result, with no cancellation for negative x.

Q is a minimax fit (Lawson's iteration on weighted least squares) of degree DEGREE over t in [0, 9.5]:
beyond it 2^(...) is below float's normal range (ex2.approx.ftz gives 0) and the result is below
bf16's. Prints the coefficients for the kernel, highest degree first, and the number of fp16 and
bf16 inputs whose result differs from the correctly rounded one, for this form and for
0.5 * x * (1 + erff(x / sqrt(2))) in float (what the float kernel and PyTorch compute).

    python native/kernels/tools/fit_gelu_erfc.py
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

DEGREE = 7
T_MAX = 9.5
LOG2E = 1.4426950408889634
F32 = np.float32

_erf = np.vectorize(math.erf)
_erfc = np.vectorize(math.erfc)


def target(tau: np.ndarray) -> np.ndarray:
    """Q(tau) in float64."""
    t = 2.0 * (1.0 / tau - 1.0)
    return (np.log(_erfc(t)) + t * t - np.log(tau)) * LOG2E - 1.0


def fit() -> tuple[np.ndarray, float]:
    low = 1.0 / (1.0 + T_MAX / 2.0)
    k = np.arange(6000)
    tau = (1.0 + low) / 2 + (1.0 - low) / 2 * np.cos(np.pi * (k + 0.5) / k.size)
    y = target(tau)
    weights = np.ones_like(tau)
    coef = np.zeros(DEGREE + 1)
    for _ in range(200):  # Lawson: weights grow where the error is largest, toward equal ripple
        coef = np.polynomial.polynomial.polyfit(tau, y, DEGREE, w=np.sqrt(weights))
        error = np.abs(np.polynomial.polynomial.polyval(tau, coef) - y)
        weights = weights * error / np.sum(weights * error) * tau.size
    dense = 1.0 / (1.0 + np.linspace(0.0, T_MAX, 400001) / 2.0)
    return coef, float(np.abs(np.polynomial.polynomial.polyval(dense, coef) - target(dense)).max())


def gelu_narrow(x: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """The kernel's arithmetic in float32 (a fused multiply-add rounded once)."""
    x = x.astype(F32)
    c = coef.astype(F32)
    tau = (1.0 / (F32(1) + np.abs(x) * F32(0.5 / math.sqrt(2))).astype(np.float64)).astype(F32)
    q = np.full_like(tau, c[-1])
    for a in c[-2::-1]:
        q = (q.astype(np.float64) * tau + np.float64(a)).astype(F32)
    with np.errstate(all="ignore"):
        e = (x.astype(np.float64) * (x * F32(-0.5 * LOG2E)).astype(F32) + q).astype(F32)
        two = np.exp2(e.astype(np.float64)).astype(F32)
        two[e < -126] = 0  # ftz
        h = (tau * two).astype(F32)
        return (x * np.where(x < 0, h, (F32(1) - h).astype(F32))).astype(F32)


def gelu_erff(x: np.ndarray) -> np.ndarray:
    x = x.astype(F32)
    erf = _erf((x * F32(0.7071067811865476)).astype(F32).astype(np.float64)).astype(F32)
    return ((F32(0.5) * x).astype(F32) * (F32(1) + erf).astype(F32)).astype(F32)


def main() -> None:
    coef, worst = fit()
    print(f"degree {DEGREE}, t in [0, {T_MAX}]: max |Q error| = {worst:.3g} (relative error of h: {worst / LOG2E:.3g})")
    print("coefficients, highest degree first:")
    for c in coef[::-1].astype(F32):
        print(f"  {float(c):.9g}f")
    for name, dtype in (("bf16", ml_dtypes.bfloat16), ("fp16", np.float16)):
        x = np.arange(1 << 16, dtype=np.uint16).view(dtype)
        x = x[np.isfinite(x.astype(np.float64))]
        wide = x.astype(np.float64)
        with np.errstate(all="ignore"):
            exact = (wide * 0.5 * _erfc(-wide / math.sqrt(2))).astype(dtype).astype(np.float64)
        for form, values in (("this form", gelu_narrow(x, coef)), ("erff in float", gelu_erff(x))):
            got = values.astype(dtype).astype(np.float64)
            bad = got != exact
            print(f"{name} {form}: {int(bad.sum())} of {x.size} inputs not correctly rounded")


if __name__ == "__main__":
    main()
