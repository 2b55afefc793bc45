"""Poisoned device indices (issue 21, item 2): every op that reads indices from device memory is fed
values that are negative, equal to the size, huge, and at the int32 (and int64) limits, and must never
read or write outside its buffers. The expected result of each op is its documented behaviour
(docs/reliability.md, "Out-of-range indices read on the device"), computed with NumPy: zero rows and a
set error flag, skipped writes, clamped lengths and positions, or, where the CPU backend checks device
values on the host, ArgumentError with nothing written. The unmarked tests use small shapes and run on
whichever backend is active (the GPU one on the GPU machine, where ci/sanitize.sh also runs them under
compute-sanitizer); the gpu-marked ones use model-sized buffers."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
from ops_testing import sample

import pygpukit as gp
from pygpukit.core.backend import current_backend
from pygpukit.core.errors import ArgumentError

Array = np.ndarray[Any, Any]
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    # Fresh data per test, reproducible from the test's name.
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def on_gpu() -> bool:
    return current_backend() == "cuda"


def poison32(size: int) -> list[int]:
    """Out-of-range values for indices into ``size`` elements: negative, == size, huge, int32 limits."""
    return [-1, size, size + 1, 2**30, I32_MAX, I32_MIN]


def upload(values: Array) -> gp.GPUArray:
    return gp.from_numpy(np.ascontiguousarray(values))


def nan_like(shape: tuple[int, ...], dtype: Any) -> gp.GPUArray:
    return gp.from_numpy(np.full(shape, np.nan, np.float32).astype(gp.dtypes.as_dtype(dtype).numpy))


# -- embedding and gather_last: zero rows and a set flag ----------------------------------------------
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_embedding_poisoned_ids(rng: np.random.Generator, index_dtype: Any) -> None:
    vocab, hidden = 37, 24
    table = sample(rng, (vocab, hidden), gp.float32, -1.0, 1.0)
    bad = poison32(vocab) + ([2**40, I64_MIN, I64_MAX, -(2**40)] if index_dtype == np.int64 else [])
    good = rng.integers(0, vocab, size=len(bad))
    ids = np.stack([good, np.array(bad)], axis=1).reshape(-1).astype(index_dtype)  # good, bad, good, bad...
    weight = upload(table)
    out = nan_like((ids.size, hidden), gp.float32)
    flag = gp.zeros(1, gp.int32)
    gp.embedding(weight, upload(ids), out=out, error_flag=flag)
    got = out.to_numpy()
    np.testing.assert_array_equal(got[0::2], table[good])
    np.testing.assert_array_equal(got[1::2], np.zeros((len(bad), hidden), np.float32))
    assert flag.to_numpy().tolist() == [1]
    np.testing.assert_array_equal(weight.to_numpy(), table)  # the table is never written
    for value in bad:  # each class alone sets the flag
        single = gp.zeros(1, gp.int32)
        row = gp.embedding(weight, upload(np.array([value], index_dtype)), error_flag=single).to_numpy()
        assert not row.any(), value
        assert single.to_numpy().tolist() == [1], value


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_last_poisoned_lengths(rng: np.random.Generator, index_dtype: Any) -> None:
    seq, hidden = 9, 16
    bad = [0, seq + 1, -1, 2**30, I32_MAX, I32_MIN] + ([2**40, I64_MAX, I64_MIN] if index_dtype == np.int64 else [])
    lengths = np.array([3, *bad, seq], index_dtype)
    batch = lengths.size
    x = sample(rng, (batch, seq, hidden), gp.bfloat16, -1.0, 1.0)
    flag = gp.zeros(1, gp.int32)
    got = gp.gather_last(upload(x), upload(lengths), error_flag=flag).to_numpy()
    assert got[0].tobytes() == x[0, 2].tobytes()
    assert got[-1].tobytes() == x[-1, seq - 1].tobytes()
    assert not got[1:-1].astype(np.float32).any()
    assert flag.to_numpy().tolist() == [1]


# -- rope: clamped on the GPU, checked on the CPU backend ---------------------------------------------
@pytest.mark.parametrize(("raw", "offset"), [([0, -1], 0), ([5, 16], 0), ([I32_MAX, 3], 1), ([I32_MIN, 3], -1),
                                             ([2**30, I32_MIN], 0), ([15, 0], I32_MAX)])  # fmt: skip
def test_rope_poisoned_positions(rng: np.random.Generator, raw: list[int], offset: int) -> None:
    max_positions, d = 16, 64
    cos, sin = gp.rope_cos_sin(d, max_positions)
    host = sample(rng, (2, 1, 4, d), gp.float32, -1.0, 1.0)
    positions = np.array(raw, np.int32)
    q = upload(host)
    if not on_gpu():
        with pytest.raises(ArgumentError):
            gp.apply_rope(q, None, cos, sin, upload(positions), position_offset=offset)
        assert q.to_numpy().tobytes() == host.tobytes()  # nothing written
        return
    gp.apply_rope(q, None, cos, sin, upload(positions), position_offset=offset)
    clamped = np.clip(positions.astype(np.int64) + offset, 0, max_positions - 1).astype(np.int32)
    want = upload(host)
    gp.apply_rope(want, None, cos, sin, upload(clamped))
    assert q.to_numpy().tobytes() == want.to_numpy().tobytes()


# -- KVCache.append: skipped on the GPU, ArgumentError on the CPU backend -----------------------------
@pytest.mark.parametrize(("bad", "offset"), [(-1, 0), (12, 0), (11, 1), (I32_MAX, 0), (I32_MAX, 1),
                                             (I32_MIN, 0), (I32_MIN, -1), (2**30, 0)])  # fmt: skip
def test_kv_cache_append_poisoned_positions(rng: np.random.Generator, bad: int, offset: int) -> None:
    max_seq, heads, d = 12, 2, 8
    cache = gp.KVCache(1, 2, heads, max_seq, d, gp.float16)
    before_k = sample(rng, cache.shape, gp.float16, -1.0, 1.0)
    before_v = sample(rng, cache.shape, gp.float16, -1.0, 1.0)
    cache.k(0).copy_(upload(before_k))
    cache.v(0).copy_(upload(before_v))
    k = sample(rng, (2, 1, heads, d), gp.float16, -1.0, 1.0)
    v = sample(rng, (2, 1, heads, d), gp.float16, -1.0, 1.0)
    positions = upload(np.array([4 - offset, bad], np.int32))  # row 0 valid (position 4), row 1 poisoned
    if not on_gpu():
        with pytest.raises(ArgumentError, match="outside"):
            cache.append(0, upload(k), upload(v), positions, offset=offset)
        assert cache.k(0).to_numpy().tobytes() == before_k.tobytes()
        assert cache.v(0).to_numpy().tobytes() == before_v.tobytes()
        return
    cache.append(0, upload(k), upload(v), positions, offset=offset)
    want_k, want_v = before_k.copy(), before_v.copy()
    want_k[0, :, 4, :] = k[0, 0]
    want_v[0, :, 4, :] = v[0, 0]
    assert cache.k(0).to_numpy().tobytes() == want_k.tobytes()
    assert cache.v(0).to_numpy().tobytes() == want_v.tobytes()


# -- PagedKVCache.append and advance: skipped on both backends ----------------------------------------
def test_paged_cache_poisoned_table_and_lengths(rng: np.random.Generator) -> None:
    num_blocks, block_size, heads, d = 6, 4, 2, 8
    bad_tables = [-5, num_blocks, I32_MAX, I32_MIN]
    bad_lens = [-1, I32_MIN, I32_MAX, 4 * block_size, 2**30]
    slots = 1 + len(bad_tables) + len(bad_lens)
    cache = gp.PagedKVCache(1, num_blocks, block_size, heads, d, gp.float32, max_batch=slots, max_blocks_per_seq=4)
    cache.add_sequence(2)  # slot 0: blocks allocated, length 2
    table = cache.block_table.to_numpy()
    lens = cache.context_lens.to_numpy()
    for i, block in enumerate(bad_tables):  # slots 1..4: a poisoned block id where the next token goes
        table[1 + i, :] = block
        lens[1 + i] = 1
    for i, length in enumerate(bad_lens):  # the rest: valid table (block 1), poisoned length
        table[1 + len(bad_tables) + i, :] = table[0, 0]
        lens[1 + len(bad_tables) + i] = length
    cache.block_table.copy_(upload(table))
    cache.context_lens.copy_(upload(lens))
    blocks_k = sample(rng, cache.k_blocks(0).shape, gp.float32, -1.0, 1.0)
    cache.k_blocks(0).copy_(upload(blocks_k))
    cache.v_blocks(0).copy_(upload(blocks_k))
    k = sample(rng, (slots, 1, heads, d), gp.float32, -1.0, 1.0)
    cache.append(0, upload(k), upload(k))
    want = blocks_k.copy()
    want[table[0, 0], :, 2, :] = k[0, 0]  # only slot 0 writes
    assert cache.k_blocks(0).to_numpy().tobytes() == want.tobytes()
    assert cache.v_blocks(0).to_numpy().tobytes() == want.tobytes()
    cache.advance()
    expected = lens.copy()
    expected[0] = 3
    expected[-1] = lens[-1]  # slot with length 2**30: no block for it, left alone
    np.testing.assert_array_equal(cache.context_lens.to_numpy(), expected)


# -- attention over a cache: device lengths clamped on the GPU, checked on the CPU backend ------------
def attend(q: Array, keys: Array, values: Array, scale: float) -> Array:
    """float64 attention of q (heads, d) over keys/values (n, kv_heads, d); zeros when n == 0."""
    heads, kv_heads = q.shape[0], keys.shape[1]
    out = np.zeros(q.shape, np.float64)
    if keys.shape[0] == 0:
        return out
    for h in range(heads):
        kh = h // (heads // kv_heads)
        s = keys[:, kh].astype(np.float64) @ q[h].astype(np.float64) * scale
        p = np.exp(s - s.max())
        out[h] = p @ values[:, kh].astype(np.float64) / p.sum()
    return out


@pytest.mark.parametrize("bad", [-1, 65, I32_MAX, I32_MIN, 2**30])
def test_decode_attention_poisoned_lengths(rng: np.random.Generator, bad: int) -> None:
    batch, heads, kv_heads, d, max_len = 2, 4, 2, 64, 64
    q = sample(rng, (batch, heads, d), gp.float32, -1.0, 1.0)
    kc = sample(rng, (batch, kv_heads, max_len, d), gp.float32, -1.0, 1.0)
    vc = sample(rng, (batch, kv_heads, max_len, d), gp.float32, -1.0, 1.0)
    lens = np.array([7, bad], np.int32)
    out = nan_like(q.shape, gp.float32)
    if not on_gpu():
        with pytest.raises(ArgumentError, match="outside"):
            gp.decode_attention(upload(q), upload(kc), upload(vc), upload(lens), out=out)
        assert np.isnan(out.to_numpy()).all()
        return
    gp.decode_attention(upload(q), upload(kc), upload(vc), upload(lens), out=out)
    got = out.to_numpy()
    for b, n in enumerate(np.clip(lens.astype(np.int64), 0, max_len)):
        want = attend(q[b], kc[b, :, :n].transpose(1, 0, 2), vc[b, :, :n].transpose(1, 0, 2), d**-0.5)
        np.testing.assert_allclose(got[b], want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("bad", [-1, -3, 62, I32_MAX, I32_MIN])
def test_prefill_attention_poisoned_start(rng: np.random.Generator, bad: int) -> None:
    # The kernels read kv_len = clamp(start_pos + seq_q, 0, max_len); query i is position
    # kv_len - seq_q + i and sees keys [0, that position]; a query with no key gives a zero row.
    batch, seq_q, heads, kv_heads, d, max_len = 2, 3, 4, 2, 64, 64
    q = sample(rng, (batch, seq_q, heads, d), gp.float32, -1.0, 1.0)
    kc = sample(rng, (batch, kv_heads, max_len, d), gp.float32, -1.0, 1.0)
    vc = sample(rng, (batch, kv_heads, max_len, d), gp.float32, -1.0, 1.0)
    start = np.array([5, bad], np.int32)
    out = nan_like(q.shape, gp.float32)
    if not on_gpu():
        with pytest.raises(ArgumentError):
            gp.prefill_attention(upload(q), upload(kc), upload(vc), upload(start), out=out)
        assert np.isnan(out.to_numpy()).all()
        return
    gp.prefill_attention(upload(q), upload(kc), upload(vc), upload(start), out=out)
    got = out.to_numpy()
    for b in range(batch):
        kv_len = int(np.clip(int(start[b]) + seq_q, 0, max_len))
        for i in range(seq_q):
            n = max(0, kv_len - seq_q + i + 1)
            want = attend(q[b, i], kc[b, :, :n].transpose(1, 0, 2), vc[b, :, :n].transpose(1, 0, 2), d**-0.5)
            np.testing.assert_allclose(got[b, i], want, rtol=2e-5, atol=2e-5, err_msg=f"row {b} query {i}")


def test_paged_decode_attention_poisoned_table_and_lengths(rng: np.random.Generator) -> None:
    heads, kv_heads, d, block_size, per_seq, num_blocks = 4, 2, 64, 16, 3, 5
    table = np.array([[1, -7, 3], [4, I32_MAX, 0], [I32_MIN, num_blocks, 2], [2, 0, 1]], np.int32)
    lens = np.array([40, 33, 48, I32_MAX], np.int32)
    batch = table.shape[0]
    q = sample(rng, (batch, heads, d), gp.float32, -1.0, 1.0)
    kb = sample(rng, (num_blocks, kv_heads, block_size, d), gp.float32, -1.0, 1.0)
    vb = sample(rng, (num_blocks, kv_heads, block_size, d), gp.float32, -1.0, 1.0)
    out = nan_like(q.shape, gp.float32)
    if not on_gpu():
        with pytest.raises(ArgumentError):
            gp.paged_decode_attention(upload(q), upload(kb), upload(vb), upload(table), upload(lens), out=out)
        assert np.isnan(out.to_numpy()).all()
        return
    gp.paged_decode_attention(upload(q), upload(kb), upload(vb), upload(table), upload(lens), out=out)
    got = out.to_numpy()
    padded_k = np.concatenate([kb, np.zeros_like(kb[:1])])  # block num_blocks: the zeros a bad id reads
    padded_v = np.concatenate([vb, np.zeros_like(vb[:1])])
    ids = np.where((table < 0) | (table >= num_blocks), num_blocks, table)
    for b in range(batch):
        n = int(min(int(lens[b]), per_seq * block_size))
        keys = padded_k[ids[b]].transpose(0, 2, 1, 3).reshape(-1, kv_heads, d)[:n]
        values = padded_v[ids[b]].transpose(0, 2, 1, 3).reshape(-1, kv_heads, d)[:n]
        np.testing.assert_allclose(got[b], attend(q[b], keys, values, d**-0.5), rtol=2e-5, atol=2e-5)


# -- MoE: invalid ids sorted last, bad permutation entries ignored, offsets clamped -------------------
def test_moe_permute_poisoned_expert_ids(rng: np.random.Generator) -> None:
    experts, hidden = 4, 16
    ids = np.array([[1, -1], [experts, 0], [I32_MAX, 3], [I32_MIN, 2**30], [2, 1]], np.int32)
    x = sample(rng, (ids.shape[0], hidden), gp.float32, -1.0, 1.0)
    x_perm, offsets, permutation = gp.moe_permute(upload(x), upload(ids), experts)
    flat = ids.reshape(-1)
    valid = (flat >= 0) & (flat < experts)
    counts = np.bincount(flat[valid], minlength=experts)
    np.testing.assert_array_equal(offsets.to_numpy(), np.concatenate([[0], np.cumsum(counts)]))
    perm = permutation.to_numpy()
    assert sorted(perm.tolist()) == list(range(flat.size))  # a permutation of the slots: all rows in bounds
    assert (perm[~valid] >= counts.sum()).all()  # invalid slots after every expert
    expected = np.empty((flat.size, hidden), np.float32)
    expected[perm] = x[np.arange(flat.size) // 2]
    np.testing.assert_array_equal(x_perm.to_numpy(), expected)


def test_moe_unpermute_poisoned_permutation(rng: np.random.Generator) -> None:
    tokens, k, hidden = 4, 2, 32
    rows = tokens * k
    perm = np.array([0, -1, rows, 3, I32_MAX, I32_MIN, 6, 2**30], np.int32)
    y = sample(rng, (rows, hidden), gp.float32, -1.0, 1.0)
    w = rng.random((tokens, k)).astype(np.float32)
    got = gp.moe_unpermute(upload(y), upload(perm), upload(w)).to_numpy()
    want = np.zeros((tokens, hidden), np.float64)
    for t in range(tokens):
        for j in range(k):
            row = int(perm[t * k + j])
            if 0 <= row < rows:
                want[t] += float(w[t, j]) * y[row].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("offsets", [[I32_MIN, 3, I32_MAX, 2, 5], [0, -1, 10, 11, I32_MIN], [I32_MAX] * 5])
def test_grouped_gemm_poisoned_offsets(rng: np.random.Generator, offsets: list[int]) -> None:
    # Group e covers rows [run_e, hi_e) with run_e the running maximum of offsets[0..e] and hi_e =
    # min(max(run_e, offsets[e + 1]), rows), both clamped to [0, rows]; rows of no group stay as they were.
    rows, n, k_dim, experts = 10, 6, 8, 4
    x = sample(rng, (rows, k_dim), gp.float32, -1.0, 1.0)
    w = sample(rng, (experts, n, k_dim), gp.float32, -1.0, 1.0)
    out = nan_like((rows, n), gp.float32)
    gp.grouped_gemm(upload(x), upload(w), upload(np.array(offsets, np.int32)), out=out)
    got = out.to_numpy()
    covered = np.zeros(rows, bool)
    run = 0
    for e in range(experts):
        run = min(max(run, offsets[e]), rows)
        hi = min(max(run, offsets[e + 1]), rows)
        want = x[run:hi].astype(np.float64) @ w[e].T.astype(np.float64)
        np.testing.assert_allclose(got[run:hi], want, rtol=1e-5, atol=1e-5, err_msg=f"expert {e}")
        covered[run:hi] = True
    assert np.isnan(got[~covered]).all()


# -- sampling: history ids outside the vocabulary ignored, sampled ids always in range ----------------
def test_sampling_poisoned_history(rng: np.random.Generator) -> None:
    vocab = 50
    logits = sample(rng, (3, vocab), gp.float32, -2.0, 2.0)
    logits[:, 7] = 10.0  # token 7 wins unless penalised
    history = np.array([[-1, vocab, I32_MAX], [I32_MIN, 2**30, 7], [7, -(2**30), vocab + 1]], np.int32)
    got = gp.sample(upload(logits), temperature=0.0, repetition_penalty=100.0, history=upload(history)).to_numpy()
    penalised = logits.copy()
    penalised[1:, 7] /= 100.0  # only the valid id 7 of rows 1 and 2 counts
    np.testing.assert_array_equal(got.reshape(-1), penalised.argmax(axis=1))
    drawn = gp.sample(upload(logits), temperature=1.0, top_k=5, repetition_penalty=1.3, history=upload(history),
                      seed=3).to_numpy()  # fmt: skip
    assert ((drawn >= 0) & (drawn < vocab)).all()


# -- model-sized buffers on the GPU --------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_model_sized_poisoned_indices(rng: np.random.Generator) -> None:
    vocab, hidden = 151936, 896  # Qwen2.5-0.5B embedding, bfloat16
    table = gp.from_numpy(sample(rng, (1024, hidden), gp.bfloat16, -1.0, 1.0))
    big = gp.empty((vocab, hidden), gp.bfloat16)
    big[:1024].copy_(table)
    ids = rng.integers(0, 1024, size=4096).astype(np.int64)
    bad_at = rng.choice(ids.size, size=64, replace=False)
    ids[bad_at] = rng.choice(np.array([-1, vocab, vocab + 7, 2**31, I64_MAX, I64_MIN, I32_MIN], np.int64), size=64)
    flag = gp.zeros(1, gp.int32)
    got = gp.embedding(big, upload(ids), error_flag=flag).to_numpy()
    host_table = table.to_numpy()
    good = np.setdiff1d(np.arange(ids.size), bad_at)
    assert got[good].tobytes() == host_table[ids[good]].tobytes()
    assert not got[bad_at].astype(np.float32).any()
    assert flag.to_numpy().tolist() == [1]
    # A Llama-sized decode over a paged cache whose table and lengths are garbage.
    heads, kv_heads, d, block_size, per_seq, num_blocks = 32, 8, 128, 16, 64, 256
    batch = 16
    table_ids = rng.integers(I32_MIN, I32_MAX, size=(batch, per_seq), dtype=np.int64).astype(np.int32)
    table_ids[::2] = rng.integers(0, num_blocks, size=(batch // 2, per_seq))
    lens = rng.integers(I32_MIN, I32_MAX, size=batch, dtype=np.int64).astype(np.int32)
    q = gp.from_numpy(sample(rng, (batch, heads, d), gp.float16, -1.0, 1.0))
    kb = gp.from_numpy(sample(rng, (num_blocks, kv_heads, block_size, d), gp.float16, -1.0, 1.0))
    first = gp.paged_decode_attention(q, kb, kb, upload(table_ids), upload(lens)).to_numpy()
    again = gp.paged_decode_attention(q, kb, kb, upload(table_ids), upload(lens)).to_numpy()
    assert np.isfinite(first.astype(np.float32)).all()
    assert first.tobytes() == again.tobytes()
    gp.synchronize()
