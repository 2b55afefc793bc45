"""scaled_matmul's per-channel and 128-block scales (W8A8 of HF "fp8" checkpoints) and its fp8 output,
against float64 references from the stored fp8 values and expanded scales (CPU backend in CI; the
GPU with -m gpu: cuBLASLt's OUTER_VEC, VEC128 and BLK128x128 modes on Hopper)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pygpukit as gp
from pygpukit.core.backend import backend_state
from pygpukit.core.errors import DTypeError, ShapeError
from pygpukit.ops.gemm import api as mm
from pygpukit.ops.gemm.scaled import block_weight_scale

E4M3 = ml_dtypes.float8_e4m3fn


def _need_fp8(block: bool = False) -> None:
    if backend_state().name != "cuda":
        return
    from pygpukit.core.device import get_device, get_device_info

    cc = tuple(get_device_info(get_device()).compute_capability)
    if cc < (8, 9) or (block and cc[0] != 9):
        pytest.skip(f"needs {'Hopper' if block else 'compute capability 8.9'}; this GPU is {cc}")


def _fp8(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    return (rng.standard_normal(shape) * 4).astype(E4M3)


def _accumulation() -> float:
    """Relative accumulation error of an fp8 GEMM (times sum |x| |w|): float32 on the CPU simulation;
    on the GPU the fp8 tensor cores keep about 14 mantissa bits between cuBLASLt's promotions to
    float32 (measured on the H100: excesses up to 5e-5 over a 1e-5 bound), so 2^-13."""
    return 2.0**-13 if backend_state().name == "cuda" else 1e-5


def _bound(x: np.ndarray[Any, Any], w: np.ndarray[Any, Any], out: Any) -> np.ndarray[Any, Any]:
    """|error| bound per element: the output rounding of the result plus the fp8 GEMM's accumulation."""
    eps = 2.0**-8 if out == ml_dtypes.bfloat16 else 2.0**-23
    mag = np.abs(x) @ np.abs(w)
    return eps * np.abs(x @ w) + _accumulation() * mag + 1e-30


def _check(got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any], bound: np.ndarray[Any, Any]) -> None:
    err = np.abs(got.astype(np.float64) - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), f"max excess {np.max(err - bound)} at {worst}"


@pytest.mark.parametrize(("m", "n", "k"), [(1, 16, 32), (37, 48, 96), (130, 272, 400)])
def test_per_channel_scales(m: int, n: int, k: int) -> None:
    _need_fp8()
    rng = np.random.default_rng(m + n + k)
    a, w = _fp8(rng, (m, k)), _fp8(rng, (n, k))
    sa = rng.uniform(0.01, 2, m).astype(np.float32)
    sw = rng.uniform(0.01, 2, n).astype(np.float32)
    got = mm.scaled_matmul(gp.from_numpy(a), gp.from_numpy(w).T, gp.from_numpy(sa), gp.from_numpy(sw)).to_numpy()
    xa = a.astype(np.float64) * sa[:, None]
    xw = (w.astype(np.float64) * sw[:, None]).T
    _check(got, xa @ xw, _bound(xa, xw, ml_dtypes.bfloat16))


