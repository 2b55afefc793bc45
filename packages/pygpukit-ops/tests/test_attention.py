"""Attention: sdpa_causal, sdpa, prefill_attention, decode_attention and paged_decode_attention against
a float64 NumPy softmax(q k^T * scale + mask) v, on real model shapes; CUDA graph replay, determinism
and argument errors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from ops_testing import poison, sample, upload

import pygpukit as gp
from pygpukit.core.backend import current_backend
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, ShapeError
from pygpukit.testing import assert_bitwise_equal

Array = np.ndarray[Any, Any]
DTYPES = [gp.float32, gp.float16, gp.bfloat16]
# (num_heads, num_kv_heads, head_dim)
QWEN = (28, 4, 128)
LLAMA = (32, 8, 128)
SMOLLM = (9, 3, 64)
MODELS = {"qwen2.5-7b": QWEN, "llama3-8b": LLAMA, "smollm2-135m": SMOLLM}
# Absolute tolerance on outputs (weighted means of values in [-1, 1]): one rounding of the result,
# plus for fp16/bf16 the probabilities rounded to the input type before P @ V.
_ATOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def reference(q: Array, k: Array, v: Array, *, causal: bool, window: int | None = None, scale: float | None = None,
              kv_lens: Any = None) -> Array:  # fmt: skip
    """float64 attention per (batch, head, query), written out plainly: q (B, Sq, H, D), k/v (B, Skv, Hkv, D)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    batch, seq_q, heads, dim = q.shape
    group = heads // k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    out = np.zeros(q.shape)
    for b in range(batch):
        n = k.shape[1] if kv_lens is None else int(kv_lens[b])
        for h in range(heads):
            keys, values = k[b, :n, h // group], v[b, :n, h // group]
            for i in range(seq_q):
                pos = n - seq_q + i
                j = np.arange(n)
                visible = np.ones(n, bool)
                if causal:
                    visible = j <= pos
                    if window is not None:
                        visible &= j > pos - window
                if not visible.any():
                    continue
                scores = keys[visible] @ q[b, i, h] * scale
                p = np.exp(scores - scores.max())
                out[b, i, h] = p @ values[visible] / p.sum()
    return out


def close(actual: gp.GPUArray, expected: Array, dtype: DType, what: str = "") -> None:
    got = actual.to_numpy()
    assert got.dtype == dtype.numpy
    assert got.shape == expected.shape, (got.shape, expected.shape)
    atol = _ATOL[dtype.name]
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=atol, atol=atol, err_msg=what)


def qkv(rng: np.random.Generator, batch: int, seq_q: int, seq_kv: int, heads: int, kv_heads: int, dim: int,
        dtype: DType) -> tuple[Array, Array, Array]:  # fmt: skip
    q = sample(rng, (batch, seq_q, heads, dim), dtype, -2.0, 2.0)
    k = sample(rng, (batch, seq_kv, kv_heads, dim), dtype, -2.0, 2.0)
    v = sample(rng, (batch, seq_kv, kv_heads, dim), dtype, -1.0, 1.0)
    return q, k, v


# -- prefill -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize(("seq_q", "seq_kv"), [(77, 77), (37, 300), (1, 50), (130, 130)])
def test_sdpa_causal_model_shapes(dtype: DType, model: str, seq_q: int, seq_kv: int) -> None:
    heads, kv_heads, dim = MODELS[model]
    rng = np.random.default_rng(seq_q * 1000 + seq_kv)
    q, k, v = qkv(rng, 2, seq_q, seq_kv, heads, kv_heads, dim, dtype)
    out = gp.sdpa_causal(upload(q), upload(k), upload(v))
    close(out, reference(q, k, v, causal=True), dtype, model)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dim", [64, 80, 96, 128, 256])
