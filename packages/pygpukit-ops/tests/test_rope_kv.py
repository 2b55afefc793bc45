"""rope_kv_append (RoPE fused with the decode step's KV-cache write): against a float64 NumPy rotation
and cache write, bit for bit against apply_rope followed by KVCache.append, both styles, partial
rotary dims, strided views of a fused qkv buffer, in place and into q_out, typed errors; on the GPU,
graph replays at new device positions equal eager runs and the scalar path equals the vector one."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
from ops_testing import Array

import pygpukit as gp
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError

DTYPES = [gp.float32, gp.float16, gp.bfloat16]
# Relative error bound of one rounding to the dtype (plus float32 arithmetic), in units of the row's scale.
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Array:
    return rng.uniform(-2.0, 2.0, size=shape).astype(np.float32).astype(dtype.numpy)


def _reference_rotate(x: Array, cos: Array, sin: Array, pos: Array, style: str) -> Array:
    """x (batch, seq, heads, head_dim) rotated in float64 by the table rows pos (batch, seq)."""
    x64 = x.astype(np.float64)
    half = cos.shape[1]
    c = cos.astype(np.float64)[pos][:, :, None, :]
    s = sin.astype(np.float64)[pos][:, :, None, :]
    out = x64.copy()
    if style == "neox":
        a, b = x64[..., :half], x64[..., half : 2 * half]
        out[..., :half], out[..., half : 2 * half] = a * c - b * s, b * c + a * s
    else:
        a, b = x64[..., 0 : 2 * half : 2], x64[..., 1 : 2 * half : 2]
        out[..., 0 : 2 * half : 2], out[..., 1 : 2 * half : 2] = a * c - b * s, b * c + a * s
    return out


def _close(got: Array, want: Array, dtype: DType, what: str) -> None:
    err = np.abs(got.astype(np.float64) - want)
    bound = TOLERANCE[dtype.name] * (np.abs(want) + 1.0)
    assert (err <= bound).all(), f"{what}: max error {err.max()}"


def _case(rng: np.random.Generator, dtype: DType, style: str, batch: int, seq: int, heads: int, kv_heads: int,
          head_dim: int, rotary_dim: int, max_seq: int, fused: bool, q_out: bool) -> None:  # fmt: skip
    cos, sin = gp.rope_cos_sin(head_dim, 512, 1e4, rotary_dim)
    if fused:  # views into one (batch, seq, heads + 2 kv_heads, head_dim) buffer, as a fused QKV GEMM writes
        hqkv = _values(rng, (batch, seq, heads + 2 * kv_heads, head_dim), dtype)
        qkv = gp.from_numpy(hqkv)
        q, k, v = qkv[:, :, :heads], qkv[:, :, heads : heads + kv_heads], qkv[:, :, heads + kv_heads :]
        hq, hk, hv = hqkv[:, :, :heads], hqkv[:, :, heads : heads + kv_heads], hqkv[:, :, heads + kv_heads :]
    else:
        hq = _values(rng, (batch, seq, heads, head_dim), dtype)
        hk, hv = (_values(rng, (batch, seq, kv_heads, head_dim), dtype) for _ in range(2))
        q, k, v = gp.from_numpy(hq), gp.from_numpy(hk), gp.from_numpy(hv)
    hk_before, hv_before = k.to_numpy().copy(), v.to_numpy().copy()
    cache = gp.ops.KVCache(1, batch, kv_heads, max_seq, head_dim, dtype=dtype)
    cache.reset(clear=True)
    hp = rng.integers(0, max_seq - seq + 1, size=batch).astype(np.int32)
    positions = gp.from_numpy(hp + 1)  # with offset -1: a lengths buffer that counts the new token
    out = gp.empty(q.shape, dtype) if q_out else None
    result = gp.ops.rope_kv_append(q, k, v, cache.k(0), cache.v(0), cos, sin, positions, style=style,
                                   rotary_dim=rotary_dim, position_offset=-1, q_out=out)  # fmt: skip
    assert result is (out if q_out else q)
    pos = hp[:, None] + np.arange(seq)[None, :]
    hc, hs = cos.to_numpy(), sin.to_numpy()
    _close(result.to_numpy(), _reference_rotate(hq, hc, hs, pos, style), dtype, "q")
    got_k, got_v = cache.k(0).to_numpy(), cache.v(0).to_numpy()
    want_k = _reference_rotate(hk, hc, hs, pos, style)
    for b in range(batch):
        window = slice(int(hp[b]), int(hp[b]) + seq)
        _close(got_k[b, :, window].transpose(1, 0, 2), want_k[b], dtype, "k cache")
        assert got_v[b, :, window].transpose(1, 0, 2).tobytes() == np.ascontiguousarray(hv[b]).tobytes()
        outside = np.ones(max_seq, bool)
        outside[window] = False
        assert not got_k[b, :, outside].any()  # nothing else written
        assert not got_v[b, :, outside].any()
    if rotary_dim < head_dim:  # the dimensions past rotary_dim are copied bit for bit
        assert result.to_numpy()[..., rotary_dim:].tobytes() == np.ascontiguousarray(hq[..., rotary_dim:]).tobytes()
    assert k.to_numpy().tobytes() == hk_before.tobytes()  # k and v are only read
    assert v.to_numpy().tobytes() == hv_before.tobytes()
    # Bit for bit the two-launch path: apply_rope in place, then KVCache.append.
    two = gp.ops.KVCache(1, batch, kv_heads, max_seq, head_dim, dtype=dtype)
    two.reset(clear=True)
    q2, k2 = gp.from_numpy(np.ascontiguousarray(hq)), gp.from_numpy(hk_before)
    gp.apply_rope(q2, k2, cos, sin, positions.reshape(batch, 1) if seq == 1 else gp.from_numpy(pos.astype(np.int32)),
                  style=style, rotary_dim=rotary_dim, position_offset=-1 if seq == 1 else 0)  # fmt: skip
    two.append(0, k2, gp.from_numpy(hv_before), positions, offset=-1)
    assert result.to_numpy().tobytes() == q2.to_numpy().tobytes()
    assert got_k.tobytes() == two.k(0).to_numpy().tobytes()
    assert got_v.tobytes() == two.v(0).to_numpy().tobytes()


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused-qkv"])
def test_decode_shapes(rng: np.random.Generator, dtype: DType, style: str, fused: bool) -> None:
    _case(rng, dtype, style, 2, 1, 9, 3, 64, 64, 37, fused, q_out=fused)  # SmolLM2-135M's heads, batch 2


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(128, 64), (80, 40), (96, 6), (12, 12)])
def test_partial_rotary_and_several_tokens(rng: np.random.Generator, style: str, head_dim: int,
                                           rotary_dim: int) -> None:  # fmt: skip
    _case(rng, gp.bfloat16, style, 3, 2, 4, 2, head_dim, rotary_dim, 19, True, q_out=False)


def test_float32_tables_in_the_activation_dtype(rng: np.random.Generator) -> None:
    cos, sin = gp.rope_cos_sin(64, 64, 1e4, dtype=gp.bfloat16)
    q, k, v = (gp.from_numpy(_values(rng, (1, 1, h, 64), gp.bfloat16)) for h in (4, 2, 2))
    hq = q.to_numpy().copy()
    cache = gp.ops.KVCache(1, 1, 2, 8, 64, dtype=gp.bfloat16)
    gp.ops.rope_kv_append(q, k, v, cache.k(0), cache.v(0), cos, sin, gp.from_numpy(np.array([3], np.int32)))
    want = _reference_rotate(hq, cos.to_numpy(), sin.to_numpy(), np.array([[3]]), "neox")
    _close(q.to_numpy(), want, gp.bfloat16, "q")


def test_positions_outside_the_cache_raise_on_cpu(rng: np.random.Generator) -> None:
    if gp.backend_state().name == "cuda":
        pytest.skip("the GPU kernel skips those writes (test_gpu_positions_outside_the_cache_are_skipped)")
    cos, sin = gp.rope_cos_sin(64, 64, 1e4)
    q, k, v = (gp.from_numpy(_values(rng, (2, 1, h, 64), gp.float32)) for h in (4, 2, 2))
    cache = gp.ops.KVCache(1, 2, 2, 8, 64, dtype=gp.float32)
    with pytest.raises(ArgumentError, match=r"batch row 1 writes positions \[8, 9\)"):
        gp.ops.rope_kv_append(q, k, v, cache.k(0), cache.v(0), cos, sin, gp.from_numpy(np.array([1, 8], np.int32)))


def test_bad_arguments_raise_typed_errors(rng: np.random.Generator) -> None:
    cos, sin = gp.rope_cos_sin(64, 64, 1e4)
    q, k, v = (gp.from_numpy(_values(rng, (1, 1, h, 64), gp.float32)) for h in (4, 2, 2))
    cache = gp.ops.KVCache(1, 1, 2, 8, 64, dtype=gp.float32)
    pos = gp.from_numpy(np.array([0], np.int32))
    kc, vc = cache.k(0), cache.v(0)
    call = gp.ops.rope_kv_append
    with pytest.raises(DTypeError, match="k must be float32"):
        call(q, k.astype(gp.float16), v, kc, vc, cos, sin, pos)
    with pytest.raises(ShapeError, match=r"k \(1, 1, 2, 64\) and v \(1, 1, 3, 64\)"):
        call(q, k, gp.zeros((1, 1, 3, 64), gp.float32), kc, vc, cos, sin, pos)
    with pytest.raises(ShapeError, match="does not hold k"):
        call(q, k, v, gp.zeros((1, 3, 8, 64), gp.float32), vc, cos, sin, pos)
    with pytest.raises(DTypeError, match="k_cache must be a float32 GPUArray"):
        call(q, k, v, gp.zeros((1, 2, 8, 64), gp.float16), vc, cos, sin, pos)
    with pytest.raises(ArgumentError, match="style must be"):
        call(q, k, v, kc, vc, cos, sin, pos, style="rotate")
    with pytest.raises(ShapeError, match="rotary_dim 32"):
        call(q, k, v, kc, vc, cos, sin, pos, rotary_dim=32)
    with pytest.raises(DTypeError, match="positions must be an int32"):
        call(q, k, v, kc, vc, cos, sin, gp.from_numpy(np.array([0], np.int64)))
    with pytest.raises(ShapeError, match=r"positions must have shape \(1,\)"):
        call(q, k, v, kc, vc, cos, sin, gp.from_numpy(np.array([0, 1], np.int32)))
    with pytest.raises(ShapeError, match="q_out"):
        call(q, k, v, kc, vc, cos, sin, pos, q_out=gp.zeros((1, 1, 5, 64), gp.float32))
    with pytest.raises(ArgumentError, match="position_offset must be an int32"):
        call(q, k, v, kc, vc, cos, sin, pos, position_offset=1.5)  # type: ignore[arg-type]
    big_cos, big_sin = gp.rope_cos_sin(128, 8, 1e4)
    with pytest.raises(ShapeError, match=r"rotary_dim 128 \(tables"):
        call(q, k, v, kc, vc, big_cos, big_sin, pos)


# -- on the GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_graph_replay_at_new_positions_equals_eager(rng: np.random.Generator, dtype: DType) -> None:
    batch, heads, kv_heads, d, max_seq = 2, 28, 4, 128, 64  # a Qwen2.5-7B decode step
    cos, sin = gp.rope_cos_sin(d, 4096, 1e6)
    stream = gp.Stream()
    with stream:
        qkv = gp.empty((batch, 1, heads + 2 * kv_heads, d), dtype)
        q, k, v = qkv[:, :, :heads], qkv[:, :, heads : heads + kv_heads], qkv[:, :, heads + kv_heads :]
        q_out = gp.empty(q.shape, dtype)
        cache = gp.ops.KVCache(1, batch, kv_heads, max_seq, d, dtype=dtype)
        lengths = gp.from_numpy(np.ones(batch, np.int32))
        args = (q, k, v, cache.k(0), cache.v(0), cos, sin, lengths)
        gp.ops.rope_kv_append(*args, position_offset=-1, q_out=q_out)  # compiled before the capture
        graph = gp.CudaGraph()
        with graph.capture(stream):
            gp.ops.rope_kv_append(*args, position_offset=-1, q_out=q_out)
        for step in range(3):
            hqkv = _values(rng, qkv.shape, dtype)
            hp = rng.integers(1, max_seq + 1, size=batch).astype(np.int32)
            qkv.copy_(hqkv)
            lengths.copy_(hp)
            graph.replay(stream)
            eager = gp.ops.KVCache(1, batch, kv_heads, max_seq, d, dtype=dtype)
            e = gp.from_numpy(hqkv)
            eq = gp.ops.rope_kv_append(e[:, :, :heads], e[:, :, heads : heads + kv_heads], e[:, :, heads + kv_heads :],
                                       eager.k(0), eager.v(0), cos, sin, gp.from_numpy(hp), position_offset=-1,
                                       q_out=gp.empty(q.shape, dtype))  # fmt: skip
            stream.synchronize()
            assert q_out.to_numpy().tobytes() == eq.to_numpy().tobytes(), step
            for b in range(batch):
                at = int(hp[b]) - 1
                assert cache.k(0).to_numpy()[b, :, at].tobytes() == eager.k(0).to_numpy()[b, :, at].tobytes()
                assert cache.v(0).to_numpy()[b, :, at].tobytes() == eager.v(0).to_numpy()[b, :, at].tobytes()


@pytest.mark.gpu
def test_gpu_scalar_path_equals_the_vector_path(rng: np.random.Generator) -> None:
    cos, sin = gp.rope_cos_sin(64, 64, 1e4)
    hqkv = _values(rng, (1, 1, 9 + 6, 64), gp.bfloat16)
    outs = []
    for shift in (0, 1):  # shift 1: rows one element off 16-byte alignment, the W = 1 kernel
        buf = gp.from_numpy(np.concatenate([np.zeros(shift, hqkv.dtype), hqkv.reshape(-1)]))[shift:]
        qkv = buf.reshape(1, 1, 15, 64)
        cache = gp.ops.KVCache(1, 1, 3, 8, 64, dtype=gp.bfloat16)
        pos = gp.from_numpy(np.array([5], np.int32))
        q = gp.ops.rope_kv_append(qkv[:, :, :9], qkv[:, :, 9:12], qkv[:, :, 12:], cache.k(0), cache.v(0), cos, sin,
                                  pos, q_out=gp.empty((1, 1, 9, 64), gp.bfloat16))  # fmt: skip
        outs.append((q.to_numpy().tobytes(), cache.k(0).to_numpy()[:, :, 5].tobytes(),
                     cache.v(0).to_numpy()[:, :, 5].tobytes()))  # fmt: skip
    assert outs[0] == outs[1]


@pytest.mark.gpu
def test_gpu_positions_outside_the_cache_are_skipped(rng: np.random.Generator) -> None:
    cos, sin = gp.rope_cos_sin(64, 64, 1e4)
    q, k, v = (gp.from_numpy(_values(rng, (2, 1, h, 64), gp.float32)) for h in (4, 2, 2))
    cache = gp.ops.KVCache(1, 2, 2, 8, 64, dtype=gp.float32)
    cache.reset(clear=True)
    gp.ops.rope_kv_append(q, k, v, cache.k(0), cache.v(0), cos, sin, gp.from_numpy(np.array([1, 8], np.int32)))
    got: Any = cache.k(0).to_numpy()
    assert got[0, :, 1].any()
    assert not got[1].any()


@pytest.mark.nvrtc
def test_every_rope_kv_kernel_compiles() -> None:
    from pygpukit.ops._kernels import all_groups, group

    groups = all_groups()["nn/rope_kv.cu"]
    assert len({e for g in groups for e in g}) == 20
    for expressions in groups:
        group("nn/rope_kv.cu", expressions).compile("80")
