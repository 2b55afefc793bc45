"""KV caches: every write is a copy, so the cache is compared bitwise with NumPy bookkeeping of what was
written; untouched positions keep their (poisoned) contents; errors are typed and change nothing; on
the GPU, graph replays of append/advance at new device positions are bitwise equal to eager runs."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
from ops_testing import Array, sample

import pygpukit as gp
from pygpukit.core.backend import current_backend
from pygpukit.core.dtypes import DType
from pygpukit.core.errors import ArgumentError, DTypeError, OutOfMemoryError, ShapeError

KV_DTYPES = [gp.float32, gp.float16, gp.bfloat16]


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def kv(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Array:
    return sample(rng, shape, dtype, -4.0, 4.0)


def poisoned_cache(cache: gp.KVCache, rng: np.random.Generator) -> tuple[list[Array], list[Array]]:
    """Fill every layer with known garbage; returns the host mirrors."""
    ks, vs = [], []
    for layer in range(cache.num_layers):
        hk, hv = kv(rng, cache.shape, cache.dtype), kv(rng, cache.shape, cache.dtype)
        hk.reshape(-1)[::7] = np.nan
        cache.k(layer).copy_(hk)
        cache.v(layer).copy_(hv)
        ks.append(hk)
        vs.append(hv)
    return ks, vs


def assert_cache(cache: gp.KVCache, ks: list[Array], vs: list[Array]) -> None:
    for layer in range(cache.num_layers):
        assert cache.k(layer).to_numpy().tobytes() == ks[layer].tobytes(), f"k of layer {layer}"
        assert cache.v(layer).to_numpy().tobytes() == vs[layer].tobytes(), f"v of layer {layer}"


# -- fixed cache -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", KV_DTYPES, ids=str)
@pytest.mark.parametrize(("kv_heads", "head_dim"), [(4, 128), (8, 128), (3, 64), (2, 6)])
def test_prefill_then_decode(rng: np.random.Generator, dtype: DType, kv_heads: int, head_dim: int) -> None:
    batch, max_seq, layers = 3, 40, 2
    cache = gp.KVCache(layers, batch, kv_heads, max_seq, head_dim, dtype)
    assert cache.k(0).shape == (batch, kv_heads, max_seq, head_dim)
    assert cache.k(1).is_contiguous
    assert cache.dtype == dtype
    ks, vs = poisoned_cache(cache, rng)
    prompt = 13
    for layer in range(layers):
        hk, hv = (
            kv(rng, (batch, prompt, kv_heads, head_dim), dtype),
            kv(rng, (batch, prompt, kv_heads, head_dim), dtype),
        )
        cache.write_prefill(layer, gp.from_numpy(hk), gp.from_numpy(hv))
        ks[layer][:, :, :prompt] = hk.transpose(0, 2, 1, 3)
        vs[layer][:, :, :prompt] = hv.transpose(0, 2, 1, 3)
    assert cache.length == prompt
    assert_cache(cache, ks, vs)
    positions = np.array([prompt, prompt + 5, 0], np.int32)  # rows at different positions
    for _ in range(4):
        for layer in range(layers):
            hk, hv = kv(rng, (batch, 1, kv_heads, head_dim), dtype), kv(rng, (batch, 1, kv_heads, head_dim), dtype)
            cache.append(layer, gp.from_numpy(hk), gp.from_numpy(hv), gp.from_numpy(positions))
            for b in range(batch):
                ks[layer][b, :, positions[b]] = hk[b, 0]
                vs[layer][b, :, positions[b]] = hv[b, 0]
        positions += 1
    assert cache.length == prompt  # device-position appends are not tracked on the host
    assert_cache(cache, ks, vs)


def test_prefill_at_an_offset_and_for_fewer_rows(rng: np.random.Generator) -> None:
    cache = gp.KVCache(1, 4, 2, 32, 64, gp.bfloat16)
    ks, vs = poisoned_cache(cache, rng)
    hk, hv = kv(rng, (2, 7, 2, 64), gp.bfloat16), kv(rng, (2, 7, 2, 64), gp.bfloat16)
    cache.write_prefill(0, gp.from_numpy(hk), gp.from_numpy(hv), start=25)  # ends exactly at max_seq_len
    ks[0][:2, :, 25:] = hk.transpose(0, 2, 1, 3)
    vs[0][:2, :, 25:] = hv.transpose(0, 2, 1, 3)
    assert_cache(cache, ks, vs)
    assert cache.length == 32


def test_append_of_several_tokens(rng: np.random.Generator) -> None:
    cache = gp.KVCache(1, 2, 2, 16, 8, gp.float16)
    ks, vs = poisoned_cache(cache, rng)
    hk, hv = kv(rng, (2, 3, 2, 8), gp.float16), kv(rng, (2, 3, 2, 8), gp.float16)
    cache.append(0, gp.from_numpy(hk), gp.from_numpy(hv), gp.from_numpy(np.array([4, 13], np.int32)))
    ks[0][0, :, 4:7] = hk[0].transpose(1, 0, 2)
    ks[0][1, :, 13:16] = hk[1].transpose(1, 0, 2)
    vs[0][0, :, 4:7] = hv[0].transpose(1, 0, 2)
    vs[0][1, :, 13:16] = hv[1].transpose(1, 0, 2)
    assert_cache(cache, ks, vs)


def test_append_with_an_offset_takes_a_lengths_buffer(rng: np.random.Generator) -> None:
    cache = gp.KVCache(1, 3, 2, 16, 8, gp.bfloat16)
    ks, vs = poisoned_cache(cache, rng)
    lens = np.array([1, 9, 16], np.int32)  # counts the new token
    hk, hv = kv(rng, (3, 1, 2, 8), gp.bfloat16), kv(rng, (3, 1, 2, 8), gp.bfloat16)
    cache.append(0, gp.from_numpy(hk), gp.from_numpy(hv), gp.from_numpy(lens), offset=-1)
    for b in range(3):
        ks[0][b, :, lens[b] - 1] = hk[b, 0]
        vs[0][b, :, lens[b] - 1] = hv[b, 0]
    assert_cache(cache, ks, vs)
    with pytest.raises(ArgumentError, match="offset must be an int32"):
        cache.append(0, gp.from_numpy(hk), gp.from_numpy(hv), gp.from_numpy(lens), offset=2**40)
    assert_cache(cache, ks, vs)


def test_strided_activations_from_a_fused_qkv_buffer(rng: np.random.Generator) -> None:
    batch, seq, hq, hk_heads, d = 2, 5, 4, 2, 64
    host = kv(rng, (batch, seq, hq + 2 * hk_heads, d), gp.bfloat16)
    qkv = gp.from_numpy(host)
    k, v = qkv[:, :, hq : hq + hk_heads], qkv[:, :, hq + hk_heads :]
    assert not k.is_contiguous
    cache = gp.KVCache(1, batch, hk_heads, 8, d, gp.bfloat16)
    ks, vs = poisoned_cache(cache, rng)
    cache.write_prefill(0, k, v, start=1)
    ks[0][:, :, 1:6] = host[:, :, hq : hq + hk_heads].transpose(0, 2, 1, 3)
    vs[0][:, :, 1:6] = host[:, :, hq + hk_heads :].transpose(0, 2, 1, 3)
    assert_cache(cache, ks, vs)


@pytest.mark.parametrize("dtype", KV_DTYPES, ids=str)
def test_snapshot_and_restore(rng: np.random.Generator, dtype: DType) -> None:
    cache = gp.KVCache(3, 2, 4, 24, 32, dtype)
    ks, vs = poisoned_cache(cache, rng)
    for layer in range(3):
        hk, hv = kv(rng, (2, 10, 4, 32), dtype), kv(rng, (2, 10, 4, 32), dtype)
        cache.write_prefill(layer, gp.from_numpy(hk), gp.from_numpy(hv))
    prompt_k = [cache.k(layer).to_numpy() for layer in range(3)]
    prompt_v = [cache.v(layer).to_numpy() for layer in range(3)]
    snapshot = cache.snapshot()
    assert snapshot.length == 10
    assert snapshot.k[1].shape == (2, 4, 10, 32)
    assert snapshot.nbytes == 2 * 3 * 2 * 4 * 10 * 32 * dtype.itemsize
    assert snapshot.k[2].to_numpy().tobytes() == prompt_k[2][:, :, :10].tobytes()
    # A continuation overwrites the prompt's positions and extends it.
    for layer in range(3):
        hk, hv = kv(rng, (2, 15, 4, 32), dtype), kv(rng, (2, 15, 4, 32), dtype)
        cache.write_prefill(layer, gp.from_numpy(hk), gp.from_numpy(hv), start=5)
    assert cache.length == 20
    cache.restore(snapshot)
    assert cache.length == 10
    for layer in range(3):
        got_k, got_v = cache.k(layer).to_numpy(), cache.v(layer).to_numpy()
        assert got_k[:, :, :10].tobytes() == prompt_k[layer][:, :, :10].tobytes()
        assert got_v[:, :, :10].tobytes() == prompt_v[layer][:, :, :10].tobytes()
    full = cache.snapshot(24)  # the whole cache: contiguous copies
    assert full.k[0].to_numpy().tobytes() == cache.k(0).to_numpy().tobytes()
    empty = cache.snapshot(0)
    cache.restore(empty)
    assert cache.length == 0
    del ks, vs


def test_reset(rng: np.random.Generator) -> None:
    cache = gp.KVCache(2, 1, 2, 8, 16, gp.float16)
    ks, vs = poisoned_cache(cache, rng)
    cache.write_prefill(1, gp.from_numpy(kv(rng, (1, 3, 2, 16), gp.float16)),
                        gp.from_numpy(kv(rng, (1, 3, 2, 16), gp.float16)))  # fmt: skip
    before = cache.k(1).to_numpy()
    cache.reset()
    assert cache.length == 0
    assert cache.k(1).to_numpy().tobytes() == before.tobytes()
    cache.reset(clear=True)
    assert not cache.k(0).to_numpy().any()
    assert not cache.v(1).to_numpy().any()
    del ks, vs


def test_fixed_cache_errors_change_nothing(rng: np.random.Generator) -> None:
    cache = gp.KVCache(2, 2, 4, 16, 32, gp.bfloat16)
    ks, vs = poisoned_cache(cache, rng)
    good = gp.from_numpy(kv(rng, (2, 3, 4, 32), gp.bfloat16))
    one = gp.from_numpy(kv(rng, (2, 1, 4, 32), gp.bfloat16))
    positions = gp.from_numpy(np.array([3, 4], np.int32))
    wide = gp.from_numpy(kv(rng, (2, 3, 4, 64), gp.bfloat16))
    other_heads = gp.KVCache(2, 2, 2, 16, 32, gp.bfloat16)
    longer = gp.KVCache(2, 2, 4, 32, 32, gp.bfloat16)

    def prefill(**change: Any) -> None:
        args = {"layer": 0, "k": good, "v": good, "start": 0} | change
        cache.write_prefill(**args)

    def append(**change: Any) -> None:
        args = {"layer": 0, "k": one, "v": one, "positions": positions} | change
        cache.append(**args)

    cases: list[tuple[type[Exception], str, Any]] = [
        (ArgumentError, r"positions \[14, 17\) do not fit in max_seq_len 16", lambda: prefill(start=14)),
        (ArgumentError, r"positions \[-1, 2\)", lambda: prefill(start=-1)),
        (ArgumentError, "layer 2 is out of range for a cache of 2 layers", lambda: prefill(layer=2)),
        (DTypeError, "k is float16 but the cache holds bfloat16",
         lambda: prefill(k=gp.from_numpy(kv(rng, (2, 3, 4, 32), gp.float16)))),
        (ShapeError, "k has 8 kv heads .* the cache has 4",
         lambda: prefill(k=gp.from_numpy(kv(rng, (2, 3, 8, 32), gp.bfloat16)))),
        (ShapeError, "v has head_dim 64 .* the cache has 32",
         lambda: prefill(v=gp.from_numpy(kv(rng, (2, 3, 4, 64), gp.bfloat16)))),
        (ShapeError, "k/v have batch 3 .* the cache only 2",
         lambda: prefill(k=gp.from_numpy(kv(rng, (3, 3, 4, 32), gp.bfloat16)),
                         v=gp.from_numpy(kv(rng, (3, 3, 4, 32), gp.bfloat16)))),
        (ShapeError, r"k \(2, 3, 4, 32\) and v \(2, 2, 4, 32\) differ",
         lambda: prefill(v=gp.from_numpy(kv(rng, (2, 2, 4, 32), gp.bfloat16)))),
        (ShapeError, r"must be \(batch, seq, num_kv_heads, head_dim\)", lambda: prefill(k=good[0])),
        (ShapeError, "last dimension of k must be contiguous", lambda: prefill(k=wide[..., ::2])),
        (DTypeError, "positions must be an int32 GPUArray, got int64",
         lambda: append(positions=gp.from_numpy(np.array([3, 4], np.int64)))),
        (ShapeError, r"positions must have shape \(2,\)",
         lambda: append(positions=gp.from_numpy(np.zeros(3, np.int32)))),
        (DTypeError, "restore needs a KVCacheSnapshot", lambda: cache.restore("snapshot")),
        (ShapeError, "restore: the snapshot", lambda: cache.restore(other_heads.snapshot(4))),
        (ShapeError, "restore: the snapshot", lambda: cache.restore(longer.snapshot(20))),
        (ArgumentError, r"snapshot: length 17 is outside \[0, max_seq_len=16\]", lambda: cache.snapshot(17)),
    ]  # fmt: skip
    if current_backend() != "cuda":  # device positions are checked on the CPU backend only
        cases.append((ArgumentError, r"batch row 1 writes positions \[16, 17\), outside max_seq_len 16",
                      lambda: append(positions=gp.from_numpy(np.array([3, 16], np.int32)))))  # fmt: skip
        cases.append((ArgumentError, r"batch row 0 writes positions \[-2, -1\)",
                      lambda: append(positions=gp.from_numpy(np.array([-2, 0], np.int32)))))  # fmt: skip
    for error, message, call in cases:
        with pytest.raises(error, match=message):
            call()
        assert_cache(cache, ks, vs)
        assert cache.length == 0, message


def test_constructor_errors() -> None:
    with pytest.raises(DTypeError, match="float32, float16 or bfloat16"):
        gp.KVCache(1, 1, 1, 8, 8, gp.float64)
    with pytest.raises(ArgumentError, match="max_seq_len must be an int"):
        gp.KVCache(1, 1, 1, 0, 8)
    with pytest.raises(ArgumentError, match="num_blocks must be an int"):
        gp.PagedKVCache(1, 0, 16, 1, 8)


# -- block allocator -------------------------------------------------------------------------------
def test_block_allocator() -> None:
    allocator = gp.BlockAllocator(6)
    assert allocator.available == 6
    first = allocator.allocate(4)
    assert first == [0, 1, 2, 3]
    assert allocator.available == 2
    with pytest.raises(gp.BlocksExhaustedError, match="3 blocks requested, 2 of 6 free") as info:
        allocator.allocate(3)
    assert isinstance(info.value, OutOfMemoryError)
    assert (info.value.requested_blocks, info.value.available_blocks) == (3, 2)
    assert allocator.available == 2
    allocator.free([1, 2])
    assert allocator.allocate(3) == [1, 2, 4]
    with pytest.raises(ArgumentError, match=r"blocks \[5\] are not allocated"):
        allocator.free([0, 5])
    with pytest.raises(ArgumentError, match="repeated block ids"):
        allocator.free([0, 0])
    with pytest.raises(ArgumentError, match=r"blocks \[9\] are not allocated"):
        allocator.free([9])
    assert allocator.available == 1  # the failed frees changed nothing
    assert allocator.used == 5
    assert allocator.allocate(0) == []


# -- paged cache -----------------------------------------------------------------------------------
class PagedMirror:
    """Host bookkeeping of what each slot's positions hold, for comparing with the cache."""

    def __init__(self, layers: int) -> None:
        self.k: list[dict[tuple[int, int], Array]] = [{} for _ in range(layers)]
        self.v: list[dict[tuple[int, int], Array]] = [{} for _ in range(layers)]

    def put(self, layer: int, slot: int, position: int, k: Array, v: Array) -> None:
        self.k[layer][slot, position] = k
        self.v[layer][slot, position] = v