def test_sdpa_causal_head_dims(dtype: DType, dim: int) -> None:
    rng = np.random.default_rng(dim)
    q, k, v = qkv(rng, 1, 131, 131, 4, 2, dim, dtype)
    close(gp.sdpa_causal(upload(q), upload(k), upload(v)), reference(q, k, v, causal=True), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("window", [1, 16, 100, 1000])
def test_sdpa_causal_sliding_window(dtype: DType, window: int) -> None:
    rng = np.random.default_rng(window)
    q, k, v = qkv(rng, 2, 200, 257, 8, 2, 128, dtype)
    out = gp.sdpa_causal(upload(q), upload(k), upload(v), window=window)
    close(out, reference(q, k, v, causal=True, window=window), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_sdpa_causal_custom_scale_and_mqa(dtype: DType) -> None:
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng, 1, 70, 70, 8, 1, 64, dtype)
    out = gp.sdpa_causal(upload(q), upload(k), upload(v), scale=0.3)
    close(out, reference(q, k, v, causal=True, scale=0.3), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_sdpa_encoder_self_attention_whisper(dtype: DType) -> None:
    rng = np.random.default_rng(6)
    q, k, v = qkv(rng, 1, 1500, 1500, 6, 6, 64, dtype)
    close(gp.sdpa(upload(q), upload(k), upload(v)), reference(q, k, v, causal=False), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("seq_q", [1, 7, 129])
def test_sdpa_cross_attention_whisper(dtype: DType, seq_q: int) -> None:
    rng = np.random.default_rng(seq_q)
    q, k, v = qkv(rng, 2, seq_q, 1500, 6, 6, 64, dtype)
    close(gp.sdpa(upload(q), upload(k), upload(v)), reference(q, k, v, causal=False), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_sdpa_more_queries_than_keys_and_causal_flag(dtype: DType) -> None:
    rng = np.random.default_rng(8)
    q, k, v = qkv(rng, 1, 129, 65, 4, 4, 96, dtype)
    close(gp.sdpa(upload(q), upload(k), upload(v)), reference(q, k, v, causal=False), dtype)
    q2, k2, v2 = qkv(rng, 1, 65, 129, 4, 4, 96, dtype)
    close(gp.sdpa(upload(q2), upload(k2), upload(v2), causal=True), reference(q2, k2, v2, causal=True), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_strided_inputs_and_poisoned_out(dtype: DType) -> None:
    """q, k, v as views of one fused (batch, seq, 3, heads, dim) projection; a non-contiguous last
    dimension (copied); out written over NaN, also as a strided view."""
    rng = np.random.default_rng(9)
    fused = sample(rng, (2, 90, 3, 4, 64), dtype, -1.0, 1.0)
    device = upload(fused)
    q, k, v = device[:, :, 0], device[:, :, 1], device[:, :, 2]
    expected = reference(fused[:, :, 0], fused[:, :, 1], fused[:, :, 2], causal=True)
    out = poison((2, 90, 4, 64), dtype)
    assert gp.sdpa_causal(q, k, v, out=out) is out
    close(out, expected, dtype)
    wide = poison((2, 90, 4, 128), dtype)
    gp.sdpa_causal(q, k, v, out=wide[..., :64])
    close(wide[..., :64], expected, dtype)
    assert np.isnan(wide.to_numpy()[..., 64:].astype(np.float64)).all()
    doubled = np.repeat(fused[:, :, 0][..., None], 2, axis=-1)  # last dimension with stride 2
    q_strided = upload(doubled)[..., 0]
    close(gp.sdpa_causal(q_strided, k, v), expected, dtype)


def test_sdpa_empty_queries() -> None:
    q = gp.empty((2, 0, 4, 64), gp.float16)
    k = gp.zeros((2, 5, 4, 64), gp.float16)
    assert gp.sdpa(q, k, k).shape == (2, 0, 4, 64)


# -- prefill over a cache with the start position on the device --------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("window", [None, 50])
def test_prefill_attention_from_cache(dtype: DType, window: int | None) -> None:
    heads, kv_heads, dim = LLAMA
    rng = np.random.default_rng(11)
    batch, seq_q, max_len = 2, 45, 300
    starts = np.array([0, 131], np.int32)
    q = sample(rng, (batch, seq_q, heads, dim), dtype, -2.0, 2.0)
    k_cache = sample(rng, (batch, kv_heads, max_len, dim), dtype, -2.0, 2.0)
    v_cache = sample(rng, (batch, kv_heads, max_len, dim), dtype, -1.0, 1.0)
    out = poison(q.shape, dtype)
    gp.prefill_attention(upload(q), upload(k_cache), upload(v_cache), upload(starts), window=window, out=out)
    k = k_cache.transpose(0, 2, 1, 3)
    v = v_cache.transpose(0, 2, 1, 3)
    expected = reference(q, k, v, causal=True, window=window, kv_lens=starts + seq_q)
    close(out, expected, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gp.bfloat16, gp.float16], ids=lambda d: d.name)
def test_prefill_attention_graph_replays_at_new_starts(dtype: DType) -> None:
    # One captured chunked-prefill step, replayed with new start positions written into the device
    # buffer: each replay equals eager execution at those positions bitwise, and the reference.
    heads, kv_heads, dim = LLAMA
    rng = np.random.default_rng(15)
    batch, seq_q, max_len = 2, 37, 400
    q_host = sample(rng, (batch, seq_q, heads, dim), dtype, -2.0, 2.0)
    k_host, v_host = cache(rng, batch, kv_heads, max_len, dim, dtype)
    q, kc, vc = upload(q_host), upload(k_host), upload(v_host)
    starts = upload(np.array([0, 5], np.int32))
    out = gp.empty(q.shape, dtype)
    gp.prefill_attention(q, kc, vc, starts, out=out)  # compiles, warms the pool
    graph = gp.CudaGraph()
    with graph.capture():
        gp.prefill_attention(q, kc, vc, starts, out=out)
    for new in ([3, 300], [250, 0], [363, 17]):
        starts.copy_(np.array(new, np.int32))
        out.copy_(np.full(q.shape, np.nan, np.float32).astype(dtype.numpy))
        gp.prefill_attention(q, kc, vc, starts, out=out)
        eager = out.to_numpy()
        expected = reference(q_host, k_host.transpose(0, 2, 1, 3), v_host.transpose(0, 2, 1, 3), causal=True,
                             kv_lens=np.array(new) + seq_q)  # fmt: skip
        close(out, expected, dtype, f"starts {new}")
        out.copy_(np.full(q.shape, np.nan, np.float32).astype(dtype.numpy))
        graph.replay()
        graph.synchronize()
        assert_bitwise_equal(out.to_numpy(), eager)


# -- decode ------------------------------------------------------------------------------------------
def cache(
    rng: np.random.Generator, batch: int, kv_heads: int, max_len: int, dim: int, dtype: DType
) -> tuple[Array, Array]:
    return (sample(rng, (batch, kv_heads, max_len, dim), dtype, -2.0, 2.0),
            sample(rng, (batch, kv_heads, max_len, dim), dtype, -1.0, 1.0))  # fmt: skip


def decode_reference(q: Array, k_cache: Array, v_cache: Array, lens: Array, window: int | None = None,
                     scale: float | None = None) -> Array:  # fmt: skip
    k = k_cache.transpose(0, 2, 1, 3)
    v = v_cache.transpose(0, 2, 1, 3)
    return reference(q[:, None], k, v, causal=True, window=window, scale=scale, kv_lens=lens)[:, 0]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("lens", [[1, 1], [63, 64], [65, 1000], [200, 1024], [777, 3]])
def test_decode_attention(dtype: DType, model: str, lens: list[int]) -> None:
    heads, kv_heads, dim = MODELS[model]
    rng = np.random.default_rng(sum(lens))
    batch, max_len = 2, 1024
    q = sample(rng, (batch, heads, dim), dtype, -2.0, 2.0)
    k_cache, v_cache = cache(rng, batch, kv_heads, max_len, dim, dtype)
    context = upload(np.array(lens, np.int32))
    ws = gp.decode_workspace(batch, heads, kv_heads, dim, max_len)
    out = poison(q.shape, dtype)
    gp.decode_attention(upload(q), upload(k_cache), upload(v_cache), context, out=out, workspace=ws)
    close(out, decode_reference(q, k_cache, v_cache, np.array(lens)), dtype, model)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("dim", [64, 80, 96, 128, 256])
def test_decode_attention_head_dims_window_scale(dtype: DType, dim: int) -> None:
    rng = np.random.default_rng(dim + 1)
    batch, heads, kv_heads, max_len = 3, 8, 2, 700
    lens = np.array([1, 350, 700])
    q = sample(rng, (batch, heads, dim), dtype, -2.0, 2.0)
    k_cache, v_cache = cache(rng, batch, kv_heads, max_len, dim, dtype)
    out = gp.decode_attention(upload(q), upload(k_cache), upload(v_cache), lens.tolist(), window=100, scale=0.2)
    close(out, decode_reference(q, k_cache, v_cache, lens, window=100, scale=0.2), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("block_size", [16, 64])
def test_paged_decode_attention_shuffled_blocks(dtype: DType, block_size: int) -> None:
    heads, kv_heads, dim = QWEN
    rng = np.random.default_rng(block_size)
    batch, blocks_per_seq = 3, 600 // block_size + 1
    lens = np.array([1, 333, 600], np.int32)
    num_blocks = batch * blocks_per_seq + 5
    table = rng.permutation(num_blocks)[: batch * blocks_per_seq].reshape(batch, blocks_per_seq).astype(np.int32)
    q = sample(rng, (batch, heads, dim), dtype, -2.0, 2.0)
    k_blocks = sample(rng, (num_blocks, kv_heads, block_size, dim), dtype, -2.0, 2.0)
    v_blocks = sample(rng, (num_blocks, kv_heads, block_size, dim), dtype, -1.0, 1.0)
    out = poison(q.shape, dtype)
    gp.paged_decode_attention(upload(q), upload(k_blocks), upload(v_blocks), upload(table), upload(lens), out=out)
    # The same keys gathered into a fixed cache.
    max_len = blocks_per_seq * block_size
    k_cache = k_blocks[table].transpose(0, 2, 1, 3, 4).reshape(batch, kv_heads, max_len, dim)
    v_cache = v_blocks[table].transpose(0, 2, 1, 3, 4).reshape(batch, kv_heads, max_len, dim)
    close(out, decode_reference(q, k_cache, v_cache, lens), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_paged_decode_bad_device_block_ids_read_zeros(dtype: DType) -> None:
    # A device table is not read back: ids outside [0, num_blocks) (negative, one past the end, huge)
    # read as zero keys and values instead of memory outside the cache; the rest of each sequence is
    # attended as usual.
    heads, kv_heads, dim = LLAMA
    rng = np.random.default_rng(17)
    batch, block_size, blocks_per_seq, num_blocks = 2, 16, 4, 9
    lens = np.array([64, 50], np.int32)
    table = np.array([[3, -7, 1, 2**30], [8, 0, 9, 5]], np.int32)
    q = sample(rng, (batch, heads, dim), dtype, -2.0, 2.0)
    k_blocks = sample(rng, (num_blocks, kv_heads, block_size, dim), dtype, -2.0, 2.0)
    v_blocks = sample(rng, (num_blocks, kv_heads, block_size, dim), dtype, -1.0, 1.0)
    results = []
    for _ in range(2):
        out = poison(q.shape, dtype)
        gp.paged_decode_attention(upload(q), upload(k_blocks), upload(v_blocks), upload(table), upload(lens), out=out)
        results.append(out.to_numpy())
    assert_bitwise_equal(results[0], results[1])
    padded_k = np.concatenate([k_blocks, np.zeros_like(k_blocks[:1])])  # block num_blocks: zeros
    padded_v = np.concatenate([v_blocks, np.zeros_like(v_blocks[:1])])
    ids = np.where((table < 0) | (table >= num_blocks), num_blocks, table)
    max_len = blocks_per_seq * block_size
    k_cache = padded_k[ids].transpose(0, 2, 1, 3, 4).reshape(batch, kv_heads, max_len, dim)
    v_cache = padded_v[ids].transpose(0, 2, 1, 3, 4).reshape(batch, kv_heads, max_len, dim)
    close(out, decode_reference(q, k_cache, v_cache, lens), dtype)


def test_decode_zero_length_gives_zeros() -> None:
    rng = np.random.default_rng(12)
    q = sample(rng, (2, 4, 64), gp.float16, -1.0, 1.0)
    k_cache, v_cache = cache(rng, 2, 2, 128, 64, gp.float16)
    out = gp.decode_attention(upload(q), upload(k_cache), upload(v_cache), [0, 5])
    got = out.to_numpy().astype(np.float64)
    assert (got[0] == 0).all()
    close(out[1:], decode_reference(q[1:], k_cache[1:], v_cache[1:], np.array([5])), gp.float16)


# -- CUDA graphs and determinism ---------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("paged", [False, True])
def test_decode_graph_replays_at_new_lengths(dtype: DType, paged: bool) -> None:
    heads, kv_heads, dim = LLAMA
    rng = np.random.default_rng(13)
    batch, max_len, block_size = 2, 4096, 64
    q = upload(sample(rng, (batch, heads, dim), dtype, -2.0, 2.0))
    k_host, v_host = cache(rng, batch, kv_heads, max_len, dim, dtype)
    lens = upload(np.array([10, 20], np.int32))
    ws = gp.decode_workspace(batch, heads, kv_heads, dim, max_len)
    out = gp.empty(q.shape, dtype)
    if paged:
        per_seq = max_len // block_size
        table_host = rng.permutation(batch * per_seq).reshape(batch, per_seq).astype(np.int32)
        k_blocks = np.empty((batch * per_seq, kv_heads, block_size, dim), k_host.dtype)
        v_blocks = np.empty_like(k_blocks)
        for b in range(batch):
            for i in range(per_seq):
                k_blocks[table_host[b, i]] = k_host[b, :, i * block_size : (i + 1) * block_size]
                v_blocks[table_host[b, i]] = v_host[b, :, i * block_size : (i + 1) * block_size]
        kb, vb, table = upload(k_blocks), upload(v_blocks), upload(table_host)

        def step() -> None:
            gp.paged_decode_attention(q, kb, vb, table, lens, out=out, workspace=ws)
    else:
        kc, vc = upload(k_host), upload(v_host)

        def step() -> None:
            gp.decode_attention(q, kc, vc, lens, out=out, workspace=ws)

    step()  # compiles, and warms the pool
    graph = gp.CudaGraph()
    with graph.capture():
        step()
    for new in ([1, 4096], [65, 3000], [4000, 129]):
        lens.copy_(np.array(new, np.int32))
        out.copy_(np.full(q.shape, np.nan, np.float32).astype(dtype.numpy))
        step()
        eager = out.to_numpy()
        close(out, decode_reference(q.to_numpy(), k_host, v_host, np.array(new)), dtype)
        out.copy_(np.full(q.shape, np.nan, np.float32).astype(dtype.numpy))
        graph.replay()
        graph.synchronize()
        assert_bitwise_equal(out.to_numpy(), eager)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [gp.float16, gp.bfloat16], ids=lambda d: d.name)
@pytest.mark.parametrize("window", [None, 700])
def test_decode_merge_of_many_splits_replays_bitwise(dtype: DType, window: int | None) -> None:
    # Multi-query heads (32 query heads on one kv head: two blocks of 16 rows per kv head), long and
    # short sequences: the last block of each (sequence, kv head, head chunk) merges the splits, and its
    # counter must be back at zero for every following launch and replay.
    rng = np.random.default_rng(16)
    batch, heads, kv_heads, dim, max_len = 3, 32, 1, 128, 8192
    q = upload(sample(rng, (batch, heads, dim), dtype, -2.0, 2.0))
    k_host, v_host = cache(rng, batch, kv_heads, max_len, dim, dtype)
    kc, vc = upload(k_host), upload(v_host)
    lens_host = np.array([8192, 257, 5000], np.int32)
    lens = upload(lens_host)
    ws = gp.decode_workspace(batch, heads, kv_heads, dim, max_len)
    assert ws.splits > 1
    out = gp.empty(q.shape, dtype)
    gp.decode_attention(q, kc, vc, lens, window=window, out=out, workspace=ws)
    eager = out.to_numpy()
    close(out, decode_reference(q.to_numpy(), k_host, v_host, lens_host, window=window), dtype)
    for _ in range(3):
        assert_bitwise_equal(gp.decode_attention(q, kc, vc, lens, window=window, workspace=ws).to_numpy(), eager)
    graph = gp.CudaGraph()
    with graph.capture():
        gp.decode_attention(q, kc, vc, lens, window=window, out=out, workspace=ws)
        gp.decode_attention(q, kc, vc, lens, window=window, out=out, workspace=ws)  # the counters reset
    for _ in range(4):
        out.copy_(np.full(q.shape, np.nan, np.float32).astype(dtype.numpy))
        graph.replay()
        graph.synchronize()
        assert_bitwise_equal(out.to_numpy(), eager)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_prefill_graph_replay_is_bitwise_eager(dtype: DType) -> None:
    rng = np.random.default_rng(14)
    q, k, v = (upload(x) for x in qkv(rng, 2, 300, 300, 8, 2, 128, dtype))
    out = gp.empty(q.shape, dtype)
    out2 = gp.empty(q.shape, dtype)
    gp.sdpa_causal(q, k, v, out=out)
    gp.sdpa(q, k, v, out=out2)
    eager, eager2 = out.to_numpy(), out2.to_numpy()
    graph = gp.CudaGraph()
    with graph.capture():
        gp.sdpa_causal(q, k, v, out=out)
        gp.sdpa(q, k, v, out=out2)
    out.copy_(np.zeros(q.shape, dtype.numpy))
    out2.copy_(np.zeros(q.shape, dtype.numpy))
    graph.replay()
    graph.synchronize()
    assert_bitwise_equal(out.to_numpy(), eager)
    assert_bitwise_equal(out2.to_numpy(), eager2)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_deterministic(dtype: DType) -> None:
    rng = np.random.default_rng(15)
    q, k, v = (upload(x) for x in qkv(rng, 2, 257, 257, 8, 2, 128, dtype))
    first = gp.sdpa_causal(q, k, v, window=64).to_numpy()
    for _ in range(3):
        assert_bitwise_equal(gp.sdpa_causal(q, k, v, window=64).to_numpy(), first)
    qd = upload(sample(rng, (2, 8, 128), dtype, -2.0, 2.0))
    kc, vc = (upload(x) for x in cache(rng, 2, 2, 5000, 128, dtype))
    lens = upload(np.array([4999, 3001], np.int32))
    ws = gp.decode_workspace(2, 8, 2, 128, 5000)
    first = gp.decode_attention(qd, kc, vc, lens, workspace=ws).to_numpy()
    for _ in range(3):
        assert_bitwise_equal(gp.decode_attention(qd, kc, vc, lens, workspace=ws).to_numpy(), first)


# -- errors ------------------------------------------------------------------------------------------
def _f16(*shape: int) -> gp.GPUArray:
    return gp.zeros(shape, gp.float16)


def test_bad_prefill_arguments_leave_out_untouched() -> None:
    out = poison((1, 8, 6, 64), gp.float16)

    def untouched() -> None:
        assert np.isnan(out.to_numpy().astype(np.float64)).all()

    q = _f16(1, 8, 6, 64)
    with pytest.raises(ShapeError, match=r"num_heads \(6\) must be a positive multiple of num_kv_heads \(4\)"):
        gp.sdpa_causal(q, _f16(1, 8, 4, 64), _f16(1, 8, 4, 64), out=out)
    with pytest.raises(ArgumentError, match=r"head_dim 48 is not supported.*64, 80, 96, 128, 256"):
        gp.sdpa_causal(_f16(1, 8, 6, 48), _f16(1, 8, 6, 48), _f16(1, 8, 6, 48))
    with pytest.raises(ShapeError, match="at least one key"):
        gp.sdpa(q, _f16(1, 0, 6, 64), _f16(1, 0, 6, 64), out=out)
    with pytest.raises(DTypeError, match="share one dtype"):
        gp.sdpa_causal(q, gp.zeros((1, 8, 6, 64), gp.bfloat16), _f16(1, 8, 6, 64), out=out)
    with pytest.raises(DTypeError, match="float16, bfloat16 and float32"):
        gp.sdpa_causal(*(gp.zeros((1, 8, 6, 64), gp.int32) for _ in range(3)))
    with pytest.raises(DTypeError, match="float16, bfloat16 and float32"):
        gp.sdpa_causal(*(gp.zeros((1, 8, 6, 64), gp.float64) for _ in range(3)))
    with pytest.raises(DTypeError, match="GPUArray"):
        gp.sdpa_causal(np.zeros((1, 8, 6, 64)), q, q)  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match="seq_q <= seq_kv"):
        gp.sdpa_causal(q, _f16(1, 4, 6, 64), _f16(1, 4, 6, 64), out=out)
    with pytest.raises(ShapeError, match="v must have the shape of k"):
        gp.sdpa(q, _f16(1, 8, 6, 64), _f16(1, 9, 6, 64), out=out)
    with pytest.raises(ShapeError, match="does not match q"):
        gp.sdpa(q, _f16(2, 8, 6, 64), _f16(2, 8, 6, 64), out=out)
    with pytest.raises(ShapeError, match=r"\(batch, seq, heads, head_dim\)"):
        gp.sdpa(_f16(8, 6, 64), q, q)
    with pytest.raises(ArgumentError, match="scale must be positive"):
        gp.sdpa_causal(q, q, q, scale=0.0, out=out)
    with pytest.raises(ArgumentError, match="scale must be positive"):
        gp.sdpa_causal(q, q, q, scale=float("nan"), out=out)
    with pytest.raises(ArgumentError, match="window must be None or a positive int"):
        gp.sdpa_causal(q, q, q, window=0, out=out)
    with pytest.raises(ShapeError, match="out must have shape"):
        gp.sdpa_causal(q, q, q, out=_f16(1, 8, 6, 32))
    with pytest.raises(DTypeError, match="out must have dtype float16"):
        gp.sdpa_causal(q, q, q, out=gp.zeros((1, 8, 6, 64), gp.float32))
    untouched()


def test_bad_decode_arguments() -> None:
    out = poison((2, 8, 128), gp.bfloat16)
    q = gp.zeros((2, 8, 128), gp.bfloat16)
    kc = gp.zeros((2, 2, 64, 128), gp.bfloat16)
    with pytest.raises(ArgumentError, match=r"context_lens\[1\] = 65 is outside \[0, 64\]"):
        gp.decode_attention(q, kc, kc, [3, 65], out=out)
    with pytest.raises(ArgumentError, match=r"context_lens\[0\] = -1"):
        gp.decode_attention(q, kc, kc, np.array([-1, 3]), out=out)
    with pytest.raises(DTypeError, match="context_lens must be int32"):
        gp.decode_attention(q, kc, kc, gp.zeros((2,), gp.int64), out=out)
    with pytest.raises(ShapeError, match=r"context_lens must have shape \(2,\)"):
        gp.decode_attention(q, kc, kc, gp.zeros((3,), gp.int32), out=out)
    with pytest.raises(ShapeError, match="num_kv_heads"):
        gp.decode_attention(gp.zeros((2, 7, 128), gp.bfloat16), kc, kc, [1, 1])
    with pytest.raises(ArgumentError, match="head_dim 32"):
        gp.decode_attention(gp.zeros((2, 8, 32), gp.bfloat16), gp.zeros((2, 2, 64, 32), gp.bfloat16),
                            gp.zeros((2, 2, 64, 32), gp.bfloat16), [1, 1])  # fmt: skip
    with pytest.raises(DTypeError, match="share one dtype"):
        gp.decode_attention(q, gp.zeros((2, 2, 64, 128), gp.float16), kc, [1, 1], out=out)
    with pytest.raises(ShapeError, match="does not match batch"):
        gp.decode_attention(q, gp.zeros((3, 2, 64, 128), gp.bfloat16), kc, [1, 1], out=out)
    with pytest.raises(ShapeError, match="was made for other shapes"):
        gp.decode_attention(q, kc, kc, [1, 1], out=out, workspace=gp.decode_workspace(2, 4, 2, 128, 64))
    with pytest.raises(DTypeError, match="DecodeWorkspace"):
        gp.decode_attention(q, kc, kc, [1, 1], out=out, workspace=gp.zeros(4))  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="max_seq_len must be a positive int"):
        gp.decode_workspace(2, 8, 2, 128, 0)
    blocks = gp.zeros((4, 2, 16, 128), gp.bfloat16)
    with pytest.raises(ArgumentError, match=r"block_table\[1, 0\] = 4 is not a block id in \[0, 4\)"):
        gp.paged_decode_attention(q, blocks, blocks, [[0, 1], [4, 2]], [20, 3], out=out)
    with pytest.raises(ArgumentError, match=r"context_lens\[0\] = 33 is outside \[0, 32\]"):
        gp.paged_decode_attention(q, blocks, blocks, [[0, 1], [3, 2]], [33, 3], out=out)
    with pytest.raises(DTypeError, match="block_table must be int32"):
        gp.paged_decode_attention(q, blocks, blocks, gp.zeros((2, 2), gp.int64), [3, 3], out=out)
    with pytest.raises(ArgumentError, match=r"start_pos\[0\] = 60"):
        gp.prefill_attention(gp.zeros((2, 5, 8, 128), gp.bfloat16), kc, kc, [60, 0])
    assert np.isnan(out.to_numpy().astype(np.float64)).all()


def test_cpu_backend_checks_device_lengths() -> None:
    if current_backend() == "cuda":
        pytest.skip("on the GPU the kernels clamp device lengths; only the CPU backend can check them on the host")
    q = gp.zeros((1, 8, 128), gp.float16)
    kc = gp.zeros((1, 2, 64, 128), gp.float16)
    with pytest.raises(ArgumentError, match="outside"):
        gp.decode_attention(q, kc, kc, upload(np.array([65], np.int32)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_repeated_call_shapes_reuse_their_plan(dtype: DType) -> None:
    """Each call shape is planned once (attention's PlanCache); later calls with fresh data, new
    addresses and new lengths go through the cached plan and still match the reference."""
    from pygpukit.core.plans import clear_plan_caches
    from pygpukit.ops import attention

    heads, kv_heads, dim = SMOLLM
    batch, max_len = 2, 300
    rng = np.random.default_rng(11)
    ws = gp.decode_workspace(batch, heads, kv_heads, dim, max_len)
    clear_plan_caches()
    planned = 0
    for round_ in range(3):
        q, k, v = qkv(rng, batch, 37, 37, heads, kv_heads, dim, dtype)
        close(gp.sdpa_causal(upload(q), upload(k), upload(v)), reference(q, k, v, causal=True), dtype, "prefill")
        qd = sample(rng, (batch, heads, dim), dtype, -2.0, 2.0)
        k_cache, v_cache = cache(rng, batch, kv_heads, max_len, dim, dtype)
        lens = rng.integers(1, max_len + 1, batch)
        out = gp.decode_attention(upload(qd), upload(k_cache), upload(v_cache), lens.tolist(), workspace=ws)
        close(out, decode_reference(qd, k_cache, v_cache, lens), dtype, "decode")
        if round_ == 0:
            planned = len(attention._PLANS)
            assert planned == 2
        assert len(attention._PLANS) == planned, "a repeated call shape was planned again"
        assert len(attention._CALLS) == 1  # sdpa_causal's checked call, launched straight from then on


@pytest.mark.gpu
def test_repeated_sdpa_of_views_that_need_copies() -> None:
    """A call whose operands the kernels cannot read in place (q at an odd address) is copied every
    time and never becomes a cached call; an aligned call of the same shapes does; each is right."""
    from pygpukit.core.plans import clear_plan_caches
    from pygpukit.ops import attention

    dtype = gp.float16
    rng = np.random.default_rng(12)
    clear_plan_caches()
    for _ in range(2):
        q, k, v = qkv(rng, 2, 19, 33, 4, 2, 64, dtype)
        wide = np.concatenate([q.reshape(-1)[:1], q.reshape(-1)])
        q_odd = upload(wide)[1:].reshape(q.shape)  # one element off: not 16-byte aligned
        np.testing.assert_array_equal(q_odd.to_numpy(), q)
        close(gp.sdpa(q_odd, upload(k), upload(v)), reference(q, k, v, causal=False), dtype, "odd q")
        assert len(attention._CALLS) == 0
    for _ in range(2):
        q, k, v = qkv(rng, 2, 19, 33, 4, 2, 64, dtype)
        close(gp.sdpa(upload(q), upload(k), upload(v), scale=0.3), reference(q, k, v, causal=False, scale=0.3),
              dtype, "aligned")  # fmt: skip
        assert len(attention._CALLS) == 1


def test_public_names() -> None:
    for name in ("sdpa", "sdpa_causal", "decode_attention", "paged_decode_attention", "decode_workspace",
                 "prefill_attention", "DecodeWorkspace"):  # fmt: skip
        assert getattr(gp, name) is getattr(gp.ops, name)


@pytest.mark.nvrtc
@pytest.mark.parametrize("file", ["attention/attention_prefill.cu", "attention/attention_decode.cu"])
def test_every_attention_kernel_compiles(file: str) -> None:
    from pygpukit.ops._kernels import all_groups, group

    groups = all_groups()[file]
    assert len(groups) >= 20
    for expressions in groups:
        group(file, expressions).compile("80")