@pytest.mark.parametrize(("m", "n", "k"), [(1, 128, 128), (5, 256, 384), (67, 400, 528), (256, 384, 1024)])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_block_scales(m: int, n: int, k: int, out_dtype: str) -> None:
    _need_fp8(block=True)
    rng = np.random.default_rng(7 * m + n)
    a, w = _fp8(rng, (m, k)), _fp8(rng, (n, k))
    kb, nb = -(-k // 128), -(-n // 128)
    sa = rng.uniform(0.01, 2, (kb, m)).astype(np.float32)  # stored M-major: (kb, m) contiguous
    sw = rng.uniform(0.01, 2, (nb, kb)).astype(np.float32)  # a weight's (N/128, K/128) block scale
    scale_b = block_weight_scale(gp.from_numpy(sw))
    got = mm.scaled_matmul(gp.from_numpy(a), gp.from_numpy(w).T, gp.from_numpy(sa).T, scale_b,
                           out_dtype=out_dtype).to_numpy()  # fmt: skip
    xa = a.astype(np.float64) * np.repeat(sa.T, 128, axis=1)[:, :k]
    full_w = np.repeat(np.repeat(sw, 128, axis=0)[:n], 128, axis=1)[:, :k]
    xw = (w.astype(np.float64) * full_w).T
    out_np = ml_dtypes.bfloat16 if out_dtype == "bfloat16" else np.float32
    _check(got, xa @ xw, _bound(xa, xw, out_np))


def test_block_weight_scale_pads_to_four_k_blocks() -> None:
    sw = np.arange(2 * 3, dtype=np.float32).reshape(2, 3) + 1
    view = block_weight_scale(gp.from_numpy(sw))
    assert view.shape == (3, 2)
    assert view.strides == (4, 16)  # bytes
    assert np.array_equal(view.to_numpy(), sw.T)
    four = np.ones((2, 4), np.float32)
    assert block_weight_scale(gp.from_numpy(four)).strides == (4, 16)


def test_fp8_output_is_saturated_and_scaled() -> None:
    _need_fp8()
    rng = np.random.default_rng(5)
    a, w = _fp8(rng, (33, 64)), _fp8(rng, (48, 64))
    sa, sb = gp.from_numpy(np.array([0.25], np.float32)), gp.from_numpy(np.array([0.5], np.float32))
    so = gp.from_numpy(np.array([12.0], np.float32))
    got = mm.scaled_matmul(gp.from_numpy(a), gp.from_numpy(w).T, sa, sb, out_dtype="float8_e4m3fn", scale_out=so)
    assert got.dtype.name == "float8_e4m3fn"
    ref = np.clip(12.0 * (a.astype(np.float64) * 0.25) @ (w.astype(np.float64) * 0.5).T, -448, 448)
    host = got.to_numpy().astype(np.float64)
    mag = 12.0 * np.abs(a.astype(np.float64) * 0.25) @ np.abs(w.astype(np.float64) * 0.5).T
    # One e4m3 rounding (relative 2^-4) of the accumulated value; saturated entries exact.
    assert np.all(np.abs(host - ref) <= 2.0**-4 * np.abs(ref) + 2.0**-9 + _accumulation() * mag)
    assert np.abs(ref).max() == 448.0  # some entries did saturate


def test_bad_scales_name_what_is_wrong() -> None:
    rng = np.random.default_rng(1)
    a, w = gp.from_numpy(_fp8(rng, (4, 256))), gp.from_numpy(_fp8(rng, (128, 256)))
    one = gp.from_numpy(np.array([1.0], np.float32))
    with pytest.raises(ShapeError, match="M-major"):
        mm.scaled_matmul(a, w.T, gp.ones((4, 2)), block_weight_scale(gp.ones((1, 2))))
    w2 = gp.from_numpy(_fp8(rng, (256, 256)))
    with pytest.raises(ShapeError, match=r"strides \(1, 4\)"):
        mm.scaled_matmul(a, w2.T, gp.ones((2, 4)).T, gp.ones((2, 2)))
    with pytest.raises(ShapeError, match="fit none of the kinds"):
        mm.scaled_matmul(a, w.T, gp.ones(4), one)
    with pytest.raises(DTypeError, match="needs scale_out"):
        mm.scaled_matmul(a, w.T, one, one, out_dtype="float8_e4m3fn")
    with pytest.raises(ShapeError, match="per-tensor scales"):
        mm.scaled_matmul(a, w.T, gp.ones(4), gp.ones(128), out_dtype="float8_e4m3fn", scale_out=one)
    with pytest.raises(DTypeError, match="applies to an fp8 out_dtype"):
        mm.scaled_matmul(a, w.T, one, one, scale_out=one)


@pytest.mark.parametrize("kind", ["channel", "block", "fp8-out"])
def test_device_fallback_equals_the_scaled_product(kind: str) -> None:
    """Where cuBLASLt lacks the scale mode (before 12.9) scaled_matmul takes scaled.device_fallback:
    device ops only (unit-scale fp8 GEMM, gathers of the block scales, float32 GEMM); the same
    product as the float64 reference, on either backend."""
    from pygpukit.ops.gemm import scaled

    _need_fp8(block=kind == "block")
    rng = np.random.default_rng(len(kind))
    m, n, k = 37, 272, 400
    a, w = _fp8(rng, (m, k)), _fp8(rng, (n, k))
    kb, nb = -(-k // 128), -(-n // 128)
    out_np: Any = ml_dtypes.bfloat16
    scale_out = None
    if kind == "channel":
        sa_h, sw_h = rng.uniform(0.01, 2, m).astype(np.float32), rng.uniform(0.01, 2, n).astype(np.float32)
        sa, sb = gp.from_numpy(sa_h), gp.from_numpy(sw_h)
        xa, xw = a.astype(np.float64) * sa_h[:, None], (w.astype(np.float64) * sw_h[:, None]).T
    elif kind == "block":
        sa_h, sw_h = rng.uniform(0.01, 2, (kb, m)).astype(np.float32), rng.uniform(0.01, 2, (nb, kb)).astype(np.float32)
        sa, sb = gp.from_numpy(sa_h).T, block_weight_scale(gp.from_numpy(sw_h))
        xa = a.astype(np.float64) * np.repeat(sa_h.T, 128, axis=1)[:, :k]
        xw = (w.astype(np.float64) * np.repeat(np.repeat(sw_h, 128, axis=0)[:n], 128, axis=1)[:, :k]).T
    else:
        sa, sb = gp.from_numpy(np.array([0.25], np.float32)), gp.from_numpy(np.array([0.5], np.float32))
        scale_out = gp.from_numpy(np.array([0.125], np.float32))
        xa, xw = a.astype(np.float64) * 0.25, (w.astype(np.float64) * 0.5).T
        out_np = ml_dtypes.float8_e4m3fn
    d = gp.empty((m, n), "float8_e4m3fn" if kind == "fp8-out" else "bfloat16")
    scaled.device_fallback(gp.from_numpy(a), gp.from_numpy(w).T, sa, sb, "tensor" if kind == "fp8-out" else kind,
                           None, d, None, scale_out)  # fmt: skip
    got = d.to_numpy().astype(np.float64)
    if kind == "fp8-out":
        want = np.clip(0.125 * (xa @ xw), -448, 448)
        assert np.all(np.abs(got - want) <= 2.0**-3 * np.abs(want) + 1e-3 * (np.abs(xa) @ np.abs(xw)) * 0.125)
        return
    _check(got, xa @ xw, _bound(xa, xw, out_np))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["channel", "block"])
def test_gpu_bias_after_where_the_bias_epilogue_is_refused(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where this cuBLASLt scales a kind only without a bias epilogue (remembered as "<kind>+bias"), the
    GEMM runs without it and the bias is added after, on the device: the same product and bias."""
    from pygpukit.core.stream import thread_device
    from pygpukit.ops.gemm import scaled

    _need_fp8(block=kind == "block")
    monkeypatch.setattr(scaled, "_REFUSED", {(kind + "+bias", thread_device())})
    rng = np.random.default_rng(11)
    m, n, k = 40, 256, 384
    a, w = _fp8(rng, (m, k)), _fp8(rng, (n, k))
    bias = rng.standard_normal(n).astype(np.float32)
    if kind == "channel":
        sa_h, sw_h = rng.uniform(0.01, 2, m).astype(np.float32), rng.uniform(0.01, 2, n).astype(np.float32)
        sa, sb = gp.from_numpy(sa_h), gp.from_numpy(sw_h)
        xa, xw = a.astype(np.float64) * sa_h[:, None], (w.astype(np.float64) * sw_h[:, None]).T
    else:
        kb, nb = k // 128, n // 128
        sa_h, sw_h = rng.uniform(0.01, 2, (kb, m)).astype(np.float32), rng.uniform(0.01, 2, (nb, kb)).astype(np.float32)
        sa, sb = gp.from_numpy(sa_h).T, block_weight_scale(gp.from_numpy(sw_h))
        xa = a.astype(np.float64) * np.repeat(sa_h.T, 128, axis=1)
        xw = (w.astype(np.float64) * np.repeat(np.repeat(sw_h, 128, axis=0), 128, axis=1)).T
    got = mm.scaled_matmul(gp.from_numpy(a), gp.from_numpy(w).T, sa, sb, out_dtype="float32",
                           bias=gp.from_numpy(bias)).to_numpy()  # fmt: skip
    want = xa @ xw + bias.astype(np.float64)
    _check(got, want, _bound(xa, xw, np.float32) + 2.0**-23 * np.abs(bias))