def assert_paged(cache: gp.PagedKVCache, mirror: PagedMirror, blocks_before: list[Array] | None = None) -> None:
    """Every recorded (slot, position) holds its k/v at block_table[slot][position // block_size]; every
    other position of the block pool is unchanged from ``blocks_before`` (when given)."""
    table = cache.block_table.to_numpy()
    size = cache.block_size
    for layer in range(cache.num_layers):
        for name, store, pool in (("k", mirror.k[layer], cache.k_blocks(layer)), ("v", mirror.v[layer],
                                                                                   cache.v_blocks(layer))):  # fmt: skip
            host = pool.to_numpy()
            written = np.zeros(host.shape[:1] + host.shape[2:3], bool)
            for (slot, position), values in store.items():
                block = table[slot, position // size]
                assert block >= 0
                got = host[block, :, position % size]
                assert got.tobytes() == values.tobytes(), (name, layer, slot, position)
                written[block, position % size] = True
            if blocks_before is not None:
                before = blocks_before[2 * layer + (name == "v")]
                untouched = ~written
                assert (
                    host.transpose(0, 2, 1, 3)[untouched].tobytes() == before.transpose(0, 2, 1, 3)[untouched].tobytes()
                ), (name, layer)


def poison_paged(cache: gp.PagedKVCache, rng: np.random.Generator) -> list[Array]:
    pools = []
    for layer in range(cache.num_layers):
        for pool in (cache.k_blocks(layer), cache.v_blocks(layer)):
            host = kv(rng, pool.shape, pool.dtype)
            pool.copy_(host)
            pools.append(host)
    return pools


@pytest.mark.parametrize("dtype", KV_DTYPES, ids=str)
def test_paged_prefill_decode_and_removal(rng: np.random.Generator, dtype: DType) -> None:
    layers, heads, d, size = 2, 2, 64, 4
    cache = gp.PagedKVCache(layers, 20, size, heads, d, dtype, max_batch=3, max_blocks_per_seq=6)
    assert cache.k_blocks(0).shape == (20, heads, size, d)
    assert cache.block_table.dtype == gp.int32
    assert cache.block_table.shape == (3, 6)
    assert cache.context_lens.shape == (3,)
    pools = poison_paged(cache, rng)
    mirror = PagedMirror(layers)
    prompts = {}
    for length in (5, 9):
        slot = cache.add_sequence(length)
        prompts[slot] = length
        for layer in range(layers):
            hk, hv = kv(rng, (length, heads, d), dtype), kv(rng, (length, heads, d), dtype)
            cache.write_prefill(layer, slot, gp.from_numpy(hk), gp.from_numpy(hv))
            for p in range(length):
                mirror.put(layer, slot, p, hk[p], hv[p])
    assert prompts == {0: 5, 1: 9}
    assert cache.sequences == {0: (0, 1), 1: (2, 3, 4)}
    assert cache.context_lens.to_numpy().tolist() == [5, 9, 0]
    assert cache.capacity(1) == 12
    assert_paged(cache, mirror, pools)
    # Decode 6 steps for slots 0 and 1 (slot 2 is free: its row is skipped by append and advance).
    lengths = [5, 9, 0]
    for _ in range(6):
        for slot in (0, 1):
            cache.ensure_capacity(slot, lengths[slot] + 1)
        for layer in range(layers):
            hk, hv = kv(rng, (3, 1, heads, d), dtype), kv(rng, (3, 1, heads, d), dtype)
            cache.append(layer, gp.from_numpy(hk), gp.from_numpy(hv))
            for slot in (0, 1):
                mirror.put(layer, slot, lengths[slot], hk[slot, 0], hv[slot, 0])
        cache.advance()
        lengths[0] += 1
        lengths[1] += 1
        assert cache.context_lens.to_numpy().tolist() == lengths
    assert_paged(cache, mirror, pools)
    assert cache.capacity(0) == 12
    assert cache.allocator.available == 20 - 3 - 4
    # Removing frees the blocks and clears the slot's row.
    cache.remove_sequence(0)
    assert cache.sequences == {1: (2, 3, 4, 6)}
    assert cache.block_table.to_numpy()[0].tolist() == [-1] * 6
    assert cache.context_lens.to_numpy().tolist() == [0, 15, 0]
    assert cache.allocator.available == 20 - 4
    again = cache.add_sequence(3)
    assert again == 0
    assert cache.sequences[0] == (0,)  # the lowest free block is reused


def test_paged_append_skips_slots_without_capacity_and_advance_too(rng: np.random.Generator) -> None:
    cache = gp.PagedKVCache(1, 8, 4, 1, 8, gp.float16, max_batch=2, max_blocks_per_seq=4)
    pools = poison_paged(cache, rng)
    cache.add_sequence(4)  # exactly one full block: position 4 has no block yet
    cache.add_sequence(2)
    hk, hv = kv(rng, (2, 1, 1, 8), gp.float16), kv(rng, (2, 1, 1, 8), gp.float16)
    cache.append(0, gp.from_numpy(hk), gp.from_numpy(hv))
    cache.advance()
    assert cache.context_lens.to_numpy().tolist() == [4, 3]
    mirror = PagedMirror(1)
    mirror.put(0, 1, 2, hk[1, 0], hv[1, 0])
    assert_paged(cache, mirror, pools)
    cache.advance(2, batch=1)  # slot 0 still has no block for position 5
    assert cache.context_lens.to_numpy().tolist() == [4, 3]
    cache.ensure_capacity(0, 6)
    cache.advance(2, batch=1)
    assert cache.context_lens.to_numpy().tolist() == [6, 3]


def test_paged_decode_step_counting_the_token_first(rng: np.random.Generator) -> None:
    """The decode step for attention kernels that take lengths including the new token: advance()
    first, then RoPE at context_lens - 1 and append(offset=-1)."""
    heads, d = 2, 16
    cache = gp.PagedKVCache(1, 8, 4, heads, d, gp.float32, max_batch=2, max_blocks_per_seq=4)
    pools = poison_paged(cache, rng)
    mirror = PagedMirror(1)
    cache.add_sequence(3)
    cache.add_sequence(4)
    cos, sin = gp.rope_cos_sin(d, 16)
    lengths = [3, 4]
    for _ in range(3):
        for slot in (0, 1):
            cache.ensure_capacity(slot, lengths[slot] + 1)
        cache.advance()  # context_lens now counts the new token
        hk, hv = kv(rng, (2, 1, heads, d), gp.float32), kv(rng, (2, 1, heads, d), gp.float32)
        k = gp.from_numpy(hk)
        gp.apply_rope(k, None, cos, sin, cache.context_lens, position_offset=-1)
        cache.append(0, k, gp.from_numpy(hv), offset=-1)
        rotated = k.to_numpy()
        for slot in (0, 1):
            mirror.put(0, slot, lengths[slot], rotated[slot, 0], hv[slot, 0])
            lengths[slot] += 1
        want = reference_rope_positions(hk, cos, sin, np.array(lengths) - 1)
        np.testing.assert_allclose(rotated, want, rtol=1e-6, atol=1e-6)
    assert cache.context_lens.to_numpy().tolist() == [6, 7]
    assert_paged(cache, mirror, pools)


def reference_rope_positions(x: Array, cos: gp.GPUArray, sin: gp.GPUArray, positions: Array) -> Array:
    c, s = cos.to_numpy().astype(np.float64)[positions], sin.to_numpy().astype(np.float64)[positions]
    half = c.shape[-1]
    x1, x2 = x[:, 0, :, :half].astype(np.float64), x[:, 0, :, half:].astype(np.float64)
    c, s = c[:, None, :], s[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)[:, None]


def test_paged_prefill_at_an_offset_and_set_length(rng: np.random.Generator) -> None:
    cache = gp.PagedKVCache(1, 8, 4, 2, 16, gp.bfloat16, max_batch=2)
    assert cache.max_blocks_per_seq == 8
    pools = poison_paged(cache, rng)
    slot = cache.add_sequence(3, slot=1)
    assert slot == 1
    cache.ensure_capacity(slot, 10)
    hk, hv = kv(rng, (1, 7, 2, 16), gp.bfloat16), kv(rng, (1, 7, 2, 16), gp.bfloat16)
    cache.write_prefill(0, slot, gp.from_numpy(hk), gp.from_numpy(hv), start=3)
    cache.set_length(slot, 10)
    assert cache.context_lens.to_numpy().tolist() == [0, 10]
    mirror = PagedMirror(1)
    for s in range(7):
        mirror.put(0, slot, 3 + s, hk[0, s], hv[0, s])
    assert_paged(cache, mirror, pools)


def test_paged_errors_change_nothing(rng: np.random.Generator) -> None:
    cache = gp.PagedKVCache(2, 5, 4, 2, 8, gp.float16, max_batch=3, max_blocks_per_seq=4)
    pools = poison_paged(cache, rng)
    slot = cache.add_sequence(5)  # blocks 0, 1
    cache.add_sequence(8)  # blocks 2, 3: one block left
    good = gp.from_numpy(kv(rng, (5, 2, 8), gp.float16))
    three = gp.from_numpy(kv(rng, (3, 1, 2, 8), gp.float16))
    four = gp.from_numpy(kv(rng, (4, 1, 2, 8), gp.float16))

    def state() -> tuple[Any, ...]:
        return (cache.block_table.to_numpy().tobytes(), cache.context_lens.to_numpy().tobytes(),
                cache.allocator.available, cache.sequences)  # fmt: skip

    before = state()
    cases: list[tuple[type[Exception], str, Any]] = [
        (ArgumentError, "17 tokens need 5 blocks of 4, more than max_blocks_per_seq 4",
         lambda: cache.ensure_capacity(slot, 17)),
        (gp.BlocksExhaustedError, "2 blocks requested, 1 of 5 free", lambda: cache.ensure_capacity(slot, 16)),
        (gp.BlocksExhaustedError, "2 blocks requested, 1 of 5 free", lambda: cache.add_sequence(8)),
        (ArgumentError, "slot 2 holds no sequence", lambda: cache.ensure_capacity(2, 4)),
        (ArgumentError, "slot 0 already holds a sequence", lambda: cache.add_sequence(1, slot=0)),
        (ArgumentError, r"slot 3 is outside \[0, max_batch=3\)", lambda: cache.add_sequence(1, slot=3)),
        (ArgumentError, "add_sequence: length must be >= 0", lambda: cache.add_sequence(-1)),
        (ArgumentError, r"positions \[4, 9\) exceed slot 0's capacity 8",
         lambda: cache.write_prefill(0, slot, good, good, start=4)),
        (ArgumentError, "slot 2 holds no sequence", lambda: cache.write_prefill(0, 2, good, good)),
        (ShapeError, "hold one sequence", lambda: cache.write_prefill(0, slot, three, three)),
        (ShapeError, "k has 1 kv heads", lambda: cache.write_prefill(0, slot, good[:, :1], good[:, :1])),
        (ArgumentError, "layer 2 is out of range", lambda: cache.write_prefill(2, slot, good, good)),
        (ShapeError, "max_batch is 3", lambda: cache.append(0, four, four)),
        (DTypeError, "k is float32", lambda: cache.append(0, three.astype(gp.float32), three.astype(gp.float32))),
        (ArgumentError, r"length 9 is outside \[0, capacity 8\]", lambda: cache.set_length(slot, 9)),
        (ArgumentError, "n must be an int in", lambda: cache.advance(0)),
        (ArgumentError, "batch must be an int in", lambda: cache.advance(1, batch=4)),
        (ArgumentError, "slot 2 holds no sequence", lambda: cache.remove_sequence(2)),
    ]  # fmt: skip
    for error, message, call in cases:
        with pytest.raises(error, match=message):
            call()
        assert state() == before, message
        assert_paged(cache, PagedMirror(2), pools)
    assert cache.add_sequence(0) == 2  # no blocks needed
    with pytest.raises(ArgumentError, match="all 3 slots hold sequences"):
        cache.add_sequence(1)


# -- GPU: graph capture of the decode-step writes --------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", KV_DTYPES, ids=str)
def test_gpu_append_graph_replays_at_new_positions_bitwise(rng: np.random.Generator, dtype: DType) -> None:
    batch, heads, d, max_seq = 4, 8, 128, 64  # Llama-3-8B kv heads
    stream = gp.Stream()
    with stream:
        graph_cache = gp.KVCache(2, batch, heads, max_seq, d, dtype)
        eager_cache = gp.KVCache(2, batch, heads, max_seq, d, dtype)
        for cache in (graph_cache, eager_cache):
            for layer in range(2):
                cache.k(layer).copy_(np.zeros(cache.shape, dtype.numpy))
                cache.v(layer).copy_(np.zeros(cache.shape, dtype.numpy))
        k, v = gp.zeros((batch, 1, heads, d), dtype), gp.zeros((batch, 1, heads, d), dtype)  # warm-up writes zeros
        positions = gp.from_numpy(np.zeros(batch, np.int32))
        graph_cache.append(0, k, v, positions)  # compiled before capture
        graph = gp.CudaGraph()
        with graph.capture(stream):
            for layer in range(2):
                graph_cache.append(layer, k, v, positions)
        for step in range(5):
            hk, hv = kv(rng, k.shape, dtype), kv(rng, v.shape, dtype)
            hp = rng.integers(0, max_seq, size=batch).astype(np.int32)
            if step == 4:
                hp[1] = max_seq + 3  # past the cache: the kernel skips it
            k.copy_(hk)
            v.copy_(hv)
            positions.copy_(hp)
            graph.replay(stream)
            for layer in range(2):  # eager on the GPU skips the out-of-range row the same way
                eager_cache.append(layer, gp.from_numpy(hk), gp.from_numpy(hv), gp.from_numpy(hp))
        stream.synchronize()
    for layer in range(2):
        for name in ("k", "v"):
            got = getattr(graph_cache, name)(layer).to_numpy()
            assert got.tobytes() == getattr(eager_cache, name)(layer).to_numpy().tobytes(), (name, layer)
            assert got.any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", KV_DTYPES, ids=str)
def test_gpu_paged_decode_graph_bitwise(rng: np.random.Generator, dtype: DType) -> None:
    """A captured decode step (append to 2 layers + advance) replayed 6 times equals 6 eager steps;
    context_lens is also overwritten between replays to move one slot elsewhere."""
    heads, d, size = 4, 128, 16

    def build() -> gp.PagedKVCache:
        cache = gp.PagedKVCache(2, 32, size, heads, d, dtype, max_batch=3, max_blocks_per_seq=8)
        for layer in range(2):
            cache.k_blocks(layer).copy_(np.zeros(cache.shape, dtype.numpy))
            cache.v_blocks(layer).copy_(np.zeros(cache.shape, dtype.numpy))
        cache.add_sequence(14)
        cache.add_sequence(31)
        cache.add_sequence(1)
        for slot in range(3):
            cache.ensure_capacity(slot, 64)
        return cache

    stream = gp.Stream()
    with stream:
        graph_cache, eager_cache = build(), build()
        k, v = gp.zeros((3, 1, heads, d), dtype), gp.zeros((3, 1, heads, d), dtype)
        graph_cache.append(0, k, v)
        graph_cache.advance()
        graph_cache.set_length(0, 14)
        graph_cache.set_length(1, 31)
        graph_cache.set_length(2, 1)
        graph = gp.CudaGraph()
        with graph.capture(stream):
            for layer in range(2):
                graph_cache.append(layer, k, v)
            graph_cache.advance()
        for step in range(6):
            hk, hv = kv(rng, k.shape, dtype), kv(rng, v.shape, dtype)
            k.copy_(hk)
            v.copy_(hv)
            if step == 3:  # move slot 2 to position 40 on the device, in both caches
                graph_cache.set_length(2, 40)
                eager_cache.set_length(2, 40)
            graph.replay(stream)
            for layer in range(2):
                eager_cache.append(layer, gp.from_numpy(hk), gp.from_numpy(hv))
            eager_cache.advance()
        stream.synchronize()
    assert graph_cache.context_lens.to_numpy().tolist() == [20, 37, 43]
    assert eager_cache.context_lens.to_numpy().tolist() == [20, 37, 43]
    for layer in range(2):
        assert graph_cache.k_blocks(layer).to_numpy().tobytes() == eager_cache.k_blocks(layer).to_numpy().tobytes()
        assert graph_cache.v_blocks(layer).to_numpy().tobytes() == eager_cache.v_blocks(layer).to_numpy().tobytes()


@pytest.mark.gpu
def test_gpu_large_prefill(rng: np.random.Generator) -> None:
    cache = gp.KVCache(1, 1, 8, 4096, 128, gp.bfloat16)
    hk, hv = kv(rng, (1, 4096, 8, 128), gp.bfloat16), kv(rng, (1, 4096, 8, 128), gp.bfloat16)
    cache.write_prefill(0, gp.from_numpy(hk), gp.from_numpy(hv))
    assert cache.k(0).to_numpy().tobytes() == hk.transpose(0, 2, 1, 3).tobytes()
    assert cache.v(0).to_numpy().tobytes() == hv.transpose(0, 2, 1, 3).tobytes()


@pytest.mark.nvrtc
def test_every_kv_kernel_compiles() -> None:
    from pygpukit.ops._kernels import all_groups, group

    groups = all_groups()["attention/kv_cache.cu"]
    assert len({e for g in groups for e in g}) == 13
    for expressions in groups:
        group("attention/kv_cache.cu", expressions).compile("80")
